"""A half-installed Transformer Engine (its Python package without its torch extension): one line
naming the broken install and the fix, never a traceback; a dry run goes on with the checks that need
no TE and says which it skipped (issue 49, item 4).

tests/megatron/te_half_installed.py runs train.py with TE's own search for its extension finding no
file, so TE raises its own FileNotFoundError (transformer_engine/common/__init__.py:154) from its own
loader, as it does after an interrupted `pip install`; the shared venv is left whole.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO
from tests.megatron.conftest import needs_stack

pytestmark = needs_stack

HALF = Path(__file__).with_name("te_half_installed.py")
# The point of issue 49's item 2: rules pass it; with TE, the shape check refuses it (S002).
POINT = (
    "cluster=gb200",
    "model=qwen3_vl_30b_a3b",
    "parallelism=3d",
    "precision=fp8cs",
    "tp=2",
    "seq_length=4100",
)


def half_installed(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MOE_VLM_SITE_FILE": "none"}
    return subprocess.run(
        [sys.executable, str(HALF), "train.py", *overrides, f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_dry_run_names_the_broken_install_once_and_plans_the_rest(tmp_path: Path) -> None:
    done = half_installed(tmp_path, *POINT, "dry_run=true")
    assert done.returncode == 0 and "Traceback" not in done.stdout + done.stderr, done.stderr[-3000:]
    (line,) = [line for line in done.stdout.splitlines() if "Fix: reinstall its PyTorch extension" in line]
    assert "Transformer Engine is half-installed here: transformer-engine 2.20" in line
    assert "transformer_engine/common/__init__.py:154" in line and "scripts/install_megatron.sh" in line
    assert "skipped here: the library's own checks (LIB-*), the shape check (S...)" in line
    assert "memory " in done.stdout and "predicted " in done.stdout  # what needs no TE ran
    assert "S000" not in done.stdout  # said once, in the line above


def test_a_run_stops_with_one_line_and_exit_2(tmp_path: Path) -> None:
    done = half_installed(tmp_path, "cluster=gb200", "model=qwen3_vl_30b_a3b")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    (line,) = [line for line in done.stderr.splitlines() if line.startswith("moe_vlm: error:")]
    assert (
        "Transformer Engine is half-installed here" in line and "fix: reinstall its PyTorch extension" in line
    )
