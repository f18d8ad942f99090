"""The validation catalogue: every rule the engine would enforce after a long queue wait,
plus the field guide's warnings, checked before anything runs.

Each rule has a stable code, a level, and a check that yields violations naming the keys
involved and a fix. Codes are grouped by concern:

    C  config values          L  layout arithmetic       F  FSDP
    D  MoE dispatcher         G  CUDA graphs             R  recompute
    E  engine support         A  data                    W  field-guide warnings
    M  memory (moe_vlm/memory.py's per-GPU estimate against cluster.gpu_memory_gib)

Engine rules cite where Megatron enforces them (MLM = Megatron-LM, MB = Megatron-Bridge).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from moe_vlm.engines.bridge_fields import effective_sequence_parallel
from moe_vlm.memory import (
    GPU_ESTIMATE_UNCERTAINTY,
    SELECTIVE_DEFAULT,
    THIN_HEADROOM_FRACTION,
    MemoryEstimate,
    estimate,
    fits_after,
    with_recompute,
)
from moe_vlm.schema import (
    CudaGraphImpl,
    DataKind,
    FlexBackend,
    RecomputeGranularity,
    RecomputeMethod,
    ShardingStrategy,
    TokenDispatcher,
)
from moe_vlm.spec import RunSpec, hybridep_topology


class Level(Enum):
    error = "error"
    warning = "warning"


@dataclass(frozen=True)
class Violation:
    keys: tuple[str, ...]
    message: str
    fix: str


@dataclass(frozen=True)
class Finding:
    code: str
    level: Level
    keys: tuple[str, ...]
    message: str
    fix: str

    @property
    def is_error(self) -> bool:
        return self.level is Level.error

    def line(self) -> str:
        return (
            f"{self.level.value.upper()} {self.code} [{', '.join(self.keys)}]: {self.message} Fix: {self.fix}"
        )

    def to_dict(self) -> dict[str, object]:
        return {
            "code": self.code,
            "level": self.level.value,
            "keys": list(self.keys),
            "message": self.message,
            "fix": self.fix,
        }


Check = Callable[[RunSpec], Iterator[Violation]]


@dataclass(frozen=True)
class Rule:
    code: str
    level: Level
    title: str
    check: Check


CATALOGUE: list[Rule] = []


def rule(code: str, level: Level, title: str) -> Callable[[Check], Check]:
    def register(check: Check) -> Check:
        assert all(existing.code != code for existing in CATALOGUE), f"duplicate rule code {code}"
        CATALOGUE.append(Rule(code, level, title, check))
        return check

    return register


def validate(spec: RunSpec) -> list[Finding]:
    """Every finding at once, errors first, in catalogue order."""
    findings = [Finding(r.code, r.level, v.keys, v.message, v.fix) for r in CATALOGUE for v in r.check(spec)]
    return sorted(findings, key=lambda f: f.level is not Level.error)


def errors(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.is_error]


SELECTIVE_RECOMPUTE_MODULES = (
    "core_attn",
    "moe_act",
    "layernorm",
    "mla_up_proj",
    "mlp",
    "moe",
    "shared_experts",
    "gdn_norm_out",
)
CUDA_GRAPH_SCOPES = ("attn", "mlp", "moe", "moe_router", "moe_preprocess", "mamba")
PARALLEL_FAMILIES = ("fsdp", "3d")


def _uses_graphs(spec: RunSpec) -> bool:
    return spec.cuda_graph.impl is not CudaGraphImpl.none


def _flex(spec: RunSpec) -> bool:
    return spec.dispatcher.token_dispatcher is TokenDispatcher.flex


# --- C: config values -------------------------------------------------------------------


@rule("C001", Level.error, "sizes must be positive")
def _positive_sizes(spec: RunSpec) -> Iterator[Violation]:
    layout = spec.layout
    sizes = {
        "mbs": spec.mbs,
        "gbs": spec.gbs,
        "seq_length": spec.seq_length,
        "nodes": layout.nodes,
        "nproc": layout.ranks_per_node,
        "train_iters": spec.train_iters,
        "tp": layout.tp,
        "pp": layout.pp,
        "vp": layout.vp,
        "cp": layout.cp,
        "etp": layout.etp,
    }
    for key, value in sizes.items():
        if value < 1:
            yield Violation((key,), f"{key}={value} must be a positive integer.", f"set {key} to 1 or more.")
    if layout.ep < 0:
        yield Violation(
            ("ep",), f"ep={layout.ep} must be >= 0.", "set ep=0 (sized to the experts) or a positive EP."
        )
    if spec.warmup_steps < 0:
        yield Violation(("warmup_steps",), "warmup_steps must be >= 0.", "set warmup_steps=0 or more.")


@rule("C002", Level.error, "parallelism.family must be fsdp or 3d")
def _family(spec: RunSpec) -> Iterator[Violation]:
    if spec.family not in PARALLEL_FAMILIES:
        yield Violation(
            ("parallelism.family",),
            f"parallelism.family={spec.family!r} is not one of {list(PARALLEL_FAMILIES)}.",
            "choose parallelism=fsdp or parallelism=3d.",
        )


@rule("C003", Level.error, "warm-up must leave a steady window")
def _steady_window(spec: RunSpec) -> Iterator[Violation]:
    if spec.train_iters >= 1 and spec.warmup_steps >= spec.train_iters:
        yield Violation(
            ("warmup_steps", "train_iters"),
            f"warmup_steps={spec.warmup_steps} leaves no steady-state steps out of train_iters={spec.train_iters}.",
            f"raise train_iters above {spec.warmup_steps} or lower warmup_steps.",
        )


@rule("C004", Level.error, "at least one module must train")
def _something_trains(spec: RunSpec) -> Iterator[Violation]:
    f = spec.freeze
    if f.vision and f.projector and f.language:
        yield Violation(
            ("vision_freeze.language",),
            "vision, projector and language model are all frozen: nothing would train.",
            "set vision_freeze.language=false or choose a lighter vision_freeze.",
        )


# --- L: layout arithmetic --------------------------------------------------------------


@rule("L001", Level.error, "world divisible by TP x PP x CP")
def _world_tp_pp_cp(spec: RunSpec) -> Iterator[Violation]:
    lay = spec.layout
    model_parallel = lay.tp * lay.pp * lay.cp
    if model_parallel > 0 and lay.world_size % model_parallel:
        yield Violation(
            ("nodes", "tp", "pp", "cp"),
            f"world size {lay.world_size} (nodes={lay.nodes} x {lay.ranks_per_node}/node) is not divisible "
            f"by TP x PP x CP = {model_parallel}.",
            "change nodes, or pick tp/pp/cp whose product divides the world size.",
        )


@rule("L002", Level.error, "world divisible by ETP x EP x PP")
def _world_etp_ep_pp(spec: RunSpec) -> Iterator[Violation]:
    lay = spec.layout
    expert_parallel = lay.etp * lay.ep * lay.pp
    if expert_parallel > 0 and lay.world_size % expert_parallel:
        yield Violation(
            ("nodes", "ep", "etp", "pp"),
            f"world size {lay.world_size} is not divisible by ETP x EP x PP = {expert_parallel}.",
            "change nodes, or pick ep/etp/pp whose product divides the world size (ep=0 sizes EP for you).",
        )


@rule("L003", Level.error, "experts divisible by EP")
def _experts_ep(spec: RunSpec) -> Iterator[Violation]:
    ep = spec.layout.ep
    if ep > 0 and spec.model.num_experts % ep:
        yield Violation(
            ("ep",),
            f"{spec.model.name} has {spec.model.num_experts} experts, not divisible by EP={ep}.",
            "pick an EP that divides the expert count, or ep=0 to size it automatically.",
        )


@rule("L004", Level.error, "decoder layers split evenly over PP x VP stages")
def _layers_pp_vp(spec: RunSpec) -> Iterator[Violation]:
    lay = spec.layout
    par = spec.parallelism
    first, last = par.first_stage_layers, par.last_stage_layers
    middle_stages = lay.pp - (first > 0) - (last > 0)
    middle_layers = spec.model.num_layers - first - last
    if lay.pp < 1 or lay.vp < 1:
        return
    if middle_stages < 0 or (middle_stages == 0 and middle_layers != 0) or middle_layers < 0:
        yield Violation(
            ("parallelism.first_stage_layers", "parallelism.last_stage_layers", "pp"),
            f"first/last stage layers ({first}/{last}) do not fit {spec.model.num_layers} layers over PP={lay.pp}.",
            "lower first_stage_layers/last_stage_layers or raise pp.",
        )
        return
    if middle_stages > 0 and middle_layers % (middle_stages * lay.vp):
        uneven = " (after the first/last stage layers)" if first or last else ""
        yield Violation(
            ("pp", "vp"),
            f"{middle_layers} decoder layers{uneven} do not split evenly over {middle_stages} stages x VP={lay.vp}.",
            "pick pp/vp that divide the layer count, or set parallelism.first_stage_layers / "
            "last_stage_layers for an uneven split.",
        )


@rule("L005", Level.error, "TP divides the attention heads; query groups a multiple or divisor of TP (MLM)")
def _heads_tp(spec: RunSpec) -> Iterator[Violation]:
    # MCore splits the heads over TP ranks and, with fewer KV groups than ranks, replicates them
    # (TransformerConfig: num_query_groups must be a multiple or divisor of TP).
    tp = spec.layout.tp
    model = spec.model
    if tp < 1:
        return
    groups = model.num_query_groups
    if model.num_attention_heads % tp or (groups % tp and tp % groups):
        yield Violation(
            ("tp",),
            f"TP={tp} must divide the {model.num_attention_heads} attention heads of {model.name}, and its "
            f"{groups} query groups must be a multiple or a divisor of TP.",
            f"pick tp from the divisors of {math.gcd(model.num_attention_heads, groups)} or a multiple of "
            f"{groups} that divides {model.num_attention_heads}.",
        )


@rule("L006", Level.error, "GBS divisible by MBS x DP")
def _gbs(spec: RunSpec) -> Iterator[Violation]:
    step = spec.mbs * spec.layout.dp
    if step > 0 and spec.gbs % step:
        yield Violation(
            ("gbs", "mbs"),
            f"GBS={spec.gbs} is not a multiple of MBS x DP = {spec.mbs} x {spec.layout.dp} = {step}.",
            f"set gbs to a multiple of {step} (or gbs=null to round the model default).",
        )


@rule("L007", Level.error, "sequence length divisible by the CP/SP padding multiple (MB ConfigContainer)")
def _seq_cp(spec: RunSpec) -> Iterator[Violation]:
    # Bridge pads VLM batches to lcm(2 x CP, TP x CP with sequence parallelism) and rejects a
    # seq_length that is not a multiple of it.
    lay = spec.layout
    if lay.cp < 1 or lay.tp < 1:
        return
    multiple = 2 * lay.cp if lay.cp > 1 else 1
    if spec.engine == "megatron" and lay.tp > 1 and effective_sequence_parallel(spec):
        multiple = math.lcm(multiple, lay.tp * lay.cp)
    if multiple > 1 and spec.seq_length % multiple:
        yield Violation(
            ("seq_length", "cp", "tp"),
            f"seq_length={spec.seq_length} must be a multiple of {multiple} "
            f"(2 x CP = {2 * lay.cp if lay.cp > 1 else 1}; TP x CP = {lay.tp * lay.cp} with sequence "
            "parallelism).",
            f"round seq_length to a multiple of {multiple}.",
        )


@rule("L008", Level.error, "virtual pipeline needs PP > 1")
def _vp_needs_pp(spec: RunSpec) -> Iterator[Violation]:
    if spec.layout.vp > 1 and spec.layout.pp <= 1:
        yield Violation(("vp", "pp"), "vp > 1 (interleaved pipeline) needs pp > 1.", "set vp=1 or raise pp.")


@rule("L009", Level.warning, "EP x TP wants sequence parallelism (MLM ModelParallelConfig warns)")
def _ep_tp_sp(spec: RunSpec) -> Iterator[Violation]:
    lay = spec.layout
    if lay.ep > 1 and lay.tp > 1 and not spec.parallelism.sequence_parallel:
        forced = spec.model.arch == "qwen3_vl_moe"
        yield Violation(
            ("parallelism.sequence_parallel", "tp", "ep"),
            "Megatron says sequence parallelism must be used when expert and tensor parallelism are combined"
            + (" (the Qwen3-VL-MoE provider turns it on for TP > 1)." if forced else " (it only warns)."),
            "set parallelism.sequence_parallel=true.",
        )


@rule("L010", Level.error, "ETP must divide the expert FFN size")
def _etp_ffn(spec: RunSpec) -> Iterator[Violation]:
    etp = spec.layout.etp
    if etp > 1 and spec.model.moe_ffn_hidden_size % etp:
        yield Violation(
            ("etp",),
            f"ETP={etp} does not divide the expert FFN size {spec.model.moe_ffn_hidden_size}.",
            "pick etp from the divisors of the expert FFN size, or etp=1.",
        )


@rule("L011", Level.error, "one rank per GPU on GPU clusters")
def _ranks_per_gpu(spec: RunSpec) -> Iterator[Violation]:
    cluster = spec.cluster
    if cluster.is_gpu_cluster and spec.layout.ranks_per_node > cluster.gpus_per_node:
        yield Violation(
            ("nproc",),
            f"nproc={spec.layout.ranks_per_node} exceeds the {cluster.gpus_per_node} GPUs per node of {cluster.name}.",
            f"set nproc={cluster.gpus_per_node} (or null).",
        )


@rule("L012", Level.warning, "sequence parallelism without TP does nothing (MB TransformerConfig.finalize)")
def _sp_without_tp(spec: RunSpec) -> Iterator[Violation]:
    if spec.parallelism.sequence_parallel and spec.layout.tp == 1 and spec.engine == "megatron":
        yield Violation(
            ("parallelism.sequence_parallel",),
            "sequence_parallel=true with TP=1 has no effect (Megatron Bridge turns it off).",
            "set parallelism.sequence_parallel=false or raise tp.",
        )


@rule("L013", Level.error, "Qwen3-VL deepstack layers sit on the first pipeline stage (MB Qwen3VLModel)")
def _deepstack_first_stage(spec: RunSpec) -> Iterator[Violation]:
    # Qwen3VLModel asserts, when it builds the first stage, that the first model chunk holds at
    # least as many decoder layers as there are deepstack feature levels.
    lay, model = spec.layout, spec.model
    deepstack = len(model.vision_deepstack_layers)
    if spec.engine != "megatron" or model.arch != "qwen3_vl_moe" or not deepstack or lay.pp < 1 or lay.vp < 1:
        return
    first_stage = spec.parallelism.first_stage_layers or model.num_layers // lay.pp
    first_chunk = first_stage // lay.vp
    if first_chunk < deepstack:
        yield Violation(
            ("parallelism.first_stage_layers", "pp", "vp"),
            f"the first pipeline chunk holds {first_chunk} decoder layer(s), fewer than the {deepstack} deepstack "
            f"levels {model.name} injects there.",
            f"give the first stage at least {deepstack * lay.vp} layers (parallelism.first_stage_layers) or "
            "lower pp/vp.",
        )


# --- F: FSDP ---------------------------------------------------------------------------


@rule("F001", Level.error, "Megatron FSDP v2 is data-parallel only")
def _fsdp_v2(spec: RunSpec) -> Iterator[Violation]:
    par, lay = spec.parallelism, spec.layout
    if spec.family != "fsdp" or par.fsdp_version != 2:
        return
    blockers = [
        name for name, size in (("tp", lay.tp), ("pp", lay.pp), ("cp", lay.cp), ("ep", lay.ep)) if size > 1
    ]
    if spec.model.num_experts > 0:
        blockers.append("MoE model")
    if _uses_graphs(spec):
        blockers.append("cuda_graph")
    if blockers:
        yield Violation(
            ("parallelism.fsdp_version",),
            f"Megatron FSDP v2 rejects {', '.join(blockers)} (it is DP-only).",
            "set parallelism.fsdp_version=1.",
        )


@rule("F002", Level.error, "FSDP-only knobs need parallelism=fsdp")
def _fsdp_knobs_on_3d(spec: RunSpec) -> Iterator[Violation]:
    par = spec.parallelism
    if spec.family != "3d":
        return
    ignored = []
    if par.sharding_strategy is not ShardingStrategy.no_shard:
        ignored.append(f"parallelism.sharding_strategy={par.sharding_strategy.value}")
    if par.fsdp_double_buffer:
        ignored.append("parallelism.fsdp_double_buffer=true")
    if par.nccl_ub:
        ignored.append("parallelism.nccl_ub=true")
    if par.fsdp_version != 1:
        ignored.append(f"parallelism.fsdp_version={par.fsdp_version}")
    if ignored:
        yield Violation(
            tuple(item.split("=")[0] for item in ignored),
            f"{', '.join(ignored)} only apply to Megatron FSDP; 3D parallel uses the distributed optimizer.",
            "use parallelism=fsdp, or drop these overrides.",
        )


@rule("F003", Level.warning, "FSDP with PP > 1 is not validated upstream")
def _fsdp_pp(spec: RunSpec) -> Iterator[Violation]:
    if spec.family == "fsdp" and spec.layout.pp > 1:
        yield Violation(
            ("pp",),
            "Megatron FSDP with PP > 1 is 'intended to work, not fully validated' upstream.",
            "use pp=1 with FSDP, or parallelism=3d for pipeline layouts.",
        )


@rule("F004", Level.warning, "FSDP family is TP=CP=1")
def _fsdp_tp_cp(spec: RunSpec) -> Iterator[Violation]:
    if spec.family == "fsdp" and (spec.layout.tp > 1 or spec.layout.cp > 1):
        yield Violation(
            ("tp", "cp"),
            "parallelism=fsdp is the TP=CP=PP=1 bring-up family; TP/CP > 1 leaves it.",
            "keep tp=1 cp=1 with FSDP, or move to parallelism=3d.",
        )


# --- D: MoE dispatcher -----------------------------------------------------------------


def _deepep_supported(gpu: str, capability: float) -> bool:
    # MB training/flex_dispatcher_backend.py: capability 8/9, or a B200/B300 device name.
    return int(capability) in (8, 9) or gpu.startswith(("NVIDIA B200", "NVIDIA B300"))


@rule("D001", Level.error, "DeepEP only on Ampere, Hopper, B200/B300 (MB flex_dispatcher_backend)")
def _deepep_gpu(spec: RunSpec) -> Iterator[Violation]:
    cluster = spec.cluster
    if (
        spec.dispatcher.backend is FlexBackend.deepep
        and cluster.is_gpu_cluster
        and not _deepep_supported(cluster.gpu, cluster.compute_capability)
    ):
        yield Violation(
            ("dispatcher", "cluster"),
            f"DeepEP is rejected on {cluster.gpu} (Megatron Bridge allows Ampere, Hopper, B200/B300).",
            "use dispatcher=hybridep on GB200, or dispatcher=alltoall.",
        )


@rule("D002", Level.error, "HybridEP only on compute capability 8/9/10 (MB flex_dispatcher_backend)")
def _hybridep_gpu(spec: RunSpec) -> Iterator[Violation]:
    cluster = spec.cluster
    if (
        spec.dispatcher.backend is FlexBackend.hybridep
        and cluster.is_gpu_cluster
        and int(cluster.compute_capability) not in (8, 9, 10)
    ):
        yield Violation(
            ("dispatcher", "cluster"),
            f"HybridEP is rejected on {cluster.gpu} (compute capability {cluster.compute_capability}); "
            "Megatron Bridge allows GB200/GB300, B200/B300, Hopper and Ampere.",
            "use dispatcher=alltoall.",
        )


@rule("D003", Level.error, "DeepEP needs TP x EP > 1 (MLM token_dispatcher)")
def _deepep_tp_ep(spec: RunSpec) -> Iterator[Violation]:
    if spec.dispatcher.backend is FlexBackend.deepep and spec.layout.tp * spec.layout.ep <= 1:
        yield Violation(
            ("dispatcher", "ep"),
            "DeepEP dispatch needs TP x EP > 1; with one rank there is nothing to dispatch.",
            "raise ep (or ep=0 to size it), or use dispatcher=alltoall.",
        )


@rule("D004", Level.error, "FP8 dispatch: HybridEP never supports it, and no engine field carries it")
def _fp8_dispatch(spec: RunSpec) -> Iterator[Violation]:
    if not (_flex(spec) and spec.dispatcher.fp8_dispatch):
        return
    # Megatron Core 0.19.2 has no FP8-dispatch switch, so with DeepEP the knob would be dropped.
    why = (
        "HybridEP does not support FP8 dispatch."
        if spec.dispatcher.backend is FlexBackend.hybridep
        else "Megatron Core 0.19.2 has no FP8-dispatch switch, so the engine would ignore it."
    )
    yield Violation(("dispatcher.fp8_dispatch",), why, "set dispatcher.fp8_dispatch=false.")


@rule("D005", Level.error, "flex dispatcher and backend go together")
def _flex_backend(spec: RunSpec) -> Iterator[Violation]:
    d = spec.dispatcher
    if _flex(spec) and d.backend is FlexBackend.none:
        yield Violation(
            ("dispatcher.backend",),
            "token_dispatcher=flex without a backend silently falls back to alltoall in Megatron Bridge.",
            "use dispatcher=deepep or dispatcher=hybridep.",
        )
    if not _flex(spec) and d.backend is not FlexBackend.none:
        yield Violation(
            ("dispatcher.backend",),
            f"backend={d.backend.value} is ignored by the {d.token_dispatcher.value} dispatcher.",
            f"use dispatcher={d.backend.value}.",
        )
    if not _flex(spec) and (d.num_sms or d.fp8_dispatch):
        yield Violation(
            ("dispatcher.num_sms", "dispatcher.fp8_dispatch"),
            "num_sms / fp8_dispatch only apply to the flex dispatcher.",
            "use dispatcher=deepep or dispatcher=hybridep, or drop these overrides.",
        )


@rule("D006", Level.error, "EP communication overlap prerequisites (MLM TransformerConfig)")
def _ep_overlap(spec: RunSpec) -> Iterator[Violation]:
    if not spec.dispatcher.overlap_moe_expert_parallel_comm:
        return
    lay = spec.layout
    missing = []
    if lay.ep <= 1:
        missing.append("EP > 1")
    if spec.dispatcher.token_dispatcher is TokenDispatcher.allgather:
        missing.append("alltoall or flex dispatcher")
    if lay.pp > 1 and lay.vp <= 1:
        missing.append("VP > 1 when PP > 1")
    if spec.recompute.granularity is RecomputeGranularity.full:
        missing.append("no full recompute")
    if missing:
        yield Violation(
            ("dispatcher.overlap_moe_expert_parallel_comm",),
            f"overlap_moe_expert_parallel_comm needs {', '.join(missing)}.",
            "set dispatcher.overlap_moe_expert_parallel_comm=false or meet the prerequisites.",
        )


@rule("D007", Level.warning, "HybridEP topology matches the cluster")
def _hybridep_topology(spec: RunSpec) -> Iterator[Violation]:
    d = spec.dispatcher
    if d.backend is not FlexBackend.hybridep:
        return
    derived = hybridep_topology(spec)
    given = {
        "NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN": d.hybridep_ranks_per_nvlink_domain,
        "NVLINK_DOMAIN_SIZE": d.hybridep_nvlink_domain_size,
    }
    for name, value in given.items():
        if value and value != derived[name]:
            yield Violation(
                (
                    f"dispatcher.hybridep_{'ranks_per_nvlink_domain' if 'RANKS' in name else 'nvlink_domain_size'}",
                ),
                f"{name}={value} does not match this cluster and layout ({derived[name]}).",
                "set it to 0 to derive it from the cluster.",
            )
    if d.hybridep_use_mnnvl and not derived["USE_MNNVL"]:
        yield Violation(
            ("dispatcher.hybridep_use_mnnvl",),
            f"USE_MNNVL=1 but {spec.cluster.name} has no multi-node NVLink.",
            "set dispatcher.hybridep_use_mnnvl=false.",
        )


# --- G: CUDA graphs --------------------------------------------------------------------


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
    if "moe" in spec.cuda_graph.scope:
        yield Violation(
            ("cuda_graph.scope",),
            f"scope 'moe' needs drop-and-pad routing; {spec.model.name} routes dropless.",
            "use moe_router + moe_preprocess (cuda_graph=te_moe).",
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


@rule("G009", Level.error, "attn scope breaks Qwen3-VL graph capture (MB Qwen3-VL perf recipes)")
def _graph_attn_qwen3vl(spec: RunSpec) -> Iterator[Violation]:
    graph = spec.cuda_graph
    te_graphs = graph.impl is CudaGraphImpl.transformer_engine
    # An empty scope captures the whole layer, attention included. (With impl=none the scope is
    # ignored: G011.)
    captures_attn = te_graphs and ("attn" in graph.scope or not graph.scope)
    if captures_attn and spec.model.arch == "qwen3_vl_moe" and spec.engine == "megatron":
        yield Violation(
            ("cuda_graph",),
            "CUDA graphs that capture attention ('attn' or whole-layer scope) break Qwen3VLModel capture "
            "(Bridge's Qwen3-VL recipes force moe_router + moe_preprocess).",
            "use cuda_graph=te_moe.",
        )


@rule("G010", Level.error, "CUDA graphs need fixed sequence lengths (Qwen3-VL, Energon packing)")
def _graph_variable_lengths(spec: RunSpec) -> Iterator[Violation]:
    if _uses_graphs(spec) and spec.data.pack_sequences:
        yield Violation(
            ("data.pack_sequences", "cuda_graph"),
            "packed (variable-length) sequences disallow CUDA graphs (Qwen3-VL variable_seq_lengths, Energon packing).",
            "set data.pack_sequences=false or cuda_graph=none.",
        )


@rule("G011", Level.error, "graph scope needs a graph impl")
def _graph_scope_without_impl(spec: RunSpec) -> Iterator[Violation]:
    if not _uses_graphs(spec) and spec.cuda_graph.scope:
        yield Violation(
            ("cuda_graph.scope",),
            "cuda_graph.scope is set but cuda_graph.impl=none, so it would be ignored.",
            "choose cuda_graph=te_moe (or another preset), or clear the scope.",
        )


# --- R: recompute ----------------------------------------------------------------------


@rule("R001", Level.error, "selective recompute modules are known and apply to the model")
def _recompute_modules(spec: RunSpec) -> Iterator[Violation]:
    modules = spec.recompute.modules
    unknown = [m for m in modules if m not in SELECTIVE_RECOMPUTE_MODULES]
    if unknown:
        yield Violation(
            ("recompute.modules",),
            f"unknown recompute modules {unknown}; allowed: {list(SELECTIVE_RECOMPUTE_MODULES)}.",
            "fix the module names.",
        )
    if "mla_up_proj" in modules:
        yield Violation(
            ("recompute.modules",),
            f"mla_up_proj needs multi-latent attention; {spec.model.name} uses GQA.",
            "drop mla_up_proj.",
        )
    if "gdn_norm_out" in modules and spec.model.full_attention_interval <= 1:
        yield Violation(
            ("recompute.modules",),
            f"gdn_norm_out needs Gated DeltaNet layers; {spec.model.name} has none.",
            "drop gdn_norm_out.",
        )
    if "shared_experts" in modules and spec.model.num_shared_experts == 0:
        yield Violation(
            ("recompute.modules",),
            f"shared_experts recompute needs shared experts; {spec.model.name} has none.",
            "drop shared_experts.",
        )


@rule("R002", Level.error, "recompute settings match the granularity")
def _recompute_shape(spec: RunSpec) -> Iterator[Violation]:
    r = spec.recompute
    if r.granularity is RecomputeGranularity.full:
        if r.method is RecomputeMethod.none or r.num_layers < 1:
            yield Violation(
                ("recompute.method", "recompute.num_layers"),
                "full recompute needs method (uniform|block) and num_layers >= 1.",
                "use recompute=full, which sets method=uniform num_layers=1.",
            )
        if r.modules:
            yield Violation(
                ("recompute.modules",),
                "recompute.modules only applies to selective recompute.",
                "clear recompute.modules or use recompute=selective.",
            )
    elif r.granularity is RecomputeGranularity.selective:
        if not r.modules:
            yield Violation(
                ("recompute.modules",),
                "selective recompute needs at least one module.",
                "e.g. recompute=selective.",
            )
        if r.method is not RecomputeMethod.none or r.num_layers:
            yield Violation(
                ("recompute.method", "recompute.num_layers"),
                "method/num_layers only apply to full recompute.",
                "drop them or use recompute=full.",
            )
    elif r.modules or r.method is not RecomputeMethod.none or r.num_layers:
        yield Violation(
            ("recompute",),
            "recompute settings are given but granularity=none, so they would be ignored.",
            "choose recompute=selective or recompute=full.",
        )


@rule("R003", Level.warning, "full recompute once the model fits with selective")
def _full_recompute(spec: RunSpec) -> Iterator[Violation]:
    # The guide's "prefer selective once the model fits": only when the estimate says it does.
    if spec.recompute.granularity is not RecomputeGranularity.full:
        return
    selective = _estimate_or_none(with_recompute(spec, SELECTIVE_DEFAULT))
    if selective is None or selective.capacity_gib is None:
        return
    if selective.total_gib <= selective.capacity_gib * (1 - THIN_HEADROOM_FRACTION):
        yield Violation(
            ("recompute",),
            f"full recompute, yet selective (core_attn) is predicted to fit: {selective.total_gib:.1f} GiB "
            f"of {selective.capacity_gib:.1f} GiB per GPU. Selective is usually the faster steady state.",
            "try recompute=selective, or sweep recompute=full,selective with mbs (sweep=mbs_recompute).",
        )


# --- E: engine support -----------------------------------------------------------------


def _torch_only(spec: RunSpec) -> bool:
    return spec.engine == "torch"


@rule("E001", Level.error, "the torch engine runs FSDP only")
def _torch_family(spec: RunSpec) -> Iterator[Violation]:
    if _torch_only(spec) and spec.family != "fsdp":
        yield Violation(
            ("parallelism", "engine"),
            "parallelism=3d needs the Megatron engine; the embedded torch engine runs FSDP2 only.",
            "use parallelism=fsdp, or engine=megatron on a GPU cluster.",
        )


@rule("E002", Level.error, "the torch engine has no TP/PP/VP/CP/EP/ETP")
def _torch_model_parallel(spec: RunSpec) -> Iterator[Violation]:
    lay = spec.layout
    if not _torch_only(spec):
        return
    sizes = {"tp": lay.tp, "pp": lay.pp, "vp": lay.vp, "cp": lay.cp, "ep": lay.ep, "etp": lay.etp}
    over = [f"{key}={value}" for key, value in sizes.items() if value > 1]
    if over:
        yield Violation(
            tuple(item.split("=")[0] for item in over),
            f"{', '.join(over)} need the Megatron engine; the torch engine is data-parallel only.",
            "set them to 1, or engine=megatron on a GPU cluster.",
        )
    if spec.parallelism.sequence_parallel:
        yield Violation(
            ("parallelism.sequence_parallel",),
            "sequence parallelism needs the Megatron engine.",
            "set parallelism.sequence_parallel=false.",
        )


@rule("E003", Level.error, "the torch engine routes tokens itself")
def _torch_dispatcher(spec: RunSpec) -> Iterator[Violation]:
    if _torch_only(spec) and spec.dispatcher.token_dispatcher is not TokenDispatcher.alltoall:
        yield Violation(
            ("dispatcher", "engine"),
            f"dispatcher={spec.dispatcher.name} needs the Megatron engine; the torch engine keeps every expert "
            "on each rank (EP=1), where alltoall is the identity.",
            "use dispatcher=alltoall, or engine=megatron on a GPU cluster.",
        )


@rule("E004", Level.error, "the torch engine has no CUDA graphs")
def _torch_graphs(spec: RunSpec) -> Iterator[Violation]:
    if _torch_only(spec) and _uses_graphs(spec):
        yield Violation(
            ("cuda_graph", "engine"),
            f"cuda_graph={spec.cuda_graph.name} needs the Megatron engine.",
            "use cuda_graph=none, or engine=megatron on a GPU cluster.",
        )


@rule("E005", Level.error, "the torch engine builds Qwen3-VL-MoE models")
def _torch_arch(spec: RunSpec) -> Iterator[Violation]:
    if _torch_only(spec) and spec.model.arch != "qwen3_vl_moe":
        yield Violation(
            ("model", "engine"),
            f"{spec.model.name} ({spec.model.arch}) is not built by the torch engine (Qwen3-VL-MoE only).",
            "use a qwen3_vl model, or engine=megatron.",
        )


@rule("E006", Level.error, "the torch engine's FSDP2 has no optimizer-only sharding")
def _torch_sharding(spec: RunSpec) -> Iterator[Violation]:
    par = spec.parallelism
    if not _torch_only(spec) or spec.family != "fsdp":
        return
    if par.sharding_strategy is ShardingStrategy.optim:
        yield Violation(
            ("parallelism.sharding_strategy",),
            "sharding_strategy=optim has no torch FSDP2 equivalent.",
            "use optim_grads_params (full shard), optim_grads (no reshard after forward) or no_shard.",
        )
    extras = [name for name in ("fsdp_double_buffer", "nccl_ub") if getattr(par, name)]
    if par.fsdp_version != 1:
        extras.append("fsdp_version")
    if extras:
        yield Violation(
            tuple(f"parallelism.{name}" for name in extras),
            f"{', '.join(extras)} are Megatron FSDP settings the torch engine does not have.",
            "drop them, or engine=megatron.",
        )


@rule("E007", Level.error, "engine=megatron needs a GPU to run")
def _megatron_needs_gpu(spec: RunSpec) -> Iterator[Violation]:
    if spec.engine == "megatron" and not spec.cluster.is_gpu_cluster and not spec.dry_run:
        yield Violation(
            ("engine", "cluster"),
            "engine=megatron runs on GPU clusters; cluster=local has no GPU profile.",
            "plan it with dry_run=true, pick cluster=gb200|b200|h100|h200, or use engine=torch.",
        )


# What the torch engine's activation checkpointing can recompute (engines/torch_model.py).
TORCH_SELECTIVE_RECOMPUTE = ("core_attn", "layernorm", "moe", "mlp")


@rule("E008", Level.error, "the torch engine recomputes only what it can checkpoint")
def _torch_recompute(spec: RunSpec) -> Iterator[Violation]:
    r = spec.recompute
    if not _torch_only(spec):
        return
    if r.granularity is RecomputeGranularity.selective:
        known = [m for m in r.modules if m in SELECTIVE_RECOMPUTE_MODULES]  # R001 reports unknown names
        unsupported = [m for m in known if m not in TORCH_SELECTIVE_RECOMPUTE]
        if unsupported:
            yield Violation(
                ("recompute.modules", "engine"),
                f"recompute.modules {unsupported} need the Megatron engine; the torch engine checkpoints "
                f"{list(TORCH_SELECTIVE_RECOMPUTE)} (moe_act sits inside transformers' fused expert loop).",
                "use moe instead of moe_act, or engine=megatron on a GPU cluster.",
            )
        if "mlp" in r.modules and spec.model.num_dense_layers == 0:
            yield Violation(
                ("recompute.modules",),
                f"recompute module 'mlp' checkpoints dense MLP layers; {spec.model.name} has none, so it "
                "would change nothing.",
                "use moe to recompute the MoE blocks, or drop mlp.",
            )
    chunked = r.method is RecomputeMethod.uniform and r.num_layers > 1
    if r.granularity is RecomputeGranularity.full and chunked:
        yield Violation(
            ("recompute.num_layers", "engine"),
            f"uniform full recompute in chunks of {r.num_layers} layers needs the Megatron engine; the torch "
            "engine checkpoints each decoder layer on its own.",
            "set recompute.num_layers=1, use recompute.method=block (first N layers), or engine=megatron.",
        )


@rule("E009", Level.error, "the torch engine's Qwen3-VL-MoE has no shared experts")
def _torch_shared_experts(spec: RunSpec) -> Iterator[Violation]:
    if _torch_only(spec) and spec.model.arch == "qwen3_vl_moe" and spec.model.num_shared_experts > 0:
        yield Violation(
            ("model.num_shared_experts", "engine"),
            f"num_shared_experts={spec.model.num_shared_experts}: transformers' Qwen3-VL-MoE has no shared "
            "experts, so the torch engine would train a different model than configured.",
            "set model.num_shared_experts=0, or engine=megatron.",
        )


@rule("E010", Level.error, "the torch engine has no dataloader workers")
def _torch_num_workers(spec: RunSpec) -> Iterator[Violation]:
    if _torch_only(spec) and spec.data.num_workers > 0:
        yield Violation(
            ("data.num_workers",),
            "data.num_workers sets Megatron's dataloader workers; the torch engine builds batches in its "
            "training loop (its data wait is recorded per step as data_wait_s).",
            "set data.num_workers=0, or engine=megatron.",
        )


# --- A: data ---------------------------------------------------------------------------


@rule("A001", Level.error, "real data needs a path")
def _real_path(spec: RunSpec) -> Iterator[Violation]:
    if spec.data.kind is DataKind.real and not spec.data.path:
        yield Violation(
            ("data.path",),
            "data=real needs the directory of WebDataset shards.",
            "add data.path=DIR (build one with scripts/build_dataset.py).",
        )


@rule("A002", Level.error, "synthetic ranges are ordered")
def _synthetic_ranges(spec: RunSpec) -> Iterator[Violation]:
    d = spec.data
    pairs = {
        "images": (d.min_images, d.max_images),
        "long_side_px": (d.min_long_side_px, d.max_long_side_px),
        "text_tokens": (d.min_text_tokens, d.max_text_tokens),
        "pixels": (d.min_pixels, d.max_pixels),
    }
    for name, (low, high) in pairs.items():
        if low < 0 or high < low:
            yield Violation(
                (f"data.min_{name}", f"data.max_{name}"),
                f"data.min_{name}={low} / data.max_{name}={high} is not a valid range.",
                f"use 0 <= data.min_{name} <= data.max_{name}.",
            )


@rule("A003", Level.error, "in-batch packing needs MBS >= 2 (MB ConfigContainer)")
def _packing_mbs(spec: RunSpec) -> Iterator[Violation]:
    # Bridge packs the sequences of one micro-batch together (enable_in_batch_packing): with one
    # sequence per micro-batch there is nothing to pack, and ConfigContainer.validate rejects it.
    if spec.engine == "megatron" and spec.data.pack_sequences and spec.mbs < 2:
        yield Violation(
            ("data.pack_sequences", "mbs"),
            f"data.pack_sequences=true packs the sequences of one micro-batch; mbs={spec.mbs} has nothing "
            "to pack.",
            "set mbs=2 or more, or data.pack_sequences=false.",
        )


@rule("A004", Level.warning, "mock data is not a performance proxy")
def _mock_data(spec: RunSpec) -> Iterator[Violation]:
    if spec.data.kind is DataKind.mock:
        yield Violation(
            ("data",),
            "image-free mock data ran about 2x faster than real multimodal input; its throughput is "
            "labelled mock and never ranked with real results.",
            "use data=synthetic or data=real before drawing throughput conclusions.",
        )


@rule("A005", Level.error, "real data path is an Energon-prepared WebDataset")
def _real_dataset_dir(spec: RunSpec) -> Iterator[Violation]:
    # Only what a directory listing shows; shards are opened and checked by data.check_data.
    path = spec.data.path
    if spec.data.kind is not DataKind.real or not path:
        return
    meta = Path(path).expanduser() / ".nv-meta"
    has_info = (meta / ".info.yaml").is_file() or (meta / ".info.json").is_file()
    if not Path(path).expanduser().is_dir():
        yield Violation(
            ("data.path",),
            f"data.path={path} does not exist.",
            "build a dataset with `python scripts/build_dataset.py --skimage DIR` and set data.path=DIR.",
        )
    elif not (has_info and (meta / "split.yaml").is_file()):
        yield Violation(
            ("data.path",),
            f"data.path={path} is not an Energon-prepared WebDataset (no .nv-meta/.info.yaml, split.yaml).",
            "build it with scripts/build_dataset.py (or run `energon prepare` on the shards).",
        )


def _image_tokens_bounds(spec: RunSpec) -> tuple[int, int]:
    """Fewest and most placeholder tokens one image can become.

    The Qwen-VL resize keeps height x width within [min_pixels, max_pixels] in multiples of
    patch x merge, so tokens = pixels / (patch x merge)^2 lies within these bounds.
    """
    factor = spec.model.vision_patch_size * spec.model.vision_spatial_merge_size
    return math.ceil(spec.data.min_pixels / factor**2), max(spec.data.max_pixels // factor**2, 1)


@rule("A006", Level.error, "the smallest image sample fits seq_length")
def _smallest_sample_fits(spec: RunSpec) -> Iterator[Violation]:
    if spec.data.kind is DataKind.mock:
        return
    images = spec.data.min_images if spec.data.kind is DataKind.synthetic else 1
    fewest, _ = _image_tokens_bounds(spec)
    needed = images * (fewest + 2) + 1  # vision_start/end per image, and one text token
    if images > 0 and needed > spec.seq_length:
        yield Violation(
            ("seq_length", "data.min_pixels"),
            f"even the smallest sample ({images} image(s) of >= {fewest} tokens at data.min_pixels="
            f"{spec.data.min_pixels}) needs {needed} tokens, more than seq_length={spec.seq_length}: "
            "every sample would be skipped (image tokens are never cut).",
            f"raise seq_length to {needed} or more, or lower data.min_pixels.",
        )


@rule("A007", Level.warning, "the largest synthetic images fit seq_length")
def _largest_sample_fits(spec: RunSpec) -> Iterator[Violation]:
    if spec.data.kind is not DataKind.synthetic:
        return
    _, most = _image_tokens_bounds(spec)
    needed = spec.data.max_images * (most + 2) + 1
    if spec.data.max_images > 0 and needed > spec.seq_length:
        yield Violation(
            ("seq_length", "data.max_images", "data.max_pixels"),
            f"{spec.data.max_images} image(s) at data.max_pixels={spec.data.max_pixels} need up to {needed} "
            f"tokens, more than seq_length={spec.seq_length}: such samples are skipped (counted in "
            "run.json data.stats.skipped_samples), which skews the image-size distribution.",
            f"raise seq_length to {needed}, or lower data.max_images / data.max_pixels.",
        )


# --- W: field-guide warnings -----------------------------------------------------------


@rule("W001", Level.warning, "ETP > 1 where EP alone would fit")
def _etp_not_needed(spec: RunSpec) -> Iterator[Violation]:
    lay = spec.layout
    wider_ep = lay.ep * lay.etp
    if (
        lay.etp > 1
        and wider_ep > 0
        and spec.model.num_experts % wider_ep == 0
        and wider_ep * lay.tp <= lay.nvlink_domain_gpus
    ):
        yield Violation(
            ("etp", "ep"),
            f"ETP={lay.etp} adds communication and tuning surface, and EP={wider_ep} alone would fit.",
            f"try ep={wider_ep} etp=1.",
        )


@rule("W002", Level.warning, "EP x TP stays inside the NVLink domain")
def _ep_tp_nvlink(spec: RunSpec) -> Iterator[Violation]:
    lay = spec.layout
    if spec.cluster.is_gpu_cluster and not lay.ep_tp_inside_nvlink:
        yield Violation(
            ("ep", "tp", "cluster"),
            f"EP x TP = {lay.ep_tp_group} ranks spans past the {lay.nvlink_domain_gpus}-GPU NVLink domain of "
            f"{spec.cluster.name}: expert all-to-all will cross the scale-out network.",
            f"keep ep x tp <= {lay.nvlink_domain_gpus} (ep=0 sizes it for you).",
        )


@rule("W003", Level.warning, "GB200: HybridEP is the strong default")
def _gb200_dispatcher(spec: RunSpec) -> Iterator[Violation]:
    if spec.cluster.default_dispatcher == "hybridep" and spec.dispatcher.backend is not FlexBackend.hybridep:
        yield Violation(
            ("dispatcher",),
            f"on {spec.cluster.name} HybridEP is the strong default dispatcher; this run uses {spec.dispatcher.name}.",
            "use dispatcher=hybridep, or sweep=dispatcher_ab to compare.",
        )


# --- M: memory ---------------------------------------------------------------------------------


def _estimate_or_none(spec: RunSpec) -> MemoryEstimate | None:
    """The estimate, or None where the layout is too broken to estimate (other rules say why)."""
    if not spec.cluster.is_gpu_cluster or spec.cluster.gpu_memory_gib <= 0:
        return None
    lay = spec.layout
    if min(lay.tp, lay.pp, lay.cp, lay.vp, lay.etp, lay.dp, spec.mbs, spec.seq_length) < 1 or lay.ep < 1:
        return None
    try:
        return estimate(spec)
    except (ArithmeticError, ValueError, IndexError):
        return None


def _largest_terms(found: MemoryEstimate, count: int = 3) -> str:
    largest = sorted(found.terms, key=lambda t: t.bytes, reverse=True)[:count]
    return ", ".join(f"{t.name} {t.gib:.1f}" for t in largest)


def _over_capacity(found: MemoryEstimate) -> float:
    """How far the prediction is over GPU memory, as a fraction of it (<= 0: it fits)."""
    assert found.capacity_gib is not None
    return found.total_gib / found.capacity_gib - 1


def _does_not_fit(spec: RunSpec, found: MemoryEstimate, hedge: str) -> Violation:
    change = fits_after(spec)
    return Violation(
        ("mbs", "recompute", "nodes"),
        f"predicted peak {found.total_gib:.1f} GiB per GPU > GPU memory {found.capacity_gib:.1f} GiB on "
        f"{spec.cluster.name}{hedge} (largest: {_largest_terms(found)} GiB; see the memory section of "
        "dry_run=true).",
        f"{change}." if change else "add nodes (more FSDP/EP sharding), raise pp, or lower seq_length.",
    )


@rule("M001", Level.error, "predicted peak memory fits the GPU")
def _memory_fits(spec: RunSpec) -> Iterator[Violation]:
    # Rejected only past the estimate's stated uncertainty; closer misses are M003 warnings.
    found = _estimate_or_none(spec)
    if found is None or found.capacity_gib is None:
        return
    if _over_capacity(found) > GPU_ESTIMATE_UNCERTAINTY:
        hedge = f", more than the estimate's {GPU_ESTIMATE_UNCERTAINTY:.0%} uncertainty"
        yield _does_not_fit(spec, found, hedge)


@rule("M003", Level.warning, "predicted over GPU memory, within the estimate's uncertainty")
def _memory_probably_over(spec: RunSpec) -> Iterator[Violation]:
    found = _estimate_or_none(spec)
    if found is None or found.capacity_gib is None:
        return
    over = _over_capacity(found)
    if 0 < over <= GPU_ESTIMATE_UNCERTAINTY:
        yield _does_not_fit(
            spec,
            found,
            f" by {over:.0%}: likely OOM, though within the {GPU_ESTIMATE_UNCERTAINTY:.0%} the (not yet "
            "GPU-calibrated) estimate may be off",
        )


@rule("M002", Level.warning, "thin memory headroom")
def _memory_headroom(spec: RunSpec) -> Iterator[Violation]:
    found = _estimate_or_none(spec)
    if found is None or not found.fits or found.headroom_fraction is None:
        return
    if found.headroom_fraction < THIN_HEADROOM_FRACTION:
        yield Violation(
            ("mbs", "recompute"),
            f"predicted peak {found.total_gib:.1f} GiB leaves {found.headroom_gib:.1f} GiB "
            f"({found.headroom_fraction:.0%}) of {found.capacity_gib:.1f} GiB: routing imbalance, "
            "fragmentation or a larger image batch can tip it over.",
            "lower mbs or use more recompute before a long run (the estimate is not yet GPU-calibrated).",
        )
