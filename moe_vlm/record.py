"""The run record: run.json when the run starts and when it ends, steps.jsonl while it runs.

run.json is written with temp file + fsync + rename, so a killed run never leaves a
half-written record; steps.jsonl is appended and flushed line by line, so a killed run
leaves every completed step readable.

A run writes run.json with `status: running` when it starts (host, PID, start time) and
refreshes heartbeat.json every HEARTBEAT_S seconds from a thread until it ends, when the
engine replaces run.json with the final record (completed or failed). A `running` record
whose process is gone (`gone` below) was killed without a word: SIGKILL, the OOM killer,
a lost node outside Slurm. `moe-vlm status` and `report` show it as failed, class killed
(launch/failures.py:settle_running), with the steps it finished.

One steps.jsonl line per optimizer step per rank (rank 0 gathers and writes them all):

    step                 1-based optimizer step
    rank                 data-parallel rank
    host                 hostname of the process that measured it (records before it was added: absent)
    warmup               step <= warmup_steps (excluded from the steady window)
    time_unix_s          wall clock at the end of the step
    step_time_s          time of the whole optimizer step (all micro-batches): torch engine, host
                         clock between device synchronisations; Megatron, CUDA events on the
                         current stream at step start and end (no synchronise: read at the gather)
    loss                 mean loss over this rank's micro-batches (Megatron: Bridge's reduced loss,
                         taken from this DP rank's last pipeline stage, token-weighted over the
                         global batch for Qwen3-VL: megatron/bridge/training/train.py:980-992)
    grad_norm            global gradient norm (same on every rank)
    lr                   learning rate used
    micro_batches        accumulation steps run
    tokens               {"padded", "real", "text", "image", "loss"}: this rank, summed over micro-batches
    sequences, images, vision_patches, sum_seq_len_squared, sum_patches_squared
                         this rank, summed over micro-batches (see data.batch.BatchStats)
    peak_memory_gib      peak on this rank: torch engine, since the run started; Megatron, within
                         this step (torch.cuda.reset_peak_memory_stats at its start), the max over
                         the DP rank's model-parallel peers. The max over lines is the run's peak
    memory_kind          a metrics.MemoryKind: "cuda_max_allocated" (GPU) or "process_peak_rss" (CPU)
    components_s         {"vision_encoder", "projector", "decoder"}: forward + backward seconds
    data_wait_s          host seconds of step_time_s the training loop spent waiting for batches
                         (torch engine: building them in its loop; Megatron: inside next(data_iterator))
    exclude              optional reason this step is outside the steady window
                         ("profiler", "checkpoint", "cuda_graph_capture"), beside warm-up

Optional, where the engine measures them (the torch engine does):

    components_forward_s, components_backward_s
                         the two halves of components_s (None when timing hooks are off)
    optimizer_s          seconds of step_time_s in grad norm + optimizer step (collectives included)
    skipped_samples      samples the data pipeline dropped while building this step's batches
                         (Megatron: seeded draws it replaced; real data skips happen inside Energon)

Megatron only, read at the step's end, max over the DP rank's model-parallel peers:

    reserved_gib         torch.cuda.memory_reserved: the caching allocator's segments
    device_used_gib      cudaMemGetInfo total - free: the whole GPU, as nvidia-smi shows it;
                         minus reserved_gib, what lives outside the allocator (CUDA context, NCCL,
                         DeepEP/HybridEP and TE userbuffer buffers)
    bridge_step_flops, bridge_tflops_per_gpu
                         Bridge's FLOP count for the step, and it over the slowest rank's step time
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import os
import platform
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, TextIO

from moe_vlm.launch.safety import scrub
from moe_vlm.spec import RunSpec

RUN_JSON = "run.json"
STEPS_JSONL = "steps.jsonl"
HEARTBEAT_JSON = "heartbeat.json"
RUNNING = "running"
# An attempt that a USR2 stopped for a requeue (launch/requeue.py); the job reruns the point.
REQUEUED = "requeued"
# A beat is one small atomic file write: every 30 s costs nothing beside a training step.
HEARTBEAT_S = 30.0
# A record from another host is called dead after this long without a beat: ten missed beats,
# to ride out what delays a beat without the process being gone: NFS/Lustre attribute caching
# (up to a minute on default NFS mounts), clock skew between nodes, and a rank stuck for a while
# in a C call that holds the GIL (graph capture, a large pickle). On the same host the PID decides.
STALE_AFTER_S = 300.0
SCHEMA_VERSION = 1
REPO_ROOT = Path(__file__).resolve().parent.parent


def write_atomic(path: Path, data: bytes | str) -> None:
    """Replace `path` with `data` in one step: readers see the old file or the new one, never half.

    The project's one atomic writer. The temp file's name is unique (mkstemp), so any number of
    processes may write the same path at once (every rank of a job materialises the same HF
    config): each renames its own complete file over the target and the last one wins. A fixed
    temp name would let one rank rename another's file away and crash on its own rename.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    blob = data.encode() if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(blob)
            handle.flush()
            os.fsync(handle.fileno())
        # mkstemp creates 0600 files; run records are read by teammates on shared clusters.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: Path, payload: dict[str, Any]) -> None:
    write_atomic(path, json.dumps(payload, indent=2, sort_keys=True, default=str) + "\n")


