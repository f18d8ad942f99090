"""On CPU, library noise a user cannot act on stays off the console (moe_vlm/base/noise.py).

Each test first shows the noise is there without the filter (otherwise the library no longer
prints it and the test skips, saying so), then that the project's code path keeps it out.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from moe_vlm.base.noise import CPP_EXTENSION_LOGGER, NO_CUDA_RUNTIME
from tests.conftest import REPO

KINETO_NOISE = ("gpuGetDeviceCount failed", "USDT:")

BARE_PROFILER = """
import torch
from torch.profiler import ProfilerActivity, profile
with profile(activities=[ProfilerActivity.CPU]):
    torch.ones(3) + 1
"""

STEP_PROFILER = """
import sys, torch
from pathlib import Path
from moe_vlm.record.profiling import StepProfiler, window
from tests.conftest import make_spec
spec = make_spec("profiling=torch")
profiler = StepProfiler(spec, Path(sys.argv[1]), 0, torch.device("cpu"))
for step in range(1, window(spec)[1] + 1):
    profiler.begin(step)
    torch.ones(64, 64) @ torch.ones(64, 64)
    profiler.end(step)
profiler.close()
print("trace", sorted(p.name for p in Path(sys.argv[1]).rglob("*.json*")))
"""


def python(code: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k != "KINETO_LOG_LEVEL"}
    env = base | {"PYTHONPATH": str(REPO), "CUDA_VISIBLE_DEVICES": ""} | (env or {})
    return subprocess.run(
        [sys.executable, "-c", code, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )


def test_kineto_noise_stays_off_the_console_on_cpu(tmp_path: Path) -> None:
    bare = python(BARE_PROFILER)
    if not any(noise in bare.stderr for noise in KINETO_NOISE):
        pytest.skip(f"this torch's Kineto prints none of {KINETO_NOISE} on CPU: nothing to filter")
    done = python(STEP_PROFILER, str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert "rank-0.json.gz" in done.stdout  # the profiler still recorded the window
    assert not [noise for noise in KINETO_NOISE if noise in done.stdout + done.stderr], done.stderr


def test_the_no_cuda_runtime_warning_is_dropped_and_nothing_else(tmp_path: Path) -> None:
    # torch.utils.cpp_extension warns at import when CUDA_HOME exists and no GPU does; TE imports it.
    env = {"CUDA_HOME": str(tmp_path)}
    bare = python("import torch.utils.cpp_extension", env=env)
    if NO_CUDA_RUNTIME not in bare.stderr:
        pytest.skip(f"torch did not print {NO_CUDA_RUNTIME!r} here (a GPU is visible, or torch changed)")
    done = python(
        "import moe_vlm, logging, torch.utils.cpp_extension\n"
        f"logging.getLogger({CPP_EXTENSION_LOGGER!r}).warning('another warning')",
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert NO_CUDA_RUNTIME not in done.stderr and "another warning" in done.stderr
