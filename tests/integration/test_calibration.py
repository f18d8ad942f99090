"""One calibration point for real: the torch engine's measured peak RSS against the estimate.

The full table comes from scripts/calibrate_memory.py (minutes); this runs its smallest useful
point (tiny model, mock data, seq 2048, MBS 1, 2 CPU ranks, 2 steps) through the same helpers.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parent.parent.parent / "scripts" / "calibrate_memory.py"


def calibrate_module() -> Any:
    spec = importlib.util.spec_from_file_location("calibrate_memory", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the script loads
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_estimate_within_target_of_the_measured_peak(tmp_path: Path) -> None:
    calibrate = calibrate_module()
    point = next(p for p in calibrate.POINTS if p.name == "mock_mbs1")
    overrides = calibrate.point_overrides(point, train_iters=2)
    measured = calibrate.run_point(overrides, tmp_path / "run", timeout_s=300)
    assert measured.memory_kind == "process_peak_rss" and measured.padded
    found = calibrate.estimate_for(overrides, measured)
    # The runtime's own RSS (python, torch, gloo) moves by tens of MiB between environments and
    # machine states, so, as the script does, the estimate is compared against a baseline point
    # measured in this same test rather than against the stored constant.
    base_overrides = calibrate.point_overrides(calibrate.BASELINE, train_iters=2)
    base = calibrate.run_point(base_overrides, tmp_path / "baseline", timeout_s=300)
    runtime_gib = base.peak_gib - calibrate.above_baseline_gib(calibrate.estimate_for(base_overrides, base))
    above_estimate = calibrate.above_baseline_gib(found)
    above_measured = measured.peak_gib - runtime_gib
    assert above_estimate + runtime_gib == pytest.approx(measured.peak_gib, rel=0.10)
    # About 90 MiB above the runtime here; run-to-run noise is a few MiB: allow 25%.
    assert above_estimate == pytest.approx(above_measured, rel=0.25), (above_estimate, above_measured)
