"""Which engine honours which knob, declared once.

A knob is a leaf of the config schema, written as a user writes it: ``mbs``,
``parallelism.sharding_strategy``, ``recompute.modules``. For each engine, every knob is one of:

- Honoured: the engine does what the knob says, for every value, or only for ``values``; a rule
  rejects any other value before anything runs (the E-rules read ``values`` from here).
- Inert: it only acts through a ``switch`` knob that this engine restricts or rejects, so it has
  nothing to act on (``cuda_graph.warmup_steps`` where there are no CUDA graphs).
- Ignored: knowingly not applied, for the reason given.
- listed nowhere: then a rule must reject every value but the default on that engine
  (``dispatcher.fp8_dispatch``: no engine field carries it, D004/D005 reject it).

For the Megatron engine, ``bridge_fields.FIELD_MAP``'s ``knob`` column is the first answer: a knob
named there reaches a Bridge field. MEGATRON below adds only what that column cannot say: the
leaves its group-named rows read (``"dispatcher"`` rows read ``dispatcher.token_dispatcher``), and
what the engine reads outside the table (the model's config.json, the launch, the step record).
NOT_ENGINE_KNOBS are read before any engine starts. tests/unit/test_knob_coverage.py walks the
schema and holds every leaf to this, so a knob nobody honours is a red test, not a silent no-op.

Imports nothing heavy: the rules, the torch model and the advisor read it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from moe_vlm.config.arch import PROFILES
from moe_vlm.config.schema import (
    SYNTHETIC_DRAW_FIELDS,
    CudaGraphImpl,
    Engine,
    OuterSharding,
    ParallelismFamily,
    Precision,
    ShardingStrategy,
    TokenDispatcher,
)
from moe_vlm.knobs.bridge_fields import FIELD_MAP


@dataclass(frozen=True)
class Honoured:
    how: str
    values: tuple[Any, ...] | None = None  # None: every value the schema allows

    def accepts(self, value: Any) -> bool:
        if self.values is None:
            return True
        if isinstance(value, list | tuple):  # a list knob: every item must be accepted
            return all(item in self.values for item in value)
        return value in self.values


@dataclass(frozen=True)
class Inert:
    switch: str  # the knob that turns this one on; restricted or rejected on this engine
    why: str


@dataclass(frozen=True)
class Ignored:
    why: str


Support = Honoured | Inert | Ignored

# The top-level shortcuts into the parallelism group: the spec resolves each pair to one size.
SHORTCUTS: Mapping[str, str] = {f"parallelism.{size}": size for size in ("tp", "pp", "vp", "cp", "ep", "etp")}

NOT_ENGINE_KNOBS: frozenset[str] = frozenset(
    {
        # What runs and how: read by run/task.py and the launcher before an engine is chosen.
        "engine",
        "dry_run",
        # Defaults the spec resolves seq_length and gbs from; the engines read those.
        "model.default_seq_length",
        "model.default_gbs",
        # The chosen option's label, recorded and compared by reports; its fields carry the
        # settings. (The Megatron engine also picks its Bridge recipe by model.name.)
        "model.name",
        "dispatcher.name",
        "recompute.name",
        "cuda_graph.name",
        "vision_freeze.name",
        "router.name",
        "precision.name",
        "profiling.name",
        "logger.name",
        "fusion.name",
        "overlap.name",
        "offload.name",
        "gc.name",
        # recipe=<name>: a set of the other knobs' values, which the engines read (the Megatron
        # engine also builds from the named function, tests/megatron/test_recipes.py); the plan
        # lists what a run changes from it (moe_vlm/knobs/recipes.py).
        "recipe.name",
        "recipe.module",
        "recipe.knobs",
        # card=<row>: the same for a published card row (conf/card/), with its published figure,
        # which the plan and the report print beside the run's (moe_vlm/knobs/cards.py).
        "card.row",
        "card.source",
        "card.published_tflops_per_gpu",
        "card.published_mfu",
        "card.validated_on",
        "card.as_written",
        "card.reasons",
        "card.assumed",
        # The routing load the predictor assumes under dropless real routing (predict/terms.py
        # routing_load): a planning input, measured by a run (run.json router.load_factor), which no
        # engine and no Bridge field reads.
        "router.assumed_load",
        # A description of the machine, read by the spec (nproc, engine=auto, EP sizing), the
        # rules, the memory estimate and the MFU denominator. (The Megatron engine also picks its
        # perf recipe by cluster.name and derives HybridEP's topology from the NVLink domain.)
        "cluster.name",
        "cluster.gpu",
        "cluster.compute_capability",
        "cluster.gpus_per_node",
        "cluster.gpu_memory_gib",
        "cluster.nvlink_domain_gpus",
        "cluster.peak_bf16_flops",
        "cluster.peak_fp8_flops",  # the precision's own MFU column
        "cluster.peak_fp4_flops",
        "cluster.default_dispatcher",
        "cluster.is_gpu_cluster",
    }
)

# Model leaves that reach transformers' config (engines/hf_config.transformers_config): the torch
# engine builds its model from it, the Megatron engine writes it as the config.json its
# provider reads. Some apply to one architecture only (hf_config says which).
MODEL_CONFIG_KNOBS: tuple[str, ...] = tuple(
    f"model.{name}"
    for name in (
        "arch",
        "num_layers",
        "hidden_size",
        "num_attention_heads",
        "num_query_groups",
        "head_dim",
        "vocab_size",
        "num_experts",
        "moe_top_k",
        "moe_ffn_hidden_size",
        "num_shared_experts",
        "shared_expert_ffn_hidden_size",
        "num_dense_layers",
        "dense_ffn_hidden_size",
        "full_attention_interval",
        "linear_num_key_heads",
        "linear_num_value_heads",
        "linear_key_head_dim",
        "linear_value_head_dim",
        "tie_word_embeddings",
        "max_position_embeddings",
        "rope_theta",
        "vision_depth",
        "vision_hidden_size",
        "vision_num_heads",
        "vision_intermediate_size",
        "vision_patch_size",
        "vision_spatial_merge_size",
        "vision_temporal_patch_size",
        "vision_num_position_embeddings",
        "vision_deepstack_layers",
        "projector_out_size",
        "image_token_id",
        "vision_start_token_id",
        "vision_end_token_id",
        "pad_token_id",
    )
)
_CONFIG_JSON = "the model's transformers config (engines/hf_config.py)"

# The torch engine's activation checkpointing (engines/torch_model.apply_recompute): core_attn is
# the attention function, the others are checkpointed modules. Order: as the E008 message lists them.
TORCH_SELECTIVE_RECOMPUTE = ("core_attn", "layernorm", "moe", "mlp")
_TORCH_SIZES = "the torch engine is data-parallel only (FSDP2)"
_MEGATRON_ONLY = "a Megatron setting; the torch engine keeps what its own modules do"
# Tuning knobs whose null (the recipe's value) is all the torch engine accepts.
TORCH_REJECTS_UNLESS_NULL: tuple[str, ...] = (
    "fusion.moe_permute_fusion",
    "fusion.moe_router_fusion",
    "fusion.cross_entropy",
    "fusion.bias_activation_fusion",
    "router.dtype",
    "router.aux_loss_coeff",
    "router.capacity_factor",
    "router.pad_to_capacity",
    "overlap.grad_reduce",
    "overlap.param_gather",
    "overlap.bucket_size",
    "overlap.tp_comm",
)
_QWEN35_ONLY = "a Gated DeltaNet (qwen3_5_moe) setting; the torch engine does not build that architecture"

TORCH: Mapping[str, Support] = {
    **{knob: Honoured(_CONFIG_JSON) for knob in MODEL_CONFIG_KNOBS},
    "model.arch": Honoured(
        "transformers' model class of the architecture",
        tuple(arch for arch, built in PROFILES.items() if built.torch_engine_builds),
    ),
    "model.num_shared_experts": Honoured("transformers' Qwen3-VL-MoE has no shared experts", (0,)),
    "model.shared_expert_ffn_hidden_size": Inert("model.num_shared_experts", "sizes shared experts"),
    **{
        f"model.{name}": Inert("model.arch", _QWEN35_ONLY)
        for name in (
            "full_attention_interval",
            "linear_num_key_heads",
            "linear_num_value_heads",
            "linear_key_head_dim",
            "linear_value_head_dim",
        )
    },
    "model.hf_model_id": Ignored(
        "the torch engine builds its config and image processor offline from the model group's fields "
        "(random init, like the Megatron engine); hf_model_id names what Megatron's AutoBridge and "
        "HF processor load"
    ),
    "mbs": Honoured("rows per micro-batch"),
    "gbs": Honoured("gradient accumulation up to GBS"),
    "seq_length": Honoured("rows padded or packed to it"),
    "nodes": Honoured("nodes x nproc ranks, spawned locally or started by the launcher"),
    "nproc": Honoured("nodes x nproc ranks, spawned locally or started by the launcher"),
    "train_iters": Honoured("optimizer steps"),
    "warmup_steps": Honoured("steps marked warmup in steps.jsonl"),
    "seed": Honoured("model init and data draws"),
    "lr": Honoured("the optimizer's learning rate"),
    "weight_decay": Honoured("AdamW's weight_decay"),
    **{size: Honoured(_TORCH_SIZES, (1,)) for size in ("tp", "pp", "vp", "cp", "ep", "etp")},
    "parallelism.family": Honoured("torch FSDP2", (ParallelismFamily.fsdp,)),
    "parallelism.sequence_parallel": Honoured(_TORCH_SIZES, (False,)),
    "parallelism.sharding_strategy": Honoured(
        "FSDP2 reshard_after_forward / no sharding",
        (ShardingStrategy.no_shard, ShardingStrategy.optim_grads, ShardingStrategy.optim_grads_params),
    ),
    "parallelism.fsdp_version": Honoured("Megatron FSDP settings the torch engine does not have", (1,)),
    "parallelism.fsdp_double_buffer": Honoured("a Megatron FSDP setting", (False,)),
    "parallelism.nccl_ub": Honoured("a Megatron FSDP setting", (False,)),
    "dispatcher.token_dispatcher": Honoured(
        "every expert on each rank (EP=1), where alltoall is the identity", (TokenDispatcher.alltoall,)
    ),
    **{
        f"dispatcher.{name}": Inert("dispatcher.backend", "HybridEP's topology")
        for name in (
            "hybridep_ranks_per_nvlink_domain",
            "hybridep_nvlink_domain_size",
            "hybridep_use_mnnvl",
            "hybridep_tokens_per_chunk_combine",
        )
    },
    "recompute.granularity": Honoured("torch activation checkpointing"),
    "recompute.method": Honoured("full: every layer (uniform) or the first N (block)"),
    "recompute.num_layers": Honoured("block: the first N layers; uniform: one layer per chunk (E008)"),
    "recompute.modules": Honoured("checkpointed per decoder layer", TORCH_SELECTIVE_RECOMPUTE),
    "cuda_graph.impl": Honoured("no CUDA graphs", (CudaGraphImpl.none,)),
    "cuda_graph.warmup_steps": Inert("cuda_graph.impl", "graph capture warm-up"),
    **{
        f"vision_freeze.{part}": Honoured("requires_grad=False")
        for part in ("vision", "projector", "language")
    },
    "data.kind": Honoured("batches built in the training loop"),
    "data.path": Honoured("data=real: Energon shards read in the training loop"),
    "data.packing": Honoured(
        "padded rows, the micro-batch in one row, or rows packed from a buffer (data/packer.py), "
        "with per-sample attention and positions"
    ),
    "data.packing_buffer": Honoured("the packer's buffer of candidate samples (data/packer.py)"),
    "data.num_workers": Honoured("batches are built in the training loop; no dataloader workers", (None, 0)),
    **{f"data.{name}": Honoured("data=synthetic draws") for name in SYNTHETIC_DRAW_FIELDS},
    "data.min_pixels": Honoured("the image processor's bounds"),
    "data.max_pixels": Honoured("the image processor's bounds"),
    # transformers' router picks experts from its own logits; random logits are Megatron's (E011).
    "router.force_load_balancing": Honoured("real routing: the router's own logits", (False,)),
    # No fp32 option: no Bridge perf recipe runs FP32, and the torch engine's FP32 on CPU is the
    # device's (bf16 matmuls are emulated there), not a setting (P003 rejects FP8/FP4).
    "precision.format": Honoured(
        "BF16 parameters with FP32 gradient reduction on GPUs (FSDP2 MixedPrecisionPolicy); FP32 on CPU",
        (Precision.bf16,),
    ),
    # Megatron's kernels, schedules and host-memory features: the torch engine runs transformers'
    # modules under FSDP2 and keeps only the recipe-neutral value of each (rules X008, O013 reject the rest).
    **{knob: Honoured(_MEGATRON_ONLY, (None,)) for knob in TORCH_REJECTS_UNLESS_NULL},
    "overlap.grad_reduce_in_fp32": Honoured(
        "FSDP2 reduces gradients in fp32 (MixedPrecisionPolicy reduce_dtype); fp32 throughout on CPU",
        (None, True),
    ),
    "parallelism.dp_outer": Honoured("torch FSDP2 shards over the whole job (no HSDP mesh)", (1,)),
    "parallelism.dp_outer_sharding": Honoured("no HSDP on the torch engine", (OuterSharding.no_shard,)),
    "offload.activation_layers": Honoured("nothing offloaded to host memory", (0,)),
    "offload.optimizer_fraction": Honoured("the optimizer runs on the training device", (0.0,)),
    "cuda_graph.vision": Honoured("no CUDA graphs", (None, False)),
    "cuda_graph.vision_scope": Inert("cuda_graph.vision", "vision-graph capture scope"),
    "cuda_graph.vision_max_seq_length": Inert("cuda_graph.vision", "vision-graph capture length"),
    "gc.manual": Honoured("Python's automatic garbage collection", (None, False)),
    "gc.interval": Inert("gc.manual", "manual collection interval"),
    # moe_vlm/record/profiling.py's StepProfiler on the profiled ranks; nsys and memory need GPUs (O003).
    "profiling.tool": Honoured("torch.profiler, the CUDA profiler API or allocator history on the window"),
    "profiling.steps": Honoured("the profiled window; its steps are left out of the steady window"),
    "profiling.ranks": Honoured("the ranks that record"),
    # moe_vlm/record/explog.py on rank 0; a tracker whose package does not import is rejected (O006).
    "logger.backend": Honoured("TensorBoard, W&B or MLflow, one point per step"),
    "logger.project": Honoured("the W&B project / MLflow experiment"),
    "logger.run_name": Honoured("the W&B / MLflow run name"),
    "logger.entity": Honoured("the W&B entity"),
    "logger.tracking_uri": Honoured("the MLflow tracking server"),
}

# The leaves FIELD_MAP's group-named rows read: a row named "dispatcher" sets the dispatcher type
# and backend, and HybridEP's topology in env_vars.
FIELD_MAP_GROUP_READS: Mapping[str, tuple[str, ...]] = {
    "parallelism": ("parallelism.family",),
    "dispatcher": (
        "dispatcher.token_dispatcher",
        "dispatcher.backend",
        "dispatcher.hybridep_ranks_per_nvlink_domain",
        "dispatcher.hybridep_nvlink_domain_size",
        "dispatcher.hybridep_use_mnnvl",
        "dispatcher.hybridep_tokens_per_chunk_combine",
    ),
    "recompute": ("recompute.granularity",),
    "cuda_graph": ("cuda_graph.impl",),
    "data": ("data.kind",),
    "profiling": ("profiling.tool",),
    "logger": ("logger.backend",),
}

# Beyond FIELD_MAP's knob column (support() answers for that column too).
MEGATRON: Mapping[str, Support] = {
    **{knob: Honoured(_CONFIG_JSON) for knob in MODEL_CONFIG_KNOBS},
    "nodes": Honoured("nodes x nproc ranks from torchrun or the launcher; launch checks the world size"),
    "nproc": Honoured("nodes x nproc ranks from torchrun or the launcher; launch checks the world size"),
    "warmup_steps": Honoured("steps marked warmup in steps.jsonl (megatron/recording.py)"),
    **{
        leaf: Honoured(f"bridge_fields.FIELD_MAP's rows named {group!r}")
        for group, leaves in FIELD_MAP_GROUP_READS.items()
        for leaf in leaves
    },
    "data.packing": Honoured(
        "in_batch: Bridge's collate-time THD packing (data/packing/in_batch.py) with vlm_step; none: padded "
        "rows; buffer: the torch engine's Packer, one packed row per dataset item, handed to vlm_step as "
        "THD (engines/megatron/data.py PackedRows; data=real: Energon's packing API over the engine's "
        "Qwen-VL task encoder, engines/megatron/energon_packing.py)",
    ),
    "data.packing_buffer": Honoured(
        "bridge_fields.FIELD_MAP's rows dataset.packing_buffer (PackedRows) and, data=real, "
        "dataset.packing_buffer_size (Energon's buffer)"
    ),
}

SUPPORT: Mapping[Engine, Mapping[str, Support]] = {Engine.torch: TORCH, Engine.megatron: MEGATRON}


def field_map_knobs() -> frozenset[str]:
    """FIELD_MAP's knob column."""
    return frozenset(row.knob for row in FIELD_MAP)


def support(engine: Engine | str, knob: str) -> Support | None:
    """What `engine` does with `knob` (a shortcut's group spelling reads as the shortcut); None: nothing,
    so a rule must reject it."""
    table, name = SUPPORT[Engine(engine)], SHORTCUTS.get(knob, knob)
    entry = table.get(knob) or table.get(name)
    if entry is None and Engine(engine) is Engine.megatron and name in field_map_knobs():
        return Honoured("bridge_fields.FIELD_MAP")
    return entry


def accepted(engine: Engine | str, knob: str) -> tuple[Any, ...] | None:
    """The values `engine` accepts for a knob it honours (None: every value)."""
    entry = support(engine, knob)
    assert isinstance(entry, Honoured), f"{knob}: not honoured by engine {Engine(engine).value}"
    return entry.values


def accepts(engine: Engine | str, knob: str, value: Any) -> bool:
    entry = support(engine, knob)
    assert isinstance(entry, Honoured), f"{knob}: not honoured by engine {Engine(engine).value}"
    return entry.accepts(value)
