"""scripts/megatron_smoke.sh: a smoke test in which nothing ran must not pass."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO


@pytest.mark.slow
def test_every_dispatcher_skipped_exits_non_zero_and_says_why(tmp_path: Path) -> None:
    # TP=3 on an 8-GPU node: the rule catalogue rejects every dispatcher's plan, so no torchrun
    # starts and no GPU is needed (GPUS stands for what nvidia-smi would list on the node).
    env = {**os.environ, "GPUS": "8", "SMOKE_DIR": str(tmp_path), "PYTHON": sys.executable}
    done = subprocess.run(
        ["bash", "scripts/megatron_smoke.sh", "b200", "tp=3"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 3, done.stdout + done.stderr
    skipped = [line.strip() for line in done.stdout.splitlines() if line.strip().startswith("SKIP")]
    assert [line.split()[1] for line in skipped] == ["alltoall:", "allgather:", "deepep:", "hybridep:"]
    assert all("ERROR L001" in line for line in skipped)
    assert "every dispatcher was skipped (reasons above): nothing ran, so nothing was checked." in done.stderr
    assert not list(tmp_path.glob("*.log"))  # no run was started
