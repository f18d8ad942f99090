"""Communication overlap, HSDP, offload, garbage collection and vision-graph rules (O...).

Each cites where Megatron Core or Bridge (paths under site-packages) rejects the setting, or
silently replaces it: a knob the engine would drop is rejected here, never ignored. A null knob
keeps the recipe's value and is judged only where the library forces a value whatever it is.
"""

from __future__ import annotations

from collections.abc import Iterator

from moe_vlm.config.precision import profile as precision_profile
from moe_vlm.config.schema import (
    Arch,
    CudaGraphImpl,
    Engine,
    OuterSharding,
    ParallelismFamily,
    Precision,
    RecomputeGranularity,
    ShardingStrategy,
)
from moe_vlm.config.sharding import dp_outer, segment_mismatch, segment_nodes
from moe_vlm.config.spec import RunSpec
from moe_vlm.knobs.support import TORCH_REJECTS_UNLESS_NULL, accepts
from moe_vlm.perf.memory.images import image_budget
from moe_vlm.perf.memory.megatron import vision_graph_length
from moe_vlm.rules.catalogue import Level, Violation, rule

# The vision encoder's blocks are dense: of MCore's graph modules only these select anything in them.
VISION_GRAPH_SCOPES = ("attn", "mlp")


def _megatron_fsdp(spec: RunSpec) -> bool:
    return spec.engine == Engine.megatron and spec.family is ParallelismFamily.fsdp


@rule("O001", Level.error, "Megatron FSDP overlaps what it shards, whatever the knob (MLM)")
def _fsdp_forces_overlap(spec: RunSpec) -> Iterator[Violation]:
    # megatron/core/distributed/fsdp/src/megatron_fsdp/megatron_fsdp.py:327-336: optim_grads and
    # optim_grads_params set overlap_grad_reduce (and assert it), optim_grads_params overlap_param_gather.
    if not _megatron_fsdp(spec):
        return
    strategy, ov = spec.parallelism.sharding_strategy, spec.overlap
    forced = []
    if ov.grad_reduce is False and strategy in (
        ShardingStrategy.optim_grads,
        ShardingStrategy.optim_grads_params,
    ):
        forced.append("overlap.grad_reduce")
    if ov.param_gather is False and strategy is ShardingStrategy.optim_grads_params:
        forced.append("overlap.param_gather")
    if forced:
        yield Violation(
            tuple(forced),
            f"Megatron FSDP with sharding_strategy={strategy.value} turns {' and '.join(forced)} back on "
            "(megatron_fsdp.py:327-336): false would not be what runs.",
            "leave them null or true, or use parallelism.sharding_strategy=optim / parallelism=3d to measure "
            "without overlap.",
        )


@rule("O002", Level.error, "DP bucket size needs gradient-reduce overlap on 3D (MLM DDP)")
def _bucket_needs_overlap(spec: RunSpec) -> Iterator[Violation]:
    size = spec.overlap.bucket_size
    if size is None:
        return
    if size <= 0:
        yield Violation(
            ("overlap.bucket_size",),
            f"bucket_size={size}: a bucket holds a positive number of parameters.",
            "use e.g. 134217728 (Bridge's 128 x 1024^2), or null.",
        )
    # Megatron DDP keeps no buckets without overlapped gradient reduction
    # (megatron/core/distributed/distributed_data_parallel.py:68-72); Megatron FSDP uses the size as
    # its communication unit either way (megatron_fsdp.py:433-434). The Qwen-VL recipes' null is off.
    elif spec.family is ParallelismFamily["3d"] and spec.overlap.grad_reduce is not True:
        yield Violation(
            ("overlap.bucket_size", "overlap.grad_reduce"),
            "Megatron DDP drops bucket_size unless gradient reduction is overlapped "
            "(distributed_data_parallel.py:68-72), and the Qwen-VL perf recipes leave it off.",
            "add overlap.grad_reduce=true (or overlap=dp), or leave overlap.bucket_size null.",
        )


