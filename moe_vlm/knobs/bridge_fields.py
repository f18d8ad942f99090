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

from moe_vlm.config.precision import profile as precision_profile
from moe_vlm.config.schema import (
    SYNTHETIC_DRAW_FIELDS,
    CrossEntropyFusion,
    CudaGraphImpl,
    DataKind,
    FlexBackend,
    Packing,
    ParallelismFamily,
    RecomputeGranularity,
    RecomputeMethod,
    RouterDtype,
    ShardingStrategy,
)
from moe_vlm.config.sharding import dp_outer
from moe_vlm.config.spec import RunSpec, hybridep_topology
from moe_vlm.data.workers import data_workers
from moe_vlm.knobs.keep import KEEP
from moe_vlm.knobs.telemetry_fields import ROWS as TELEMETRY_ROWS
from moe_vlm.knobs.telemetry_fields import in_run_dir

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


def _recompute_granularity(spec: RunSpec) -> str | None:
    g = spec.recompute.granularity
    return None if g is RecomputeGranularity.none else g.value


def _recompute_method(spec: RunSpec) -> str | None:
    m = spec.recompute.method
    return None if m is RecomputeMethod.none else m.value


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


def _hybridep_env(spec: RunSpec) -> dict[str, Any]:
    """The HybridEP variables of cfg.env_vars; {} removes the recipe's for other dispatchers.

    A KEEP entry keeps the recipe's value of that variable (none when the recipe sets none)."""
    d = spec.dispatcher
    if d.backend is not FlexBackend.hybridep:
        return {}
    derived = hybridep_topology(spec)
    mnnvl = derived["USE_MNNVL"] if d.hybridep_use_mnnvl is None else int(d.hybridep_use_mnnvl)
    env: dict[str, Any] = {
        "NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN": str(
            d.hybridep_ranks_per_nvlink_domain or derived["NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN"]
        ),
        "NVLINK_DOMAIN_SIZE": str(d.hybridep_nvlink_domain_size or derived["NVLINK_DOMAIN_SIZE"]),
        "USE_MNNVL": str(mnnvl),
        # A tuning value, not topology: the recipe's (GB200 perf recipes: 128) unless the knob sets one.
        "NUM_OF_TOKENS_PER_CHUNK_COMBINE_API": (
            str(d.hybridep_tokens_per_chunk_combine) if d.hybridep_tokens_per_chunk_combine else KEEP
        ),
    }
    return env


def _num_sms_alias(backend: FlexBackend) -> Callable[[RunSpec], Any]:
    """A deprecated per-backend SM count: the recipe's for its own backend while num_sms is 0.

    MCore routes a set alias into moe_flex_dispatcher_num_sms whatever the backend
    (megatron/core/transformer/transformer_config.py:1616-1635), so the other backend's alias
    is cleared: the GB200 recipes' HybridEP 32 (perf_recipes/_common.py:86-87), or the general
    recipes' 16 (recipes/qwen_vl/h100/qwen3_vl.py:238), must not size DeepEP.
    """

    def value(spec: RunSpec) -> Any:
        return KEEP if spec.dispatcher.num_sms == 0 and spec.dispatcher.backend is backend else None

    return value


def _fsdp(spec: RunSpec) -> bool:
    return spec.family is ParallelismFamily.fsdp


def _knob(group: str, name: str, convert: Callable[[Any], Any] = lambda v: v) -> Callable[[RunSpec], Any]:
    """A knob whose null keeps the recipe's value; any other value, converted, is set."""

    def value(spec: RunSpec) -> Any:
        knob = getattr(getattr(spec, group), name)
        return KEEP if knob is None else convert(knob)

    return value


def _cross_entropy_impl(spec: RunSpec) -> Any:
    fusion = spec.fusion.cross_entropy
    return KEEP if fusion in (None, CrossEntropyFusion.off) else fusion.value


