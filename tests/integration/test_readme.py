"""README.md, executed: every command of its ```bash blocks, as written, in a fresh directory.

Each command runs in its own `bash -c`, in order, in a scratch directory laid out like a clone
(train.py, conf/, sweeps/, scripts/, moe_vlm/, hydra_plugins/, .venv linked from the repository),
so every output (outputs/, multirun/) lands there. It runs twice: on a machine without Slurm's
client tools (PATH with sbatch, squeue, srun, sinfo, scontrol, sacct and scancel masked) and on the
real local Slurm (marked `slurm`). Unlike tests/unit/test_docs_commands.py (every document,
plan-only), the README's commands really train and sweep here: the tiny CPU model is the default.

EXPECT says, per command, what the README says it shows: the exit status, text the output holds,
at most how many lines, that nothing is written. A README command without an entry, or an entry
for a command the README no longer has, fails the test, so the two cannot drift apart.

The two set-up commands are represented by their installed equivalents (RUN_AS): `bash
scripts/bootstrap.sh` is what made the `.venv` these commands already use, so its line runs as
the `.venv/bin/python train.py` it chains to; `bash scripts/test.sh` is the suite this test
belongs to (running it here would recurse), so it is checked to parse (`bash -n`).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.unit.test_docs_commands import bash_blocks

LINKED = ("train.py", "conf", "sweeps", "scripts", "moe_vlm", "hydra_plugins", ".venv", "pyproject.toml")
SLURM_TOOLS = ("sbatch", "squeue", "srun", "sinfo", "scontrol", "sacct", "scancel")
SLURM_CONF = "/tmp/moe_vlm_slurm/slurm.conf"
PLAN_SCREEN = 40  # a plan fits on one screen (docs/configuration.md)
SHOWCASE = (
    ".venv/bin/python train.py parallelism=fsdp dispatcher=hybridep recompute=selective cluster=gb200 "
    "model=qwen3_vl_235b_a22b nodes=16 dry_run=true"
)
SLURM_DRY_RUN = (
    ".venv/bin/python train.py -m hydra/launcher=slurm_gb200 cluster=gb200 model=qwen3_vl_30b_a3b "
    "mbs=1,2,4 dry_run=true"
)


@dataclass(frozen=True)
class Expect:
    """What the README says a command shows."""

    rc: int = 0
    shows: tuple[str, ...] = ()  # regular expressions, each found in stdout + stderr (MULTILINE)
    max_lines: int | None = None  # stdout + stderr
    writes_nothing: bool = False  # no file appears in the scratch directory


EXPECT: dict[str, Expect] = {
    # "installs, then trains the tiny MoE VLM on CPU (2 ranks, FSDP2), leaving a run record"
    "bash scripts/bootstrap.sh && .venv/bin/python train.py": Expect(shows=(r"tokens/s",)),
    "bash scripts/test.sh": Expect(),
    # "knobs, layout, every rule finding at once, the per-GPU memory estimate ... plan.json. Nothing runs."
    SHOWCASE: Expect(
        shows=(r"^layout ", r"^memory .*FITS", r"^predicted ", r"plan\.json", r"^VALID$"),
        max_lines=PLAN_SCREEN,
    ),
    # "one line naming the key, the allowed values and a fix, exit status 2"
    ".venv/bin/python train.py dispatcher=foo": Expect(
        rc=2, shows=(r"dispatcher", r"alltoall", r"hybridep", r"[Ff]ix"), max_lines=1, writes_nothing=True
    ),
    # "Train on CPU and read the record: resolved config, per-step metrics, effective tokens/s."
    ".venv/bin/python train.py train_iters=6": Expect(shows=(r"tokens/s",)),
    "ls -A outputs/*/*/": Expect(shows=(r"^run\.json$", r"^steps\.jsonl$", r"^\.hydra$")),
    # "The sweep prints its directory"
    ".venv/bin/python train.py -m mbs=1,2 recompute=none,full train_iters=6": Expect(shows=(r"multirun/",)),
    # "a report that ranks configurations by effective tokens/s/GPU, mock data kept apart"
    ".venv/bin/moe-vlm report multirun/latest": Expect(
        shows=(r"^4 runs: 4 completed", r"Ranked by effective .*tokens/s/GPU", r"^\| 1=? \| ")
    ),
    # "prints every sbatch script it would submit, on any machine (no Slurm tools needed)"
    SLURM_DRY_RUN: Expect(shows=(r"^#SBATCH ", r"3 point\(s\)", r"nothing was submitted")),
    # "status lists the points as planned, not submitted"
    ".venv/bin/moe-vlm status multirun/latest": Expect(shows=(r"planned",)),
    # "Where to start, and what to try next after a sweep."
    ".venv/bin/moe-vlm advise cluster=gb200 model=qwen3_vl_235b_a22b nodes=16": Expect(
        shows=(
            r"^start:",
            r"python train\.py cluster=gb200 model=qwen3_vl_235b_a22b nodes=16 ",
            r"predicted peak",
        )
    ),
    # "why the model ranks one point above another": the terms that differ, with their seconds
    '.venv/bin/moe-vlm explain "dispatcher=hybridep" "dispatcher=alltoall" cluster=gb200 model=qwen3_vl_30b_a3b nodes=2': Expect(
        shows=(r"^knobs that differ: .*dispatcher", r"^verdict ", r"^ep_hybridep ", r"^ep_alltoall ")
    ),
}

RUN_AS = {
    "bash scripts/bootstrap.sh && .venv/bin/python train.py": ".venv/bin/python train.py",
    "bash scripts/test.sh": "bash -n scripts/test.sh",
}


def readme_commands() -> list[str]:
    """Every command of README.md's ```bash blocks, in order, without its trailing comment."""
    return [c.partition(" #")[0].strip() for block in bash_blocks(REPO / "README.md") for c in block]


