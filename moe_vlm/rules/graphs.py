"""Cuda graphs rules (G...)."""

from __future__ import annotations

from collections.abc import Iterator

from moe_vlm.config.arch import profile
from moe_vlm.config.schema import (
    CudaGraphImpl,
    Engine,
    RecomputeGranularity,
    TokenDispatcher,
)
from moe_vlm.config.spec import RunSpec
from moe_vlm.rules.catalogue import (
    CUDA_GRAPH_SCOPES,
    Level,
    Violation,
    _uses_graphs,
    rule,
)


@rule("G001", Level.error, "graph scopes are known names")
def _graph_scope_names(spec: RunSpec) -> Iterator[Violation]:
    unknown = [s for s in spec.cuda_graph.scope if s not in CUDA_GRAPH_SCOPES]
    if unknown:
        yield Violation(
            ("cuda_graph.scope",),
            f"unknown CUDA-graph scope {unknown}; allowed: {list(CUDA_GRAPH_SCOPES)}.",
            "fix the scope names (empty list = whole layer).",
        )


@rule("G002", Level.error, "local graph impl only for full-iteration graphs (MB utils/cuda_graph)")
def _graph_local(spec: RunSpec) -> Iterator[Violation]:
    if spec.cuda_graph.impl is CudaGraphImpl.local:
        yield Violation(
            ("cuda_graph.impl",),
            "cuda_graph_impl=local is only supported for full-iteration graphs.",
            "use cuda_graph=full_iteration or cuda_graph=te_moe.",
        )


@rule("G003", Level.error, "moe and moe_router scopes are mutually exclusive (MLM)")
def _graph_moe_router(spec: RunSpec) -> Iterator[Violation]:
    scope = spec.cuda_graph.scope
    if "moe" in scope and "moe_router" in scope:
        yield Violation(
            ("cuda_graph.scope",),
            "CUDA-graph scopes 'moe' and 'moe_router' cannot be combined.",
            "keep moe_router (+ moe_preprocess) for dropless MoE, e.g. cuda_graph=te_moe.",
        )


@rule("G004", Level.error, "moe_preprocess scope needs moe_router (MLM)")
def _graph_preprocess(spec: RunSpec) -> Iterator[Violation]:
    scope = spec.cuda_graph.scope
    if "moe_preprocess" in scope and "moe_router" not in scope:
        yield Violation(
            ("cuda_graph.scope",),
            "CUDA-graph scope 'moe_preprocess' requires 'moe_router'.",
            "add moe_router to cuda_graph.scope.",
        )


@rule("G005", Level.error, "moe scope only for drop-and-pad MoE (MLM)")
def _graph_moe_scope(spec: RunSpec) -> Iterator[Violation]:
    # transformer_config.py:2504-2509: a capacity factor with padding to capacity (router=drop_and_pad).
    drop_and_pad = spec.router.capacity_factor is not None and bool(spec.router.pad_to_capacity)
    if "moe" in spec.cuda_graph.scope and not drop_and_pad:
        yield Violation(
            ("cuda_graph.scope",),
            f"scope 'moe' needs drop-and-pad routing; {spec.model.name} routes dropless.",
            "use moe_router + moe_preprocess (cuda_graph=te_moe), or router=drop_and_pad.",
        )


@rule("G006", Level.error, "mlp scope only for dense layers (MLM)")
def _graph_mlp_scope(spec: RunSpec) -> Iterator[Violation]:
    if "mlp" in spec.cuda_graph.scope and spec.model.num_dense_layers == 0:
        yield Violation(
            ("cuda_graph.scope",),
            f"scope 'mlp' only captures dense MLP layers; {spec.model.name} has none.",
            "drop mlp from cuda_graph.scope.",
        )


@rule("G007", Level.error, "full recompute only with full-iteration graphs (MLM)")
def _graph_full_recompute(spec: RunSpec) -> Iterator[Violation]:
    if (
        spec.recompute.granularity is RecomputeGranularity.full
        and _uses_graphs(spec)
        and spec.cuda_graph.impl is not CudaGraphImpl.full_iteration
    ):
        yield Violation(
            ("recompute", "cuda_graph"),
            "full recompute works with CUDA graphs only when the graph covers the full iteration.",
            "use recompute=selective with scoped graphs, or cuda_graph=full_iteration.",
        )


@rule("G008", Level.error, "moe recompute conflicts with a moe_router graph (MLM, TE impl)")
def _graph_moe_recompute(spec: RunSpec) -> Iterator[Violation]:
    if (
        spec.cuda_graph.impl is CudaGraphImpl.transformer_engine
        and "moe_router" in spec.cuda_graph.scope
        and spec.recompute.granularity is RecomputeGranularity.selective
        and "moe" in spec.recompute.modules
    ):
        yield Violation(
            ("recompute.modules", "cuda_graph.scope"),
            "recomputing 'moe' cannot be combined with a TE moe_router CUDA graph.",
            "drop moe from recompute.modules (e.g. moe_act instead), or use cuda_graph=none.",
        )


