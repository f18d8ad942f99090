"""THE mapping from our knobs to Megatron Bridge ConfigContainer fields.

One table, read by three places: the dry-run plan prints it, the Megatron engine applies
it on top of the recipe, and the tests check it against real ConfigContainer objects.
A Bridge version bump that renames a field is one edit here.

Checked against megatron-bridge 0.6.2 / megatron-core 0.19.2 (tests/megatron builds the real
ConfigContainer for every config option and reads each field back). A value of ``KEEP`` leaves
the recipe's value; ``None`` sets the field to None (Bridge's "off" / "engine default").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from moe_vlm.schema import CudaGraphImpl, DataKind, FlexBackend, RecomputeGranularity, RecomputeMethod
from moe_vlm.spec import RunSpec, hybridep_topology


class _Keep:
    """Sentinel: leave the recipe's value (printed as such by the plan)."""

    def __repr__(self) -> str:
        return "(recipe's)"


KEEP: Any = _Keep()

# HybridEP topology variables (Bridge's perf_recipes.environment.HYBRID_EP_ENV_NAMES): the engine
# replaces the recipe's set with ours, and drops them for other dispatchers.
HYBRID_EP_ENV_NAMES = (
    "NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN",
    "NUM_OF_TOKENS_PER_CHUNK_COMBINE_API",
    "NVLINK_DOMAIN_SIZE",
    "USE_MNNVL",
)


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


def effective_sequence_parallel(spec: RunSpec) -> bool:
    """Sequence parallelism as the engine will run it, said up front instead of changed behind
    the plan's back: Bridge's TransformerConfig.finalize turns it off when TP = 1, and
    Qwen3VLMoEModelProvider.finalize turns it on whenever TP > 1 (the Qwen3.5 provider does not)."""
    if spec.layout.tp <= 1:
        return False
    return spec.parallelism.sequence_parallel or spec.model.arch == "qwen3_vl_moe"


def _recompute_granularity(spec: RunSpec) -> str | None:
    g = spec.recompute.granularity
    return None if g is RecomputeGranularity.none else g.value


def _recompute_method(spec: RunSpec) -> str | None:
    m = spec.recompute.method
    return None if m is RecomputeMethod.none else m.value


def _graph_impl(spec: RunSpec) -> str:
    # MCore 0.19 has a first-class "full_iteration" implementation ("local" + scope
    # full_iteration is its deprecated spelling).
    return spec.cuda_graph.impl.value


def _graph_modules(spec: RunSpec) -> list[str]:
    # MCore asserts cuda_graph_modules is empty for full_iteration; empty = whole layer otherwise.
    if spec.cuda_graph.impl in (CudaGraphImpl.full_iteration, CudaGraphImpl.none):
        return []
    return list(spec.cuda_graph.scope)


def _graphs_on(spec: RunSpec) -> bool:
    return spec.cuda_graph.impl is not CudaGraphImpl.none


def _dispatcher_type(spec: RunSpec) -> str:
    return spec.dispatcher.token_dispatcher.value


def _flex_backend(spec: RunSpec) -> str | None:
    b = spec.dispatcher.backend
    return None if b is FlexBackend.none else b.value


def _hybridep_env(spec: RunSpec) -> dict[str, str]:
    """The HybridEP variables of cfg.env_vars; {} removes the recipe's for other dispatchers."""
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


def _num_images(spec: RunSpec) -> Any:
    # Bridge's mock VLM dataset draws a fixed image count; mock means image-free.
    if spec.data.kind is DataKind.mock:
        return 0
    if spec.data.kind is DataKind.synthetic:
        # Bridge's mock draws one fixed count: the mean of our range, rounded up.
        return (spec.data.min_images + spec.data.max_images + 1) // 2
    return KEEP  # EnergonDatasetConfig has no such field


def _image_size(spec: RunSpec) -> Any:
    if spec.data.kind is not DataKind.synthetic:
        return KEEP
    side = (spec.data.min_long_side_px + spec.data.max_long_side_px) // 2
    return (side, side)


def _real(spec: RunSpec) -> bool:
    return spec.data.kind is DataKind.real


def _if_real(value: Callable[[RunSpec], Any]) -> Callable[[RunSpec], Any]:
    return lambda s: value(s) if _real(s) else KEEP