@rule("O003", Level.error, "fp32 gradient reduction is a Megatron DDP setting, not Megatron FSDP's")
def _fp32_grads_fsdp(spec: RunSpec) -> Iterator[Violation]:
    # Megatron FSDP sizes its gradient buffer from megatron_fsdp_main_grads_dtype (None: the parameter
    # dtype), never from grad_reduce_in_fp32 (megatron/core/distributed/fsdp/mcore_fsdp_adapter.py:134-138,
    # fsdp/src/megatron_fsdp/param_and_grad_buffer.py:2306-2315); only Megatron DDP reads it
    # (megatron/core/distributed/param_and_grad_buffer.py:917).
    if _megatron_fsdp(spec) and spec.overlap.grad_reduce_in_fp32:
        yield Violation(
            ("overlap.grad_reduce_in_fp32", "parallelism"),
            "Megatron FSDP keeps and reduces gradients in the parameters' dtype whatever grad_reduce_in_fp32 says "
            "(mcore_fsdp_adapter.py:134-138): the run would reduce in bf16.",
            "use parallelism=3d for fp32 gradient reduction, or leave overlap.grad_reduce_in_fp32 null.",
        )


@rule("O004", Level.error, "TP communication overlap needs TP >= 2 and sequence parallelism (MB)")
def _tp_comm_overlap(spec: RunSpec) -> Iterator[Violation]:
    # megatron/bridge/training/comm_overlap.py:442-451 turns it off with a log line otherwise.
    if spec.engine != Engine.megatron or not spec.overlap.tp_comm:
        return
    missing = [
        need
        for need, met in (("TP >= 2", spec.layout.tp >= 2), ("sequence parallelism", spec.sequence_parallel))
        if not met
    ]
    if missing:
        yield Violation(
            ("overlap.tp_comm", "tp"),
            f"TP communication overlap needs {' and '.join(missing)}; Bridge silently turns it off otherwise "
            "(training/comm_overlap.py:442-451).",
            "use parallelism=3d tp=2 (or more) with parallelism.sequence_parallel=true, or overlap.tp_comm=null.",
        )


@rule("O005", Level.error, "HSDP replicas divide the data-parallel and expert data-parallel sizes (MLM)")
def _hsdp_divides(spec: RunSpec) -> Iterator[Violation]:
    lay, knob = spec.layout, spec.parallelism.dp_outer
    if knob < 0:
        yield Violation(
            ("parallelism.dp_outer",), f"dp_outer={knob} is negative.", "use 1, 0 (derive) or more."
        )
        return
    outer = dp_outer(spec)
    # megatron/core/parallel_state.py:922-926 (DP x CP) and :1447-1450 (expert DP) assert.
    sizes = {"DP x CP": lay.dp * lay.cp, "expert DP": lay.expert_dp}
    bad = [f"{name} = {size}" for name, size in sizes.items() if size % outer]
    if outer > 1 and bad:
        yield Violation(
            ("parallelism.dp_outer",),
            f"dp_outer={outer} does not divide {' and '.join(bad)} (Megatron asserts it: parallel_state.py:"
            "922-926, 1447-1450).",
            "use a divisor of both, or parallelism.dp_outer=0 (one replica per NVLink-domain segment).",
        )


@rule("O006", Level.error, "outer-DP optimizer sharding needs HSDP over fully sharded FSDP (MLM)")
def _outer_sharding(spec: RunSpec) -> Iterator[Violation]:
    if spec.parallelism.dp_outer_sharding is OuterSharding.no_shard:
        return
    why = []
    if spec.family is not ParallelismFamily.fsdp:
        why.append("it is a Megatron FSDP setting (3D's distributed optimizer never reads it)")
    elif spec.parallelism.sharding_strategy is not ShardingStrategy.optim_grads_params:
        # megatron/core/distributed/fsdp/src/megatron_fsdp/param_and_grad_buffer.py:2491-2506 raises.
        why.append(
            "Megatron FSDP raises NotImplementedError below optim_grads_params (param_and_grad_buffer.py:2491-2506)"
        )
    if dp_outer(spec) <= 1:
        # mcore_fsdp_adapter.py:342: HSDP only with num_distributed_optimizer_instances > 1.
        why.append(
            "without HSDP (dp_outer > 1) there is no outer group to shard over (mcore_fsdp_adapter.py:342)"
        )
    if why:
        yield Violation(
            ("parallelism.dp_outer_sharding",),
            f"dp_outer_sharding=optim: {'; '.join(why)}.",
            "use parallelism=fsdp with parallelism.dp_outer=0 (one replica per NVLink-domain segment) on a "
            "multi-domain job, or "
            "parallelism.dp_outer_sharding=no_shard.",
        )


