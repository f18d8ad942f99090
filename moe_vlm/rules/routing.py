"""MoE routing and kernel-fusion rules (X...): the router group's capacity, dtype and aux-loss
knobs, and the fusion group, against what Megatron Core accepts (paths under site-packages).

A null knob keeps the recipe's value (every Qwen-VL recipe: fp32 router, aux loss 1e-3, dropless,
all fusions on), so these rules judge values a user set, never the recipe's.
"""

from __future__ import annotations

from collections.abc import Iterator

from moe_vlm.config.schema import (
    CrossEntropyFusion,
    CudaGraphImpl,
    Engine,
    FlexBackend,
    RouterDtype,
    TokenDispatcher,
)
from moe_vlm.config.spec import RunSpec
from moe_vlm.knobs.support import TORCH_REJECTS_UNLESS_NULL, accepts
from moe_vlm.rules.catalogue import Level, Violation, rule

# MCore warns from this many experts when the router runs in the model dtype
# (megatron/core/transformer/transformer_config.py:2795-2803).
ROUTER_FP32_EXPERTS = 32


def _capacity(spec: RunSpec) -> float | None:
    return spec.router.capacity_factor


def _drop_and_pad(spec: RunSpec) -> bool:
    return _capacity(spec) is not None and bool(spec.router.pad_to_capacity)


@rule("X001", Level.error, "padding to capacity needs a capacity factor (MLM TransformerConfig)")
def _pad_needs_capacity(spec: RunSpec) -> Iterator[Violation]:
    # megatron/core/transformer/transformer_config.py:1686-1690 raises ValueError.
    if spec.router.pad_to_capacity and _capacity(spec) is None:
        yield Violation(
            ("router.pad_to_capacity", "router.capacity_factor"),
            "pad_to_capacity pads each expert's input to its capacity, and there is none: routing is dropless "
            "(Megatron Core rejects it: transformer_config.py:1686-1690).",
            "set router.capacity_factor (e.g. 1.0, or router=drop_and_pad), or router.pad_to_capacity=null.",
        )


@rule("X002", Level.error, "capacity factor and aux-loss coefficient are positive (MLM router)")
def _positive_router_values(spec: RunSpec) -> Iterator[Violation]:
    capacity, coeff = _capacity(spec), spec.router.aux_loss_coeff
    if capacity is not None and capacity <= 0:
        # A negative factor becomes None, dropless (transformer_config.py:1660-1662); 0 gives every
        # expert capacity ceil(0) = 0 tokens (moe/moe_utils.py:256): everything is dropped.
        yield Violation(
            ("router.capacity_factor",),
            f"capacity_factor={capacity:g}: Megatron Core turns a negative factor into dropless routing "
            "(transformer_config.py:1660-1662) and 0 drops every token (moe_utils.py:256).",
            "use a factor > 0 (1.0 = each expert's balanced share), or null for dropless routing.",
        )
    if coeff is not None and coeff < 0:
        # The router adds the aux loss only for a coefficient > 0 (moe/router.py:400-405).
        yield Violation(
            ("router.aux_loss_coeff",),
            f"aux_loss_coeff={coeff:g}: the router applies the load-balancing loss only for a coefficient "
            "> 0 (moe/router.py:400-405), so a negative one silently means none.",
            "use 0 for no aux loss, or a positive weight (the recipes: 1e-3).",
        )


@rule("X003", Level.error, "DeepEP cannot pad to capacity (MLM TransformerConfig)")
def _deepep_pad(spec: RunSpec) -> Iterator[Violation]:
    # megatron/core/transformer/transformer_config.py:1600-1607 raises ValueError.
    if spec.dispatcher.backend is FlexBackend.deepep and spec.router.pad_to_capacity:
        yield Violation(
            ("router.pad_to_capacity", "dispatcher"),
            "the flex dispatcher with the DeepEP backend does not support moe_pad_expert_input_to_capacity "
            "(transformer_config.py:1600-1607).",
            "use dispatcher=hybridep or alltoall for drop-and-pad, or router.pad_to_capacity=null.",
        )


@rule("X004", Level.error, "alltoall token dropping syncs in moe_preprocess: no graph (MLM)")
def _dropping_preprocess_graph(spec: RunSpec) -> Iterator[Violation]:
    # megatron/core/transformer/transformer_config.py:2503-2518: without drop-and-pad, the alltoall
    # dispatcher with a capacity factor copies device-to-host in its preprocess step.
    graphs = spec.cuda_graph.impl in (CudaGraphImpl.transformer_engine, CudaGraphImpl.local)
    if (
        graphs
        and "moe_preprocess" in spec.cuda_graph.scope
        and spec.dispatcher.token_dispatcher is TokenDispatcher.alltoall
        and _capacity(spec) is not None
        and not _drop_and_pad(spec)
    ):
        yield Violation(
            ("cuda_graph.scope", "router.capacity_factor"),
            "the alltoall dispatcher drops tokens with device-to-host syncs in its preprocess step, which a "
            "moe_preprocess CUDA graph cannot capture (transformer_config.py:2512-2518).",
            "add router.pad_to_capacity=true (drop-and-pad: static shapes), or drop moe_preprocess from "
            "cuda_graph.scope.",
        )


