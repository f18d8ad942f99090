"""The config schema: one plain dataclass per Hydra config group.

Registered in Hydra's ConfigStore as ``train_schema`` so that a typo in a key or a
value of the wrong type fails at composition, before anything runs. Every field a
user may set lives here with a comment; the YAML files under ``conf/`` only fill in
values.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum, StrEnum
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from moe_vlm.base.errors import BadInput

# The config groups' YAML options this schema types (conf/ beside the moe_vlm/ package).
CONF_DIR = Path(__file__).resolve().parents[2] / "conf"

# Engine, parallelism family and architecture are StrEnums: a member equals its value, so a
# member prints as the value users type and compares equal to it.


class Engine(StrEnum):
    auto = "auto"  # megatron on GPU clusters, torch on cluster=local
    torch = "torch"  # embedded engine: transformers Qwen3-VL-MoE + torch FSDP2
    megatron = "megatron"  # Megatron Bridge + Megatron Core + Transformer Engine


# OmegaConf converts a string to an Enum by member NAME, and "3d" is no identifier: the functional
# API lets the name be the value users type. Spell the member ParallelismFamily["3d"].
ParallelismFamily = StrEnum(
    "ParallelismFamily",
    [
        ("fsdp", "fsdp"),  # Megatron FSDP (torch FSDP2 on the torch engine): DP-sharded, EP for experts
        ("3d", "3d"),  # TP/PP/VP/CP + EP/ETP with the distributed optimizer
    ],
    module=__name__,
    qualname="ParallelismFamily",
)


class Arch(StrEnum):
    """A decoder/vision architecture; moe_vlm/config/arch.py holds one profile per member."""

    qwen3_vl_moe = "qwen3_vl_moe"  # Qwen3-VL-MoE: full attention, deepstack vision features
    qwen3_5_moe = "qwen3_5_moe"  # Qwen3.5-MoE: Gated DeltaNet between full-attention layers


class DataKind(Enum):
    mock = "mock"  # image-free token batches: NOT a performance proxy for a VLM
    # Bridge's perf-recipe workload (MockVLMSFTDatasetConfig): one 256x256 noise image, "Describe
    # this image.", 10-29 random words, padded to seq_length. Mock: never ranked with real data.
    bridge_mock = "bridge_mock"
    synthetic = "synthetic"  # realistic image payloads generated from the seed
    real = "real"  # image-text WebDataset shards on disk (Energon layout)


class Packing(StrEnum):
    """How a micro-batch's samples become model rows (docs/data.md "Padding or packing")."""

    none = "none"  # one sample per row, padded to seq_length
    # the micro-batch's samples concatenated unpadded into one row, attention confined to each sample
    # (torch: per-sample attention and positions; Megatron: Bridge's collate-time THD packing + vlm_step)
    in_batch = "in_batch"
    # rows of seq_length filled first-fit-decreasing from a buffer of data.packing_buffer samples
    # (moe_vlm/data/packer.py): packs at MBS 1 too; GBS counts rows, records count samples and tokens
    buffer = "buffer"


# Data that is no performance proxy for a VLM on real images: labelled mock, never ranked with the rest.
MOCK_KINDS = (DataKind.mock, DataKind.bridge_mock)


class TokenDispatcher(Enum):
    alltoall = "alltoall"
    allgather = "allgather"
    flex = "flex"  # DeepEP / HybridEP, picked by `backend`


class FlexBackend(Enum):
    none = "none"
    deepep = "deepep"
    hybridep = "hybridep"


class RecomputeGranularity(Enum):
    none = "none"
    selective = "selective"
    full = "full"


class RecomputeMethod(Enum):
    none = "none"
    uniform = "uniform"
    block = "block"


class CudaGraphImpl(Enum):
    none = "none"
    transformer_engine = "transformer_engine"
    local = "local"
    full_iteration = "full_iteration"


class OuterSharding(StrEnum):
    no_shard = "no_shard"  # HSDP replicates across the outer groups
    optim = "optim"  # optimizer state sharded over the outer groups too


class ShardingStrategy(Enum):
    no_shard = "no_shard"
    optim = "optim"
    optim_grads = "optim_grads"
    optim_grads_params = "optim_grads_params"