def test_every_readme_command_has_its_expectation() -> None:
    assert sorted(readme_commands()) == sorted(EXPECT), "README.md and EXPECT differ: add or drop the entry"


def without_slurm(tmp_path: Path) -> str:
    """PATH with every directory holding a Slurm client tool replaced by a copy of it (symlinks)
    without those tools."""
    parts = []
    for i, entry in enumerate(os.environ["PATH"].split(os.pathsep)):
        folder = Path(entry)
        if not any((folder / tool).exists() for tool in SLURM_TOOLS):
            parts.append(entry)
            continue
        shadow = tmp_path / f"path{i}"
        shadow.mkdir()
        for item in folder.iterdir():
            if item.name not in SLURM_TOOLS:
                (shadow / item.name).symlink_to(item)
        parts.append(str(shadow))
    path = os.pathsep.join(parts)
    assert not any(shutil.which(tool, path=path) for tool in SLURM_TOOLS)
    return path


def files_under(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if not any(p.is_relative_to(root / name) for name in LINKED)}


def run_readme(tmp_path: Path, env: dict[str, str]) -> None:
    work = tmp_path / "clone"
    work.mkdir()
    for name in LINKED:
        (work / name).symlink_to(REPO / name)
    env = {
        **env,
        "PYTHONPATH": str(REPO),  # this checkout's moe_vlm, whatever the venv's editable install names
        "MOE_VLM_SITE_FILE": "none",  # no site file: nothing routes to Slurm
    }
    failures = []
    for command in readme_commands():
        expect = EXPECT[command]
        before = files_under(work)
        done = subprocess.run(
            ["bash", "-c", RUN_AS.get(command, command)],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=1800,  # minutes on an idle machine; a loaded one (load 13 on 2 cores) took 25 for the sweep
        )
        out = done.stdout + done.stderr
        lines = out.splitlines()
        problems = []
        if done.returncode != expect.rc:
            problems.append(f"exit status {done.returncode}, not {expect.rc}")
        if "Traceback" in out:
            problems.append("a traceback")
        problems += [
            f"no match for {pattern!r}" for pattern in expect.shows if not re.search(pattern, out, re.M)
        ]
        if expect.max_lines is not None and len(lines) > expect.max_lines:
            problems.append(f"{len(lines)} lines, more than {expect.max_lines}")
        if expect.writes_nothing and files_under(work) != before:
            problems.append(f"wrote {sorted(map(str, files_under(work) - before))}")
        if problems:
            failures.append(f"$ {command}\n  {'; '.join(problems)}\n{out[-2500:]}")
    assert not failures, "\n\n".join(failures)


@pytest.mark.slow
def test_the_readme_runs_as_written_without_slurm_tools(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    run_readme(tmp_path, {**env, "PATH": without_slurm(tmp_path)})


@pytest.mark.slow
@pytest.mark.slurm
def test_the_readme_runs_as_written_on_slurm(tmp_path: Path) -> None:
    env = {**os.environ, "SLURM_CONF": os.environ.get("SLURM_CONF", SLURM_CONF)}
    ping = subprocess.run(["scontrol", "ping"], env=env, capture_output=True, text=True, timeout=20)
    if ping.returncode != 0 or "UP" not in ping.stdout:
        if os.environ.get("MOE_VLM_SLURM") == "1":
            pytest.fail(
                "MOE_VLM_SLURM=1 but Slurm is not answering `scontrol ping` (is SLURM_CONF exported?)"
            )
        pytest.skip(
            "no Slurm here: `eval $(scripts/slurm_local.sh start) && MOE_VLM_SLURM=1 pytest -m slurm`"
        )
    run_readme(tmp_path, env)
