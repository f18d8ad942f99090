"""RunSpec: the resolved knobs plus every derived number, computed once.

Everything after composition (rules, plan, engines, metrics, memory, advise) reads a RunSpec,
never raw Hydra config, so a derived number (DP, accumulation steps, EP, the pipeline stage
split, the micro-batches in flight, sequence parallelism as the engine runs it) has exactly
one definition.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from enum import Enum
from typing import Any

from omegaconf import DictConfig, OmegaConf

from moe_vlm.config.arch import ArchProfile, profile
from moe_vlm.config.precision import profile as precision_profile
from moe_vlm.config.schema import (
    CardConfig,
    ClusterConfig,
    CudaGraphConfig,
    DataConfig,
    DispatcherConfig,
    DryRun,
    Engine,
    FusionConfig,
    GcConfig,
    LoggerConfig,
    ModelConfig,
    OffloadConfig,
    OverlapConfig,
    Packing,
    ParallelismConfig,
    ParallelismFamily,
    PrecisionConfig,
    ProfilingConfig,
    RecipeConfig,
    RecomputeConfig,
    RouterConfig,
    RunKnobs,
    TrainConfig,
    VisionFreezeConfig,
    dry_run_mode,
    upgrade_recorded,
)


@dataclass(frozen=True)
class Layout:
    """How the world is cut up. Sizes that do not divide evenly are floored; rules report them."""

    world_size: int
    nodes: int
    ranks_per_node: int
    tp: int
    pp: int
    vp: int
    cp: int
    ep: int
    etp: int
    dp: int  # world / (TP x PP x CP)
    expert_dp: int  # world / (EP x ETP x PP)
    ep_auto: bool  # EP was sized automatically (ep=0)
    nvlink_domain_gpus: int
    ep_tp_group: int  # ranks one token can be dispatched across: EP x TP
    nvlink_domains_spanned: int  # domains the whole job touches

    @property
    def ep_tp_inside_nvlink(self) -> bool:
        return self.ep_tp_group <= self.nvlink_domain_gpus


@dataclass(frozen=True)
class PipelineSplit:
    """Decoder layers over the pipeline ranks, as Megatron cuts them.

    num_layers_in_first/last_pipeline_stage where set (``first``/``last``, 0 = unset), the rest
    evenly over the middle stages, and within a stage evenly over its VP chunks.
    """

    layers: int
    pp: int
    vp: int
    first: int
    last: int

    @property
    def middle_stages(self) -> int:
        return self.pp - (self.first > 0) - (self.last > 0)

    @property
    def middle_layers(self) -> int:
        return self.layers - self.first - self.last

    @property
    def fits(self) -> bool:
        """The first/last stage layers leave a rest the middle stages can hold (none without them)."""
        middle_stages, middle_layers = self.middle_stages, self.middle_layers
        return not (middle_stages < 0 or (middle_stages == 0 and middle_layers != 0) or middle_layers < 0)

    @property
    def even(self) -> bool:
        """The middle layers divide over the middle stages x VP chunks, and a set first/last stage's
        layers over its VP chunks: Megatron Core asserts both when it builds a stage
        (megatron/core/transformer/transformer_block.py:122-125 the middle, :136-140 a set first/last
        stage's count, :166-169 its division by VP)."""
        chunks = self.vp if self.pp > 1 else 1
        if any(stage % chunks for stage in (self.first, self.last) if stage > 0):
            return False
        return self.middle_stages <= 0 or self.middle_layers % (self.middle_stages * chunks) == 0

    @property
    def counts(self) -> tuple[int, ...]:
        """Decoder layers held by each pipeline rank (a rank's virtual chunks summed)."""
        pp = max(self.pp, 1)
        if pp == 1:
            return (self.layers,)
        middle_stages = self.middle_stages
        even = self.middle_layers // middle_stages if middle_stages > 0 else 0
        counts = [even] * pp
        if self.first:
            counts[0] = self.first
        if self.last:
            counts[-1] = self.last
        return tuple(counts)

    def indices(self, stage: int) -> range:
        """The decoder layer indices of pipeline rank `stage`."""
        counts = self.counts
        start = sum(counts[:stage])
        return range(start, start + counts[stage])

    @classmethod
    def balanced(cls, layers: int, pp: int) -> PipelineSplit:
        """A split of `layers` over `pp` stages that Megatron accepts: even when it divides, else equal
        first and last stages (vision and embedding sit on the first, logits on the last) around an even
        middle; PP 2 halves. The even split when nothing balances (L004 then says why)."""
        even = cls(layers, pp, 1, 0, 0)
        if pp <= 1 or even.even:
            return even
        if pp == 2:
            candidates = [cls(layers, pp, 1, layers // 2, layers - layers // 2)]
        else:
            candidates = [cls(layers, pp, 1, edge, edge) for edge in range(layers // pp, 0, -1)]
        usable = (c for c in candidates if c.fits and c.even and min(c.counts) > 0)
        return next(usable, even)


# Not frozen: a frozen dataclass cannot extend RunKnobs, which TrainConfig (a Hydra structured config,
# assigned to while composing) extends too. Only build_spec makes a RunSpec; levers use replace().
@dataclass(kw_only=True)
class RunSpec(RunKnobs):
    """Every knob resolved, plus what is derived from them. The RunKnobs fields (mbs, lr, seed, ...)
    are carried as the user set them; the fields below are resolved (engine, gbs, seq_length, the
    shortcuts into `layout` and `parallelism`)."""

    model: ModelConfig
    parallelism: ParallelismConfig
    dispatcher: DispatcherConfig
    recompute: RecomputeConfig
    cuda_graph: CudaGraphConfig
    freeze: VisionFreezeConfig
    data: DataConfig
    cluster: ClusterConfig
    router: RouterConfig
    precision: PrecisionConfig
    profiling: ProfilingConfig
    logger: LoggerConfig
    fusion: FusionConfig
    overlap: OverlapConfig
    offload: OffloadConfig
    gc: GcConfig
    engine: Engine  # resolved: torch | megatron
    engine_requested: Engine  # as the user set it: auto | torch | megatron
    dry_run: bool
    gbs: int
    gbs_is_default: bool
    seq_length: int
    layout: Layout
    # The Bridge perf recipe this run reproduces (recipe=<name>); name "none" when there is none.
    recipe: RecipeConfig = field(default_factory=RecipeConfig)
    # The published card row this run reproduces (card=<row>); row "none" when there is none.
    card: CardConfig = field(default_factory=CardConfig)

    @property
    def accumulation_steps(self) -> int:
        denominator = self.mbs * self.layout.dp
        return self.gbs // denominator if denominator > 0 else 0

    @property
    def family(self) -> ParallelismFamily:
        return self.parallelism.family

    @property
    def arch_profile(self) -> ArchProfile:
        return profile(self.model.arch)

    @property
    def sequence_parallel(self) -> bool:
        """Sequence parallelism as the Megatron engine runs it; the knob is parallelism.sequence_parallel.

        Said up front instead of changed behind the plan's back: Bridge's TransformerConfig.finalize
        turns it off when TP = 1 (megatron/bridge/models/transformer_config.py:179-180), and a
        provider that forces it (Qwen3VLMoEModelProvider.finalize,
        megatron/bridge/models/qwen_vl/qwen3_vl_provider.py:302-306) turns it on whenever TP > 1.
        The torch engine has no sequence parallelism (and no TP).
        """
        if self.layout.tp <= 1:
            return False
        return self.parallelism.sequence_parallel or self.arch_profile.provider_forces_sp

    @property
    def tp_comm_overlap(self) -> bool:
        """Whether Bridge runs TE userbuffer TP overlap: needs TP >= 2 with sequence parallelism
        (megatron/bridge/training/comm_overlap.py:442-451); overlap.tp_comm=null keeps the recipe's, on
        in every Qwen-VL perf recipe for Blackwell (CommOverlapConfig(tp_comm_overlap=True) in
        perf_recipes/qwen_vl/{b200,gb200,gb300,b300}/*.py; tests/megatron/test_runtime_refusals.py
        holds it to each)."""
        if self.layout.tp < 2 or not self.sequence_parallel:
            return False
        if self.overlap.tp_comm is not None:
            return self.overlap.tp_comm
        return self.cluster.compute_capability >= 10.0

    @property
    def collate_padding_multiple(self) -> int:
        """The multiple Bridge pads a VLM batch's sequence to, and with in-batch packing every packed
        sample (megatron/bridge/training/config.py:1213-1220, handed to the packer at :1239):
        lcm(2 x CP if CP > 1, CP x TP with sequence parallelism). Each CP rank holds its share of the
        TP-sharded sequence, so SP's multiple is TP per CP rank: CP x TP, not TP. validate refuses a
        seq_length that is not a multiple of it (:1221-1230; rule L007)."""
        cp, tp = self.layout.cp, self.layout.tp
        cp_multiple = 2 * cp if cp > 1 else 1
        return math.lcm(cp_multiple, cp * tp if self.sequence_parallel else 1)

    @property
    def packed_micro_batches(self) -> bool:
        """A micro-batch reaches the model as one THD row of packed samples (data.packing=in_batch or
        buffer): on the Megatron engine that is Bridge's vlm_step with variable_seq_lengths
        (knobs/bridge_fields.py), which the rules that refuse variable lengths read (A010, G010)."""
        return self.data.packing is not Packing.none

    @property
    def packed_row_length(self) -> int:
        """data.packing=buffer: the positions of one packed row, seq_length rounded up to a multiple of
        the collate padding multiple (each packed sample's CP/SP split) and of the precision's token
        multiple per rank: TE checks a GEMM's LOCAL input (transformer_engine/pytorch/module/
        linear.py:472, before SP's all-gather), one CP x (TP under SP) share of the row
        (perf/rank_shapes.py), so the row is token_multiple x CP x TP_sp long, whatever the MBS."""
        sp_tp = self.layout.tp if self.sequence_parallel else 1
        per_rank = precision_profile(self.precision.format).token_multiple
        multiple = math.lcm(self.collate_padding_multiple, per_rank * self.layout.cp * sp_tp)
        return -(-self.seq_length // multiple) * multiple

    @property
    def pipeline(self) -> PipelineSplit:
        par = self.parallelism
        return PipelineSplit(
            self.model.num_layers,
            self.layout.pp,
            self.layout.vp,
            par.first_stage_layers,
            par.last_stage_layers,
        )

    @property
    def stage_layer_counts(self) -> tuple[int, ...]:
        return self.pipeline.counts

    def stage_layer_indices(self, stage: int) -> range:
        return self.pipeline.indices(stage)

    @property
    def in_flight_micro_batches(self) -> float:
        """Micro-batches whose activations the first stage holds at its peak (Megatron 1F1B).

        Interleaving multiplies by 1 + (PP-1)/(PP x VP) (Megatron-LM theoretical_memory_usage.py).
        """
        pp, vp = max(self.layout.pp, 1), max(self.layout.vp, 1)
        if pp == 1:
            return 1.0
        micro_batches = max(self.accumulation_steps, 1)
        in_flight = float(min(pp, micro_batches))
        if vp > 1:
            in_flight *= 1 + (pp - 1) / (pp * vp)
        return in_flight

    def to_dict(self) -> dict[str, Any]:
        return _plain(asdict(self)) | {"accumulation_steps": self.accumulation_steps}

    @classmethod
    def from_config(cls, cfg: DictConfig | TrainConfig) -> RunSpec:
        train: TrainConfig = OmegaConf.to_object(cfg) if isinstance(cfg, DictConfig) else cfg  # type: ignore[assignment]
        return build_spec(train)

    @classmethod
    def from_recorded(cls, config: dict[str, Any]) -> RunSpec:
        """The RunSpec of a config a run recorded (run.json, point.json), in today's schema
        (schema.upgrade_recorded). Raises what composing it raises when it no longer builds."""
        merged = OmegaConf.merge(OmegaConf.structured(TrainConfig), upgrade_recorded(dict(config)))
        return cls.from_config(merged)  # type: ignore[arg-type]


def _plain(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value


def resolve_engine(requested: Engine, cluster: ClusterConfig) -> Engine:
    if requested is not Engine.auto:
        return requested
    return Engine.megatron if cluster.is_gpu_cluster else Engine.torch


def auto_expert_parallel(
    num_experts: int, world_size: int, pp: int, etp: int, tp: int, nvlink_domain_gpus: int, engine: Engine
) -> int:
    """Largest EP that divides the experts and the expert-parallel world and keeps EP x TP on NVLink.

    The guide sizes EP to the expert topology ("often large"), but never past the NVLink
    domain, where all-to-all traffic would fall back to the scale-out network.
    """
    if engine is Engine.torch:
        return 1  # the embedded engine replicates experts; it has no expert parallelism
    room = world_size // max(pp * etp, 1)
    limit = max(nvlink_domain_gpus // max(tp, etp, 1), 1)
    best = 1
    for candidate in range(1, num_experts + 1):
        if num_experts % candidate == 0 and room % candidate == 0 and candidate <= limit:
            best = candidate
    return best


def build_spec(train: TrainConfig) -> RunSpec:
    par = train.parallelism
    cluster = train.cluster
    model = train.model
    engine = resolve_engine(train.engine, cluster)

    tp = train.tp if train.tp is not None else par.tp
    pp = train.pp if train.pp is not None else par.pp
    vp = train.vp if train.vp is not None else par.vp
    cp = train.cp if train.cp is not None else par.cp
    etp = train.etp if train.etp is not None else par.etp
    ep_requested = train.ep if train.ep is not None else par.ep
    ranks_per_node = train.nproc if train.nproc is not None else cluster.gpus_per_node
    world = train.nodes * ranks_per_node

    ep_auto = ep_requested == 0
    ep = (
        auto_expert_parallel(model.num_experts, world, pp, etp, tp, cluster.nvlink_domain_gpus, engine)
        if ep_auto
        else ep_requested
    )
    dp = world // (tp * pp * cp) if tp > 0 and pp > 0 and cp > 0 else 0
    expert_dp = world // (ep * etp * pp) if ep > 0 and etp > 0 and pp > 0 else 0

    layout = Layout(
        world_size=world,
        nodes=train.nodes,
        ranks_per_node=ranks_per_node,
        tp=tp,
        pp=pp,
        vp=vp,
        cp=cp,
        ep=ep,
        etp=etp,
        dp=dp,
        expert_dp=expert_dp,
        ep_auto=ep_auto,
        nvlink_domain_gpus=cluster.nvlink_domain_gpus,
        ep_tp_group=ep * tp,
        nvlink_domains_spanned=math.ceil(world / max(cluster.nvlink_domain_gpus, 1)),
    )

    step = train.mbs * dp
    if train.gbs is None and step > 0:
        gbs = math.ceil(model.default_gbs / step) * step
    else:
        gbs = train.gbs if train.gbs is not None else model.default_gbs

    # The engine is what runs the job, so the spec carries resolved copies of the shortcut knobs.
    resolved_par = ParallelismConfig(
        **{**vars(par), "tp": tp, "pp": pp, "vp": vp, "cp": cp, "ep": ep, "etp": etp}
    )
    return RunSpec(
        model=model,
        parallelism=resolved_par,
        dispatcher=train.dispatcher,
        recompute=train.recompute,
        cuda_graph=train.cuda_graph,
        freeze=train.vision_freeze,
        data=train.data,
        cluster=cluster,
        router=train.router,
        precision=train.precision,
        profiling=train.profiling,
        logger=train.logger,
        fusion=train.fusion,
        overlap=train.overlap,
        offload=train.offload,
        gc=train.gc,
        engine=engine,
        engine_requested=train.engine,
        dry_run=dry_run_mode(train.dry_run) is not DryRun.off,
        gbs=gbs,
        gbs_is_default=train.gbs is None,
        seq_length=train.seq_length if train.seq_length is not None else model.default_seq_length,
        layout=layout,
        **{f.name: getattr(train, f.name) for f in fields(RunKnobs)},
        recipe=train.recipe,
        card=train.card,
    )


def hybridep_topology(spec: RunSpec) -> dict[str, int]:
    """HybridEP env settings implied by the cluster and layout (what Bridge's GB200 recipes set)."""
    cluster = spec.cluster
    return {
        "NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN": min(spec.layout.ep, cluster.nvlink_domain_gpus),
        "NVLINK_DOMAIN_SIZE": cluster.nvlink_domain_gpus,
        "USE_MNNVL": int(cluster.nvlink_domain_gpus > cluster.gpus_per_node),
    }
