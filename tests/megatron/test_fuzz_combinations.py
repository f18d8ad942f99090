"""A seeded combination fuzzer: random points through the planner and the library's own checks.

Each point (tests/megatron/fuzz_space.py: a GPU cluster, a model, a node count, group options
and leaves drawn from the schema) is planned as `dry_run=true` plans it (the rule catalogue,
memory estimate included). A point the plan calls VALID gets the configuration the engine would
run (the recipe with THE table applied) and moe_vlm/engines/megatron/library_checks.py's checks:
Bridge's runtime update, the ViT's TransformerConfig, TE's recipe, userbuffers and fused router,
Megatron-LM's argument validation. A VALID point the library refuses is a false accept: the test
fails and names it with the command line that plans it.

The counts (points, VALID, refused by rules and by the library, by code) print in the session
summary; docs/testing.md records them for the seed below.
"""

from __future__ import annotations

import collections
import random
import time
from typing import Any

from moe_vlm.config.spec import RunSpec
from moe_vlm.engines.megatron.config import apply_overrides
from moe_vlm.knobs.bridge_fields import bridge_overrides
from moe_vlm.knobs.bridge_recipe import select_recipe
from moe_vlm.rules import errors, validate
from moe_vlm.run.plan import shape_check
from tests.megatron.conftest import REPORT, RecipeCache, needs_stack
from tests.megatron.fuzz_space import assemble, draw, draw_shape_point, gpus_per_node, space, unplaced

SEED = 19
POINTS = 2000
AGREEMENT_SAMPLE = 12  # points composed whole by Hydra to check the assembly
SHAPE_POINTS = 300  # on the shape axes (fuzz_space.SHAPE_AXES)


def test_every_knob_is_in_the_fuzzers_space() -> None:
    """A schema leaf the fuzzer neither varies nor excludes with a reason is a knob nobody fuzzes."""
    assert unplaced() == [], (
        f"knobs missing from the fuzzer's space: {unplaced()}; give them values in "
        "tests/megatron/fuzz_space.py DOMAINS (or a reason in EXCLUDED)"
    )
    assert len(space()) > 60


def test_assembled_points_are_what_hydra_composes() -> None:
    """The fuzzer assembles points from cached compositions; Hydra's compose of the same command
    line gives the same TrainConfig (so the fuzzer judges what a user would run)."""
    from moe_vlm.config.compose import compose_config

    rng = random.Random(SEED + 1)
    per_node = gpus_per_node()
    for _ in range(AGREEMENT_SAMPLE):
        point = draw(rng, per_node)
        from omegaconf import OmegaConf

        composed = OmegaConf.to_object(compose_config(point.overrides))
        assert composed == assemble(point), point.describe()


def _library_key(spec: RunSpec) -> tuple[Any, ...]:
    """What the library checks read: the recipe, the table's values, the job's world and GPU."""
    recipe = select_recipe(spec)
    rows = tuple((o.field, repr(o.value)) for o in bridge_overrides(spec))
    return (recipe.name if recipe else None, spec.model.name, spec.layout.world_size, spec.cluster.name, rows)


