"""THE mapping from our knobs to Megatron Bridge ConfigContainer fields.

One table, read by three places: the dry-run plan prints it, the Megatron engine applies
it on top of the recipe, and the tests check it against real ConfigContainer objects.
A Bridge version bump that renames a field is one edit here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from moe_vlm.schema import CudaGraphImpl, DataKind, FlexBackend, RecomputeGranularity, RecomputeMethod
from moe_vlm.spec import RunSpec, hybridep_topology


@dataclass(frozen=True)
class FieldMap:
    knob: str  # our knob, as a user writes it
    field: str  # dotted path inside ConfigContainer
    value: Callable[[RunSpec], Any]
    why: str = ""  # set when the value is not a plain copy of the knob


@dataclass(frozen=True)
class BridgeOverride:
    knob: str
    field: str
    value: Any
    why: str


def _none_if_one(value: int) -> int | None:
    return None if value <= 1 else value


def _recompute_granularity(spec: RunSpec) -> str | None:
    g = spec.recompute.granularity
    return None if g is RecomputeGranularity.none else g.value


def _recompute_method(spec: RunSpec) -> str | None:
    m = spec.recompute.method
    return None if m is RecomputeMethod.none else m.value


def _graph_impl(spec: RunSpec) -> str:
    impl = spec.cuda_graph.impl
    # Bridge spells a full-iteration graph as the "local" implementation with full_iteration scope.
    return "local" if impl is CudaGraphImpl.full_iteration else impl.value


def _graph_scope(spec: RunSpec) -> list[str]:
    if spec.cuda_graph.impl is CudaGraphImpl.full_iteration:
        return ["full_iteration"]
    return list(spec.cuda_graph.scope)


def _dispatcher_type(spec: RunSpec) -> str:
    return spec.dispatcher.token_dispatcher.value


def _flex_backend(spec: RunSpec) -> str | None:
    b = spec.dispatcher.backend
    return None if b is FlexBackend.none else b.value


def _hybridep_env(spec: RunSpec) -> dict[str, str]:
    d = spec.dispatcher
    if d.backend is not FlexBackend.hybridep:
        return {}
    derived = hybridep_topology(spec)
    env = {
        "NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN": d.hybridep_ranks_per_nvlink_domain
        or derived["NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN"],
        "NVLINK_DOMAIN_SIZE": d.hybridep_nvlink_domain_size or derived["NVLINK_DOMAIN_SIZE"],
        "USE_MNNVL": int(d.hybridep_use_mnnvl) or derived["USE_MNNVL"],
    }
    if d.hybridep_tokens_per_chunk_combine:
        env["NUM_OF_TOKENS_PER_CHUNK_COMBINE_API"] = d.hybridep_tokens_per_chunk_combine
    return {key: str(value) for key, value in env.items()}


def _fsdp(spec: RunSpec) -> bool:
    return spec.family == "fsdp"


def _dataset_kind(spec: RunSpec) -> str:
    return {
        DataKind.mock: "MockVLMSFTDatasetConfig",
        DataKind.synthetic: "MockVLMSFTDatasetConfig",
        DataKind.real: "EnergonDatasetConfig",
    }[spec.data.kind]


def _num_images(spec: RunSpec) -> int | None:
    # Bridge's mock VLM dataset draws a fixed image count; mock means image-free.
    if spec.data.kind is DataKind.mock:
        return 0
    if spec.data.kind is DataKind.synthetic:
        return spec.data.max_images
    return None


def _image_size(spec: RunSpec) -> list[int] | None:
    if spec.data.kind is not DataKind.synthetic:
        return None
    side = (spec.data.min_long_side_px + spec.data.max_long_side_px) // 2
    return [side, side]


FIELD_MAP: tuple[FieldMap, ...] = (
    # Parallel layout.
    FieldMap("tp", "model.tensor_model_parallel_size", lambda s: s.layout.tp),
    FieldMap("pp", "model.pipeline_model_parallel_size", lambda s: s.layout.pp),
    FieldMap("vp", "model.virtual_pipeline_model_parallel_size", lambda s: _none_if_one(s.layout.vp), "1 -> None"),
    FieldMap("cp", "model.context_parallel_size", lambda s: s.layout.cp),
    FieldMap("ep", "model.expert_model_parallel_size", lambda s: s.layout.ep),
    FieldMap("etp", "model.expert_tensor_parallel_size", lambda s: s.layout.etp),
    FieldMap("parallelism.sequence_parallel", "model.sequence_parallel", lambda s: s.parallelism.sequence_parallel),
    FieldMap(
        "parallelism.first_stage_layers",
        "model.num_layers_in_first_pipeline_stage",
        lambda s: s.parallelism.first_stage_layers or None,
        "0 -> None (even split)",
    ),
    FieldMap(
        "parallelism.last_stage_layers",
        "model.num_layers_in_last_pipeline_stage",
        lambda s: s.parallelism.last_stage_layers or None,
        "0 -> None (even split)",
    ),
    # Megatron FSDP vs the distributed optimizer.
    FieldMap("parallelism", "ddp.use_megatron_fsdp", _fsdp),
    FieldMap("parallelism", "dist.use_megatron_fsdp", _fsdp),
    FieldMap("parallelism", "ddp.use_distributed_optimizer", lambda s: True, "FSDP forces it; 3D uses it"),
    FieldMap("parallelism", "optimizer.use_distributed_optimizer", lambda s: True, "FSDP forces it; 3D uses it"),
    FieldMap(
        "parallelism.sharding_strategy",
        "ddp.data_parallel_sharding_strategy",
        lambda s: s.parallelism.sharding_strategy.value if _fsdp(s) else "no_shard",
    ),
    FieldMap("parallelism.fsdp_version", "ddp.megatron_fsdp_version", lambda s: s.parallelism.fsdp_version),
    FieldMap("parallelism.fsdp_double_buffer", "ddp.fsdp_double_buffer", lambda s: s.parallelism.fsdp_double_buffer),
    FieldMap("parallelism.nccl_ub", "ddp.nccl_ub", lambda s: s.parallelism.nccl_ub),
    FieldMap(
        "parallelism",
        "checkpoint.ckpt_format",
        lambda s: "fsdp_dtensor" if _fsdp(s) else "torch_dist",
        "Megatron FSDP checkpoints must be fsdp_dtensor",
    ),
    FieldMap("parallelism", "model.init_model_with_meta_device", _fsdp, "what Bridge's --use_megatron_fsdp sets"),
    FieldMap("parallelism", "model.gradient_accumulation_fusion", lambda s: True, "as Bridge's perf scripts"),
    # MoE dispatcher.
    FieldMap("dispatcher", "model.moe_token_dispatcher_type", _dispatcher_type),
    FieldMap("dispatcher", "model.moe_flex_dispatcher_backend", _flex_backend),
    FieldMap(
        "dispatcher.num_sms",
        "model.moe_flex_dispatcher_num_sms",
        lambda s: s.dispatcher.num_sms or None,
        "0 -> engine default",
    ),
    FieldMap(
        "dispatcher",
        "model.moe_shared_expert_overlap",
        lambda s: False if s.dispatcher.backend is not FlexBackend.none else None,
        "flex backends turn it off (apply_flex_dispatcher_backend); None keeps the recipe's",
    ),
    FieldMap(
        "dispatcher.overlap_moe_expert_parallel_comm",
        "comm_overlap.overlap_moe_expert_parallel_comm",
        lambda s: s.dispatcher.overlap_moe_expert_parallel_comm,
    ),
    FieldMap("dispatcher", "env_vars", _hybridep_env, "HybridEP topology, derived from the cluster when 0"),
    # Recompute.
    FieldMap("recompute", "model.recompute_granularity", _recompute_granularity),
    FieldMap("recompute.method", "model.recompute_method", _recompute_method),
    FieldMap("recompute.num_layers", "model.recompute_num_layers", lambda s: s.recompute.num_layers or None),
    FieldMap(
        "recompute.modules",
        "model.recompute_modules",
        lambda s: list(s.recompute.modules) or None,
        "empty -> None (engine default core_attn is never inherited silently)",
    ),
    # CUDA graphs.
    FieldMap("cuda_graph", "model.cuda_graph_impl", _graph_impl),
    FieldMap("cuda_graph.scope", "model.cuda_graph_scope", _graph_scope),
    FieldMap("cuda_graph.warmup_steps", "model.cuda_graph_warmup_steps", lambda s: s.cuda_graph.warmup_steps),
    FieldMap(
        "cuda_graph",
        "model.use_te_rng_tracker",
        lambda s: s.cuda_graph.impl is not CudaGraphImpl.none,
        "a graph impl requires the TE RNG tracker",
    ),
    FieldMap(
        "cuda_graph",
        "rerun_state_machine.check_for_nan_in_loss",
        lambda s: s.cuda_graph.impl is not CudaGraphImpl.full_iteration,
        "full-iteration graphs require it off",
    ),
    # Freezing: always explicit, the MoE provider freezes language and vision by default.
    FieldMap("vision_freeze.language", "model.freeze_language_model", lambda s: s.freeze.language),
    FieldMap("vision_freeze.vision", "model.freeze_vision_model", lambda s: s.freeze.vision),
    FieldMap("vision_freeze.projector", "model.freeze_vision_projection", lambda s: s.freeze.projector),
    # Qwen3-VL model requirements.
    FieldMap(
        "cp",
        "model.calculate_per_token_loss",
        lambda s: s.layout.cp > 1 or None,
        "Qwen3-VL requires it with CP > 1; None keeps the recipe's",
    ),
    FieldMap("model", "model.apply_rope_fusion", lambda s: False, "Qwen3-VL requires it off"),
    FieldMap(
        "data.pack_sequences",
        "model.variable_seq_lengths",
        lambda s: s.data.pack_sequences,
        "CUDA graphs require fixed lengths",
    ),
    # Batch, sequence, schedule.
    FieldMap("mbs", "train.micro_batch_size", lambda s: s.mbs),
    FieldMap("gbs", "train.global_batch_size", lambda s: s.gbs),
    FieldMap("train_iters", "train.train_iters", lambda s: s.train_iters),
    FieldMap("seq_length", "model.seq_length", lambda s: s.seq_length),
    FieldMap("seq_length", "dataset.seq_length", lambda s: s.seq_length),
    FieldMap("seed", "rng.seed", lambda s: s.seed),
    FieldMap("lr", "optimizer.lr", lambda s: s.lr),
    # Data.
    FieldMap("data", "dataset", _dataset_kind, "dataset config class"),
    FieldMap("data", "dataset.num_images", _num_images, "mock is image-free"),
    FieldMap("data", "dataset.image_size", _image_size, "synthetic: mid-range long side"),
    FieldMap("data.path", "dataset.path", lambda s: s.data.path if s.data.kind is DataKind.real else None),
    FieldMap(
        "data.pack_sequences",
        "dataset.pad_to_max_length",
        lambda s: (not s.data.pack_sequences) or s.layout.pp > 1 or s.layout.ep > 1,
        "Bridge forces padding when PP > 1 or EP > 1",
    ),
    FieldMap("logger", "logger.log_interval", lambda s: 1, "per-step records"),
    FieldMap("logger", "logger.log_throughput", lambda s: True, "Bridge's own TFLOP/s kept beside ours"),
)


def bridge_overrides(spec: RunSpec) -> list[BridgeOverride]:
    """Every Bridge field this run sets, in table order. None values mean 'leave the recipe's'."""
    return [BridgeOverride(m.knob, m.field, m.value(spec), m.why) for m in FIELD_MAP]


