"""The step-time model's terms: what one optimizer step asks of each GPU, in seconds at a base rate.

Each term is a load (FLOPs, bytes) divided by a base rate; the prediction multiplies each by a
calibrated scale (moe_vlm/predict/calibration.py) and adds them up. Base rates:

compute     the dense peak the FLOPs run at (``moe_vlm.perf.peaks.module_peaks``: the decoder's GEMMs
            at the precision's peak, the vision tower at BF16; the attention core and the output
            layer stay BF16, precision_peak_of's docstring), so a scale of 1 / efficiency. A
            cluster without a peak (cluster=local) gets a nominal 1 GFLOP/s: uncalibrated.
links       per-GPU NVLink and NIC bandwidth, one direction (moe_vlm/predict/hardware.py); scale =
            1 / the fraction of the line rate a collective reaches. CPU ranks: nominal 1 GB/s.
optimizer   Adam's bytes over HBM bandwidth (memory-bound; CPU: nominal 10 GB/s).
overhead    one second: the per-step constant (data wait, launches, the loop) only a fit knows.

Routing: the routed experts' GEMMs and the EP exchange wait on the most loaded expert, so both
scale by the max / mean tokens per expert (routing_load): 1 under forced balance, the capacity
factor when every expert's input is padded to its capacity, that capacity as an assumed bound when
tokens are dropped but not padded; under dropless real routing no citable load factor exists (every
published row forces balance), so the load is taken as balanced and the plan says so.

FLOPs are the project's hardware FLOPs (``moe_vlm.perf.flops``: padded tokens, padded vocabulary,
frozen-aware, plus recompute's extra forward), split by operation class and divided evenly over
the world (TP, PP, CP, EP and DP each split the work; imbalance is what calibration absorbs). The
pipeline bubble multiplies compute by 1 + (p - 1) / (m x vp) (Narayanan et al., SC'21, the
interleaved 1F1B schedule Megatron runs; m = micro-batches per rank per step).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

from moe_vlm.config.arch import Mlp, layer_kinds
from moe_vlm.config.schema import (
    Engine,
    FlexBackend,
    ModelConfig,
    ParallelismFamily,
    Precision,
    RecomputeGranularity,
    TokenDispatcher,
)
from moe_vlm.config.spec import RunSpec
from moe_vlm.perf.flops import (
    DecoderForward,
    Workload,
    decoder_forward,
    multipliers,
    padded_vocab_size,
    projector_forward,
    recompute_forward,
    vision_encoder_forward,
)
from moe_vlm.perf.memory.megatron import grad_bytes
from moe_vlm.perf.memory.shared import ParamCounts, param_counts
from moe_vlm.perf.peaks import module_peaks
from moe_vlm.predict.hardware import links_of

NOMINAL_CPU_FLOPS = 1e9  # cluster=local: no datasheet peak; the scale carries the calibrated rate
NOMINAL_CPU_LINK = 1e9
NOMINAL_CPU_MEMORY = 1e10
BF16_BYTES, FP32_BYTES = 2, 4
# Adam with fp32 main weights, per trainable parameter: read param, grad, m, v (4 x 4 B), write
# param, m, v (3 x 4 B) and the bf16 model copy (2 B). Arithmetic on Megatron's distributed
# optimizer layout (megatron/core/optimizer/distrib_optimizer.py keeps fp32 main params + Adam state).
ADAM_BYTES_PER_PARAM = 4 * 4 + 3 * 4 + 2
# Share of the EP all-to-all hidden behind compute with overlap_moe_expert_parallel_comm: 36.55%
# (0.11% without), Nsight on Qwen3-30B, 16 x H100 (Megatron-Bridge moe-comm-overlap skill, 2026-07-25;
# ../shared/reference/sister-skills.md 2.5).
EP_OVERLAP_HIDDEN = 0.3655
EP_NO_OVERLAP_HIDDEN = 0.0011
# Forward dispatch + combine, backward the same on the gradients.
EP_PASSES = 4
# The share of its format's peak the decoder's GEMMs reach relative to BF16's share of the BF16
# peak. MXFP8: DeepSeek-V3 on 256 x B200, the same layout in BF16 ~520 TFLOP/s and FP8-MX ~800
# (moe-hardware-configs/card.yaml; ../shared/reference/sister-skills.md 2.5, line 143): 800 / 4.5 PF
# over 520 / 2.25 PF = 0.769. No published A/B for FP8 current scaling or NVFP4: absent here (1.0),
# and the plan says those precisions are uncalibrated (predict/model.py).
PRECISION_EFFICIENCY: dict[Precision, float] = {Precision.fp8mx: (800 / 4.5) / (520 / 2.25)}


@dataclass(frozen=True)
class RoutingLoad:
    """The max / mean tokens per expert a step waits on, and where the figure comes from."""

    factor: float
    assumed: bool  # a bound taken as the load, not what the library makes it
    why: str


# Dropless real routing: the load is the data's, published for no row, so it is not modelled (the
# plan says so next to the number) unless the user assumes one, router.assumed_load, which a run
# of the workload measures (run.json router.load_factor, record/router_load.py).
ROUTING_NOT_MODELLED = "routing imbalance not modelled: real-routing predictions assume balanced load"


def routing_load(spec: RunSpec) -> RoutingLoad | None:
    """The routing load the expert and EP terms scale by; None: real dropless routing without
    router.assumed_load (not modelled)."""
    router = spec.router
    if router.force_load_balancing:
        # MCore router.py:856-858: random logits whatever the tokens; every expert equally loaded.
        return RoutingLoad(1.0, False, "forced balance (random router logits: every expert equally loaded)")
    capacity = router.capacity_factor
    if capacity is None or capacity <= 0:
        if router.assumed_load is None:
            return None
        load = router.assumed_load
        return RoutingLoad(
            load, True, f"routing load x{load:g} (assumed; measured by a run's run.json router.load_factor)"
        )
    if router.pad_to_capacity:
        # token_dispatcher.py:511-519: every expert gets capacity = ceil(tokens x top-k / experts x
        # factor) (moe_utils.py:256) tokens, padded: the GEMMs and the exchange carry factor x the mean.
        return RoutingLoad(
            capacity, False, f"drop-and-pad: every expert padded to {capacity:g} x its balanced share"
        )
    # Dropped above capacity, not padded: the fullest expert holds at most capacity x the mean.
    return RoutingLoad(
        capacity,
        True,
        f"assumed routing load: at most {capacity:g} x the balanced share per expert (the capacity bound)",
    )


class Term(StrEnum):
    """Every term a step time is made of (the calibration fits one scale per term)."""

    vision = "vision"
    dense = "dense"
    attention = "attention"
    gdn = "gdn"
    experts = "experts"
    logits = "logits"
    ep_alltoall = "ep_alltoall"
    ep_deepep = "ep_deepep"
    ep_hybridep = "ep_hybridep"
    fsdp = "fsdp"
    dp_grad = "dp_grad"
    tp = "tp"
    optimizer = "optimizer"
    overhead = "overhead"

    @property
    def meaning(self) -> str:
        """What the term's seconds are spent on (printed beside its fitted scale)."""
        return _MEANINGS[self]

    @property
    def is_compute(self) -> bool:
        return self in COMPUTE

    @property
    def is_comm(self) -> bool:
        return self in COMM