@dataclass
class ModelConfig:
    name: str = MISSING
    hf_model_id: str = MISSING  # the Hugging Face id; its config is materialised offline
    arch: Arch = Arch.qwen3_vl_moe
    # Language model (decoder).
    num_layers: int = MISSING
    hidden_size: int = MISSING
    num_attention_heads: int = MISSING
    num_query_groups: int = MISSING  # KV heads
    head_dim: int = MISSING
    vocab_size: int = MISSING
    num_experts: int = MISSING
    moe_top_k: int = MISSING
    moe_ffn_hidden_size: int = MISSING  # per routed expert
    num_shared_experts: int = 0
    shared_expert_ffn_hidden_size: int = 0
    num_dense_layers: int = 0  # leading dense (non-MoE) layers
    dense_ffn_hidden_size: int = 0
    # Every Nth layer is full attention, the others Gated DeltaNet (Qwen3.5); 1 = all full attention.
    full_attention_interval: int = 1
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 262144
    rope_theta: float = 5_000_000.0
    # Vision encoder (ViT) and patch merger / projector.
    vision_depth: int = MISSING
    vision_hidden_size: int = MISSING
    vision_num_heads: int = MISSING
    vision_intermediate_size: int = MISSING
    vision_patch_size: int = 16
    vision_spatial_merge_size: int = 2
    vision_temporal_patch_size: int = 2
    vision_num_position_embeddings: int = 2304
    vision_deepstack_layers: list[int] = field(default_factory=list)
    projector_out_size: int = MISSING  # merger output = decoder hidden size
    # Special tokens (Qwen3-VL tokenizer ids; the tiny model keeps them inside its small vocab).
    image_token_id: int = 151655
    vision_start_token_id: int = 151652
    vision_end_token_id: int = 151653
    pad_token_id: int = 151643
    # Defaults chosen per model so that runs are valid as typed.
    default_seq_length: int = 4096
    default_gbs: int = 512


@dataclass
class ParallelismConfig:
    family: ParallelismFamily = ParallelismFamily.fsdp
    tp: int = 1
    pp: int = 1
    vp: int = 1  # virtual pipeline stages per rank (1 = off)
    cp: int = 1
    ep: int = 0  # 0 = size EP to the experts (largest divisor of the expert count that fits the world)
    etp: int = 1
    sequence_parallel: bool = False
    # Uneven pipeline split (0 = even): vision + embedding sit on the first stage, logits on the last.
    first_stage_layers: int = 0
    last_stage_layers: int = 0
    # Megatron FSDP only.
    sharding_strategy: ShardingStrategy = ShardingStrategy.optim_grads_params
    fsdp_version: int = 1  # 2 is DP-only: no MoE, no TP/PP/CP/EP, no CUDA graphs
    fsdp_double_buffer: bool = False
    nccl_ub: bool = False
    # HSDP for jobs over several NVLink domains: data-parallel replicas outside the sharding group
    # (Megatron's ddp.num_distributed_optimizer_instances; on 3D the distributed optimizer shards
    # within DP / dp_outer). 1 = shard over all of DP; 0 = one replica per NVLink-domain segment
    # (what the launcher's segment=auto places: moe_vlm/config/sharding.py).
    dp_outer: int = 1
    # What the outer replicas shard (Megatron FSDP only): no_shard, or optim (optimizer state over
    # the whole DP; needs sharding_strategy=optim_grads_params).
    dp_outer_sharding: OuterSharding = OuterSharding.no_shard


@dataclass
class DispatcherConfig:
    name: str = "alltoall"
    token_dispatcher: TokenDispatcher = TokenDispatcher.alltoall
    backend: FlexBackend = FlexBackend.none
    # 0 = the recipe's value (the GB200 perf recipes give HybridEP 32 SMs); moe_flex_dispatcher_num_sms otherwise
    num_sms: int = 0
    fp8_dispatch: bool = False  # rejected (D004) until an engine field carries it
    # HybridEP topology (env vars the engine reads). 0 = derive from the cluster.
    hybridep_ranks_per_nvlink_domain: int = 0
    hybridep_nvlink_domain_size: int = 0
    hybridep_use_mnnvl: bool | None = None  # null = derive; false forces USE_MNNVL=0
    hybridep_tokens_per_chunk_combine: int = 0  # 0 = the recipe's value (the GB200 perf recipes: 128)
    overlap_moe_expert_parallel_comm: bool = False


