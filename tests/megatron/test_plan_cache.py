"""The plan cache against the real Bridge: a hit gives the sections a build gives, a corrupt
entry is rebuilt, and the key covers every project module the build imports.

The first plan of the module's point builds every perf recipe of the family and runs Bridge's
runtime update on each (the seconds the cache saves); the tests after it read what it stored.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from moe_vlm.config.spec import RunSpec
from moe_vlm.engines.megatron import plan_cache
from moe_vlm.rules import validate
from moe_vlm.run.plan import render
from tests.conftest import REPO, make_spec
from tests.megatron.conftest import needs_stack

pytestmark = needs_stack
POINT = ("cluster=gb200", "model=qwen3_vl_30b_a3b", "nodes=2", "dry_run=true")
NOTES = ("(built now", "(from the plan cache:")


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("plan_cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(plan_cache.CACHE_ENV, str(path))
        yield path


@pytest.fixture(scope="module")
def first(cache: Path) -> tuple[RunSpec, str]:
    """The point's plan with nothing cached: every section built here."""
    spec = make_spec(*POINT)
    return spec, render(spec, validate(spec))


def without_notes(plan: str) -> list[str]:
    return [line for line in plan.splitlines() if not line.startswith(NOTES)]


def test_a_second_plan_reads_every_bridge_section_from_the_cache_and_prints_the_same(
    first: tuple[RunSpec, str], capsys: pytest.CaptureFixture[str]
) -> None:
    spec, built = first
    assert built.count("(built now with") == 2, built  # the stack check and the effective configuration
    assert "-- recipe family" in built and "not built here" not in built
    again = render(spec, validate(spec))
    assert capsys.readouterr().err == ""  # no build, so no progress line
    assert again.count("(from the plan cache:") == 2
    assert without_notes(again) == without_notes(built)


def test_the_second_dry_run_command_reads_both_sections_from_the_cache(tmp_path: Path) -> None:
    """Two `train.py ... dry_run=true` commands: the first builds (and says so on stderr), the
    second reads the stack check and the effective configuration from the cache, although it
    never imports the stack whose import sets environment variables (TE sets
    NVTE_CUDA_INCLUDE_DIR) and prints the same plan."""
    env = {
        **os.environ,
        plan_cache.CACHE_ENV: str(tmp_path / "cache"),
        "MOE_VLM_SITE_FILE": "none",
    }

    def dry_run() -> subprocess.CompletedProcess[str]:
        # dry_run=full: the whole plan, which says where each section came from (true: one screen)
        command = [
            sys.executable,
            str(REPO / "train.py"),
            *POINT,
            "dry_run=full",
            f"hydra.run.dir={tmp_path / 'out'}",
        ]
        done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stderr[-3000:]
        return done

    cold, warm = dry_run(), dry_run()
    assert cold.stdout.count("(built now with") == 2 and "first time for this configuration" in cold.stderr
    assert warm.stdout.count("(from the plan cache:") == 2, warm.stdout[-3000:]
    assert "first time for this configuration" not in warm.stderr
    plan = [line for line in cold.stdout.splitlines() if line.startswith(("==", "--", "  ", "VALID"))]
    assert [line for line in warm.stdout.splitlines() if line.startswith(("==", "--", "  ", "VALID"))] == plan


def test_a_cached_entry_round_trips_to_the_same_objects(first: tuple[RunSpec, str]) -> None:
    spec, _ = first
    planned, entry = plan_cache.planned_effective(spec)
    probes, stack_entry = plan_cache.stack_probe(spec)
    assert entry.hit and stack_entry.hit
    fresh = plan_cache.plan_effective(spec)  # what a build gives now, not through the cache
    assert planned == fresh
    assert planned.effective.lines() == fresh.effective.lines()
    assert planned.family_lines() == fresh.family_lines()
    assert [(p.module, p.version, p.error) for p in probes] == [
        (p.module, p.version, p.error) for p in plan_cache.probe(spec)
    ]


@pytest.mark.parametrize(
    "damage",
    [
        lambda text: text[: len(text) // 2],  # a write cut short (not by us: ours are atomic)
        lambda text: "\x00\xff binary",
        lambda text: json.dumps({**json.loads(text), "payload": {"recipe": 5}}),  # parses, does not load
        lambda text: json.dumps({**json.loads(text), "key": "another"}),  # another configuration's
    ],
    ids=["truncated", "binary", "wrong-shape", "other-key"],
)
def test_a_corrupt_entry_is_ignored_and_rebuilt(
    first: tuple[RunSpec, str], damage: object, capsys: pytest.CaptureFixture[str]
) -> None:
    spec, _ = first
    path = plan_cache.entry_path("effective", plan_cache.effective_inputs(spec))
    good = path.read_text()
    path.write_text(damage(good))  # type: ignore[operator]
    _, entry = plan_cache.planned_effective(spec)
    assert not entry.hit and entry.stored
    assert "building Bridge's ConfigContainer for model=qwen3_vl_30b_a3b" in capsys.readouterr().err
    rebuilt = json.loads(path.read_text())
    assert rebuilt["payload"] == json.loads(good)["payload"]
    assert plan_cache.planned_effective(spec)[1].hit


def test_the_code_version_covers_every_project_module_the_build_imports() -> None:
    """In a fresh interpreter: the project modules plan_effective imports while it builds
    (at module level or inside functions) are all in the key's code version."""
    script = f"""
import sys
from moe_vlm.engines.megatron import plan_cache
from tests.conftest import make_spec
spec = make_spec(*{POINT!r})
before = set(sys.modules)
plan_cache.plan_effective(spec)
loaded = sorted(m for m in set(sys.modules) - before if m == "moe_vlm" or m.startswith("moe_vlm."))
print("LOADED=" + ",".join(loaded))
"""
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("LOADED=")]
    loaded = set(line.removeprefix("LOADED=").split(",")) - {""}
    assert loaded, "the build imported no project module (the check would prove nothing)"
    covered = set(plan_cache.code_modules(*plan_cache.EFFECTIVE_ROOTS))
    assert loaded <= covered, sorted(loaded - covered)
