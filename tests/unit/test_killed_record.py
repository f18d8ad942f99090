"""When is a `running` record's process gone (moe_vlm/runtime/heartbeat.py:gone), and the heartbeat.

Real processes and real /proc: a child that exited and was reaped, one that exited and was not
(a zombie), this process under its own PID and under a PID whose start time does not match (a
reused PID). A record from another host is judged by its heartbeat's age alone. The runs killed
with SIGKILL are in tests/integration/test_killed_runs.py.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from moe_vlm.base.files import HEARTBEAT_JSON
from moe_vlm.runtime.heartbeat import STALE_AFTER_S, Heartbeat, gone, process_info, read_heartbeat

HERE = socket.gethostname()


def record_of(
    pid: int, host: str = HERE, start_ticks: int | None = None, started: float | None = None
) -> dict:
    return {
        "status": "running",
        "process": {
            "host": host,
            "pid": pid,
            "pid_start_ticks": start_ticks,
            "started_unix_s": time.time() if started is None else started,
        },
    }


def test_on_its_own_host_the_pid_decides() -> None:
    me = process_info()
    assert gone({"status": "running", "process": me}, None) is None
    # An old heartbeat does not make a live local process dead: the PID decides here.
    assert gone({"status": "running", "process": me}, time.time() - 10 * STALE_AFTER_S) is None

    reaped = subprocess.Popen([sys.executable, "-c", "pass"])
    reaped.wait()
    why = gone(record_of(reaped.pid), None)
    assert why == f"process {reaped.pid} on {HERE} is gone and left no final record"


def test_a_zombie_and_a_reused_pid_are_gone() -> None:
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 30
    while Path(f"/proc/{zombie.pid}/stat").read_text().split(") ")[1][0] != "Z":
        assert time.monotonic() < deadline, "the child never exited"
        time.sleep(0.05)
    try:
        assert gone(record_of(zombie.pid), None) is not None  # exited, not yet reaped
    finally:
        zombie.wait()
    me = process_info()
    assert me["pid_start_ticks"] is not None
    reused = record_of(os.getpid(), start_ticks=me["pid_start_ticks"] + 1)
    assert gone(reused, None) is not None


def test_from_another_host_a_stale_heartbeat_decides() -> None:
    now = time.time()
    other = record_of(os.getpid(), host="some-other-node", started=now - 3600)
    assert gone(other, now - 10, now_s=now) is None
    why = gone(other, now - STALE_AFTER_S - 1, now_s=now)
    assert why is not None and why.startswith("no heartbeat from some-other-node for ")
    # No heartbeat file yet: the start time stands in for it.
    assert gone(other, None, now_s=now) is not None
    assert gone(record_of(1, host="n2", started=now), None, now_s=now) is None


def test_the_heartbeat_thread_beats_and_stops(tmp_path: Path) -> None:
    with Heartbeat(tmp_path, interval_s=0.05):
        deadline = time.monotonic() + 20
        while read_heartbeat(tmp_path) is None:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        first = read_heartbeat(tmp_path)
        while read_heartbeat(tmp_path) == first:
            assert time.monotonic() < deadline, "the heartbeat did not advance"
            time.sleep(0.02)
    stopped = read_heartbeat(tmp_path)
    time.sleep(0.3)
    assert read_heartbeat(tmp_path) == stopped
    assert json.loads((tmp_path / HEARTBEAT_JSON).read_text())["pid"] == os.getpid()


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork only")
def test_forking_while_the_heartbeat_runs_leaves_the_child_free_to_write(tmp_path: Path) -> None:
    """The torch engine forks its ranks while the heartbeat thread runs; a child that inherited
    the beat lock held would hang on its first write."""
    with Heartbeat(tmp_path, interval_s=0.001):
        for _ in range(20):
            pid = os.fork()
            if pid == 0:  # the child: one beat of its own, then out; SIGALRM ends a hung one
                signal.alarm(10)
                from moe_vlm.runtime.heartbeat import beat

                beat(tmp_path / "child")
                os._exit(0)
            _, status = os.waitpid(pid, 0)
            assert os.waitstatus_to_exitcode(status) == 0