@dataclass
class RecomputeConfig:
    name: str = "none"
    granularity: RecomputeGranularity = RecomputeGranularity.none
    method: RecomputeMethod = RecomputeMethod.none  # full only
    num_layers: int = 0  # full only: layers per recompute chunk (uniform) or count (block)
    # selective only: core_attn, moe_act, layernorm, mla_up_proj, mlp, moe, shared_experts, gdn_norm_out
    modules: list[str] = field(default_factory=list)


@dataclass
class CudaGraphConfig:
    name: str = "none"
    impl: CudaGraphImpl = CudaGraphImpl.none
    # attn, mlp, moe, moe_router, moe_preprocess, mamba; empty = whole layer
    scope: list[str] = field(default_factory=list)
    warmup_steps: int = 3
    # Vision encoder TE graphs (Qwen3-VL-MoE provider's vision_cuda_graph_impl; Qwen3.5 has none).
    # null = the recipe's (none in every Qwen-VL recipe); true = transformer_engine; false = none.
    vision: bool | None = None
    vision_scope: list[str] = field(default_factory=list)  # attn, mlp; empty = whole ViT block
    # Patches per micro-batch the vision graph is captured for (inputs are padded to it; longer
    # ones raise). 0 = the encoder's default, num_position_embeddings / merge^2.
    vision_max_seq_length: int = 0


@dataclass
class VisionFreezeConfig:
    name: str = "none"
    vision: bool = False  # ViT blocks and patch embedding
    projector: bool = False  # patch merger (and deepstack mergers)
    language: bool = False  # the decoder; set explicitly, never inherited from the engine


@dataclass
class DataConfig:
    kind: DataKind = DataKind.mock
    path: str | None = None  # real: an Energon-prepared WebDataset directory (scripts/build_dataset.py)
    packing: Packing = Packing.none  # none: pad each sample to seq_length; in_batch: one unpadded row
    packing_buffer: int = 64  # data.packing=buffer: candidate samples each rank's packer holds
    # DataLoader workers per rank; null = per engine (torch: 0, in its loop; megatron: from the CPUs per rank)
    num_workers: int | None = None
    # synthetic: per sample, uniform draws from each [min, max] range (text_tokens: byte-level ids)
    min_images: int = 1
    max_images: int = 2  # real: also the most images a sample may have (Energon max_num_images)
    min_long_side_px: int = 336
    max_long_side_px: int = 1344
    # width / height, one drawn per image
    aspect_ratios: list[float] = field(default_factory=lambda: [1.0, 0.75, 1.333, 0.5625, 1.778])
    min_text_tokens: int = 64
    max_text_tokens: int = 512
    # Qwen3-VL image processor bounds, every kind (pixels per image after resize)
    min_pixels: int = 256 * 28 * 28 // 4
    max_pixels: int = 1280 * 28 * 28


# The DataConfig fields a synthetic sample is drawn from (both engines' seeded data reads them).
SYNTHETIC_DRAW_FIELDS = (
    "min_images",
    "max_images",
    "min_long_side_px",
    "max_long_side_px",
    "aspect_ratios",
    "min_text_tokens",
    "max_text_tokens",
)


@dataclass
class ClusterConfig:
    name: str = "local"
    gpu: str = "cpu"  # device name as the engine sees it, e.g. "NVIDIA GB200"
    compute_capability: float = 0.0  # 0 = no GPU
    gpus_per_node: int = 2  # on cluster=local: ranks per node (CPU processes or local GPUs)
    gpu_memory_gib: float = 0.0
    nvlink_domain_gpus: int = 1  # GPUs that share one NVLink domain (NVL72: 72)
    peak_bf16_flops: float = 0.0  # dense BF16 peak per GPU, the MFU denominator
    # Dense FP8 / FP4 peaks per GPU (0 = none): the precision's own MFU column (precision=fp8cs|fp8mx|nvfp4)
    peak_fp8_flops: float = 0.0
    peak_fp4_flops: float = 0.0
    default_dispatcher: str = "alltoall"
    is_gpu_cluster: bool = False


# --- precision -------------------------------------------------------------------------------


class Precision(StrEnum):
    """The decoder GEMMs' number format; moe_vlm/config/precision.py holds one profile per member."""

    bf16 = "bf16"  # BF16 everywhere (the perf recipes' *_bf16_config)
    fp8cs = "fp8cs"  # FP8 with per-tensor current scaling (*_fp8cs_config): Hopper and Blackwell
    fp8mx = "fp8mx"  # MXFP8, one E8M0 scale per 32 values (*_fp8mx_config): Blackwell only
    nvfp4 = "nvfp4"  # NVFP4, one E4M3 scale per 16 values: Blackwell only, no Qwen-VL perf recipe