@rule("O007", Level.warning, "the FSDP sharding group fills one NVLink-domain segment")
def _hsdp_segment(spec: RunSpec) -> Iterator[Violation]:
    # The launcher's segment=auto (the GB200/GB300 presets) keeps each block of nodes on one NVLink
    # domain (moe_vlm/launch/slurm.segment_nodes); an explicit segment is checked when launching.
    cluster, lay = spec.cluster, spec.layout
    if spec.engine != Engine.megatron or not cluster.is_gpu_cluster or min(lay.nodes, lay.ranks_per_node) < 1:
        return  # C001 reports the sizes
    problem = segment_mismatch(spec, "auto")
    if problem:
        message, _, fix = problem.partition(" Fix: ")
        yield Violation(("parallelism.dp_outer",), message, f"{fix}.")
    multi_node_domain = cluster.nvlink_domain_gpus > cluster.gpus_per_node
    segments = lay.nodes // max(segment_nodes(spec), 1)
    if spec.family is ParallelismFamily.fsdp and dp_outer(spec) == 1 and multi_node_domain and segments > 1:
        yield Violation(
            ("parallelism.dp_outer", "parallelism"),
            f"Megatron FSDP shards over all {lay.world_size} GPUs, {segments} NVLink-domain segments: every "
            "parameter all-gather and gradient reduce-scatter crosses the scale-out network.",
            "set parallelism.dp_outer=0 (HSDP: FSDP inside each segment, replicas across).",
        )


@rule("O008", Level.error, "activation offload: PP = 1, no recompute, no TE graphs, fewer layers (MLM)")
def _activation_offload(spec: RunSpec) -> Iterator[Violation]:
    layers = spec.offload.activation_layers
    if layers == 0:
        return
    total, problems = spec.model.num_layers, []
    # megatron/core/transformer/transformer_config.py:1707-1722 and :2467-2468 (ValueError each).
    if not 0 < layers < total:
        problems.append(
            f"activation_layers must be in [1, {total - 1}] ({spec.model.name} has {total} layers)"
        )
    if spec.layout.pp > 1:
        problems.append("pipeline parallelism is not supported with it")
    if spec.recompute.granularity is not RecomputeGranularity.none:
        problems.append("it does not work with activation recomputation")
    if spec.cuda_graph.impl in (CudaGraphImpl.transformer_engine, CudaGraphImpl.local):
        problems.append("per-layer CUDA graphs are not supported with it")
    if problems:
        yield Violation(
            ("offload.activation_layers",),
            f"CPU activation offload: {'; '.join(problems)} (Megatron Core: transformer_config.py:1707-1722, "
            "2467-2468).",
            "offload.activation_layers=0, or pp=1 recompute=none cuda_graph=none with fewer layers than the model.",
        )


@rule("O009", Level.error, "the optimizer offload fraction is in [0, 1]")
def _optimizer_fraction(spec: RunSpec) -> Iterator[Violation]:
    fraction = spec.offload.optimizer_fraction
    # HybridDeviceOptimizer offloads parameters while their numel stays under fraction x the total
    # (megatron/core/optimizer/cpu_offloading/hybrid_optimizer.py:251-275): past 1 is 1, below 0 is 0.
    if not 0.0 <= fraction <= 1.0:
        yield Violation(
            ("offload.optimizer_fraction",),
            f"optimizer_fraction={fraction:g} is the share of the optimizer state on the CPU.",
            "use a value in (0, 1] (1 = the whole optimizer on the CPU), or 0 for none.",
        )


