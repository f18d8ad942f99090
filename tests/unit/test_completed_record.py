"""A completed run.json carries the job's place from the engine's own write."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from moe_vlm.base.files import STEPS_JSONL
from moe_vlm.config.spec import RunSpec
from moe_vlm.engines import torch_engine
from moe_vlm.run.task import resolved_config
from moe_vlm.runtime.dist_env import ENV_POINT_RESTARTS
from tests.conftest import REPO, compose_cfg

STEPS = REPO / "tests" / "fixtures" / "cpu_sweep" / "4b3021dc6b3c834c" / STEPS_JSONL


def test_a_completed_record_says_where_the_job_ran_before_the_launcher_adds_to_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `moe-vlm status` calls a point completed from this write; the launcher's additions (host,
    # task times) come after, so restarts and the Slurm job id must already be here, as in a
    # failed record.
    cfg = compose_cfg("model=tiny_moe_vlm", "data=mock")
    shutil.copy(STEPS, tmp_path / STEPS_JSONL)
    for name in ("SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_STEP_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv(ENV_POINT_RESTARTS, "1")
    record = torch_engine._record(RunSpec.from_config(cfg), resolved_config(cfg), tmp_path, "completed")
    assert record["status"] == "completed"
    assert record["launch"] == {"slurm_job_id": "4242", "restarts": 1}