def _if_vision_graphs(value: Callable[[RunSpec], Any]) -> Callable[[RunSpec], Any]:
    # The Qwen3.5 provider has no vision-graph fields: rows stay unset unless vision graphs are asked for.
    return lambda s: value(s) if s.cuda_graph.vision else KEEP


# The Megatron engine's config class for mock and synthetic data (engines/megatron/data.py), and
# the knobs it carries: the project's own seeded samples, the ones the torch engine feeds.
# The forward step Bridge runs. Qwen3-VL's own packs nothing at collate time and refuses a batch the
# collate packed (models/qwen_vl/qwen3_vl_step.py:61-65); with data.packing=in_batch the engine runs
# Bridge's generic VLM step, which consumes the collate's THD row (training/vlm_step.py:129-131,
# 262-297) and refuses deferred packing (:219-222). tests/megatron/test_packing.py runs both.
QWEN3_VL_STEP = "megatron.bridge.models.qwen_vl.qwen3_vl_step:forward_step"
VLM_STEP = "megatron.bridge.training.vlm_step:forward_step"


def forward_step_path(spec: RunSpec) -> str:
    """`module:function` of the forward step a run with these options hands to pretrain (buffer
    packing hands a THD row too: engines/megatron/data.py buffer_bridge_batch)."""
    return VLM_STEP if _thd_collate(spec) else QWEN3_VL_STEP


def _thd_collate(spec: RunSpec) -> bool:
    return spec.packed_micro_batches


SEEDED_DATASET = "MoeVlmDatasetConfig"
SEEDED_DATA_FIELDS = (*SYNTHETIC_DRAW_FIELDS, "min_pixels", "max_pixels")
SEEDED_MODEL_FIELDS = (
    "vision_patch_size",
    "vision_temporal_patch_size",
    "vision_spatial_merge_size",
    "image_token_id",
    "vision_start_token_id",
    "vision_end_token_id",
    "pad_token_id",
    "vocab_size",
)


# data=bridge_mock: Bridge's own mock VLM dataset, exactly as the perf recipes configure it
# (recipes/qwen_vl/*/qwen3_vl.py *_pretrain_mock_config; data/builders/mock_vlm_sft.py:43-59).
BRIDGE_MOCK_DATASET = "MockVLMSFTDatasetConfig"
# Where a run builds the Qwen3-VL processor that dataset loads (AutoProcessor.from_pretrained,
# mock_vlm_sft.py:154-160) when model.hf_model_id is a hub id: offline, nothing can be downloaded.
BRIDGE_PROCESSOR_DIR = "hf_processor"


# data=real with buffer packing: Bridge's Energon config builds only Bridge's Qwen-VL encoder, which
# cannot pack (models/qwen_vl/data/energon.py:175), so the engine's provider with its own encoder
# (engines/megatron/energon_packing.py) holds the same Energon fields and the packed row's geometry.
PACKED_ENERGON_DATASET = "PackedEnergonDatasetConfig"


def _dataset_kind(spec: RunSpec) -> str:
    if _bridge_mock(spec):
        return BRIDGE_MOCK_DATASET
    if _real(spec):
        return PACKED_ENERGON_DATASET if _packed_real(spec) else "EnergonDatasetConfig"
    return SEEDED_DATASET


def _seeded(spec: RunSpec) -> bool:
    # bridge_mock with buffer packing: Bridge's mock has no packer, so the engine's own dataset draws
    # that workload (data/bridge_mock.py), packed by the torch engine's Packer.
    return spec.data.kind in (DataKind.mock, DataKind.synthetic) or (
        spec.data.kind is DataKind.bridge_mock and spec.data.packing is Packing.buffer
    )


def _bridge_mock(spec: RunSpec) -> bool:
    return spec.data.kind is DataKind.bridge_mock and spec.data.packing is not Packing.buffer