@rule("X005", Level.warning, "router in the model dtype with many experts (MLM warns)")
def _router_dtype(spec: RunSpec) -> Iterator[Violation]:
    if spec.router.dtype is RouterDtype.bf16 and spec.model.num_experts >= ROUTER_FP32_EXPERTS:
        yield Violation(
            ("router.dtype",),
            f"{spec.model.num_experts} experts routed in bf16: Megatron Core warns that from "
            f"{ROUTER_FP32_EXPERTS} experts the router wants fp32 for numerical stability "
            "(transformer_config.py:2795-2803); the perf recipes route in fp32.",
            "use router.dtype=fp32 (or null: the recipe's), unless measuring the bf16 router on purpose.",
        )


@rule("X006", Level.warning, "TE fused cross entropy has known stability issues (MLM warns)")
def _te_cross_entropy(spec: RunSpec) -> Iterator[Violation]:
    if spec.fusion.cross_entropy is CrossEntropyFusion.te:
        yield Violation(
            ("fusion.cross_entropy",),
            "Megatron Core warns that Transformer Engine's fused cross entropy has known stability issues and "
            "that Megatron-LM rejects it by default (model_parallel_config.py:536-543); the perf recipes use it "
            "for throughput.",
            "use fusion.cross_entropy=native for runs whose loss matters.",
        )


@rule("X007", Level.warning, "token dropping: the experts do less work than the FLOPs count")
def _dropping_changes_work(spec: RunSpec) -> Iterator[Violation]:
    capacity = _capacity(spec)
    if capacity is None:
        return
    how = (
        f"pads every expert to {capacity:g}x its balanced share"
        if _drop_and_pad(spec)
        else f"drops tokens past {capacity:g}x each expert's balanced share"
    )
    yield Violation(
        ("router.capacity_factor",),
        f"router.capacity_factor={capacity:g} {how}: the expert GEMMs process a different token count than "
        "the model FLOPs (top-k per token, moe_vlm/perf/flops.py) assume, so MFU is not comparable with dropless runs.",
        "compare only runs with the same capacity factor, or use router.capacity_factor=null (dropless).",
    )


@rule("X008", Level.error, "the torch engine has Megatron's fusion and router settings only at their default")
def _torch_routing(spec: RunSpec) -> Iterator[Violation]:
    if spec.engine != Engine.torch:
        return
    groups = {"fusion": spec.fusion, "router": spec.router}
    names = [knob for knob in TORCH_REJECTS_UNLESS_NULL if knob.split(".")[0] in groups]
    set_here = [
        knob
        for knob in names
        if not accepts(Engine.torch, knob, getattr(groups[knob.split(".")[0]], knob.split(".")[1]))
    ]
    if set_here:
        yield Violation(
            (*set_here, "engine"),
            f"Megatron Core kernel and routing settings ({', '.join(set_here)}): the torch engine runs "
            "transformers' own router, MLPs and loss.",
            "leave them null (fusion=recipe; router=real), or engine=megatron.",
        )


def router_fusion_on(spec: RunSpec) -> bool:
    """fusion.moe_router_fusion, or the recipe's when null: on in every Qwen-VL perf recipe
    (perf_recipes/qwen_vl/<gpu>/qwen3_vl.py `cfg.model.moe_router_fusion = True`, qwen_vl/common.py:57;
    tests/megatron/test_runtime_refusals.py holds it to each recipe the engine can pick)."""
    fused = spec.fusion.moe_router_fusion
    return True if fused is None else fused


@rule("X009", Level.error, "an fp64 router cannot use TE's fused router kernels (TE router.py)")
def _fp64_fused_router(spec: RunSpec) -> Iterator[Violation]:
    # MCore computes the router logits in float64 for moe_router_dtype='fp64' (moe/router.py:103-108) and,
    # with moe_router_fusion, routes through TE's fused top-k (moe/moe_utils.py:772-790), which raises
    # "Current TE does not support float64 router type." (transformer_engine/pytorch/router.py:345-346)
    # at the first forward. MCore's config checks never compare the two (transformer_config.py:790, 915).
    if spec.engine == Engine.megatron and spec.router.dtype is RouterDtype.fp64 and router_fusion_on(spec):
        why = (
            "fusion.moe_router_fusion=true" if spec.fusion.moe_router_fusion else "the recipe's router fusion"
        )
        yield Violation(
            ("router.dtype", "fusion.moe_router_fusion"),
            f"router.dtype=fp64 with {why}: Transformer Engine's fused router raises 'Current TE does not "
            "support float64 router type' at the first forward (transformer_engine/pytorch/router.py:345-346).",
            "use router.dtype=fp32 (the recipes'), or add fusion.moe_router_fusion=false for an fp64 router.",
        )
