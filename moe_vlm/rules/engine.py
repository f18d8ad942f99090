"""Engine support rules (E...): what an engine does not honour, rejected before anything runs.

Which values each engine honours is declared once, in moe_vlm/knobs/support.py; these rules
read it and say what to do instead.
"""

from __future__ import annotations

from collections.abc import Iterator

from moe_vlm.config.arch import profile
from moe_vlm.config.schema import (
    Engine,
    ParallelismFamily,
    RecomputeGranularity,
    RecomputeMethod,
)
from moe_vlm.config.spec import RunSpec
from moe_vlm.knobs.support import TORCH_SELECTIVE_RECOMPUTE, accepts
from moe_vlm.rules.catalogue import (
    SELECTIVE_RECOMPUTE_MODULES,
    Level,
    Violation,
    rule,
)

TORCH = Engine.torch


def _torch_only(spec: RunSpec) -> bool:
    return Engine(spec.engine) is TORCH


@rule("E001", Level.error, "the torch engine runs FSDP only")
def _torch_family(spec: RunSpec) -> Iterator[Violation]:
    if _torch_only(spec) and not accepts(TORCH, "parallelism.family", spec.family):
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
    # A size below 1 is C001's to report.
    over = [f"{key}={value}" for key, value in sizes.items() if value >= 1 and not accepts(TORCH, key, value)]
    if over:
        yield Violation(
            tuple(item.split("=")[0] for item in over),
            f"{', '.join(over)} need the Megatron engine; the torch engine is data-parallel only.",
            "set them to 1, or engine=megatron on a GPU cluster.",
        )
    if not accepts(TORCH, "parallelism.sequence_parallel", spec.parallelism.sequence_parallel):
        yield Violation(
            ("parallelism.sequence_parallel",),
            "sequence parallelism needs the Megatron engine.",
            "set parallelism.sequence_parallel=false.",
        )


@rule("E003", Level.error, "the torch engine routes tokens itself")
def _torch_dispatcher(spec: RunSpec) -> Iterator[Violation]:
    if _torch_only(spec) and not accepts(
        TORCH, "dispatcher.token_dispatcher", spec.dispatcher.token_dispatcher
    ):
        yield Violation(
            ("dispatcher", "engine"),
            f"dispatcher={spec.dispatcher.name} needs the Megatron engine; the torch engine keeps every expert "
            "on each rank (EP=1), where alltoall is the identity.",
            "use dispatcher=alltoall, or engine=megatron on a GPU cluster.",
        )


@rule("E004", Level.error, "the torch engine has no CUDA graphs")
def _torch_graphs(spec: RunSpec) -> Iterator[Violation]:
    if _torch_only(spec) and not accepts(TORCH, "cuda_graph.impl", spec.cuda_graph.impl):
        yield Violation(
            ("cuda_graph", "engine"),
            f"cuda_graph={spec.cuda_graph.name} needs the Megatron engine.",
            "use cuda_graph=none, or engine=megatron on a GPU cluster.",
        )


@rule("E005", Level.error, "the torch engine builds Qwen3-VL-MoE models")
def _torch_arch(spec: RunSpec) -> Iterator[Violation]:
    if _torch_only(spec) and not accepts(TORCH, "model.arch", spec.model.arch):
        yield Violation(
            ("model", "engine"),
            f"{spec.model.name} ({spec.model.arch}) is not built by the torch engine (Qwen3-VL-MoE only).",
            "use a qwen3_vl model, or engine=megatron.",
        )


@rule("E006", Level.error, "the torch engine's FSDP2 has no optimizer-only sharding")
def _torch_sharding(spec: RunSpec) -> Iterator[Violation]:
    par = spec.parallelism
    if not _torch_only(spec) or spec.family != ParallelismFamily.fsdp:
        return
    if not accepts(TORCH, "parallelism.sharding_strategy", par.sharding_strategy):
        yield Violation(
            ("parallelism.sharding_strategy",),
            "sharding_strategy=optim has no torch FSDP2 equivalent.",
            "use optim_grads_params (full shard), optim_grads (no reshard after forward) or no_shard.",
        )
    extras = [
        name
        for name in ("fsdp_double_buffer", "nccl_ub", "fsdp_version")
        if not accepts(TORCH, f"parallelism.{name}", getattr(par, name))
    ]
    if extras:
        yield Violation(
            tuple(f"parallelism.{name}" for name in extras),
            f"{', '.join(extras)} are Megatron FSDP settings the torch engine does not have.",
            "drop them, or engine=megatron.",
        )


@rule("E007", Level.error, "engine=megatron needs a GPU to run")
def _megatron_needs_gpu(spec: RunSpec) -> Iterator[Violation]:
    if spec.engine == Engine.megatron and not spec.cluster.is_gpu_cluster and not spec.dry_run:
        yield Violation(
            ("engine", "cluster"),
            "engine=megatron runs on GPU clusters; cluster=local has no GPU profile.",
            "plan it with dry_run=true, pick cluster=gb200|b200|h100|h200, or use engine=torch.",
        )


@rule("E008", Level.error, "the torch engine recomputes only what it can checkpoint")
def _torch_recompute(spec: RunSpec) -> Iterator[Violation]:
    r = spec.recompute
    if not _torch_only(spec):
        return
    if r.granularity is RecomputeGranularity.selective:
        known = [m for m in r.modules if m in SELECTIVE_RECOMPUTE_MODULES]  # R001 reports unknown names
        unsupported = [m for m in known if not accepts(TORCH, "recompute.modules", [m])]
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
    shared = spec.model.num_shared_experts
    if (
        _torch_only(spec)
        and not profile(spec.model.arch).hf_shared_experts
        and not accepts(TORCH, "model.num_shared_experts", shared)
    ):
        yield Violation(
            ("model.num_shared_experts", "engine"),
            f"num_shared_experts={spec.model.num_shared_experts}: transformers' Qwen3-VL-MoE has no shared "
            "experts, so the torch engine would train a different model than configured.",
            "set model.num_shared_experts=0, or engine=megatron.",
        )


@rule("E010", Level.error, "the torch engine has no dataloader workers")
def _torch_num_workers(spec: RunSpec) -> Iterator[Violation]:
    if _torch_only(spec) and not accepts(TORCH, "data.num_workers", spec.data.num_workers):
        yield Violation(
            ("data.num_workers",),
            "data.num_workers sets Megatron's dataloader workers; the torch engine builds batches in its "
            "training loop (its data wait is recorded per step as data_wait_s).",
            "set data.num_workers=0, or engine=megatron.",
        )


@rule("E011", Level.error, "the torch engine routes tokens for real")
def _torch_forced_balance(spec: RunSpec) -> Iterator[Violation]:
    forced = spec.router.force_load_balancing
    if _torch_only(spec) and not accepts(TORCH, "router.force_load_balancing", forced):
        yield Violation(
            ("router.force_load_balancing", "router", "engine"),
            "router=forced_balance replaces the router's logits with random ones (Megatron's "
            "moe_router_force_load_balancing); the torch engine always routes with its own router.",
            "use router=real, or engine=megatron.",
        )