@rule("G009", Level.error, "attn scope breaks Qwen3-VL / Qwen3.5 graph capture (MLM cuda_graphs, TE graph)")
def _graph_attn_mrope(spec: RunSpec) -> Iterator[Violation]:
    # Megatron's TE capture hands rotary embeddings to attention only for position_embedding_type
    # 'rope' (megatron/core/transformer/cuda_graphs.py:2304-2317); both VL archs use 'mrope', so the
    # captured attention has none, and TE's replay drops the rotary_pos_emb passed later
    # (transformer_engine/pytorch/graph.py:1190-1205): attention would silently run without RoPE.
    graph = spec.cuda_graph
    te_graphs = graph.impl is CudaGraphImpl.transformer_engine
    # An empty scope captures the whole layer, attention included. (With impl=none the scope is
    # ignored: G011.)
    captures_attn = te_graphs and ("attn" in graph.scope or not graph.scope)
    if (
        captures_attn
        and not profile(spec.model.arch).graphs_capture_attention
        and spec.engine == Engine.megatron
    ):
        yield Violation(
            ("cuda_graph",),
            f"CUDA graphs that capture attention ('attn' or whole-layer scope) would run {spec.model.arch}'s "
            "mRoPE attention without rotary embeddings (Megatron's TE capture passes them only for 'rope'; "
            "Bridge's Qwen3-VL recipes force moe_router + moe_preprocess).",
            "use cuda_graph=te_moe.",
        )


@rule("G010", Level.error, "CUDA graphs need fixed sequence lengths (Qwen3-VL, packing)")
def _graph_variable_lengths(spec: RunSpec) -> Iterator[Violation]:
    # Both packings set variable_seq_lengths (our table, bridge_fields.py; Bridge with PP > 1, models/
    # transformer_config.py:188-189) and Qwen3VLModel asserts it off under language-model graphs
    # (models/qwen_vl/modelling_qwen3_vl/model.py:388-392).
    if _uses_graphs(spec) and spec.packed_micro_batches:
        yield Violation(
            ("data.packing", "cuda_graph"),
            "packed (variable-length) micro-batches disallow CUDA graphs: Qwen3VLModel requires "
            "variable_seq_lengths=False with graphs (modelling_qwen3_vl/model.py:388-392).",
            "set data.packing=none or cuda_graph=none.",
        )


@rule("G011", Level.error, "graph scope needs a graph impl")
def _graph_scope_without_impl(spec: RunSpec) -> Iterator[Violation]:
    if not _uses_graphs(spec) and spec.cuda_graph.scope:
        yield Violation(
            ("cuda_graph.scope",),
            "cuda_graph.scope is set but cuda_graph.impl=none, so it would be ignored.",
            "choose cuda_graph=te_moe (or another preset), or clear the scope.",
        )


@rule("G012", Level.error, "full-iteration graphs cannot capture the Qwen3-VL step (MLM, MB)")
def _graph_full_iteration_qwen3vl(spec: RunSpec) -> Iterator[Violation]:
    # FullCudaGraphWrapper captures the whole forward/backward (megatron/core/full_cuda_graph.py:
    # 226-233), but the Qwen3-VL step syncs with the host inside it
    # (megatron/bridge/models/qwen_vl/qwen3_vl_step.py:198 `.max().item()`; the vision model at
    # modelling_qwen3_vl/vision_model.py:191, 195, 372), which a capturing stream forbids. Had it
    # captured, replays skip Python (full_cuda_graph.py:241) and read the data before the forward
    # step (:203), so our counting forward step would record 0 tokens on every steady step.
    # Every model this engine builds goes through that step.
    if spec.engine == Engine.megatron and spec.cuda_graph.impl is CudaGraphImpl.full_iteration:
        yield Violation(
            ("cuda_graph",),
            "full-iteration CUDA graphs cannot be captured around the Qwen3-VL forward step (it reads "
            "sequence lengths and image grids back to the host), and replays would bypass the token count.",
            "use cuda_graph=te_moe with parallelism=3d, or cuda_graph=none.",
        )


@rule("G013", Level.error, "the moe scope cannot capture the allgather dispatcher's host syncs (MLM)")
def _graph_moe_allgather(spec: RunSpec) -> Iterator[Violation]:
    # The 'moe' scope captures the whole MoE layer, dispatch included (megatron/core/transformer/
    # transformer_layer.py:1255-1262); the allgather dispatcher's dispatch_postprocess copies the token
    # counts to the host (.cpu()) and reads their sum (.item()) on every call, drop-and-pad or not
    # (megatron/core/transformer/moe/token_dispatcher.py:317-325), which a capturing stream forbids.
    # MCore's config check for the scope (transformer_config.py:2505-2518) looks only at alltoall.
    if (
        spec.engine == Engine.megatron
        and spec.cuda_graph.impl in (CudaGraphImpl.transformer_engine, CudaGraphImpl.local)
        and "moe" in spec.cuda_graph.scope
        and spec.dispatcher.token_dispatcher is TokenDispatcher.allgather
    ):
        yield Violation(
            ("cuda_graph.scope", "dispatcher"),
            "CUDA-graph scope 'moe' captures the token dispatch, and the allgather dispatcher reads token counts "
            "back to the host in it (.cpu()/.item(), moe/token_dispatcher.py:317-325): capture fails.",
            "use dispatcher=alltoall with router=drop_and_pad for the moe scope, or cuda_graph=te_moe "
            "(moe_router + moe_preprocess).",
        )