def _processor_path(spec: RunSpec) -> str:
    # A local checkpoint directory given as model.hf_model_id is used as it is; a hub id resolves
    # from the local Hugging Face cache (the engine runs with HF_HUB_OFFLINE=1).
    return spec.model.hf_model_id


FIELD_MAP: tuple[FieldMap, ...] = (
    # Parallel layout.
    FieldMap("tp", "model.tensor_model_parallel_size", lambda s: s.layout.tp),
    FieldMap("pp", "model.pipeline_model_parallel_size", lambda s: s.layout.pp),
    FieldMap(
        "vp",
        "model.virtual_pipeline_model_parallel_size",
        lambda s: _none_if_one(s.layout.vp),
        "1 -> None",
    ),
    FieldMap("cp", "model.context_parallel_size", lambda s: s.layout.cp),
    FieldMap("ep", "model.expert_model_parallel_size", lambda s: s.layout.ep),
    FieldMap("etp", "model.expert_tensor_parallel_size", lambda s: s.layout.etp),
    FieldMap(
        "parallelism.sequence_parallel",
        "model.sequence_parallel",
        effective_sequence_parallel,
        "off when TP = 1 (Bridge); on when TP > 1 for Qwen3-VL-MoE (its provider)",
    ),
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
    FieldMap(
        "parallelism",
        "optimizer.use_distributed_optimizer",
        lambda s: True,
        "FSDP forces it; 3D uses it",
    ),
    FieldMap(
        "parallelism.sharding_strategy",
        "ddp.data_parallel_sharding_strategy",
        lambda s: s.parallelism.sharding_strategy.value if _fsdp(s) else "no_shard",
    ),
    FieldMap(
        "parallelism.fsdp_double_buffer",
        "ddp.fsdp_double_buffer",
        lambda s: s.parallelism.fsdp_double_buffer,
    ),
    FieldMap("parallelism.nccl_ub", "ddp.nccl_ub", lambda s: s.parallelism.nccl_ub),
    FieldMap(
        "parallelism",
        "checkpoint.ckpt_format",
        lambda s: "fsdp_dtensor" if _fsdp(s) else "torch_dist",
        "Megatron FSDP checkpoints must be fsdp_dtensor",
    ),
    FieldMap(
        "parallelism",
        "model.init_model_with_meta_device",
        _fsdp,
        "what Bridge's --use_megatron_fsdp sets",
    ),
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
        "dispatcher.num_sms",
        "model.moe_hybridep_num_sms",
        lambda s: None,
        "deprecated alias (GB200 perf recipes set 32) would override num_sms",
    ),
    FieldMap(
        "dispatcher.num_sms",
        "model.moe_deepep_num_sms",
        lambda s: None,
        "deprecated alias would override num_sms",
    ),
    FieldMap(
        "dispatcher",
        "model.moe_shared_expert_overlap",
        lambda s: False if s.dispatcher.backend is not FlexBackend.none else KEEP,
        "flex backends turn it off (apply_flex_dispatcher_backend)",
    ),
    FieldMap(
        "dispatcher.overlap_moe_expert_parallel_comm",
        "comm_overlap.overlap_moe_expert_parallel_comm",
        lambda s: s.dispatcher.overlap_moe_expert_parallel_comm,
    ),
    FieldMap(
        "dispatcher.overlap_moe_expert_parallel_comm",
        "comm_overlap.delay_wgrad_compute",
        lambda s: KEEP if s.dispatcher.overlap_moe_expert_parallel_comm else False,
        "needs the EP overlap (the H100 perf recipes turn both on)",
    ),
    FieldMap(
        "dispatcher",
        "env_vars",
        _hybridep_env,
        "replaces the recipe's HybridEP variables; derived from the cluster when 0",
    ),
    # Recompute.
    FieldMap("recompute", "model.recompute_granularity", _recompute_granularity),
    FieldMap("recompute.method", "model.recompute_method", _recompute_method),
    FieldMap("recompute.num_layers", "model.recompute_num_layers", lambda s: s.recompute.num_layers or None),
    FieldMap(
        "recompute.modules",
        "model.recompute_modules",
        lambda s: list(s.recompute.modules),
        "explicit list: MCore's None default would mean core_attn",
    ),
    # CUDA graphs.
    FieldMap("cuda_graph", "model.cuda_graph_impl", _graph_impl),
    FieldMap("cuda_graph.scope", "model.cuda_graph_modules", _graph_modules, "empty = whole layer"),
    FieldMap(
        "cuda_graph.scope",
        "model.cuda_graph_scope",
        lambda s: None,
        "deprecated alias of cuda_graph_modules; MCore rejects both set",
    ),
    FieldMap("cuda_graph.warmup_steps", "model.cuda_graph_warmup_steps", lambda s: s.cuda_graph.warmup_steps),
    FieldMap("cuda_graph", "model.use_te_rng_tracker", _graphs_on, "graphs require the TE RNG tracker"),
    FieldMap("cuda_graph", "rng.te_rng_tracker", _graphs_on, "Bridge turns both on if either is"),
    FieldMap(
        "cuda_graph",
        "rerun_state_machine.check_for_nan_in_loss",
        lambda s: False if s.cuda_graph.impl is CudaGraphImpl.full_iteration else KEEP,
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
        lambda s: True if s.layout.cp > 1 else KEEP,
        "Qwen3-VL requires it with CP > 1",
    ),
    FieldMap(
        "cp",
        "ddp.average_in_collective",
        lambda s: False if s.layout.cp > 1 else KEEP,
        "Bridge requires it off with CP > 1 on VLM datasets",
    ),
    FieldMap("model", "model.apply_rope_fusion", lambda s: False, "Qwen3-VL requires it off"),
    FieldMap(
        "data.pack_sequences",
        "model.variable_seq_lengths",
        lambda s: s.data.pack_sequences,
        "packed micro-batches vary in length (Qwen3-VL CUDA graphs require fixed lengths)",
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
    FieldMap("data", "dataset.num_images", _num_images, "mock is image-free; synthetic: mean, rounded up"),
    FieldMap("data", "dataset.image_size", _image_size, "synthetic: mid-range long side (one fixed size)"),
    FieldMap("seed", "dataset.random_seed", lambda s: KEEP if _real(s) else s.seed),
    FieldMap("data.path", "dataset.path", lambda s: s.data.path if _real(s) else KEEP),
    FieldMap("mbs", "dataset.micro_batch_size", lambda s: s.mbs if _real(s) else KEEP, "Energon: = MBS"),
    FieldMap(
        "model.hf_model_id",
        "dataset.hf_processor_path",
        lambda s: KEEP if _real(s) else _processor_path(s),
        "a local dir is used as is; a hub id resolves from the HF cache (offline)",
    ),
    FieldMap(
        "model.hf_model_id",
        "dataset.task_encoder.hf_processor_path",
        lambda s: _processor_path(s) if _real(s) else KEEP,
        "a local dir is used as is; a hub id resolves from the HF cache (offline)",
    ),
    FieldMap(
        "data",
        "dataset.task_encoder",
        _if_real(lambda s: "QwenVLEnergonTaskEncoderConfig"),
        "the Qwen-VL Energon task encoder (reads .nv-meta/dataset.yaml: ChatMLWebdataset)",
    ),
    FieldMap("data.min_pixels", "dataset.task_encoder.min_pixels", _if_real(lambda s: s.data.min_pixels)),
    FieldMap("data.max_pixels", "dataset.task_encoder.max_pixels", _if_real(lambda s: s.data.max_pixels)),
    FieldMap("data.max_images", "dataset.task_encoder.max_num_images", _if_real(lambda s: s.data.max_images)),
    FieldMap(
        "model.vision_patch_size",
        "dataset.task_encoder.patch_size",
        _if_real(lambda s: s.model.vision_patch_size),
        "the encoder defaults to Qwen2-VL's 14; Qwen3-VL uses 16",
    ),
    FieldMap(
        "model.vision_spatial_merge_size",
        "dataset.task_encoder.spatial_merge_size",
        _if_real(lambda s: s.model.vision_spatial_merge_size),
    ),
    FieldMap(
        "model.vision_temporal_patch_size",
        "dataset.task_encoder.temporal_patch_size",
        _if_real(lambda s: s.model.vision_temporal_patch_size),
    ),
    FieldMap("data.num_workers", "dataset.num_workers", lambda s: s.data.num_workers),
    FieldMap("data.pack_sequences", "dataset.enable_in_batch_packing", lambda s: s.data.pack_sequences),
    FieldMap(
        "data.pack_sequences",
        "dataset.defer_in_batch_packing_to_step",
        lambda s: s.data.pack_sequences,
        "qwen3_vl_step packs in the step; it rejects collate-time packing",
    ),
    FieldMap(
        "data.pack_sequences",
        "dataset.pad_to_max_length",
        lambda s: (not s.data.pack_sequences) or s.layout.pp > 1 or s.layout.ep > 1,
        "Bridge forces padding when PP > 1 or EP > 1",
    ),
    FieldMap("logger", "logger.log_interval", lambda s: 1, "per-step records"),
    FieldMap("logger", "logger.log_throughput", lambda s: True, "Bridge's own TFLOP/s kept beside ours"),
    FieldMap("train_iters", "checkpoint.save", lambda s: None, "benchmark runs write no checkpoints"),
    FieldMap(
        "train_iters",
        "checkpoint.load",
        lambda s: None,
        "start from scratch (recipes point it at ./nemo_experiments/default)",
    ),
    FieldMap("logger", "logger.tensorboard_dir", lambda s: None, "steps.jsonl is the record"),
    FieldMap("train_iters", "validation.eval_iters", lambda s: 0, "no evaluation inside the measured run"),
    FieldMap(
        "train_iters",
        "train.eval_iters",
        lambda s: None,
        "deprecated alias: Bridge copies it over validation.eval_iters",
    ),
)