_MEANINGS = {
    Term.vision: "ViT blocks + projector mergers",
    Term.dense: "decoder attention projections, shared experts, dense MLPs",
    Term.attention: "attention core (sum of squared lengths)",
    Term.gdn: "Gated DeltaNet layers: projections, conv and the delta-rule recurrence (Qwen3.5)",
    Term.experts: "routed experts' grouped GEMMs",
    Term.logits: "the output layer",
    Term.ep_alltoall: "EP token exchange, all-to-all dispatcher",
    Term.ep_deepep: "EP token exchange, DeepEP dispatcher",
    Term.ep_hybridep: "EP token exchange, HybridEP dispatcher",
    Term.fsdp: "FSDP's parameter all-gathers + gradient reduce-scatters",
    Term.dp_grad: "3D: the distributed optimizer's gradient reduce-scatter + parameter all-gather",
    Term.tp: "sequence-parallel all-gathers / reduce-scatters",
    Term.optimizer: "the Adam step, memory-bound",
    Term.overhead: "the per-step constant",
}

COMPUTE = (Term.vision, Term.dense, Term.attention, Term.gdn, Term.experts, Term.logits)
COMM = (Term.ep_alltoall, Term.ep_deepep, Term.ep_hybridep, Term.fsdp, Term.dp_grad, Term.tp)


@dataclass(frozen=True)
class Load:
    term: Term
    base_s: float  # seconds at the base rate (scale 1)
    why: str


def _masked(decoder: DecoderForward, keep: tuple[str, ...]) -> DecoderForward:
    zero = {name: 0.0 for name in vars(decoder) if name not in keep}
    return replace(decoder, **zero)


CLASS_PARTS: dict[Term, tuple[str, ...]] = {
    Term.dense: ("attention_projections", "moe_shared", "dense_mlp"),
    Term.attention: ("attention_core",),
    # Its own term: fla's chunked delta-rule kernels (core/ssm/gated_delta_net) are not the
    # GEMMs or the flash attention the Qwen3 rows measure, so a calibration can give them their
    # own efficiency; until one does they run at the compute scale and the plan's band says so.
    Term.gdn: ("gdn_weight", "gdn_recurrence"),
    Term.experts: ("moe_routed",),
    Term.logits: ("logits",),
}