def _if_seeded(value: Callable[[RunSpec], Any]) -> Callable[[RunSpec], Any]:
    return lambda s: value(s) if _seeded(s) else KEEP


def _if_bridge_data(value: Callable[[RunSpec], Any]) -> Callable[[RunSpec], Any]:
    """Rows of the fields Bridge's own datasets share (Energon, and the mock VLM one)."""
    return lambda s: value(s) if _real(s) or _bridge_mock(s) else KEEP


def _mock_processor_path(spec: RunSpec) -> Any:
    if not _bridge_mock(spec):
        return KEEP
    # Always the offline-built one, even beside a local checkpoint: its tokenizer gives the mock's
    # words Qwen's token counts, and the run needs nothing from the hub or the checkpoint.
    return in_run_dir(BRIDGE_PROCESSOR_DIR)


def _seeded_row(group: str, name: str) -> FieldMap:
    return FieldMap(
        f"{group}.{name}", f"dataset.{name}", _if_seeded(lambda s: getattr(getattr(s, group), name))
    )


def _real(spec: RunSpec) -> bool:
    return spec.data.kind is DataKind.real


def _if_real(value: Callable[[RunSpec], Any]) -> Callable[[RunSpec], Any]:
    return lambda s: value(s) if _real(s) else KEEP


def _packed_real(spec: RunSpec) -> bool:
    return _real(spec) and spec.data.packing is Packing.buffer


def _if_packed_real(value: Callable[[RunSpec], Any]) -> Callable[[RunSpec], Any]:
    return lambda s: value(s) if _packed_real(s) else KEEP


def _processor_path(spec: RunSpec) -> str:
    # A local checkpoint directory given as model.hf_model_id is used as it is; a hub id resolves
    # from the local Hugging Face cache (the engine runs with HF_HUB_OFFLINE=1).
    return spec.model.hf_model_id


