"""Recompute rules (R...)."""

from __future__ import annotations

from collections.abc import Iterator

from moe_vlm.config.schema import (
    RecomputeGranularity,
    RecomputeMethod,
)
from moe_vlm.config.spec import RunSpec
from moe_vlm.perf.memory import (
    SELECTIVE_DEFAULT,
    THIN_HEADROOM_FRACTION,
    with_recompute,
)
from moe_vlm.rules.catalogue import (
    SELECTIVE_RECOMPUTE_MODULES,
    Level,
    Violation,
    rule,
)
from moe_vlm.rules.memory import estimate_or_none


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
    selective = estimate_or_none(with_recompute(spec, SELECTIVE_DEFAULT))
    if selective is None or selective.capacity_gib is None:
        return
    if selective.total_gib <= selective.capacity_gib * (1 - THIN_HEADROOM_FRACTION):
        yield Violation(
            ("recompute",),
            f"full recompute, yet selective (core_attn) is predicted to fit: {selective.total_gib:.1f} GiB "
            f"of {selective.capacity_gib:.1f} GiB per GPU. Selective is usually the faster steady state.",
            "try recompute=selective, or sweep recompute=full,selective with mbs (sweep=mbs_recompute).",
        )