def bridge_overrides(spec: RunSpec) -> list[BridgeOverride]:
    """Every Bridge field this run sets, in table order (KEEP: the recipe's value stays)."""
    return [BridgeOverride(m.knob, m.field, m.value(spec), m.why) for m in FIELD_MAP]


@dataclass(frozen=True)
class Recipe:
    module: str
    function: str
    kind: str  # "perf" (benchmark recipe for this GPU), "general", or "template" (another model's)
    note: str = ""

    @property
    def name(self) -> str:
        return f"{self.module}.{self.function}"


# megatron-bridge 0.6.2 ships the flat perf recipes in the package (perf_recipes/<family>/<gpu>/);
# the general recipes are the H100 mock-pretrain ones behind recipes/qwen_vl/{qwen3_vl,qwen35_vl}.
_PERF_GPUS = {
    "qwen3_vl_30b_a3b": {"gb200": 8, "b200": 8, "h100": 16},
    "qwen3_vl_235b_a22b": {"gb200": 64, "b200": 64, "h100": 256},
    "qwen35_vl_35b_a3b": {"gb200": 8, "b200": 8, "h100": 16},
}
_PERF_MODULE = {"qwen3_vl_moe": "qwen3_vl", "qwen3_5_moe": "qwen35_vl"}
_GENERAL_MODULE = {"qwen3_vl_moe": "megatron.bridge.recipes.qwen_vl.qwen3_vl",
                   "qwen3_5_moe": "megatron.bridge.recipes.qwen_vl.qwen35_vl"}  # fmt: skip
