"""The dense peaks an MFU is quoted against, named: the cluster's BF16 peak, and the run's own
number format's per module (the decoder at FP8/FP4, the vision tower at BF16).

Apart from the metrics (perf/metrics.py), which read run records: a plan quotes its peaks before
any record exists, and need not import the records to do so.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from moe_vlm.config.precision import PeakKind, peak_flops
from moe_vlm.config.precision import profile as precision_profile
from moe_vlm.config.spec import RunSpec
from moe_vlm.perf.flops import MODULES

TERA = 1e12


def peak_of(spec: RunSpec) -> dict[str, Any]:
    """The MFU denominator, named: which GPU, which precision, which number, from where."""
    cluster = spec.cluster
    flops = cluster.peak_bf16_flops
    if flops <= 0:
        return {"name": None, "flops": None}
    return {
        "name": f"{cluster.gpu} dense BF16 {flops / TERA:g} TFLOP/s (cluster={cluster.name})",
        "flops": flops,
    }


# The modules whose GEMMs run BF16 whatever the precision: Qwen3VLModel builds the vision tower
# (ViT blocks, patch merger, deepstack mergers) from get_vision_model_config, which sets neither
# fp8 nor fp4 (megatron/bridge/models/qwen_vl/modelling_qwen3_vl/transformer_config.py:63-158,
# model.py:313-324), so its blocks never enter an FP8/FP4 autocast (modelling_qwen3_vl/
# transformer_block.py:313-335 enters megatron/core/fp8_utils.py get_fp8_context only when
# config.fp8 is set) and its weights are BF16 by Float16Module's cast of the whole model
# (megatron/core/transformer/module.py:464); tests/megatron/test_effective.py reads the config off
# the real provider.
BF16_MODULES = ("vision_encoder", "projector")


def module_peaks(spec: RunSpec) -> dict[str, dict[str, Any]]:
    """Each module's dense peak under the run's precision: the decoder at its format's, the vision
    tower at BF16 (BF16_MODULES)."""
    own = precision_profile(spec.precision.format).peak
    kinds = {module: PeakKind.bf16 if module in BF16_MODULES else own for module in MODULES}
    return {m: {"kind": kind.value, "flops": peak_flops(spec.cluster, kind)} for m, kind in kinds.items()}


def precision_peak_of(spec: RunSpec, flops_by_module: Mapping[str, float] | None = None) -> dict[str, Any]:
    """The second MFU denominator: the dense peaks of the run's own number format, per module, named.

    BF16 runs repeat the BF16 peak. FP8/FP4 runs quote the decoder against the FP8/FP4 peak and the
    vision encoder and projector against the BF16 one (they run BF16: BF16_MODULES). `flops` is the
    one peak that gives the same MFU: the step's FLOPs over the time each module's FLOPs would take
    at its own peak (sum of flops_m / peak_m), so MFU = that ideal time over the measured one. With no
    FLOPs split given, the decoder's. Still an upper bound for the decoder: its attention core,
    norms, router and output layer stay BF16/FP32.
    """
    cluster, peaks = spec.cluster, module_peaks(spec)
    kind = precision_profile(spec.precision.format).peak
    by_module = {"by_module": peaks}
    if any(p["flops"] <= 0 for p in peaks.values()):
        missing = next(p["kind"] for p in peaks.values() if p["flops"] <= 0)
        return {"name": None, "flops": None, "kind": missing, **by_module}
    decoder = peaks["decoder"]["flops"]
    if kind is PeakKind.bf16:
        name = f"{cluster.gpu} dense BF16 {decoder / TERA:g} TFLOP/s (cluster={cluster.name})"
    else:
        name = (
            f"{cluster.gpu} dense {kind.value.upper()} {decoder / TERA:g} TFLOP/s for the decoder, dense "
            f"BF16 {cluster.peak_bf16_flops / TERA:g} TFLOP/s for the vision encoder and projector "
            f"(cluster={cluster.name})"
        )
    flops = decoder
    total = sum(flops_by_module.values()) if flops_by_module else 0.0
    if flops_by_module and total > 0:
        flops = total / sum(flops_by_module[m] / peaks[m]["flops"] for m in MODULES)
    return {"name": name, "flops": flops, "kind": kind.value, **by_module}
