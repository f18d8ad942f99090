"""The terms a predicted step is made of, what each one means, and the routing load they scale by.

Each term is seconds of one step on one GPU (or CPU rank) that the step model (step.py) computes
from the point's knobs and the hardware's rates; the sum is the step. Communication terms are what
stays exposed after the overlap the knobs turn on; ``launch`` is host time the device waits for.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from moe_vlm.config.schema import FlexBackend, TokenDispatcher
from moe_vlm.config.spec import RunSpec


class Term(StrEnum):
    """Every term a step time is made of (a calibration may scale each group of them)."""

    vision = "vision"
    projector = "projector"
    dense = "dense"
    attention = "attention"
    gdn = "gdn"
    router = "router"
    experts = "experts"
    logits = "logits"
    elementwise = "elementwise"
    pipeline = "pipeline"
    imbalance = "imbalance"
    ep_alltoall = "ep_alltoall"
    ep_allgather = "ep_allgather"
    ep_deepep = "ep_deepep"
    ep_hybridep = "ep_hybridep"
    fsdp = "fsdp"
    dp_grad = "dp_grad"
    tp = "tp"
    optimizer = "optimizer"
    launch = "launch"
    data = "data"
    overhead = "overhead"

    @property
    def meaning(self) -> str:
        """What the term's seconds are spent on (printed beside it)."""
        return _MEANINGS[self]

    @property
    def is_compute(self) -> bool:
        return self in COMPUTE

    @property
    def is_comm(self) -> bool:
        return self in COMM


_MEANINGS = {
    Term.vision: "ViT: patch embedding and blocks (GEMMs at the patches' M, attention per image)",
    Term.projector: "patch merger and deepstack mergers",
    Term.dense: "decoder GEMMs outside the experts: attention projections, shared experts, dense MLPs",
    Term.attention: "fused attention core (flash/cuDNN) by sequence length and head size",
    Term.gdn: "Gated DeltaNet layers: projections and the chunked delta-rule kernels (Qwen3.5)",
    Term.router: "the MoE router's GEMM",
    Term.experts: "routed experts' grouped GEMMs at the tokens each local expert receives",
    Term.logits: "the output layer's GEMM and the cross-entropy over the vocabulary",
    Term.elementwise: "memory-bound kernels: norms, activations, rotary, residuals, token permutes",
    Term.imbalance: "waiting for the data-parallel rank whose samples hold the most image work",
    Term.pipeline: "the pipeline's bubble ((PP-1)/VP stage-times) and its exposed stage-to-stage sends",
    Term.ep_alltoall: "EP token exchange left exposed, NCCL all-to-all dispatcher",
    Term.ep_allgather: "EP token exchange left exposed, all-gather dispatcher",
    Term.ep_deepep: "EP token exchange left exposed, DeepEP kernels",
    Term.ep_hybridep: "EP token exchange left exposed, HybridEP kernels",
    Term.fsdp: "FSDP's parameter all-gathers and gradient reduce-scatters left exposed",
    Term.dp_grad: "3D: the distributed optimizer's gradient reduce-scatter and parameter all-gather left exposed",
    Term.tp: "tensor/sequence-parallel all-gathers and reduce-scatters left exposed",
    Term.optimizer: "the Adam step over the local shard, memory-bound",
    Term.launch: "host time the device waits for: kernel launches after the MoE dispatcher's sync "
    "(CPU: every op's dispatch)",
    Term.data: "the data loader's host time per sample not hidden by its workers",
    Term.overhead: "a per-step constant (0 unless a calibration fits one)",
}

COMPUTE = (
    Term.vision,
    Term.projector,
    Term.dense,
    Term.attention,
    Term.gdn,
    Term.router,
    Term.experts,
    Term.logits,
    Term.elementwise,
    Term.pipeline,
    Term.imbalance,
)
COMM = (
    Term.ep_alltoall,
    Term.ep_allgather,
    Term.ep_deepep,
    Term.ep_hybridep,
    Term.fsdp,
    Term.dp_grad,
    Term.tp,
)
HOST = (Term.launch, Term.data, Term.overhead)


@dataclass(frozen=True)
class Load:
    """One term of a step: its seconds at the hardware's rates, and why, in words."""

    term: Term
    base_s: float
    why: str


def ep_term(spec: RunSpec) -> Term:
    d = spec.dispatcher
    if d.token_dispatcher is TokenDispatcher.flex and d.backend is FlexBackend.deepep:
        return Term.ep_deepep
    if d.token_dispatcher is TokenDispatcher.flex and d.backend is FlexBackend.hybridep:
        return Term.ep_hybridep
    if d.token_dispatcher is TokenDispatcher.allgather:
        return Term.ep_allgather
    return Term.ep_alltoall


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
