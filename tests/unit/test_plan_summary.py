"""A plan printed by default fits on one screen (40 lines), library output kept in plan.json;
dry_run=full prints the whole plan, and plan.txt holds it either way."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from moe_vlm.engines.megatron.plan_cache import CACHE_ENV
from moe_vlm.knobs.recipes import option_names
from moe_vlm.rules import validate
from moe_vlm.run.plan import PLAN_TEXT, SUMMARY_LINES, gather, summary
from tests.conftest import REPO, make_spec

SCREEN = 40


@pytest.mark.parametrize("name", option_names())
def test_every_recipe_plan_fits_one_screen_with_every_finding(name: str) -> None:
    """recipe=X dry_run=true as the console shows it: at most SUMMARY_LINES lines (the rest of the
    40 is left to the stack check's progress lines), every finding there, none cut."""
    spec = make_spec(f"recipe={name}", "dry_run=true")
    findings = validate(spec)
    # The sections Bridge builds are one line each here: shallow gives the same count, in ms.
    text = summary(spec, findings, gather(spec, findings, deep=False), "outputs/d/t")
    lines = text.splitlines()
    assert len(lines) <= SUMMARY_LINES, text
    assert "more in plan.txt" not in text, text
    for f in findings:
        assert any(line.startswith(f"  {f.level.value.upper()} {f.code} ") for line in lines), (f.code, text)
    assert lines[-1 if not findings else -1 - len(findings)].startswith(("VALID", "INVALID"))


def dry_run(tmp_path: Path, *overrides: str, cache: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "MOE_VLM_SITE_FILE": "none"}
    if cache is not None:
        env[CACHE_ENV] = str(cache)
    return subprocess.run(
        [sys.executable, str(REPO / "train.py"), *overrides, f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,  # the first plan of a GPU point imports Megatron: a minute on a busy machine
    )


@pytest.mark.slow
def test_a_gpu_plan_fits_one_screen_and_the_library_output_goes_to_plan_json(tmp_path: Path) -> None:
    """The 30B GB200 point, planned for the first time (the stack imported, Bridge's sections
    built): its console output, stdout and stderr, counted; the Megatron log lines and Python
    warnings those imports print are in plan.json, not on the console; plan.txt is the whole plan."""
    if importlib.util.find_spec("megatron.bridge") is None:
        pytest.skip("no Megatron Bridge here: the plan imports no library, so it prints none")
    # A cache of its own: the library is imported (and prints) only for a configuration not cached.
    done = dry_run(
        tmp_path, "cluster=gb200", "model=qwen3_vl_30b_a3b", "dry_run=true", cache=tmp_path / "cache"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    console = (done.stdout + done.stderr).splitlines()
    assert len(console) <= SCREEN, "\n".join(console)
    assert done.stdout.splitlines()[-1] == "VALID"
    assert not [line for line in console if "Warning" in line or "][INFO]" in line], console
    plan = json.loads((tmp_path / "run" / "plan.json").read_text())
    whole = (tmp_path / "run" / PLAN_TEXT).read_text()
    assert "-- Megatron Bridge --" in whole and "-- effective configuration" in whole
    assert plan["bridge"]["effective"] is not None, plan["bridge"]["effective_note"]
    assert any("][INFO]" in line for line in plan["library_output"]), plan["library_output"]
    assert f"{len(plan['library_output'])} line(s) of library output kept in plan.json" in done.stdout


@pytest.mark.slow
def test_dry_run_full_prints_the_whole_plan(tmp_path: Path) -> None:
    done = dry_run(tmp_path, "dry_run=full")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.rstrip("\n") == (tmp_path / "run" / PLAN_TEXT).read_text().rstrip("\n")
    assert "-- torch engine --" in done.stdout


CAPTURE = """
import logging, os, sys, warnings
from moe_vlm.base import noise
logging.basicConfig(stream=sys.stdout, format="[%(name)s][%(levelname)s] - %(message)s")
with noise.captured() as kept:
    print("from python")
    warnings.warn("a library warning", UserWarning, stacklevel=1)
    logging.getLogger("megatron.core").warning("a log line")
    os.system("echo from C")  # a child writing to the inherited descriptors
    print("progress", file=noise.progress(), flush=True)
print("KEPT", kept)
"""


def test_captured_takes_python_logging_and_c_level_output_and_gives_progress_the_console() -> None:
    done = subprocess.run(
        [sys.executable, "-c", CAPTURE],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == "progress", done.stderr
    kept = done.stdout.strip()
    assert kept.startswith("KEPT") and len(done.stdout.splitlines()) == 1, done.stdout
    for text in ("from python", "a library warning", "[megatron.core][WARNING] - a log line", "from C"):
        assert text in kept, kept