def hardware_flops_by_class(spec: RunSpec, workload: Workload) -> dict[Term, float]:
    """The step's hardware FLOPs (moe_vlm.perf.flops.step_flops's ``hardware``) split by operation class."""
    model = spec.model
    factors = multipliers(spec.freeze.vision, spec.freeze.projector, spec.freeze.language)
    padded = workload.padded()
    decoder = decoder_forward(model, padded, padded_vocab_size(model.vocab_size, spec.layout.tp))
    lay = spec.layout
    out = {
        Term.vision: factors["vision_encoder"].apply(vision_encoder_forward(model, workload))
        + factors["projector"].apply(projector_forward(model, workload))
    }
    gradient = factors["decoder"].activation > 1
    for term, parts in CLASS_PARTS.items():
        part = _masked(decoder, parts)
        recomputed = (
            recompute_forward(spec.recompute, part, model.num_layers, lay.pp, lay.vp) if gradient else 0.0
        )
        out[term] = factors["decoder"].apply(part.as_forward()) + recomputed
    return out


def bubble_factor(spec: RunSpec) -> float:
    """1 + (p - 1) / (m x vp): the pipeline's idle share on top of the compute."""
    lay = spec.layout
    if lay.pp <= 1:
        return 1.0
    micro = max(spec.gbs // max(spec.mbs * lay.dp, 1), 1)
    return 1.0 + (lay.pp - 1) / (micro * max(lay.vp, 1))


def _compute_peaks(spec: RunSpec) -> dict[Term, float]:
    peaks = module_peaks(spec)
    bf16 = spec.cluster.peak_bf16_flops
    decoder = peaks["decoder"]["flops"] * PRECISION_EFFICIENCY.get(spec.precision.format, 1.0)
    return {
        Term.vision: peaks["vision_encoder"]["flops"],
        Term.dense: decoder,
        Term.experts: decoder,
        Term.attention: bf16,
        # fla's Triton kernels compute in BF16 whatever the linear layers' format
        # (megatron-first-contact.md line 64: core/ssm/gated_delta_net/common.py).
        Term.gdn: bf16,
        Term.logits: bf16,
    }


def _moe_recompute_passes(spec: RunSpec) -> int:
    """Extra EP exchanges a step's recompute makes: the MoE forward run again in backward."""
    recompute = spec.recompute
    if recompute.granularity is RecomputeGranularity.full:
        return 2
    if recompute.granularity is RecomputeGranularity.selective and "moe" in recompute.modules:
        return 2
    return 0


_PARAMS: dict[str, ParamCounts] = {}


def _param_counts(model: ModelConfig) -> ParamCounts:
    """param_counts, once per model (a big dry run predicts many points of one model)."""
    key = repr(model)
    if key not in _PARAMS:
        _PARAMS[key] = param_counts(model)
    return _PARAMS[key]


def param_split(spec: RunSpec) -> tuple[float, float]:
    """Parameters one rank holds before data-parallel sharding: (dense over TP x PP, routed
    experts over EP x ETP x PP)."""
    lay = spec.layout
    params = _param_counts(spec.model)
    experts = sum(layer.experts for layer in params.layers)
    return (params.total - experts) / max(lay.tp * lay.pp, 1), experts / max(lay.ep * lay.etp * lay.pp, 1)


def ep_term(spec: RunSpec) -> Term:
    d = spec.dispatcher
    if d.token_dispatcher is TokenDispatcher.flex and d.backend is FlexBackend.deepep:
        return Term.ep_deepep
    if d.token_dispatcher is TokenDispatcher.flex and d.backend is FlexBackend.hybridep:
        return Term.ep_hybridep
    return Term.ep_alltoall


def loads(spec: RunSpec, workload: Workload) -> list[Load]:
    """Every nonzero term of one step on one GPU at its base rate."""
    lay, model, cluster = spec.layout, spec.model, spec.cluster
    world = max(lay.world_size, 1)
    links = links_of(cluster.name)
    gpu = cluster.peak_bf16_flops > 0
    out: list[Load] = []

    bubble = bubble_factor(spec)
    peaks = _compute_peaks(spec)
    routing = routing_load(spec)
    load = routing.factor if routing is not None else 1.0
    load_note = f" x routing load {load:g}" if load != 1.0 else ""
    bubble_note = f" x bubble {bubble:.3f}" if bubble > 1 else ""
    for term, flops in hardware_flops_by_class(spec, workload).items():
        if flops <= 0:
            continue
        peak = peaks[term] if gpu and peaks[term] > 0 else NOMINAL_CPU_FLOPS
        rate = f"{peak / 1e12:.4g} TFLOP/s peak" if gpu else "nominal 1 GFLOP/s (no CPU peak)"
        if gpu and term in (Term.dense, Term.experts) and spec.precision.format in PRECISION_EFFICIENCY:
            rate += (
                f" ({spec.precision.format.value} peak x {PRECISION_EFFICIENCY[spec.precision.format]:.3f})"
            )
        routed = load if term is Term.experts else 1.0
        out.append(
            Load(
                term,
                flops / world / peak * bubble * routed,
                f"{flops / world:.3g} FLOP/GPU at {rate}{bubble_note}{load_note if routed != 1.0 else ''}",
            )
        )

    nvlink = links.nvlink_bytes_per_s if links else NOMINAL_CPU_LINK
    scale_out = links.scale_out_bytes_per_s if links else NOMINAL_CPU_LINK
    act_bytes = BF16_BYTES if gpu else FP32_BYTES
    moe_layers = sum(kind.mlp is Mlp.moe for kind in layer_kinds(model))
    padded = workload.padded_tokens

    if lay.ep > 1 and moe_layers:
        passes = EP_PASSES + _moe_recompute_passes(spec)
        volume = padded * moe_layers * model.hidden_size * model.moe_top_k * act_bytes
        per_gpu = volume * (lay.ep - 1) / lay.ep * passes / world
        group = lay.ep_tp_group
        inside = min(group, lay.nvlink_domain_gpus) / group
        seconds = per_gpu * inside / nvlink + per_gpu * (1 - inside) / scale_out
        overlap = spec.dispatcher.overlap_moe_expert_parallel_comm
        hidden = EP_OVERLAP_HIDDEN if overlap else EP_NO_OVERLAP_HIDDEN
        where = "inside the NVLink domain" if inside >= 1 else f"{1 - inside:.0%} across domains"
        out.append(
            Load(
                ep_term(spec),
                seconds * (1 - hidden) * load,
                f"{per_gpu / 1e9:.3g} GB/GPU ({passes} passes, top-{model.moe_top_k}, {where}); "
                f"{hidden:.2%} hidden{' (EP overlap)' if overlap else ''}{load_note}",
            )
        )

    params = _param_counts(model)
    frozen = (params.vision if spec.freeze.vision else 0) + (params.projector if spec.freeze.projector else 0)
    dense_local, experts_local = param_split(spec)
    across = lay.world_size > lay.nvlink_domain_gpus
    dp_link = scale_out if across else nvlink
    param_bytes = act_bytes
    gbytes = grad_bytes(spec)[0] if spec.engine is Engine.megatron else act_bytes
    dense_n, expert_n = max(lay.dp * lay.cp, 1), max(lay.expert_dp, 1)

    def ring(size: float, n: int) -> float:
        return size * (n - 1) / n

    if spec.family is ParallelismFamily.fsdp:
        gathered = 2 * (ring(dense_local, dense_n) + ring(experts_local, expert_n)) * param_bytes
        reduced = (ring(dense_local - frozen, dense_n) + ring(experts_local, expert_n)) * gbytes
        total = gathered + reduced
        if total > 0:
            out.append(
                Load(
                    Term.fsdp, total / dp_link, f"{total / 1e9:.3g} GB/GPU: 2 all-gathers + 1 reduce-scatter"
                )
            )
    else:
        total = (ring(dense_local - frozen, dense_n) + ring(experts_local, expert_n)) * (gbytes + param_bytes)
        if total > 0:
            out.append(
                Load(
                    Term.dp_grad,
                    total / dp_link,
                    f"{total / 1e9:.3g} GB/GPU: grad reduce-scatter + param all-gather",
                )
            )

    if lay.tp > 1:
        passes = 8 + (4 if spec.recompute.granularity is RecomputeGranularity.full else 0)
        per_gpu = passes * padded * model.hidden_size * act_bytes * (lay.tp - 1) / lay.tp
        per_gpu *= model.num_layers / max(lay.pp, 1) / max(lay.dp * lay.cp, 1)
        out.append(
            Load(Term.tp, per_gpu / nvlink, f"{per_gpu / 1e9:.3g} GB/GPU ({passes} SP collectives/layer)")
        )

    trainable = params.total - frozen - (params.language if spec.freeze.language else 0)
    local = trainable / world
    hbm = links.hbm_bytes_per_s if links else NOMINAL_CPU_MEMORY
    out.append(
        Load(
            Term.optimizer,
            local * ADAM_BYTES_PER_PARAM / hbm,
            f"{local:.3g} params/GPU x {ADAM_BYTES_PER_PARAM} B",
        )
    )
    out.append(Load(Term.overhead, 1.0, "per-step constant (data wait, launches, the loop)"))
    return out
