"""The running record and its heartbeat: how a run killed without a word still leaves a record.

Rank 0 writes run.json with `status: running` when the run starts (`write_running`: host, PID
and its start time), then `Heartbeat` rewrites heartbeat.json every HEARTBEAT_S seconds from a
daemon thread until the engine writes the final record. `gone` says when the process behind a
running record is known to be dead; runtime/failures.py:settle_running turns such a record into
a failed one, class killed, for `moe-vlm status` (which writes it) and `report` (which does not).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

from moe_vlm.base.files import HEARTBEAT_JSON, RUN_JSON, write_json_atomic
from moe_vlm.record.records import RUNNING

# A beat is one small atomic file write: every 30 s costs nothing beside a training step.
HEARTBEAT_S = 30.0
# A record from another host is called dead after this long without a beat: ten missed beats,
# to ride out what delays a beat without the process being gone: NFS/Lustre attribute caching
# (up to a minute on default NFS mounts), clock skew between nodes, and a rank stuck for a while
# in a C call that holds the GIL (graph capture, a large pickle). On the same host the PID decides.
STALE_AFTER_S = 300.0

# Held around every beat and across fork(): the torch engine forks its ranks while the heartbeat
# thread runs, and a child must never inherit the thread's write half done.
_BEAT_LOCK = threading.Lock()
os.register_at_fork(
    before=_BEAT_LOCK.acquire, after_in_parent=_BEAT_LOCK.release, after_in_child=_BEAT_LOCK.release
)


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state, start time in clock ticks since boot) from /proc/PID/stat; None without /proc."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Field 2 (the command name) may hold spaces and parentheses; the fields after it do not.
    fields = stat[stat.rfind(")") + 2 :].split()
    try:
        return fields[0], int(fields[19])  # fields 3 (state) and 22 (starttime)
    except (IndexError, ValueError):
        return None


def process_started_unix_s(pid: int | None = None) -> float | None:
    """When a process started (unix seconds), from /proc: its interpreter start-up and imports
    count. None without /proc."""
    stat = _proc_stat(os.getpid() if pid is None else pid)
    try:
        boot = next(
            int(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime ")
        )
    except (OSError, StopIteration, ValueError, IndexError):
        return None
    return round(boot + stat[1] / os.sysconf("SC_CLK_TCK"), 3) if stat else None


def process_info() -> dict[str, Any]:
    """This process, as a running record names it: where, which PID, since when."""
    pid = os.getpid()
    stat = _proc_stat(pid)
    return {
        "host": socket.gethostname(),
        "pid": pid,
        # Tells this process from a later one that got the same PID.
        "pid_start_ticks": stat[1] if stat else None,
        "started_unix_s": round(time.time(), 3),
        "heartbeat_s": HEARTBEAT_S,
    }


def beat(run_dir: Path) -> None:
    with _BEAT_LOCK:
        write_json_atomic(
            run_dir / HEARTBEAT_JSON, {"time_unix_s": round(time.time(), 3), "pid": os.getpid()}
        )


def read_heartbeat(run_dir: Path) -> float | None:
    try:
        value = json.loads((run_dir / HEARTBEAT_JSON).read_text()).get("time_unix_s")
    except (OSError, ValueError, RecursionError, AttributeError):  # torn, binary, not an object
        return None
    return float(value) if isinstance(value, int | float) and abs(value) < 1e300 else None


def write_running(run_dir: Path, record: dict[str, Any]) -> dict[str, Any]:
    """run.json when the run starts: `status: running` and this process; a first beat before it,
    so that a running record always has a heartbeat to read."""
    beat(run_dir)
    running = {**record, "status": RUNNING, "process": process_info()}
    write_json_atomic(run_dir / RUN_JSON, running)
    return running


class Heartbeat:
    """Refreshes heartbeat.json every `interval_s` seconds from a daemon thread, whatever the run
    is doing (a first step that compiles for minutes beats as often as a fast one)."""

    def __init__(self, run_dir: Path, interval_s: float = HEARTBEAT_S) -> None:
        self.run_dir = run_dir
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="moe_vlm-heartbeat", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            # A full or briefly unreachable file system must not end the run; the next beat retries.
            with contextlib.suppress(OSError):
                beat(self.run_dir)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def _alive(pid: int, start_ticks: int | None) -> bool:
    if pid <= 0:
        return False  # no process id: kill(0) and kill(-1) would ask about process groups
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # no such process; a number no PID can be
        return False
    except PermissionError:
        pass  # another user's process: it exists
    stat = _proc_stat(pid)
    if stat is None:
        return True  # no /proc: kill(0) is all there is to know
    state, ticks = stat
    # A zombie is dead but not yet reaped; other start ticks: the PID now belongs to another process.
    return state not in ("Z", "X") and (start_ticks is None or ticks == start_ticks)


def gone(
    record: dict[str, Any],
    heartbeat_unix_s: float | None,
    now_s: float | None = None,
    host: str | None = None,
) -> str | None:
    """Why the process of a `running` record is known to be dead (one line), or None while it may
    be alive. On its own host the PID decides; from another host, a heartbeat older than
    STALE_AFTER_S (the last beat, else the start time)."""
    process = record.get("process") or {}
    pid, where = process.get("pid"), process.get("host")
    if where and where == (host or socket.gethostname()) and isinstance(pid, int):
        if _alive(pid, process.get("pid_start_ticks")):
            return None
        return f"process {pid} on {where} is gone and left no final record"
    last = heartbeat_unix_s if heartbeat_unix_s is not None else process.get("started_unix_s")
    if not isinstance(last, int | float):
        return None
    age = (time.time() if now_s is None else now_s) - last
    if age <= STALE_AFTER_S:
        return None
    return (
        f"no heartbeat from {where or 'its host'} for {age:.0f} s (a run beats every {HEARTBEAT_S:.0f} s; "
        f"stale after {STALE_AFTER_S:.0f} s)"
    )
