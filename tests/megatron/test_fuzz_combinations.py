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
import contextlib
import functools
import io
import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from moe_vlm.config.spec import RunSpec
from moe_vlm.engines.megatron.config import apply_overrides
from moe_vlm.engines.megatron.plan_cache import CACHE_ENV
from moe_vlm.knobs.bridge_fields import bridge_overrides
from moe_vlm.knobs.bridge_recipe import select_recipe
from moe_vlm.rules import catalogue, errors, validate
from moe_vlm.rules import shapes as shape_rules
from moe_vlm.run.plan import shape_check
from tests.megatron.conftest import REPORT, RecipeCache, needs_stack
from tests.megatron.fuzz_space import (
    THIRD_AXES,
    Point,
    assemble,
    draw,
    draw_shape_point,
    draw_sweep,
    gpus_per_node,
    space,
    third_points,
    unplaced,
)

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


# --- the third pass (issue 49): userbuffers x precision, odd lengths, every family x every knob ------

THIRD_SEED = SEED + 30
SWEEPS = 12  # with 2 or 3 points each the rules pass, differing in shape


@dataclass
class Fuzzed:
    """What a run of the fuzzer over some points found."""

    counts: collections.Counter[str] = field(default_factory=collections.Counter)
    codes: collections.Counter[str] = field(default_factory=collections.Counter)
    false_accepts: dict[str, str] = field(default_factory=dict)  # the library's line -> command line + it
    seconds: float = 0.0

    def lines(self, name: str) -> list[str]:
        c = self.counts
        return [
            f"{name}: {c['points']} points in {self.seconds:.0f} s: {c['refused by rules']} refused by rules, "
            f"{c['refused by the shape check']} by the shape check, {c['planned VALID']} planned VALID, "
            f"{len(self.false_accepts)} VALID but refused by the library",
            f"{name}: refused, by code: {dict(sorted(self.codes.items()))}",
        ]


def fuzz(points: list[Point], recipes: RecipeCache, cache: dict[tuple[Any, ...], Any]) -> Fuzzed:
    """Each point planned as a dry run plans it (the rules, then the shape check of its micro-batch);
    each VALID one through the library's checks (cached per library configuration in `cache`)."""
    found, started = Fuzzed(), time.monotonic()
    for point in points:
        spec = RunSpec.from_config(assemble(point))
        found.counts["points"] += 1
        refused = errors(validate(spec))
        stage = "refused by rules"
        if not refused:
            refused, stage = errors(shape_check(spec)), "refused by the shape check"
        if refused:
            found.counts[stage] += 1
            found.codes.update({f.code for f in refused})
            continue
        found.counts["planned VALID"] += 1
        for line in _judge(recipes, spec, cache):
            found.false_accepts.setdefault(
                line[:160], f"python train.py {' '.join(point.overrides)}\n    -> {line}"
            )
    found.seconds = time.monotonic() - started
    return found


@functools.cache
def third_pass() -> tuple[Point, ...]:
    return tuple(third_points(random.Random(THIRD_SEED), gpus_per_node()))


_LIBRARY: dict[tuple[Any, ...], Any] = {}
CATALOGUE_SIZE = len(catalogue.CATALOGUE) + len(
    shape_rules.SHAPE_RULES
)  # the library's verdicts: a mutation of ours changes none


@needs_stack
def test_no_point_on_the_third_pass_axes_planned_valid_is_refused(recipes: RecipeCache) -> None:
    """TP userbuffers (the recipe's, on, off) x every precision x sequence lengths that are multiples
    of 128 or only of 64, 32, 16, 8, 4 x every model family (Qwen3.5's GDN layers included) x TP, CP,
    PP, EP, ETP, SP, FSDP/3D x every packing mode x MBS: 0 false accepts."""
    found = fuzz(list(third_pass()), recipes, _LIBRARY)
    REPORT.append(f"third-pass fuzzer (seed {THIRD_SEED}) axes: {', '.join(THIRD_AXES)}")
    REPORT.extend(found.lines(f"third-pass fuzzer (seed {THIRD_SEED})"))
    assert found.counts["planned VALID"] >= len(third_pass()) // 10, found.counts
    assert {"S004", "L015"} <= set(found.codes), found.codes  # items 1 and 3 are in the space
    assert not found.false_accepts, "points the plan calls VALID that the library refuses:\n" + "\n".join(
        found.false_accepts.values()
    )


