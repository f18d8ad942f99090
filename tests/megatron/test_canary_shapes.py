"""Issue 49, item 2: every distinct shape of a sweep gets the shape check, in the plan where Transformer
Engine imports and in the canary where it does not.

On a login node without TE, `-m precision=fp8cs tp=2 seq_length=4096,4100` planned "2 valid" (S000 on
each) and the canary shape-checked its first point only: the 4100 point started and died in TE's FP8
GEMM assert (transformer_engine/pytorch/utils.py:704-714). The canary's pass over its points file
(moe_vlm/launch/canary.py check_points) now runs the library's checks and the shape check on each,
building one micro-batch per distinct shape; a refused point never starts, the others do.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from moe_vlm.engines.megatron.plan_cache import CACHE_ENV
from moe_vlm.launch.canary import REFUSED_PREFIX, check_points
from moe_vlm.runtime import points
from tests.megatron.conftest import needs_stack

pytestmark = needs_stack

SWEEP = ("cluster=gb200", "model=qwen3_vl_30b_a3b", "parallelism=3d", "precision=fp8cs", "tp=2")
LENGTHS = (4096, 4100, 4096)  # the third shares the first's shape: one batch for both


def points_file(tmp_path: Path) -> Path:
    """A sweep's points as the launcher lists them for its canary (launcher.py submit_canaries)."""
    sweep_dir, listed = tmp_path / "sweep", []
    for number, length in enumerate(LENGTHS):
        overrides = [*SWEEP, f"seq_length={length}", f"seed={number}"]
        name = f"p{number}-{length}"
        points.write_point(
            sweep_dir / name,
            {"point_id": name, "overrides": overrides, "config": {}, "valid": True, "refused": []},
        )
        listed.append({"point_dir": str(sweep_dir / name), "overrides": overrides})
    path = tmp_path / points.CANARY_POINTS
    path.write_text(json.dumps({"points": listed}))
    return path


def test_the_canary_shape_checks_every_point_and_holds_only_the_refused_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    listed = points_file(tmp_path)
    summary = check_points(listed)
    assert re.search(r"on 3 point\(s\) \(\d distinct shape\(s\) built\): 1 refused", summary), summary
    assert f"{REFUSED_PREFIX} p1-4100: S002: " in capsys.readouterr().out
    sweep_dir = tmp_path / "sweep"
    assert [r["code"] for r in points.refused(sweep_dir / "p1-4100")] == ["S002"]
    for passes in ("p0-4096", "p2-4096"):
        assert points.refused(sweep_dir / passes) == [] and not (sweep_dir / passes / "run.json").exists()
