"""Memory rules (M...)."""

from __future__ import annotations

from collections.abc import Iterator

from moe_vlm.config.spec import RunSpec
from moe_vlm.config.vendor import vendor_recipe
from moe_vlm.knobs.cards import row_as_run
from moe_vlm.knobs.recipes import changes, recipe_memory
from moe_vlm.perf.memory import (
    GPU_ESTIMATE_UNCERTAINTY,
    THIN_HEADROOM_FRACTION,
    Fit,
    MemoryEstimate,
    estimate,
    fits_after,
)
from moe_vlm.rules.catalogue import (
    Level,
    Violation,
    rule,
)

# The last spec estimated and its estimate: the three M rules judge one spec in a row (a third of a
# plan's validation time otherwise). Held by reference, so `is` cannot match another spec.
_LAST: list[tuple[RunSpec, MemoryEstimate | None]] = []


def estimate_or_none(spec: RunSpec) -> MemoryEstimate | None:
    """The estimate, or None where the layout is too broken to estimate (other rules say why)."""
    if _LAST and _LAST[0][0] is spec:
        return _LAST[0][1]
    found = _estimate_or_none(spec)
    _LAST[:] = [(spec, found)]
    return found


def _estimate_or_none(spec: RunSpec) -> MemoryEstimate | None:
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


def describe_fit(fit: Fit) -> str:
    """A memory change as the fix says it: its overrides and the peak predicted after it."""
    found = fit.estimate
    return f"{fit.variant.overrides} (predicted {found.total_gib:.1f} GiB of {found.capacity_gib:.1f})"


def _does_not_fit(spec: RunSpec, found: MemoryEstimate, hedge: str) -> Violation:
    fit = fits_after(spec)
    return Violation(
        ("mbs", "recompute", "nodes"),
        f"predicted peak {found.total_gib:.1f} GiB per GPU > GPU memory {found.capacity_gib:.1f} GiB on "
        f"{spec.cluster.name}{hedge} (largest: {_largest_terms(found)} GiB; see the memory section of "
        "dry_run=true).",
        f"{describe_fit(fit)}."
        if fit
        else "add nodes (more FSDP/EP sharding), raise pp, or lower seq_length.",
    )


def _vendor_runs_it(spec: RunSpec, found: MemoryEstimate, published: str) -> Violation:
    """A Bridge perf recipe or a published card row, run as written, that we predict over GPU memory:
    someone ran it at this size, so the disagreement is our (GPU-uncalibrated) estimate's to resolve,
    not a rejection."""
    return Violation(
        ("mbs", "recompute"),
        f"predicted peak {found.total_gib:.1f} GiB per GPU > GPU memory {found.capacity_gib:.1f} GiB on "
        f"{spec.cluster.name}, but {published} at this size; "
        f"our GPU terms are not calibrated (largest: {_largest_terms(found)} GiB). Recorded for GPU "
        "calibration in docs/memory-and-advisor.md.",
        "run it as written and compare steps.jsonl peak_memory_gib with the estimate's terms; lower mbs "
        "or add recompute only if it runs out of memory.",
    )


def _published_as_written(spec: RunSpec) -> str | None:
    """What ran this configuration, where the run reproduces a Bridge perf recipe unchanged or a
    card row changed only where its option says why, or changes a recipe without raising the
    predicted peak above the recipe's own (the vendor ran that on this much memory, so our estimate
    is refuted there, not the run: issue 31, e.g. Qwen3.5 at MBS 8 on GB300, predicted 352 GiB of
    268); else None."""
    recipe = vendor_recipe(spec)
    if recipe is not None and not changes(spec):
        return f"{recipe} is Bridge's own perf recipe, run by the vendor"
    if row_as_run(spec):
        return f"card row {spec.card.row} ({spec.card.source}) published a figure"
    theirs = recipe_memory(spec)
    ours = estimate_or_none(spec)
    if (
        theirs is not None
        and ours is not None
        and ours.capacity_gib is not None
        and ours.total_gib <= theirs.total_gib
        and ours.capacity_gib >= theirs.capacity_gib
    ):
        return (
            f"{theirs.recipe} (our estimate for it: {theirs.total_gib:.1f} GiB, no less than this run's) was run "
            "by the vendor"
        )
    return None


@rule("M001", Level.error, "predicted peak memory fits the GPU")
def _memory_fits(spec: RunSpec) -> Iterator[Violation]:
    # Rejected only past the estimate's stated uncertainty; closer misses are M003 warnings, and so is
    # any miss on a Bridge perf recipe or a published card row run as written (someone ran it).
    found = estimate_or_none(spec)
    if found is None or found.capacity_gib is None or _published_as_written(spec) is not None:
        return
    if _over_capacity(found) > GPU_ESTIMATE_UNCERTAINTY:
        hedge = f", more than the estimate's {GPU_ESTIMATE_UNCERTAINTY:.0%} uncertainty"
        yield _does_not_fit(spec, found, hedge)


@rule(
    "M003",
    Level.warning,
    "predicted over GPU memory, within the estimate's uncertainty or on a vendor recipe or card row",
)
def _memory_probably_over(spec: RunSpec) -> Iterator[Violation]:
    found = estimate_or_none(spec)
    if found is None or found.capacity_gib is None:
        return
    over, published = _over_capacity(found), _published_as_written(spec)
    if published is not None and over > 0:
        yield _vendor_runs_it(spec, found, published)
    elif 0 < over <= GPU_ESTIMATE_UNCERTAINTY:
        yield _does_not_fit(
            spec,
            found,
            f" by {over:.0%}: likely OOM, though within the {GPU_ESTIMATE_UNCERTAINTY:.0%} the (not yet "
            "GPU-calibrated) estimate may be off",
        )


@rule("M002", Level.warning, "thin memory headroom")
def _memory_headroom(spec: RunSpec) -> Iterator[Violation]:
    found = estimate_or_none(spec)
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
