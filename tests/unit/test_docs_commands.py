"""Every command in docs/*.md runs as written (README.md's: tests/integration/test_readme.py).

The ```bash blocks are extracted (a trailing backslash joins lines) and run in order, one shell per
block, in a scratch directory laid out like the repository (train.py, conf/, sweeps/, scripts/,
.venv), with the venv's `python` and `moe-vlm` first on PATH. Commands that would train or
submit run in their plan-only form: `dry_run=true` is appended to `train.py` and `torchrun`
lines that do not set it. Since nothing trains, the scratch directory starts with one recorded
sweep (tests/fixtures/advise/gb200_30b_sweep, as a sweep leaves it) under multirun/, with the
`multirun/latest` link a sweep leaves, which the docs' `multirun/latest` and globs find. Plans leave out the sections Bridge
builds (MOE_VLM_PLAN_SHALLOW=1, as a big dry run does: seconds per Megatron point, checked
against the real library in tests/megatron), so the whole test stays within minutes. A line whose comment says
`# cluster only: <reason>` or `# long run: <reason>` is skipped, with that reason; a line whose
comment says `exits 2` shows bad input and must exit with status 2.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from moe_vlm.run.plan import SHALLOW_ENV
from tests.conftest import REPO

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# README.md's commands run as written, not plan-only, in tests/integration/test_readme.py (with and
# without Slurm); running them here again in their weaker plan-only form cost CI two minutes.
PLANNED_DOCS = [doc for doc in DOCS if doc.name != "README.md"]
SWEEP_FIXTURE = REPO / "tests" / "fixtures" / "advise" / "gb200_30b_sweep"
SKIP = re.compile(r"#\s*(cluster only|long run):\s*\S")
FAILS = re.compile(r"#.*\bexits 2\b")
PLANNED = re.compile(r"(^|\s)(\S*python\S* \S*train\.py|torchrun .*train\.py)(\s|$)")
LINKED = ("train.py", "conf", "sweeps", "scripts", "moe_vlm", "hydra_plugins", ".venv", "pyproject.toml")


def bash_blocks(path: Path) -> list[list[str]]:
    """The commands of each ```bash block of a document (continuations joined, comment lines dropped)."""
    blocks = []
    for body in re.findall(r"^```bash\n(.*?)^```", path.read_text(), re.S | re.M):
        commands: list[str] = []
        pending = ""
        for line in body.splitlines():
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1] + " "
                continue
            line = pending + line
            pending = ""
            if line.strip() and not line.strip().startswith("#"):
                commands.append(line.strip())
        blocks.append(commands)
    return blocks


def planned_form(command: str) -> str:
    """The command as the test runs it: plan-only when it would train or submit."""
    code, hash_, comment = command.partition(" #")
    if PLANNED.search(code) and "dry_run=" not in code:
        code = code.rstrip() + " dry_run=true"
    # A planned sweep writes its points' plan.json: outside multirun/, so the recorded sweep stays
    # multirun/latest for the commands after it, as a sweep that ran would be.
    if PLANNED.search(code) and re.search(r"(^|\s)-m(\s|$)", code) and "hydra.sweep.dir=" not in code:
        code = code.rstrip() + " 'hydra.sweep.dir=planned/${now:%H-%M-%S-%f}'"
    return code + hash_ + comment


def test_every_bash_block_is_found() -> None:
    found = {path.name: bash_blocks(path) for path in DOCS}
    assert found["README.md"] and sum(bool(blocks) for blocks in found.values()) >= 8
    assert sum(len(b) for blocks in found.values() for b in blocks) >= 30


@pytest.mark.slow
@pytest.mark.parametrize("doc", PLANNED_DOCS, ids=lambda p: p.name)
def test_the_commands_of_a_document_run_as_written(doc: Path, tmp_path: Path) -> None:
    blocks = bash_blocks(doc)
    if not blocks:
        pytest.skip(f"{doc.name} has no bash block")
    for name in LINKED:
        (tmp_path / name).symlink_to(REPO / name)
    shutil.copytree(SWEEP_FIXTURE, tmp_path / "multirun" / "recorded-sweep")
    (tmp_path / "multirun" / "latest").symlink_to("recorded-sweep")  # as the sweep left it
    env = {
        **os.environ,
        "PATH": f"{REPO / '.venv' / 'bin'}:{os.environ['PATH']}",
        "PYTHONPATH": str(REPO),
        "MOE_VLM_SITE_FILE": "none",  # no site file: nothing is submitted
        SHALLOW_ENV: "1",
    }
    for commands in blocks:
        script = ["set -e"]
        for command in commands:
            if SKIP.search(command):
                continue
            if FAILS.search(command):  # bad input on purpose: one line, exit status 2
                script.append(f"set +e; {planned_form(command)}\nrc=$?; set -e; [ $rc -eq 2 ]")
                continue
            script.append(planned_form(command))
        done = subprocess.run(
            ["bash", "-c", "\n".join(script)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            # A bound on a hang, not a speed check: on a loaded machine one block of megatron.md ran
            # past 300 s (the whole document took 410 s there).
            timeout=900,
        )
        assert done.returncode == 0, (
            f"{doc.name}: {script}\nstdout: {done.stdout[-3000:]}\nstderr: {done.stderr[-3000:]}"
        )


def test_every_dry_run_the_readme_shows_plans_clean() -> None:
    """A new user's first plans fit and warn of nothing (the tour's 235B showcase once planned at
    189 GiB of 185: "likely OOM"): each `train.py ... dry_run=true` line of the README, composed,
    has no finding at warning level or above and a memory estimate that fits."""
    import shlex

    from moe_vlm.config.compose import compose_spec
    from moe_vlm.perf.memory import estimate
    from moe_vlm.rules import validate

    shown = [
        shlex.split(line)[2:]
        for block in bash_blocks(REPO / "README.md")
        for line in block
        if " train.py " in line and line.rstrip().endswith("dry_run=true") and " -m " not in line
    ]
    assert shown, "the README shows no single-point dry run"
    for overrides in shown:
        spec = compose_spec(overrides)
        assert [f.code for f in validate(spec)] == [], overrides
        assert estimate(spec).fits, overrides