@dataclass
class PrecisionConfig:
    name: str = "bf16"
    format: Precision = Precision.bf16


# --- MoE routing -----------------------------------------------------------------------------


class RouterDtype(StrEnum):
    fp32 = "fp32"
    fp64 = "fp64"
    bf16 = "bf16"  # no router dtype: softmax and top-k in the model's dtype (MCore None)


@dataclass
class RouterConfig:
    name: str = "real"
    # True: random router logits, every expert equally loaded whatever the tokens (MCore's
    # moe_router_force_load_balancing, "only for benchmark": transformer_config.py:812-814,
    # router.py:856-858). Bridge's perf recipes turn it on; runs with it are not ranked with
    # real-routing runs (moe-vlm report labels them).
    force_load_balancing: bool = False
    # null below = the recipe's value (every Qwen-VL recipe: fp32 router, aux loss 1e-3, dropless).
    # The router's softmax/top-k precision (MCore moe_router_dtype; bf16 = MCore's None, the model
    # dtype, which MCore warns about from 32 experts).
    dtype: RouterDtype | None = None
    aux_loss_coeff: float | None = None  # load-balancing loss weight; 0 = none
    # Tokens per expert = capacity_factor x (tokens x top-k / experts); the rest are dropped.
    # null = the recipe's (dropless); a value > 0 drops tokens.
    capacity_factor: float | None = None
    # Pad every expert's input to its capacity (drop-and-pad: static shapes, the 'moe' graph scope).
    pad_to_capacity: bool | None = None
    # The plan's routing load for dropless real routing: the fullest expert's tokens / the mean
    # (>= 1; a run's run.json router.load_factor measures it). Read by the predictor only, no engine.
    # null = not modelled (balanced load assumed, and the plan says so). Forced balance and a
    # capacity factor give the load themselves: then this is not used.
    assumed_load: float | None = None


# --- fusions, communication overlap, offload, garbage collection -------------------------------
# null = the recipe's value (what the Bridge perf recipe sets; the plan shows what the run gets).


class CrossEntropyFusion(StrEnum):
    te = "te"  # Transformer Engine's fused cross entropy (the perf recipes')
    native = "native"  # Megatron's fused vocab-parallel cross entropy
    off = "off"  # unfused: logits materialised in fp32 by the loss


@dataclass
class FusionConfig:
    name: str = "recipe"
    moe_permute_fusion: bool | None = None  # TE fused token permute/unpermute in the dispatcher
    moe_router_fusion: bool | None = None  # TE fused top-k + aux-loss scores in the router
    cross_entropy: CrossEntropyFusion | None = None  # cross_entropy_loss_fusion + its impl
    bias_activation_fusion: bool | None = None  # fused SwiGLU (bias + activation) in the MLPs


@dataclass
class OverlapConfig:
    name: str = "recipe"
    # Data-parallel: reduce-scatter of gradients during backward, all-gather of parameters during
    # forward (the Qwen-VL perf recipes turn both off; Megatron FSDP forces them on when it shards
    # gradients / parameters).
    grad_reduce: bool | None = None
    param_gather: bool | None = None
    # DP bucket size in PARAMETERS, not bytes (null: the recipe's; Bridge's 128 x 1024^2 when DP > 1)
    bucket_size: int | None = None
    # Gradients reduced (3D: also accumulated) in fp32 instead of bf16; 3D only (Megatron FSDP's
    # gradient dtype is its own setting). The perf recipes say false.
    grad_reduce_in_fp32: bool | None = None
    # Tensor-parallel GEMM/communication overlap through TE userbuffers: needs TP >= 2 and sequence
    # parallelism (the perf recipes ask for it; Bridge turns it off where TP = 1).
    tp_comm: bool | None = None


@dataclass
class OffloadConfig:
    name: str = "none"
    # Decoder layers whose saved activations live in pinned host memory between forward and backward
    # (MCore cpu_offloading_num_layers, via TE's CPU offload). 0 = off; < num_layers; PP = 1.
    activation_layers: int = 0
    # Fraction of the optimizer (Adam moments, fp32 update) run on the CPU (optimizer_cpu_offload +
    # optimizer_offload_fraction; the distributed optimizer, which every family uses). 0 = off.
    optimizer_fraction: float = 0.0


