"""A rank that raises leaves run.json status failed, with the failure classified, and no half record."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import torch.distributed as dist

from moe_vlm.base.errors import RunFailed
from moe_vlm.base.files import RUN_JSON
from moe_vlm.engines.torch_engine import run_rank
from moe_vlm.runtime.dist_env import DistEnv
from tests.conftest import make_spec


def test_failure_is_recorded(tmp_path: Path) -> None:
    # Real data from a directory that is not there: the data group raises when the rank starts
    # (rule A005 would have stopped `train.py`; run_rank is called directly to reach the engine).
    spec = make_spec("nproc=1", "data=real", f"data.path={tmp_path / 'missing'}")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = DistEnv(0, 1, 0, 1, "127.0.0.1", port, "spawn")
    with pytest.raises(RunFailed, match="python"):
        run_rank(spec, {"data": {"kind": "real"}}, tmp_path, env)
    assert not dist.is_initialized()  # torn down on the way out

    record = json.loads((tmp_path / RUN_JSON).read_text())
    assert record["status"] == "failed"
    assert record["failure"]["class"] == "python"
    assert any("missing" in line for line in record["failure"]["log_tail"])
    assert record["data"]["kind"] == "real"
    assert not list(tmp_path.glob(f".{RUN_JSON}.*"))


def test_a_failure_keeps_every_finished_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A step's line waits for the next step's start (its period ends there); a rank that fails in
    step 3 still leaves steps 1 and 2 in steps.jsonl (step 2 without a period)."""
    from moe_vlm.base.files import STEPS_JSONL
    from moe_vlm.engines import torch_engine
    from moe_vlm.record.records import StepRecord, read_steps

    real_step = torch_engine.Trainer.step

    def failing_step(self: torch_engine.Trainer, step: int) -> StepRecord:
        if step == 3:
            raise RuntimeError("injected fault in step 3")
        return real_step(self, step)

    monkeypatch.setattr(torch_engine.Trainer, "step", failing_step)
    spec = make_spec("nproc=1", "train_iters=4")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = DistEnv(0, 1, 0, 1, "127.0.0.1", port, "spawn")
    with pytest.raises(RunFailed):
        run_rank(spec, {}, tmp_path, env)
    steps = read_steps(tmp_path / STEPS_JSONL)
    assert [s.step for s in steps] == [1, 2]
    assert steps[0].step_period_s is not None and steps[1].step_period_s is None