# Models without a recipe of their own start from their architecture's general recipe.
_TEMPLATE_MODEL = {"qwen3_vl_moe": "qwen3_vl_30b_a3b", "qwen3_5_moe": "qwen35_vl_35b_a3b"}


def select_recipe(spec: RunSpec) -> Recipe | None:
    """The Bridge recipe our overrides start from: the GPU's perf recipe where one exists."""
    model, cluster, arch = spec.model.name, spec.cluster.name, spec.model.arch
    if arch not in _GENERAL_MODULE:
        return None
    gpus = _PERF_GPUS.get(model, {}).get(cluster)
    if gpus is not None:
        return Recipe(
            f"megatron.bridge.perf_recipes.qwen_vl.{cluster}.{_PERF_MODULE[arch]}",
            f"{model}_pretrain_{gpus}gpu_{cluster}_bf16_config",
            "perf",
            f"tuned for {gpus}x{cluster.upper()}",
        )
    if model in _PERF_GPUS:
        return Recipe(_GENERAL_MODULE[arch], f"{model}_pretrain_mock_config", "general")
    template = _TEMPLATE_MODEL[arch]
    return Recipe(
        _GENERAL_MODULE[arch],
        f"{template}_pretrain_mock_config",
        "template",
        f"{model} has no Bridge recipe: {template}'s is the template, the architecture is our model group's",
    )