@rule(
    "O010", Level.error, "optimizer CPU offload runs only on Megatron DDP's distributed optimizer (MLM, MB)"
)
def _fsdp_optimizer_offload(spec: RunSpec) -> Iterator[Violation]:
    # MCore builds the HybridDeviceOptimizer over the model's parameters (megatron/core/optimizer/
    # __init__.py:502-543) and rebuilds it over the fp32 main-weight shards only for Megatron DDP
    # (distrib_optimizer.py:778-781); with Megatron FSDP the distributed optimizer returns before that
    # (distrib_optimizer.py:704-706), leaving the offloading optimizer on FSDP's own sharded parameters.
    # Bridge's offload fix-ups walk Megatron DDP's shards only (training/optim.py:244-323, setup.py:
    # 414-420). Nothing upstream runs it, and no CPU check can: refused until a GPU run shows it works.
    if _megatron_fsdp(spec) and spec.offload.optimizer_fraction > 0:
        yield Violation(
            ("offload.optimizer_fraction", "parallelism"),
            "optimizer CPU offload (HybridDeviceOptimizer) is rebuilt over main-weight shards only by Megatron "
            "DDP's distributed optimizer (distrib_optimizer.py:778-781); with Megatron FSDP it returns before "
            "that (:704-706) and no upstream path runs the combination.",
            "use parallelism=3d for offload=optimizer, or offload=none with parallelism=fsdp.",
        )


@rule("O011", Level.error, "manual GC interval is non-negative (MB train loop asserts)")
def _gc_interval(spec: RunSpec) -> Iterator[Violation]:
    interval = spec.gc.interval
    # megatron/bridge/training/train.py:208-213 asserts it; train.py:1106-1108 never collects at 0.
    if interval is not None and interval < 0:
        yield Violation(
            ("gc.interval",),
            f"gc.interval={interval}: Bridge asserts a non-negative interval (training/train.py:208-213).",
            "use 0 (never collect during training) or a step count.",
        )
    if interval is not None and spec.gc.manual is False:
        yield Violation(
            ("gc.interval", "gc.manual"),
            "gc.interval applies to manual collection only; with gc.manual=false Python collects on its own.",
            "drop gc.interval, or gc=manual.",
        )


@rule("O012", Level.error, "vision-encoder CUDA graphs: Qwen3-VL provider, ViT scopes, long enough (MB)")
def _vision_graphs(spec: RunSpec) -> Iterator[Violation]:
    graph = spec.cuda_graph
    if not graph.vision:
        extras = [
            key
            for key, value in (
                ("cuda_graph.vision_scope", graph.vision_scope),
                ("cuda_graph.vision_max_seq_length", graph.vision_max_seq_length),
            )
            if value
        ]
        if extras:
            yield Violation(
                tuple(extras),
                f"{', '.join(extras)} only shape vision-encoder CUDA graphs, which are off.",
                "add cuda_graph.vision=true, or drop them.",
            )
        if graph.vision is None or spec.model.arch is not Arch.qwen3_5_moe:
            return
    if spec.model.arch is Arch.qwen3_5_moe:
        # Only the Qwen3-VL-MoE provider declares vision_cuda_graph_impl/_scope/max_vision_cuda_graph_seq_length
        # (megatron/bridge/models/qwen_vl/qwen3_vl_provider.py:294-300); the Qwen3.5 provider does not.
        yield Violation(
            ("cuda_graph.vision", "model"),
            f"{spec.model.name}'s Bridge provider (Qwen3.5-VL) has no vision-encoder CUDA graph settings "
            "(only qwen3_vl_provider.py:294-300 declares them).",
            "leave cuda_graph.vision null with Qwen3.5 models.",
        )
        return
    unknown = [s for s in graph.vision_scope if s not in VISION_GRAPH_SCOPES]
    if unknown:
        yield Violation(
            ("cuda_graph.vision_scope",),
            f"vision_scope {unknown}: the vision encoder's blocks are dense attention + MLP; of Megatron's graph "
            f"modules only {list(VISION_GRAPH_SCOPES)} capture anything there.",
            f"use a subset of {list(VISION_GRAPH_SCOPES)}, or [] for whole blocks.",
        )
    budget, length = image_budget(spec).patches, vision_graph_length(spec)
    if budget > length:
        # Bridge pads the vision sequence to this length and raises past it
        # (models/qwen_vl/modelling_qwen3_vl/vision_model.py:55-61, 290-294).
        yield Violation(
            ("cuda_graph.vision_max_seq_length",),
            f"a micro-batch can carry {budget} ViT patches, more than the {length} the vision graph is captured "
            "for (Bridge raises: vision_model.py:55-61).",
            f"set cuda_graph.vision_max_seq_length={budget} (or more), or fewer/smaller images per micro-batch.",
        )
    if _megatron_fsdp(spec) and spec.parallelism.sharding_strategy is not ShardingStrategy.no_shard:
        # The vision helper captures vision_model.decoder.layers with TE (megatron/core/transformer/
        # cuda_graphs.py:3086-3089), TransformerLayers that Megatron FSDP hooks (rule F005's citations).
        yield Violation(
            ("cuda_graph.vision", "parallelism"),
            "Megatron FSDP keeps forward hooks on the vision encoder's TransformerLayers too, and Transformer Engine "
            "refuses to capture a hooked module (transformer_engine/pytorch/graph.py:386-400).",
            "use parallelism=3d for vision CUDA graphs, or cuda_graph.vision=null.",
        )


