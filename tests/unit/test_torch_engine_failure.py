"""A rank that raises leaves run.json status failed, with the failure classified, and no half record."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import torch.distributed as dist

from moe_vlm.engines import RunFailed
from moe_vlm.engines.torch_engine import run_rank
from moe_vlm.launch.dist_env import DistEnv
from moe_vlm.record import RUN_JSON
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
