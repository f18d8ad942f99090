"""precision=bf16|fp8cs|fp8mx|nvfp4 against the installed library, on CPU.

- The table's mixed-precision config is, field for field, the one Bridge's perf recipes build
  (perf_recipes/_common.py _perf_precision), for every format including NVFP4 (no perf recipe).
- Bridge's *_fp8cs_config / *_fp8mx_config perf recipes and the *_bf16_config one with our
  precision row give the same ConfigContainer once the table is applied (the variants differ in
  more than precision only in fields the table sets: CUDA graph scope and the TE RNG tracker).
- Rule P001 says what Transformer Engine's own capability checks say, on every GPU cluster.
- The quantized-weight bytes of the memory estimate are TE's own allocation of such a weight.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from moe_vlm.config.precision import PROFILES, profile, runs_on, weight_bytes
from moe_vlm.config.schema import Precision
from moe_vlm.knobs.bridge_recipe import select_recipe
from moe_vlm.rules import validate
from tests.conftest import CONF, make_spec
from tests.megatron.conftest import REPORT, needs_stack

# _perf_precision's names for our formats (megatron/bridge/perf_recipes/_common.py:99-109).
PERF_DTYPE = {
    Precision.bf16: "bf16",
    Precision.fp8cs: "fp8_cs",
    Precision.fp8mx: "fp8_mx",
    Precision.nvfp4: "nvfp4",
}
GPU_CLUSTERS = ("h100", "h200", "b200", "gb200", "b300", "gb300")


@needs_stack
@pytest.mark.parametrize("fmt", list(Precision))
def test_the_table_builds_the_perf_recipes_mixed_precision(fmt: Precision) -> None:
    from megatron.bridge.perf_recipes._common import _perf_precision

    from moe_vlm.engines.megatron.config import named_config

    spec = make_spec("engine=megatron", "dry_run=true", "cluster=gb200", f"precision={fmt.value}")
    ours = named_config("mixed_precision", profile(fmt).bridge_recipe, spec)
    assert ours == _perf_precision(PERF_DTYPE[fmt])


def _flat(cfg: Any) -> dict[str, Any]:
    from moe_vlm.engines.megatron.effective import leaves

    return {
        f"{f.name}.{key}" if key else f.name: value
        for f in dataclasses.fields(cfg)
        for key, value in leaves(getattr(cfg, f.name)).items()
    }


def _built(function: Any, spec: Any, workdir: Path) -> dict[str, Any]:
    from moe_vlm.engines.hf_config import hf_model_dir
    from moe_vlm.engines.megatron.config import apply_overrides, offline_hf

    with warnings.catch_warnings(), offline_hf(hf_model_dir(spec.model, workdir)):
        warnings.simplefilter("ignore")
        cfg = function()
    apply_overrides(cfg, spec)
    return _flat(cfg)


@needs_stack
@pytest.mark.parametrize(
    ("model", "cluster", "fmt"),
    [
        ("qwen3_vl_30b_a3b", "gb200", Precision.fp8cs),
        ("qwen3_vl_30b_a3b", "gb200", Precision.fp8mx),
        ("qwen3_vl_30b_a3b", "h100", Precision.fp8cs),  # its variant leaves the TE RNG tracker off
        ("qwen35_vl_35b_a3b", "gb200", Precision.fp8mx),  # its variant has another graph scope
    ],
)
def test_bridges_precision_variant_and_our_row_give_one_config(
    tmp_path: Path, model: str, cluster: str, fmt: Precision
) -> None:
    spec = make_spec(
        "engine=megatron", "dry_run=true", f"model={model}", f"cluster={cluster}", f"precision={fmt}"
    )
    recipe = select_recipe(spec)
    assert recipe is not None and recipe.kind == "perf"
    module = importlib.import_module(recipe.module)
    variant = getattr(module, recipe.function.replace("_bf16_config", f"_{profile(fmt).perf_variant}_config"))
    ours, bridges = _built(getattr(module, recipe.function), spec, tmp_path), _built(variant, spec, tmp_path)
    differing = sorted(k for k in {*ours, *bridges} if repr(ours.get(k)) != repr(bridges.get(k)))
    assert differing == []
    REPORT.append(f"precision: {variant.__name__} == the bf16 recipe + precision={fmt} ({len(ours)} fields)")


@needs_stack
@pytest.mark.parametrize("cluster", GPU_CLUSTERS)
def test_p001_agrees_with_transformer_engines_own_checks(
    monkeypatch: pytest.MonkeyPatch, cluster: str
) -> None:
    from transformer_engine.pytorch import quantization

    spec = make_spec("engine=megatron", "dry_run=true", f"cluster={cluster}")
    capability = spec.cluster.compute_capability
    major, minor = int(capability), round(capability % 1 * 10)
    monkeypatch.setattr(quantization, "get_device_compute_capability", lambda: (major, minor))
    for fmt, p in PROFILES.items():
        if not p.te_check:
            continue
        te_runs, _ = getattr(quantization, p.te_check)()
        assert runs_on(fmt, capability) is te_runs, (cluster, fmt)
        fired = "P001" in {f.code for f in validate(make_spec(f"cluster={cluster}", f"precision={fmt}"))}
        assert fired is not te_runs, (cluster, fmt)


@needs_stack
@pytest.mark.parametrize("capability", [(8, 0), (9, 0), (10, 0), (10, 3), (11, 0), (12, 0), (13, 0)])
def test_capability_ranges_are_transformer_engines(
    monkeypatch: pytest.MonkeyPatch, capability: tuple[int, int]
) -> None:
    from transformer_engine.pytorch import quantization

    monkeypatch.setattr(quantization, "get_device_compute_capability", lambda: capability)
    for fmt, p in PROFILES.items():
        if p.te_check:
            assert (
                runs_on(fmt, capability[0] + capability[1] / 10) is getattr(quantization, p.te_check)()[0]
            ), fmt


def _quantizer(fmt: Precision) -> Any:
    import transformer_engine_torch as tex
    from transformer_engine.pytorch.tensor.float8_tensor import Float8CurrentScalingQuantizer
    from transformer_engine.pytorch.tensor.mxfp8_tensor import MXFP8Quantizer
    from transformer_engine.pytorch.tensor.nvfp4_tensor import NVFP4Quantizer

    if fmt is Precision.fp8cs:
        return Float8CurrentScalingQuantizer(tex.DType.kFloat8E4M3, torch.device("cpu"))
    if fmt is Precision.fp8mx:
        return MXFP8Quantizer(tex.DType.kFloat8E4M3)
    return NVFP4Quantizer()


@needs_stack
@pytest.mark.parametrize("capability", [(9, 0), (10, 0)])
@pytest.mark.parametrize("fmt", [Precision.fp8cs, Precision.fp8mx, Precision.nvfp4])
def test_quantized_weight_bytes_are_tes_allocation(
    monkeypatch: pytest.MonkeyPatch, fmt: Precision, capability: tuple[int, int]
) -> None:
    """A weight quantized for the forward (row-wise) and backward (column-wise) GEMMs, as TE's own
    allocation specs lay it out on that GPU (the shape is a 30B expert's fc1: 1536 x 2048)."""
    from transformer_engine.pytorch import utils

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *_a, **_k: capability)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: torch.device("cpu"))  # NVFP4's RHT sign mask
    utils.is_non_tn_fp8_gemm_supported.cache_clear()
    try:
        shape = (1536, 2048)
        specs = _quantizer(fmt).inner_tensor_specs(shape)
        nbytes = sum(math.prod(s) * torch.empty((), dtype=d).element_size() for s, d in specs.values())
    finally:
        utils.is_non_tn_fp8_gemm_supported.cache_clear()
    per_tensor_scales = (
        8 if fmt is Precision.nvfp4 else 4 if fmt is Precision.fp8cs else 0
    )  # FP32 amax / scale_inv
    assert nbytes - per_tensor_scales == weight_bytes(fmt, capability[0] + capability[1] / 10) * math.prod(
        shape
    )


def test_each_option_file_names_its_format() -> None:
    for path in sorted((CONF / "precision").glob("*.yaml")):
        spec = make_spec(f"precision={path.stem}")
        assert spec.precision.name == spec.precision.format.value == path.stem
    assert {p.stem for p in (CONF / "precision").glob("*.yaml")} == {f.value for f in Precision}