_NULL_TOKENIZER = "as the perf recipes: no hub id, no tokenizer files"


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
        lambda s: s.sequence_parallel,
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
        lambda s: _fsdp(s) and s.parallelism.sharding_strategy is not ShardingStrategy.no_shard,
        "what Bridge's --use_megatron_fsdp sets; off for no_shard, which Megatron FSDP refuses on the meta device "
        "(megatron_fsdp/fully_shard.py:364-368, training/arguments.py:1160-1164)",
    ),
    FieldMap("parallelism", "model.gradient_accumulation_fusion", lambda s: True, "as Bridge's perf scripts"),
    # MoE dispatcher.
    FieldMap("dispatcher", "model.moe_token_dispatcher_type", _dispatcher_type),
    FieldMap("dispatcher", "model.moe_flex_dispatcher_backend", _flex_backend),
    FieldMap(
        "dispatcher.num_sms",
        "model.moe_flex_dispatcher_num_sms",
        lambda s: s.dispatcher.num_sms or KEEP,
        "0 -> the recipe's value (MCore fills it from the backend's deprecated alias below)",
    ),
    FieldMap(
        "dispatcher.num_sms",
        "model.moe_hybridep_num_sms",
        _num_sms_alias(FlexBackend.hybridep),
        "deprecated alias: the recipe's (GB200 perf: 32) for HybridEP at num_sms=0, else None",
    ),
    FieldMap(
        "dispatcher.num_sms",
        "model.moe_deepep_num_sms",
        _num_sms_alias(FlexBackend.deepep),
        "deprecated alias: the recipe's for DeepEP at num_sms=0, else None",
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
        "replaces the recipe's HybridEP topology (derived from the cluster when 0/null); keeps its combine chunk",
    ),
    # Routing.
    FieldMap(
        "router.force_load_balancing",
        "model.moe_router_force_load_balancing",
        lambda s: s.router.force_load_balancing,
        "the perf recipes force it on (random logits, MCore: benchmark only); real routing by default",
    ),
    FieldMap(
        "router.dtype",
        "model.moe_router_dtype",
        _knob("router", "dtype", lambda d: None if d is RouterDtype.bf16 else d.value),
        "bf16 -> None (the model's dtype)",
    ),
    FieldMap("router.aux_loss_coeff", "model.moe_aux_loss_coeff", _knob("router", "aux_loss_coeff")),
    FieldMap(
        "router.capacity_factor", "model.moe_expert_capacity_factor", _knob("router", "capacity_factor")
    ),
    FieldMap(
        "router.pad_to_capacity", "model.moe_pad_expert_input_to_capacity", _knob("router", "pad_to_capacity")
    ),
    # Fusions (null: the recipe's; the plan's effective configuration shows the value).
    FieldMap("fusion.moe_permute_fusion", "model.moe_permute_fusion", _knob("fusion", "moe_permute_fusion")),
    FieldMap("fusion.moe_router_fusion", "model.moe_router_fusion", _knob("fusion", "moe_router_fusion")),
    FieldMap(
        "fusion.cross_entropy",
        "model.cross_entropy_loss_fusion",
        _knob("fusion", "cross_entropy", lambda f: f is not CrossEntropyFusion.off),
        "te/native -> fused; off -> unfused",
    ),
    FieldMap(
        "fusion.cross_entropy",
        "model.cross_entropy_fusion_impl",
        _cross_entropy_impl,
        "which fused kernel; off leaves the (unused) impl as the recipe set it",
    ),
    FieldMap(
        "fusion.bias_activation_fusion",
        "model.bias_activation_fusion",
        _knob("fusion", "bias_activation_fusion"),
    ),
    # Precision: Bridge's registered mixed-precision recipe by name, which the engine resolves with
    # Bridge's own get_mixed_precision_config (training/mixed_precision.py:445-461), then adjusted as
    # _perf_precision adjusts it for every *_bf16/_fp8cs/_fp8mx_config perf recipe
    # (perf_recipes/_common.py:90-111): the same MixedPrecisionConfig those recipes hold.
    FieldMap(
        "precision.format",
        "mixed_precision",
        lambda s: precision_profile(s.precision.format).bridge_recipe,
        "Bridge's recipe by name (engines/megatron/config.py resolves it), adjusted by the two rows below",
    ),
    FieldMap(
        "precision",
        "mixed_precision.first_last_layers_bf16",
        lambda s: False,
        "every decoder layer in the format, as the *_fp8cs_config recipes (perf_recipes/_common.py:103)",
    ),
    FieldMap(
        "overlap.grad_reduce_in_fp32",
        "mixed_precision.grad_reduce_in_fp32",
        lambda s: bool(s.overlap.grad_reduce_in_fp32),
        "null: false, the perf recipes' value (perf_recipes/_common.py:110; Bridge's named recipes say True); "
        "setup copies it into ddp (training/mixed_precision.py:113-135)",
    ),
    # Communication overlap. CommOverlapConfig.setup writes comm_overlap's DP values (None: its own
    # defaults, on when DP > 1) over ddp and optimizer (training/comm_overlap.py:562-643): both are set.
    FieldMap("overlap.grad_reduce", "comm_overlap.overlap_grad_reduce", _knob("overlap", "grad_reduce")),
    FieldMap("overlap.grad_reduce", "ddp.overlap_grad_reduce", _knob("overlap", "grad_reduce")),
    FieldMap("overlap.param_gather", "comm_overlap.overlap_param_gather", _knob("overlap", "param_gather")),
    FieldMap("overlap.param_gather", "ddp.overlap_param_gather", _knob("overlap", "param_gather")),
    FieldMap(
        "overlap.param_gather",
        "optimizer.overlap_param_gather",
        _knob("overlap", "param_gather"),
        "Bridge turns both on if either is (training/config.py:1969-1981)",
    ),
    FieldMap(
        "overlap.bucket_size", "comm_overlap.bucket_size", _knob("overlap", "bucket_size"), "parameters"
    ),
    FieldMap("overlap.bucket_size", "ddp.bucket_size", _knob("overlap", "bucket_size"), "parameters"),
    FieldMap(
        "overlap.tp_comm",
        "comm_overlap.tp_comm_overlap",
        _knob("overlap", "tp_comm"),
        "Bridge drops it unless TP >= 2 with sequence parallelism (training/comm_overlap.py:442-451)",
    ),
    # HSDP across NVLink domains.
    FieldMap(
        "parallelism.dp_outer",
        "ddp.num_distributed_optimizer_instances",
        dp_outer,
        "0 -> one replica per NVLink-domain segment (moe_vlm/config/sharding.py)",
    ),
    FieldMap(
        "parallelism.dp_outer_sharding",
        "ddp.outer_dp_sharding_strategy",
        lambda s: s.parallelism.dp_outer_sharding.value,
    ),
    # Host-memory offload: always written (no Qwen-VL recipe offloads).
    FieldMap("offload.activation_layers", "model.cpu_offloading", lambda s: s.offload.activation_layers > 0),
    FieldMap(
        "offload.activation_layers", "model.cpu_offloading_num_layers", lambda s: s.offload.activation_layers
    ),
    FieldMap(
        "offload.optimizer_fraction",
        "optimizer.optimizer_cpu_offload",
        lambda s: s.offload.optimizer_fraction > 0,
    ),
    FieldMap(
        "offload.optimizer_fraction",
        "optimizer.optimizer_offload_fraction",
        lambda s: s.offload.optimizer_fraction,
    ),
    # Garbage collection.
    FieldMap("gc.manual", "train.manual_gc", _knob("gc", "manual")),
    FieldMap("gc.interval", "train.manual_gc_interval", _knob("gc", "interval")),
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
    # MCore 0.19 has a first-class "full_iteration" implementation ("local" + scope
    # full_iteration is its deprecated spelling), so the value is copied as it is.
    FieldMap("cuda_graph", "model.cuda_graph_impl", lambda s: s.cuda_graph.impl.value),
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
    # Vision encoder CUDA graphs (the Qwen3-VL-MoE provider's fields, qwen3_vl_provider.py:294-300).
    FieldMap(
        "cuda_graph.vision",
        "model.vision_cuda_graph_impl",
        _knob("cuda_graph", "vision", lambda on: "transformer_engine" if on else "none"),
    ),
    FieldMap(
        "cuda_graph.vision_scope",
        "model.vision_cuda_graph_scope",
        _if_vision_graphs(lambda s: list(s.cuda_graph.vision_scope)),
        "empty = whole ViT block",
    ),
    FieldMap(
        "cuda_graph.vision_max_seq_length",
        "model.max_vision_cuda_graph_seq_length",
        _if_vision_graphs(lambda s: s.cuda_graph.vision_max_seq_length or None),
        "0 -> None: the encoder's default, num_position_embeddings / merge^2",
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
        "data.packing",
        "model.variable_seq_lengths",
        _thd_collate,
        "packed micro-batches vary in length (Qwen3-VL CUDA graphs require fixed lengths; G010, A010); "
        "buffer: one [1, MBS x row] THD row, not the [seq_length, MBS] PP hands on",
    ),
    # Batch, sequence, schedule.
    FieldMap("mbs", "train.micro_batch_size", lambda s: s.mbs),
    FieldMap("gbs", "train.global_batch_size", lambda s: s.gbs),
    FieldMap("train_iters", "train.train_iters", lambda s: s.train_iters),
    FieldMap("seq_length", "model.seq_length", lambda s: s.seq_length),
    FieldMap("seq_length", "dataset.seq_length", lambda s: s.seq_length),
    FieldMap("seed", "rng.seed", lambda s: s.seed),
    FieldMap("lr", "optimizer.lr", lambda s: s.lr),
    # MCore's scheduler sets every step's weight decay from its own start/end values
    # (optimizer_param_scheduler.py:184-202, 300): constant, so both hold the knob. It overwrites
    # optimizer.weight_decay from the first step (the perf recipes leave 0.1 there, run 0.033), so
    # that field stays the recipe's: a vendor recipe's option then equals its function.
    FieldMap("weight_decay", "scheduler.start_weight_decay", lambda s: s.weight_decay),
    FieldMap("weight_decay", "scheduler.end_weight_decay", lambda s: s.weight_decay),
    # Data.
    FieldMap(
        "data",
        "dataset",
        _dataset_kind,
        f"mock/synthetic: {SEEDED_DATASET}, the torch engine's seeded samples (engines/megatron/data.py)",
    ),
    FieldMap("data.kind", "dataset.kind", _if_seeded(lambda s: s.data.kind.value)),
    *(_seeded_row("data", name) for name in SEEDED_DATA_FIELDS),
    *(_seeded_row("model", name) for name in SEEDED_MODEL_FIELDS if name != "pad_token_id"),
    FieldMap(
        "model.pad_token_id",
        "dataset.pad_token_id",
        lambda s: s.model.pad_token_id if _seeded(s) or _packed_real(s) else KEEP,
        "the id packed rows are padded with (seeded data; data=real with buffer packing)",
    ),
    FieldMap("seed", "dataset.random_seed", _if_seeded(lambda s: s.seed), "sample i is drawn from (seed, i)"),
    FieldMap("data.path", "dataset.path", lambda s: s.data.path if _real(s) else KEEP),
    FieldMap("mbs", "dataset.micro_batch_size", lambda s: s.mbs if _real(s) else KEEP, "Energon: = MBS"),
    FieldMap(
        "model.hf_model_id",
        "dataset.task_encoder.hf_processor_path",
        lambda s: _processor_path(s) if _real(s) else KEEP,
        "a local dir is used as is; a hub id resolves from the HF cache (offline)",
    ),
    # The training tokenizer only sizes the vocabulary here (training/setup.py:293-299; the Energon
    # data module just stores it, data/energon/base_energon_datamodule.py:96): the data encodes its
    # own text (the seeded samples, or Energon's processor). So every recipe gets the NullTokenizer
    # of the model's vocabulary that Bridge's perf recipes use (perf_recipes/qwen_vl/common.py:34-43)
    # instead of the general recipes' hub id (recipes/qwen_vl/h100/qwen3_vl.py:128), which needs
    # tokenizer files (a materialised config has none) and resizes the vocabulary to the tokenizer's.
    FieldMap("model.vocab_size", "tokenizer.tokenizer_type", lambda s: "NullTokenizer", _NULL_TOKENIZER),
    FieldMap("model.vocab_size", "tokenizer.tokenizer_model", lambda s: None, _NULL_TOKENIZER),
    FieldMap("model.vocab_size", "tokenizer.vocab_size", lambda s: s.model.vocab_size),
    FieldMap(
        "model.vocab_size",
        "tokenizer.use_tokenizer_vocab_size",
        lambda s: False,
        "the model's vocabulary, not one derived from a tokenizer",
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
    FieldMap(
        "data",
        "dataset.task_encoder.max_visual_tokens",
        _if_real(lambda s: None),
        "None: the image processor runs once per sample, in collate (a budget runs it in encode_sample too, "
        "models/qwen_vl/data/energon.py:286-296); data.max_images x data.max_pixels bound the image tokens",
    ),
    FieldMap(
        "data.num_workers",
        "dataset.num_workers",
        lambda s: KEEP if _bridge_mock(s) and s.data.num_workers is None else data_workers(s).count,
        "null: from the CPUs per rank, here (plan) or on each rank (run); data/workers.py "
        "(bridge_mock: the recipe's)",
    ),
    FieldMap(
        "data.packing",
        "dataset.enable_in_batch_packing",
        lambda s: s.data.packing is Packing.in_batch,
        "in_batch: the collate packs the micro-batch into one THD row (Bridge's build_mcore_thd_sequence_"
        "batch_from_rows, data/packing/in_batch.py:89-215), run by vlm_step",
    ),
    FieldMap(
        "data.packing_buffer",
        "dataset.packing_buffer",
        _if_seeded(lambda s: s.data.packing_buffer if s.data.packing is Packing.buffer else 0),
        "buffer: each DP rank's Packer holds this many samples; one dataset item is one packed row "
        "(engines/megatron/data.py PackedRows)",
    ),
    FieldMap(
        "data.packing_buffer",
        "dataset.packing_buffer_size",
        _if_packed_real(lambda s: s.data.packing_buffer),
        "real, buffer: Energon's packing buffer (task_encoder/base.py:578-596) over the engine's Qwen-VL "
        "encoder, first-fit-decreasing as the torch engine packs (engines/megatron/energon_packing.py)",
    ),
    FieldMap("data.packing", "dataset.packed_row_length", _if_packed_real(lambda s: s.packed_row_length)),
    FieldMap(
        "data.packing", "dataset.sample_multiple", _if_packed_real(lambda s: s.collate_padding_multiple)
    ),
    FieldMap(
        "data.packing",
        "dataset.defer_in_batch_packing_to_step",
        _if_bridge_data(lambda s: False),
        "vlm_step refuses deferred packing (training/vlm_step.py:219-222)",
    ),
    FieldMap(
        "data.packing",
        "dataset.pad_to_max_length",
        _if_bridge_data(lambda s: s.data.packing is Packing.none or s.layout.pp > 1 or s.layout.ep > 1),
        "Bridge forces padding when PP > 1 or EP > 1; the packing collate ignores it",
    ),
    FieldMap(
        "data",
        "dataset.hf_processor_path",
        _mock_processor_path,
        "bridge_mock: the Qwen3-VL processor the run builds offline in its directory "
        "(data/bridge_processor.py); the recipes name a hub id",
    ),
    FieldMap("logger", "logger.log_interval", lambda s: 1, "per-step records"),
    FieldMap("logger", "logger.log_throughput", lambda s: True, "Bridge's own TFLOP/s kept beside ours"),
    # Profiling and experiment logging: knobs/telemetry_fields.py.
    *(FieldMap(*row) for row in TELEMETRY_ROWS),
    FieldMap("train_iters", "checkpoint.save", lambda s: None, "benchmark runs write no checkpoints"),
    FieldMap(
        "train_iters",
        "checkpoint.load",
        lambda s: None,
        "start from scratch (recipes point it at ./nemo_experiments/default)",
    ),
    FieldMap("train_iters", "validation.eval_iters", lambda s: 0, "no evaluation inside the measured run"),
    FieldMap(
        "train_iters",
        "train.eval_iters",
        lambda s: None,
        "deprecated alias: Bridge copies it over validation.eval_iters",
    ),
)


# Fields Bridge's runtime update carries a row's value on to: comm_overlap's TP overlap into the model,
# dropped below TP 2 or without sequence parallelism (training/comm_overlap.py:442-451, 617-633); the
# fp32 gradient reduction into ddp (training/mixed_precision.py:113-135). The plan shows them per knob.
RESOLVED_FIELDS: dict[str, tuple[str, ...]] = {
    "overlap.tp_comm": ("model.tp_comm_overlap",),
    "overlap.grad_reduce_in_fp32": ("ddp.grad_reduce_in_fp32",),
}


def bridge_overrides(spec: RunSpec) -> list[BridgeOverride]:
    """Every Bridge field this run sets, in table order (KEEP: the recipe's value stays)."""
    return [BridgeOverride(m.knob, m.field, m.value(spec), m.why) for m in FIELD_MAP]
