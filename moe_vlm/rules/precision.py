"""Precision rules (P...): where each number format runs, and what is known about it upstream.

The formats' facts (Bridge recipe, Transformer Engine's capability range) are in moe_vlm/config/precision.py.
What Megatron Core and Bridge reject with FP8/FP4 beyond the GPU is out of reach of these knobs:
delayed scaling's limits (first/last BF16 layers, moe_act/layernorm recompute:
megatron/core/transformer/transformer_config.py:1400-1403, :1821-1826) are not a recipe offered
here; HybridEP's FP8 dispatch (megatron/core/transformer/moe/fused_a2a.py:326) is D004's.
NVFP4 keeps its primary weights packed (two E2M1 values per byte, Bridge's bf16_with_nvfp4_mixed:
fp4_param_gather=True, training/mixed_precision.py:405-417), which Megatron FSDP's buffers and TE's
userbuffers do not handle: P004 and P005. Path citations are under site-packages (megatron-core
0.19.2, megatron-bridge 0.6.2, transformer-engine 2.20.2).
"""

from __future__ import annotations

from collections.abc import Iterator

from moe_vlm.config.precision import capability_range, profile, quantized, runs_on
from moe_vlm.config.schema import Engine, ParallelismFamily, Precision
from moe_vlm.config.spec import RunSpec
from moe_vlm.knobs.support import accepts
from moe_vlm.rules.catalogue import Level, Violation, rule


@rule("P001", Level.error, "the number format runs on this GPU (TE quantization checks)")
def _format_on_gpu(spec: RunSpec) -> Iterator[Violation]:
    fmt, cluster = spec.precision.format, spec.cluster
    # cluster=local declares no GPU (capability 0): nothing to check against.
    if spec.engine != Engine.megatron or not quantized(fmt) or cluster.compute_capability <= 0:
        return
    if runs_on(fmt, cluster.compute_capability):
        return
    fallback = (
        "precision=fp8cs (current scaling runs on Hopper) or "
        if runs_on(Precision.fp8cs, cluster.compute_capability)
        else ""
    )
    yield Violation(
        ("precision", "cluster"),
        f"precision={fmt.value} ({profile(fmt).label}) needs compute capability {capability_range(fmt)}; "
        f"{cluster.gpu} is {cluster.compute_capability}. Transformer Engine refuses it when the first layer "
        "enters its autocast (transformer_engine/pytorch/quantization.py:149-175, asserted at :758-769).",
        f"use {fallback}precision=bf16 here, or a Blackwell cluster (b200, gb200, b300, gb300).",
    )


@rule("P002", Level.warning, "FP8/FP4 for MoE VLMs is not validated upstream")
def _not_validated(spec: RunSpec) -> Iterator[Violation]:
    fmt = spec.precision.format
    if spec.engine != Engine.megatron or not quantized(fmt):
        return
    recipes = (
        f"Bridge 0.6.2 ships Qwen-VL *_{profile(fmt).perf_variant}_config perf recipes without published numbers"
        if profile(fmt).perf_variant
        else "Bridge 0.6.2 has no NVFP4 perf recipe for any Qwen-VL model"
    )
    yield Violation(
        ("precision",),
        f"precision={fmt.value}: the field guide's MoE-VLM card lists 'FP8 untested' under its limitations "
        f"(moe-vlm-training/card.yaml), and {recipes}. Throughput is comparable; convergence is unknown.",
        "compare against the same point at precision=bf16 (e.g. -m precision=bf16,"
        f"{fmt.value}), and check the loss curve before trusting a low-precision result.",
    )


@rule("P003", Level.error, "the torch engine trains in BF16")
def _torch_precision(spec: RunSpec) -> Iterator[Violation]:
    fmt = spec.precision.format
    if spec.engine == Engine.torch and not accepts(Engine.torch, "precision.format", fmt):
        yield Violation(
            ("precision", "engine"),
            f"precision={fmt.value} needs Transformer Engine (the Megatron engine); the torch engine trains "
            "in BF16 on GPUs (FSDP2 mixed precision) and FP32 on CPU.",
            "use precision=bf16, or engine=megatron on a GPU cluster.",
        )


@rule("P004", Level.error, "NVFP4 primary weights cannot live in Megatron FSDP's buffers (MLM megatron_fsdp)")
def _nvfp4_fsdp(spec: RunSpec) -> Iterator[Violation]:
    # Megatron FSDP takes every TE QuantizedTensor for an FP8 one (megatron/core/distributed/fsdp/src/
    # megatron_fsdp/mixed_precision.py:63-66, 173-175) and views its buffer slice with the parameter's
    # logical shape (param_and_grad_buffer.py:2941, 2949-2955), while an NVFP4 weight's raw data is packed to
    # half the last dimension: copying it into the slice fails (param_and_grad_buffer.py:2953), and
    # fp8_set_raw_data asserts equal shapes (mixed_precision.py:238-240), when the model is wrapped,
    # on every sharding strategy. Bridge's own NVFP4 perf recipes turn fp4_param_gather
    # off because "FP4 primary weights fault during buffer init" (perf_recipes/nemotronh/common.py:
    # 102-105), a setting this project does not offer.
    if (
        spec.engine == Engine.megatron
        and spec.family is ParallelismFamily.fsdp
        and spec.precision.format is Precision.nvfp4
    ):
        yield Violation(
            ("precision", "parallelism"),
            "precision=nvfp4 keeps packed NVFP4 primary weights (fp4_param_gather), which Megatron FSDP stores as "
            "if they were FP8: wrapping the model fails on fp8_set_raw_data's shape assert "
            "(megatron_fsdp/mixed_precision.py:238-240).",
            "use precision=nvfp4 with parallelism=3d, or precision=fp8mx|fp8cs|bf16 with parallelism=fsdp.",
        )


@rule("P005", Level.error, "NVFP4 with TE userbuffer TP overlap (TE module/base.py)")
def _nvfp4_userbuffers(spec: RunSpec) -> Iterator[Violation]:
    # Bridge starts userbuffers with overlap on (training/initialize.py:236-237), in BF16 mode for FP4
    # (fp8 is None: initialize.py:363); each sequence-parallel column-parallel GEMM then fills its
    # all-gather buffer with the NVFP4 input quantizer (transformer_engine/pytorch/module/
    # layernorm_linear.py:292-306), and TE's fill_userbuffers_buffer_for_all_gather handles only
    # None, Float8 and MXFP8 quantizers: "Unsupported quantizer for Userbuffers" (module/base.py:754).
    if spec.engine == Engine.megatron and spec.precision.format is Precision.nvfp4 and spec.tp_comm_overlap:
        why = (
            "overlap.tp_comm=true"
            if spec.overlap.tp_comm
            else "the recipe's TP overlap (overlap.tp_comm=null)"
        )
        yield Violation(
            ("precision", "overlap.tp_comm", "tp"),
            f"precision=nvfp4 with {why} at TP={spec.layout.tp} + sequence parallelism: Transformer Engine's "
            "userbuffer all-gather accepts only FP8/MXFP8 quantizers and raises 'Unsupported quantizer for "
            "Userbuffers' at the first forward (transformer_engine/pytorch/module/base.py:754).",
            "add overlap.tp_comm=false (or overlap=none), or use precision=fp8mx|fp8cs|bf16 for TP overlap.",
        )