@dataclass
class GcConfig:
    name: str = "recipe"
    # Python's garbage collector off, collected every `interval` steps on every rank at once
    # (train.manual_gc; the perf recipes: on, every 100 steps). false = Python's automatic GC.
    manual: bool | None = None
    interval: int | None = None  # steps between collections; 0 = never during training


# --- profiling and experiment logging ----------------------------------------------------------


class Profiler(StrEnum):
    """What records the profiled steps (moe_vlm/record/profiling.py; Bridge's ProfilingConfig on Megatron)."""

    none = "none"
    nsys = "nsys"  # Nsight Systems: the launcher wraps srun; the CUDA profiler API opens the window
    torch = "torch"  # torch.profiler: a Chrome trace per profiled rank -> the report's per-module table
    memory = "memory"  # CUDA allocator history from the start; a snapshot at the window's end and on OOM


@dataclass
class ProfilingConfig:
    name: str = "none"
    tool: Profiler = Profiler.none
    # Global ranks that record (nsys runs only on them); empty = every rank.
    ranks: list[int] = field(default_factory=lambda: [0])
    # Optimizer steps recorded, 1-based and inclusive: [first, last] or [step]; empty = the first
    # step after warm-up. The steady window leaves the profiled steps out (moe_vlm/record/profiling.py).
    steps: list[int] = field(default_factory=list)


class ExperimentLogger(StrEnum):
    none = "none"
    tensorboard = "tensorboard"  # event files in <run_dir>/tensorboard
    wandb = "wandb"  # Weights & Biases; WANDB_API_KEY from the environment
    mlflow = "mlflow"  # MLflow; MLFLOW_TRACKING_* credentials from the environment


@dataclass
class LoggerConfig:
    name: str = "none"
    backend: ExperimentLogger = ExperimentLogger.none
    project: str = "moe_vlm"  # W&B project / MLflow experiment
    run_name: str | None = None  # W&B / MLflow run name; null = model, cluster and layout (explog.run_name)
    entity: str | None = None  # W&B entity (team); null = the API key's default
    # MLflow tracking server; null = mlflow's own choice (MLFLOW_TRACKING_URI, else its default store)
    tracking_uri: str | None = None


# --- a Bridge perf recipe reproduced ----------------------------------------------------------


@dataclass
class RecipeConfig:
    """The Bridge perf recipe a run reproduces (`recipe=<name>`; conf/recipe/ is generated from the
    installed library by scripts/gen_recipes.py). Knobs given on the command line override it."""

    name: str = "none"  # the recipe function without `_config`; none = no recipe selected
    module: str = ""  # where the function lives (megatron.bridge.perf_recipes.qwen_vl.<gpu>.<family>)
    # Every knob the recipe sets, dotted key -> value as the option writes it (group choices as
    # `<group>.name`): the plan lists each one a run differs in (moe_vlm/knobs/recipes.py).
    knobs: dict[str, Any] = field(default_factory=dict)


@dataclass
class CardConfig:
    """A published card row a run reproduces (`card=<row>`, conf/card/; the `sweep=card_*` presets
    choose one). The option sets the knobs the run uses; these fields say what the row published
    and how the run differs from the row as written, each difference with its reason."""

    row: str = "none"  # the row's key in its card; none = no card row
    source: str = ""  # the card it comes from
    published_tflops_per_gpu: float | None = None  # the row's figure (the card's own count)
    published_mfu: float | None = None  # as a fraction; null where the card gives none
    validated_on: str = ""  # the card's date for the figure
    # The row as the card writes it, dotted knob key -> value (group choices as `<group>.name`); a
    # setting no option expresses is a string that says so. The plan lists each one the run differs in.
    as_written: dict[str, Any] = field(default_factory=dict)
    # knob -> why the option runs it otherwise (the rule the row as written breaks).
    reasons: dict[str, str] = field(default_factory=dict)
    # knob -> why the option chose its value where the card says nothing (the plan shows the value).
    assumed: dict[str, str] = field(default_factory=dict)


class DryRun(Enum):
    """dry_run=false runs; true plans (a sweep of more than a few points prints one line per point
    and writes each plan to its directory); full prints every plan in full."""

    off = "false"
    plan = "true"
    full = "full"


