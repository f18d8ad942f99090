"""Moe dispatcher rules (D...)."""

from __future__ import annotations

from collections.abc import Iterator

from moe_vlm.rules.catalogue import (
    Level,
    Violation,
    _flex,
    rule,
)
from moe_vlm.schema import (
    FlexBackend,
    RecomputeGranularity,
    TokenDispatcher,
)
from moe_vlm.spec import RunSpec, hybridep_topology


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
