"""The canary's job-side check (moe_vlm/launch/canary.py), run for real on this machine."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from moe_vlm.launch.canary import FAILED_PREFIX, CanaryFailed, check_gpus, main
from tests.conftest import make_spec

REPO = Path(__file__).resolve().parents[2]


def test_the_canary_passes_where_the_torch_engine_imports(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["model=tiny_moe_vlm", "data=mock", "nproc=2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("moe_vlm canary: ok in ") and "cluster=local engine=torch" in out


def test_an_interpreter_without_the_stack_fails_the_canary_with_one_last_line() -> None:
    # The venv's own base interpreter: a real Python that lacks the project's dependencies, as a
    # container image without them would.
    base = getattr(sys, "_base_executable", sys.executable)
    probe = subprocess.run([base, "-c", "import submitit"], capture_output=True)
    if probe.returncode == 0:
        pytest.skip(f"{base} imports submitit: run the tests from a virtual environment (scripts/test.sh)")
    done = subprocess.run(
        [base, "-m", "moe_vlm.launch.canary", "model=tiny_moe_vlm"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert (
        done.stderr.strip().splitlines()[-1]
        == f"{FAILED_PREFIX}: ModuleNotFoundError: No module named 'submitit'"
    )


def test_a_point_that_does_not_compose_fails_the_canary(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["model=no_such_model"]) == 1
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith(FAILED_PREFIX) and "no_such_model" in last


def test_on_a_gpu_cluster_the_canary_needs_cuda_to_see_the_jobs_gpus() -> None:
    spec = make_spec("cluster=gb200", "model=qwen3_vl_30b_a3b")
    if torch.cuda.is_available():
        assert "GPU(s)" in check_gpus(spec)
    else:
        with pytest.raises(CanaryFailed, match="CUDA sees no GPU"):
            check_gpus(spec)
    assert check_gpus(make_spec("cluster=local")) == ""
