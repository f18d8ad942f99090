"""Each precision option, declared once: the Bridge mixed-precision recipe it runs, the GPUs
Transformer Engine runs it on, what a quantized weight costs in memory, and the dense peak its
own MFU column is quoted against.

Imports nothing heavy: the rules, the memory estimate, the metrics and the Bridge field table read
it. tests/megatron/test_precision.py holds each fact to the installed library: Bridge's recipes,
TE's capability checks and TE's own allocation of a quantized weight.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from moe_vlm.config.schema import ClusterConfig, Precision


class PeakKind(StrEnum):
    """Which dense peak of the cluster profile a precision's GEMMs run at."""

    bf16 = "bf16"
    fp8 = "fp8"  # FP8 and MXFP8 run at the same tensor-core rate
    fp4 = "fp4"


@dataclass(frozen=True)
class PrecisionProfile:
    label: str
    # Bridge's registered mixed-precision recipe (megatron/bridge/training/mixed_precision.py
    # MIXED_PRECISION_RECIPES); the perf recipes adjust it (perf_recipes/_common.py:90-111).
    bridge_recipe: str
    # The suffix of Bridge's Qwen-VL perf recipe variant (perf_recipes/qwen_vl/<gpu>/*.py:
    # *_pretrain_<n>gpu_<gpu>_<suffix>_config); None where Bridge 0.6.2 ships none.
    perf_variant: str | None
    # The compute capabilities Transformer Engine runs it on, [minimum, below): the quantization
    # checks of transformer_engine/pytorch/quantization.py:149-175, asserted when a layer enters
    # TE's autocast (quantization.py:758-769).
    min_capability: float
    below_capability: float | None
    te_check: str  # the TE function deciding it (tests call it)
    peak: PeakKind
    # Bytes per element of one quantized GEMM weight, with both the row-wise (forward) and the
    # column-wise (backward) copy TE allocates for it: TE's own allocation specs
    # (transformer_engine/pytorch/tensor/*_tensor.py inner_tensor_specs).
    #   fp8cs: 1 B data + 1 B transpose where the GPU has no non-TN FP8 GEMM (Hopper); on
    #          Blackwell one buffer serves both (float8_tensor.py:423-428, utils.py:770-775).
    #   fp8mx: 1 B row-wise + 1 B column-wise + one E8M0 byte per 32 values each (mxfp8_tensor.py:83-94).
    #   nvfp4: 1/2 B row-wise + 1/2 B column-wise + one E4M3 byte per 16 values each (nvfp4_tensor.py:379-398).
    weight_bytes: float
    # The multiple a GEMM input's token count (the product of its leading dimensions, one rank's
    # shard under sequence parallelism) must be for TE to run it quantized: assert_dim_for_fp8_exec
    # wants 8 for every quantized format (transformer_engine/pytorch/utils.py:704-714, called by
    # module/linear.py:472, layernorm_linear.py:184, layernorm_mlp.py:356), the block formats'
    # quantizers a whole block (is_quantizable: MXFP8 32, tensor/mxfp8_tensor.py:125-133; NVFP4 16,
    # tensor/nvfp4_tensor.py:261-271; constants.py:185-187). tests/megatron/test_precision.py runs both.
    token_multiple: int = 1
    weight_bytes_tn_only: float | None = None  # where it differs on a GPU without non-TN FP8 GEMMs


PROFILES: dict[Precision, PrecisionProfile] = {
    Precision.bf16: PrecisionProfile(
        "BF16", "bf16_mixed", "bf16", 0.0, None, "", PeakKind.bf16, weight_bytes=2.0
    ),
    Precision.fp8cs: PrecisionProfile(
        "FP8 current scaling, one scale per tensor",
        "bf16_with_fp8_current_scaling_mixed",
        "fp8cs",
        8.9,
        None,
        "_compute_fp8_support",
        PeakKind.fp8,
        weight_bytes=1.0,
        token_multiple=8,
        weight_bytes_tn_only=2.0,
    ),
    Precision.fp8mx: PrecisionProfile(
        "MXFP8, E4M3 with a scale per 32 values",
        "bf16_with_mxfp8_mixed",
        "fp8mx",
        10.0,
        12.0,
        "_compute_mxfp8_support",
        PeakKind.fp8,
        weight_bytes=2 * (1 + 1 / 32),
        token_multiple=32,
    ),
    Precision.nvfp4: PrecisionProfile(
        "NVFP4, E2M1 with a scale per 16 values",
        "bf16_with_nvfp4_mixed",
        None,
        10.0,
        None,
        "_compute_nvfp4_support",
        PeakKind.fp4,
        weight_bytes=2 * (0.5 + 1 / 16),
        token_multiple=16,
    ),
}


def profile(precision: Precision | str) -> PrecisionProfile:
    return PROFILES[Precision(precision)]


def quantized(precision: Precision | str) -> bool:
    return Precision(precision) is not Precision.bf16


def runs_on(precision: Precision | str, capability: float) -> bool:
    """Whether Transformer Engine runs this format on a GPU of that compute capability."""
    p = profile(precision)
    return capability >= p.min_capability and (p.below_capability is None or capability < p.below_capability)


def capability_range(precision: Precision | str) -> str:
    p = profile(precision)
    return f">= {p.min_capability:g}" + (f" and < {p.below_capability:g}" if p.below_capability else "")


def weight_bytes(precision: Precision | str, capability: float) -> float:
    """Bytes per element of a decoder GEMM weight on this GPU (BF16: 2)."""
    p = profile(precision)
    if p.weight_bytes_tn_only is not None and not non_tn_fp8_gemm(capability):
        return p.weight_bytes_tn_only
    return p.weight_bytes


def non_tn_fp8_gemm(capability: float) -> bool:
    """TE's is_non_tn_fp8_gemm_supported (transformer_engine/pytorch/utils.py:770-775): one FP8
    buffer serves the forward and the transposed backward GEMM."""
    return 10.0 <= capability < 12.0 or capability >= 13.0


def peak_flops(cluster: ClusterConfig, kind: PeakKind) -> float:
    return {
        PeakKind.bf16: cluster.peak_bf16_flops,
        PeakKind.fp8: cluster.peak_fp8_flops,
        PeakKind.fp4: cluster.peak_fp4_flops,
    }[kind]