@rule(
    "O014",
    Level.error,
    "optimizer CPU offload with FP8 parameter gather needs delayed scaling (MLM arguments)",
)
def _offload_fp8_param_gather(spec: RunSpec) -> Iterator[Violation]:
    # Megatron's argument validation refuses it (megatron/training/arguments.py:1808-1811): the
    # HybridDeviceOptimizer takes the precision-aware optimizer's path (arguments.py:1804-1807), which
    # casts FP8 primary weights itself only for delayed scaling (optimizer_config.py:404-410). Bridge's
    # fp8cs and fp8mx recipes gather FP8 parameters with current / MXFP8 scaling
    # (training/mixed_precision.py:255-266, 285-303), and Bridge never runs Megatron's validation.
    fmt = spec.precision.format
    if (
        spec.engine == Engine.megatron
        and fmt in (Precision.fp8cs, Precision.fp8mx)
        and spec.offload.optimizer_fraction > 0
    ):
        yield Violation(
            ("offload.optimizer_fraction", "precision"),
            f"optimizer CPU offload with precision={fmt.value} ({precision_profile(fmt).bridge_recipe}: FP8 parameter "
            "gather, non-delayed scaling): Megatron refuses it ('When --fp8-param-gather is enabled, the optimizer "
            "cpu offload must be used in conjunction with --fp8-recipe delayed', megatron/training/arguments.py:1808-1811).",
            "use precision=bf16 with offload=optimizer, or offload=none with FP8.",
        )


def grad_reduce_overlapped(spec: RunSpec) -> bool:
    """Whether DP gradient reduction is overlapped in the run: Megatron FSDP forces it where it shards
    gradients (O001); otherwise the knob, or the recipe's when null (every Qwen-VL perf recipe: off,
    tests/megatron/test_runtime_refusals.py reads it after Bridge's runtime update)."""
    if _megatron_fsdp(spec) and spec.parallelism.sharding_strategy in (
        ShardingStrategy.optim_grads,
        ShardingStrategy.optim_grads_params,
    ):
        return True
    return bool(spec.overlap.grad_reduce)