def dry_run_mode(value: Any) -> DryRun:
    """The DryRun a `dry_run` value means; BadInput (one line) for anything else."""
    if isinstance(value, bool):
        return DryRun.plan if value else DryRun.off
    if isinstance(value, str) and value.lower() in {m.value for m in DryRun}:
        return DryRun(value.lower())
    raise BadInput(
        f"dry_run={value!r}: not one of false, true, full. Fix: dry_run=true (plan; one line per point "
        "in a sweep of more than 8), dry_run=full (every plan in full) or dry_run=false (run)."
    )


def knob(default: Any, help: str) -> Any:
    """A top-level knob: its default and the line `python train.py --help` shows for it (moe_vlm/cli/train_help.py).
    conf/train.yaml repeats none of them: Hydra fills every key from this schema."""
    return field(default=default, metadata={"help": help})


@dataclass
class RunKnobs:
    """The top-level knobs the RunSpec carries as they are: spec.RunSpec extends this class, so a
    field added here is a key of every run (train.py KEY=VALUE), a field of every RunSpec and a
    line of --help, declared once."""

    mbs: int = knob(1, "micro-batch size per rank")
    train_iters: int = knob(8, "optimizer steps")
    warmup_steps: int = knob(2, "steps excluded from the steady-state window")
    seed: int = knob(1234, "model init and data draws")
    lr: float = knob(3e-4, "peak learning rate")
    weight_decay: float = knob(0.033, "AdamW decoupled weight decay (the Bridge perf recipes' 0.033)")


_SHORTCUT = "shortcut into the parallelism group; null keeps the group's value"


@dataclass
class TrainConfig(RunKnobs):
    model: ModelConfig = MISSING
    parallelism: ParallelismConfig = MISSING
    dispatcher: DispatcherConfig = MISSING
    recompute: RecomputeConfig = MISSING
    cuda_graph: CudaGraphConfig = MISSING
    vision_freeze: VisionFreezeConfig = MISSING
    data: DataConfig = MISSING
    cluster: ClusterConfig = MISSING
    router: RouterConfig = MISSING
    precision: PrecisionConfig = MISSING
    profiling: ProfilingConfig = MISSING
    logger: LoggerConfig = MISSING
    fusion: FusionConfig = MISSING
    overlap: OverlapConfig = MISSING
    offload: OffloadConfig = MISSING
    gc: GcConfig = MISSING
    # The knobs the spec resolves (RunKnobs above are carried as they are).
    recipe: RecipeConfig = field(default_factory=RecipeConfig)  # recipe=<name> fills it; none by default
    card: CardConfig = field(default_factory=CardConfig)  # card=<row> fills it; none by default
    engine: Engine = knob(
        Engine.auto, "auto | torch | megatron (auto: megatron on GPU clusters, torch on cluster=local)"
    )
    # false | true | full (DryRun): a bool before `full` existed, so typed Any; dry_run_mode checks it.
    dry_run: Any = knob(
        False,
        "true: compose, validate, print the plan on one screen (plan.txt holds all), train nothing; "
        "full: every plan in full",
    )
    gbs: int | None = knob(None, "global batch; null = model default rounded up to a multiple of MBS x DP")
    seq_length: int | None = knob(None, "null = model default")
    nodes: int = knob(1, "nodes of the job")
    nproc: int | None = knob(None, "ranks per node; null = cluster.gpus_per_node")
    tp: int | None = knob(None, _SHORTCUT)
    pp: int | None = knob(None, _SHORTCUT)
    vp: int | None = knob(None, _SHORTCUT)
    cp: int | None = knob(None, _SHORTCUT)
    ep: int | None = knob(None, _SHORTCUT)
    etp: int | None = knob(None, _SHORTCUT)


def register() -> None:
    ConfigStore.instance().store(name="train_schema", node=TrainConfig)


register()


def upgrade_recorded(config: dict[str, Any]) -> dict[str, Any]:
    """A recorded (run.json) config in today's schema, where a renamed knob maps one to one:
    `data.pack_sequences: false` (before data.packing) is `data.packing: none`. Its `true` filled
    rows across samples with attention crossing them, which no option reproduces: it is kept, so
    the config does not build and its readers say why."""
    data = config.get("data")
    if isinstance(data, dict) and data.get("pack_sequences") is False and "packing" not in data:
        data = {k: v for k, v in data.items() if k != "pack_sequences"} | {"packing": Packing.none.value}
        return {**config, "data": data}
    return config
