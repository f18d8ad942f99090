"""Moe dispatcher rules (D...)."""

from __future__ import annotations

from collections.abc import Iterator

from moe_vlm.config.schema import (
    Engine,
    FlexBackend,
    RecomputeGranularity,
    TokenDispatcher,
)
from moe_vlm.config.spec import RunSpec, hybridep_topology
from moe_vlm.rules.catalogue import (
    Level,
    Violation,
    _flex,
    rule,
)


def _deepep_supported(gpu: str, capability: float) -> bool:
    # megatron/bridge/training/flex_dispatcher_backend.py:62 (apply: falls back to alltoall) and
    # :108 (validate: ValueError): capability major 8/9, or a device name starting "NVIDIA B200" /
    # "NVIDIA B300". So GB200 and GB300 (major 10, names "NVIDIA GB...") are out; B300 is in.
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
            "use dispatcher=hybridep (the GB200/GB300 default), or dispatcher=alltoall.",
        )


@rule("D002", Level.error, "HybridEP only on compute capability 8/9/10 (MB flex_dispatcher_backend)")
def _hybridep_gpu(spec: RunSpec) -> Iterator[Violation]:
    # flex_dispatcher_backend.py:72 (apply) and :116 (validate) read the capability major only:
    # GB300/B300 (10.3) pass like GB200/B200 (10.0).
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
            # Meeting them is no way out on this engine: Qwen3VLModel cannot run the overlapped
            # schedule (D008), and VP > 1 is itself rejected for Qwen3-VL-MoE (L014).
            "set dispatcher.overlap_moe_expert_parallel_comm=false.",
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


@rule("D008", Level.error, "EP overlap needs build_schedule_plan; Qwen3VLModel has none (MLM)")
def _ep_overlap_qwen3vl(spec: RunSpec) -> Iterator[Violation]:
    # The overlapped 1F1B schedule (megatron/core/pipeline_parallel/schedules.py:751-752, 1458-1459)
    # looks up build_schedule_plan on the unwrapped model (combined_1f1b.py:381-383); only
    # GPTModel has it (megatron/core/models/gpt/gpt_model.py:798), and get_attr_wrapped_model
    # raises when it is missing (megatron/core/utils.py:664-666). Both providers build Qwen3VLModel
    # (qwen3_vl_provider.py:322, qwen35_vl_provider.py:428), a MegatronModule without it: step 1 crashes.
    if spec.engine == Engine.megatron and spec.dispatcher.overlap_moe_expert_parallel_comm:
        yield Violation(
            ("dispatcher.overlap_moe_expert_parallel_comm",),
            "the EP-overlap schedule calls build_schedule_plan on the model, which Qwen3VLModel (every "
            f"model this engine builds, {spec.model.name} included) does not have: step 1 would crash "
            "(megatron/core/pipeline_parallel/combined_1f1b.py:381-383 looks it up; megatron/core/utils.py:666 "
            "raises).",
            "set dispatcher.overlap_moe_expert_parallel_comm=false.",
        )


@rule("D009", Level.warning, "forced load balancing ignores the data (MCore: benchmark only)")
def _forced_balance(spec: RunSpec) -> Iterator[Violation]:
    # megatron/core/transformer/moe/router.py:856-858 replaces the router's logits with random ones;
    # transformer_config.py:812-814 calls it "only for benchmark". Experts are perfectly balanced
    # whatever the images and text, so dispatcher and EP results measure an ideal load.
    if spec.router.force_load_balancing:
        yield Violation(
            ("router",),
            "router=forced_balance routes tokens to random experts (perfectly balanced, whatever the data); "
            "its throughput is labelled forced-balance and never ranked with real-routing results.",
            "use router=real (the default) to measure real routing.",
        )