@needs_stack
@pytest.mark.parametrize(
    ("item", "code", "library"),
    [
        ("1: MXFP8 with TP userbuffers", "S004", "divisible by 128"),
        ("3: MoE TP > 1 without SP", "L015", "LIB-MOE: ValueError: During training"),
    ],
)
def test_the_third_pass_fuzzer_finds_each_item_with_its_fix_removed(
    recipes: RecipeCache, monkeypatch: pytest.MonkeyPatch, item: str, code: str, library: str
) -> None:
    """The guard, not the list: with the rule that mends an item taken out, the same draws report
    false accepts, the library's own refusal among them."""
    monkeypatch.setattr(catalogue, "CATALOGUE", [r for r in catalogue.CATALOGUE if r.code != code])
    monkeypatch.setattr(shape_rules, "SHAPE_RULES", [r for r in shape_rules.SHAPE_RULES if r.code != code])
    assert len(catalogue.CATALOGUE) + len(shape_rules.SHAPE_RULES) == CATALOGUE_SIZE - 1, code  # it was there
    found = fuzz(list(third_pass()), recipes, _LIBRARY)
    REPORT.append(f"mutation (item {item}, {code} removed): {len(found.false_accepts)} false accept(s) found")
    assert any(library in line for line in found.false_accepts.values()), found.false_accepts


def _canary_sweep(sweep: list[Point], tmp_path: Path) -> dict[str, list[str]]:
    """The canary's pass over a sweep's points file (moe_vlm/launch/canary.py check_points): which
    points it refuses, by directory name, with the codes it wrote into their point.json."""
    from moe_vlm.launch.canary import check_points
    from moe_vlm.runtime import points as point_records

    listed = []
    for number, point in enumerate(sweep):
        point_dir = tmp_path / f"p{number}"
        overrides = point.overrides
        point_records.write_point(
            point_dir,
            {"point_id": point_dir.name, "overrides": overrides, "config": {}, "valid": True, "refused": []},
        )
        listed.append({"point_dir": str(point_dir), "overrides": overrides})
    file = tmp_path / "points.json"
    file.write_text(json.dumps({"points": listed}))
    with contextlib.redirect_stdout(io.StringIO()):
        check_points(file)
    return {
        f"p{n}": [r["code"] for r in point_records.refused(tmp_path / f"p{n}")] for n in range(len(sweep))
    }


def _sweeps_fuzzed(recipes: RecipeCache, tmp_path: Path) -> tuple[collections.Counter[str], list[str]]:
    """Sweeps whose points differ in shape, planned as on a login node without Transformer Engine (the
    rules pass them; the shape check says S000) and checked by the canary on the cluster's stack:
    a point the canary lets start that the shape check or the library refuses is a false accept."""
    rng = random.Random(THIRD_SEED + 1)
    per_node = gpus_per_node()
    counts: collections.Counter[str] = collections.Counter()
    missed: list[str] = []
    for number in range(SWEEPS * 20):  # drawn until SWEEPS of them hold 2 points the rules pass
        if counts["sweeps"] == SWEEPS:
            break
        sweep = [
            p for p in draw_sweep(rng, per_node) if not errors(validate(RunSpec.from_config(assemble(p))))
        ]
        if len(sweep) < 2:
            continue
        counts["sweeps"] += 1
        counts["points"] += len(sweep)
        verdicts = _canary_sweep(sweep, tmp_path / f"s{number}")
        for index, point in enumerate(sweep):
            spec = RunSpec.from_config(assemble(point))
            truth = errors(shape_check(spec)) or _judge(recipes, spec, _LIBRARY)
            counts["refused by the canary"] += bool(verdicts[f"p{index}"])
            if truth and not verdicts[f"p{index}"]:
                missed.append(f"python train.py {' '.join(point.overrides)}: the canary let it start")
    return counts, missed


@needs_stack
def test_the_canary_refuses_every_point_of_a_sweep_that_differs_in_shape(
    recipes: RecipeCache, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    counts, missed = _sweeps_fuzzed(recipes, tmp_path)
    REPORT.append(
        f"sweep fuzzer (seed {THIRD_SEED + 1}): {counts['sweeps']} sweeps differing in shape, {counts['points']} "
        f"points the rules pass, {counts['refused by the canary']} refused by the canary, {len(missed)} false accepts"
    )
    assert counts["refused by the canary"] > 0 and not missed, missed


@needs_stack
def test_the_sweep_fuzzer_finds_item_2_with_its_fix_removed(
    recipes: RecipeCache, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Item 2 mutated back: the canary's per-point pass runs the library's checks only (the shape check
    on its first point alone, as before): the sweep fuzzer reports the points that start and die."""
    from moe_vlm.engines.megatron.plan_cache import library_checks
    from moe_vlm.launch import canary
    from moe_vlm.rules import Finding, Level

    def library_only(spec: RunSpec) -> list[Finding]:
        found, _entry = library_checks(spec)
        return [
            Finding(f.check.value, Level.error, ("engine",), f.message, f.fix) for f in found if f.refuses
        ]

    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(canary, "point_refusals", library_only)
    counts, missed = _sweeps_fuzzed(recipes, tmp_path)
    REPORT.append(
        f"mutation (item 2, the canary's per-point shape check removed): {len(missed)} false accept(s)"
    )
    assert missed, counts