@needs_stack
def test_no_point_planned_valid_is_refused_by_the_library(recipes: RecipeCache) -> None:
    from moe_vlm.engines.megatron.library_checks import Check, LibraryFinding, check_config

    rng = random.Random(SEED)
    per_node = gpus_per_node()
    started = time.monotonic()
    counts: collections.Counter[str] = collections.Counter()
    rule_codes: collections.Counter[str] = collections.Counter()
    library_codes: collections.Counter[str] = collections.Counter()
    cache: dict[tuple[Any, ...], list[LibraryFinding]] = {}
    false_accepts: dict[str, tuple[str, str]] = {}  # finding text -> (first command line, finding)
    for _ in range(POINTS):
        point = draw(rng, per_node)
        spec = RunSpec.from_config(assemble(point))
        refused = errors(validate(spec))
        counts["points"] += 1
        if refused:
            counts["refused by rules"] += 1
            rule_codes.update({f.code for f in refused})
            continue
        shaped = errors(shape_check(spec))
        if shaped:
            counts["refused by the shape check"] += 1
            rule_codes.update({f.code for f in shaped})
            continue
        counts["planned VALID"] += 1
        key = _library_key(spec)
        if key not in cache:
            cfg = recipes.config(spec)
            apply_overrides(cfg, spec)
            cache[key] = check_config(cfg, spec)
            counts["library runs"] += 1
        findings = cache[key]
        if any(f.check is Check.stack for f in findings):
            counts["not judged here (a package the run imports is missing)"] += 1
            continue
        if not findings:
            continue
        counts["refused by the library"] += 1
        library_codes.update({f.check.value for f in findings})
        for finding in findings:
            false_accepts.setdefault(finding.line()[:160], (" ".join(point.overrides), finding.line()))
    seconds = time.monotonic() - started
    REPORT.append(
        f"fuzzer (seed {SEED}): {counts['points']} points in {seconds:.0f} s: {counts['planned VALID']} planned "
        f"VALID ({counts['library runs']} distinct library configurations), {counts['refused by rules']} refused "
        f"by rules, {counts['refused by the shape check']} by the shape check, {counts['refused by the library']} "
        "VALID but refused by the library, "
        f"{counts['not judged here (a package the run imports is missing)']} not judged (a tracker missing here)"
    )
    REPORT.append(f"fuzzer: refused by rules, by code: {dict(sorted(rule_codes.items()))}")
    REPORT.append(f"fuzzer: refused by the library, by check: {dict(sorted(library_codes.items()))}")
    assert counts["planned VALID"] >= POINTS // 5, counts  # enough points reach the library
    assert not false_accepts, "points the plan calls VALID that the library refuses:\n" + "\n".join(
        f"python train.py {command}\n    -> {finding}" for command, finding in false_accepts.values()
    )


def _judge(recipes: RecipeCache, spec: RunSpec, cache: dict[tuple[Any, ...], Any]) -> list[str]:
    """The library's refusals of a point the plan calls VALID (cached per library configuration)."""
    from moe_vlm.engines.megatron.library_checks import Check, check_config

    key = _library_key(spec)
    if key not in cache:
        cfg = recipes.config(spec)
        apply_overrides(cfg, spec)
        cache[key] = check_config(cfg, spec)
    return [f.line() for f in cache[key] if f.check is not Check.stack]


@needs_stack
def test_no_point_on_the_shape_axes_planned_valid_is_refused(recipes: RecipeCache) -> None:
    """Data kinds x packing x precision x TP/CP/SP x MBS x odd sequence lengths: each point is planned
    as a dry run plans it (the rules, then the shape check of its real micro-batch), and each point
    the plan calls VALID goes through the library's checks. 0 false accepts: none the library refuses,
    and none the rules pass and the shape check refuses without an S finding (the plan says why)."""
    rng = random.Random(SEED + 2)
    per_node = gpus_per_node()
    started = time.monotonic()
    counts: collections.Counter[str] = collections.Counter()
    codes: collections.Counter[str] = collections.Counter()
    cache: dict[tuple[Any, ...], Any] = {}
    false_accepts: dict[str, str] = {}
    for _ in range(SHAPE_POINTS):
        point = draw_shape_point(rng, per_node)
        spec = RunSpec.from_config(assemble(point))
        counts["points"] += 1
        refused = errors(validate(spec))
        if refused:
            counts["refused by rules"] += 1
            codes.update({f.code for f in refused})
            continue
        shaped = shape_check(spec)
        if errors(shaped):
            counts["refused by the shape check"] += 1
            codes.update({f.code for f in errors(shaped)})
            continue
        counts["planned VALID"] += 1
        if any(f.code == "S000" for f in shaped):
            counts["VALID, shape check not run (S000)"] += 1
        for line in _judge(recipes, spec, cache):
            false_accepts.setdefault(
                line[:160], f"python train.py {' '.join(point.overrides)}\n    -> {line}"
            )
    seconds = time.monotonic() - started
    REPORT.append(
        f"shape fuzzer (seed {SEED + 2}): {counts['points']} points in {seconds:.0f} s: {counts['refused by rules']} "
        f"refused by rules, {counts['refused by the shape check']} by the shape check, {counts['planned VALID']} "
        f"planned VALID ({counts['VALID, shape check not run (S000)']} with S000), {len(cache)} library "
        f"configurations, {len(false_accepts)} VALID but refused by the library; codes: {dict(sorted(codes.items()))}"
    )
    assert counts["planned VALID"] >= SHAPE_POINTS // 10, counts
    assert counts["refused by the shape check"] > 0, counts  # the odd lengths reach TE's checks
    assert not false_accepts, "points the plan calls VALID that the library refuses:\n" + "\n".join(
        false_accepts.values()
    )
