"""Precision rules (P...): where each number format runs, and what is known about it upstream.

The formats' facts (Bridge recipe, Transformer Engine's capability range) are in moe_vlm/precision.py.
What Megatron Core and Bridge reject with FP8/FP4 beyond the GPU is out of reach of these knobs:
delayed scaling's limits (first/last BF16 layers, moe_act/layernorm recompute:
megatron/core/transformer/transformer_config.py:1400-1403, :1821-1826) are not a recipe offered
here; HybridEP's FP8 dispatch (megatron/core/transformer/moe/fused_a2a.py:326) is D004's.
"""

from __future__ import annotations

from collections.abc import Iterator

from moe_vlm.engines.support import accepts
from moe_vlm.precision import capability_range, profile, quantized, runs_on
from moe_vlm.rules.catalogue import Level, Violation, rule
from moe_vlm.schema import Engine, Precision
from moe_vlm.spec import RunSpec


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