@rule("O015", Level.error, "parameter-gather overlap needs gradient-reduce overlap (MLM arguments)")
def _param_gather_without_grad_reduce(spec: RunSpec) -> Iterator[Violation]:
    # Megatron's argument validation: 'Must use --overlap-param-gather with --overlap-grad-reduce'
    # (megatron/training/arguments.py:990-995). Bridge copies both into ddp and optimizer without the
    # check (training/comm_overlap.py:604-643, training/config.py:1969-1981).
    if spec.engine == Engine.megatron and spec.overlap.param_gather and not grad_reduce_overlapped(spec):
        yield Violation(
            ("overlap.param_gather", "overlap.grad_reduce"),
            "overlap.param_gather=true without gradient-reduce overlap: Megatron refuses it ('Must use "
            "--overlap-param-gather with --overlap-grad-reduce', megatron/training/arguments.py:994-995).",
            "add overlap.grad_reduce=true (overlap=dp sets both), or overlap.param_gather=false.",
        )


@rule(
    "O016",
    Level.error,
    "vision-encoder CUDA graphs change the Qwen3-VL ViT (MLM cuda_graphs, MB vision_model)",
)
def _vision_graphs_change_the_vit(spec: RunSpec) -> Iterator[Violation]:
    # In graph mode the vision model drops its per-image attention metadata: packed_seq_params=None with
    # at most a padding mask (Bridge qwen_vl/modelling_qwen3_vl/vision_model.py:95-106, 297-303, 346-353),
    # and the ViT attention is built no_mask (megatron/core/models/vision/vit_layer_specs.py:47): every
    # image of a micro-batch attends to every other. Where the graph captures attention, MCore's vision
    # helper captures each block with hidden_states and a causal mask only (cuda_graphs.py:3182-3197,
    # transformer_layer.py:1101-1122), and TE's replay feeds only the captured keyword arguments
    # (transformer_engine/pytorch/graph.py:1189-1202): the 2D rotary embeddings are dropped (G009's
    # reasoning for the decoder). It also captures num_microbatches x depth graphs, each with its own
    # L x hidden input and L x L mask (cuda_graphs.py:3182-3197; Bridge passes get_num_microbatches(),
    # training/train.py:293-302). It would train, and time, a different encoder.
    graph = spec.cuda_graph
    if spec.engine != Engine.megatron or not graph.vision or spec.model.arch is not Arch.qwen3_vl_moe:
        return
    attention = not graph.vision_scope or "attn" in graph.vision_scope
    rope = " and the captured attention runs without the ViT's 2D rotary embeddings" if attention else ""
    yield Violation(
        ("cuda_graph.vision",),
        "vision-encoder CUDA graphs run the ViT without its per-image attention mask (packed_seq_params=None, "
        f"no_mask attention: images in a micro-batch attend to each other and to padding){rope} "
        "(Bridge vision_model.py:95-106, MCore cuda_graphs.py:3182-3197).",
        "leave cuda_graph.vision null; decoder graphs (cuda_graph=te_moe with parallelism=3d) are unaffected.",
    )


_TORCH_KNOBS = (
    *(k for k in TORCH_REJECTS_UNLESS_NULL if k.startswith("overlap.")),
    "overlap.grad_reduce_in_fp32",
    "parallelism.dp_outer",
    "parallelism.dp_outer_sharding",
    "offload.activation_layers",
    "offload.optimizer_fraction",
    "cuda_graph.vision",
    "gc.manual",
)


@rule(
    "O013", Level.error, "the torch engine has no Megatron overlap, HSDP, offload, vision graphs or manual GC"
)
def _torch_overlap(spec: RunSpec) -> Iterator[Violation]:
    if spec.engine != Engine.torch:
        return
    groups = {"overlap": spec.overlap, "parallelism": spec.parallelism, "offload": spec.offload}
    groups |= {"cuda_graph": spec.cuda_graph, "gc": spec.gc}
    set_here = [
        knob
        for knob in _TORCH_KNOBS
        if not accepts(Engine.torch, knob, getattr(groups[knob.split(".")[0]], knob.split(".")[1]))
    ]
    if set_here:
        yield Violation(
            (*set_here, "engine"),
            f"Megatron settings ({', '.join(set_here)}): the torch engine runs FSDP2 over the whole job with "
            "its own overlap, everything on the device and Python's own garbage collection.",
            "leave them at their defaults (overlap=recipe offload=none gc=recipe, parallelism.dp_outer=1), "
            "or engine=megatron.",
        )