class StepWriter:
    """Appends one JSON object per line and flushes it, so readers see every finished step."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._handle: TextIO = path.open("a", buffering=1)

    def write(self, record: dict[str, Any]) -> None:
        self._handle.write(json.dumps(record, sort_keys=True, default=str) + "\n")
        self._handle.flush()

    def close(self) -> None:
        self._handle.close()

    def __enter__(self) -> StepWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_steps(path: Path) -> list[dict[str, Any]]:
    """Every complete line; a torn last line from a killed writer is skipped."""
    steps: list[dict[str, Any]] = []
    if not path.exists():
        return steps
    for line in path.read_text().splitlines():
        try:
            steps.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return steps


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def git_state(root: Path = REPO_ROOT) -> dict[str, Any]:
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": bool(status) if status is not None else None}


def environment() -> dict[str, Any]:
    packages = ("torch", "transformers", "hydra-core", "submitit", "megatron-core", "megatron-bridge")
    return {
        "python": platform.python_version(),
        **{name.replace("-", "_"): _version(name) for name in packages},
        "git": git_state(),
        "host": socket.gethostname(),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
    }


def point_id(config: dict[str, Any], code_version: str | None) -> str:
    """Identity of a sweep point: the resolved config plus the code that runs it."""
    blob = json.dumps({"config": config, "code": code_version}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def base_record(spec: RunSpec, config: dict[str, Any], status: str) -> dict[str, Any]:
    env = environment()
    layout = spec.layout
    # Secrets from the environment (a path through ${oc.env:...}) must not reach any record.
    return scrub(
        {
            "schema_version": SCHEMA_VERSION,
            "status": status,
            "point_id": point_id(config, env["git"]["commit"]),
            "config": config,
            "spec": spec.to_dict(),
            "layout": {
                "world_size": layout.world_size,
                "nodes": layout.nodes,
                "dp": layout.dp,
                "tp": layout.tp,
                "pp": layout.pp,
                "vp": layout.vp,
                "cp": layout.cp,
                "ep": layout.ep,
                "etp": layout.etp,
            },
            "engine": spec.engine,
            # Forced-balance routing is labelled beside the data kind: neither is a real-routing VLM run.
            "data": {"kind": spec.data.kind.value, "routing": spec.router.name},
            "env": env,
        }
    )


# --- the running record and its heartbeat ----------------------------------------------------

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
    except (OSError, json.JSONDecodeError, AttributeError):
        return None
    return float(value) if isinstance(value, int | float) else None


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
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
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