@dataclass(frozen=True)
class Recipe:
    module: str
    function: str
    kind: str  # "perf" (benchmark recipe for this GPU) or "general"


_PERF_RECIPES: dict[tuple[str, str], Recipe] = {
    (model, cluster): Recipe(
        f"megatron.bridge.perf_recipes.qwen_vl.{cluster}.qwen3_vl",
        f"{model}_pretrain_{gpus}gpu_{cluster}_bf16_config",
        "perf",
    )
    for model, gpus in (("qwen3_vl_30b_a3b", 8), ("qwen3_vl_235b_a22b", 64))
    for cluster in ("gb200", "b200")
}

_GENERAL_RECIPES: dict[str, Recipe] = {
    "qwen3_vl_30b_a3b": Recipe(
        "megatron.bridge.recipes.qwen_vl.qwen3_vl", "qwen3_vl_30b_a3b_pretrain_mock_config", "general"
    ),
    "qwen3_vl_235b_a22b": Recipe(
        "megatron.bridge.recipes.qwen_vl.qwen3_vl", "qwen3_vl_235b_a22b_pretrain_mock_config", "general"
    ),
    "qwen35_vl_35b_a3b": Recipe(
        "megatron.bridge.recipes.qwen_vl.qwen35_vl", "qwen35_vl_35b_a3b_pretrain_mock_config", "general"
    ),
}


def select_recipe(spec: RunSpec) -> Recipe | None:
    """The Bridge recipe our overrides start from: the GPU's perf recipe where one exists."""
    key = (spec.model.name, spec.cluster.name)
    return _PERF_RECIPES.get(key) or _GENERAL_RECIPES.get(spec.model.name)
