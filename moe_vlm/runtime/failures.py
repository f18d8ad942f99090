"""Why a run failed, from its exit status, Slurm's job state and its logs.

Classes, most specific first (the first that matches wins):

    timeout    Slurm time limit ("DUE TO TIME LIMIT", state TIMEOUT) or a USR2 past the requeue budget
    preempted  preemption ("DUE TO PREEMPTION", state PREEMPTED)
    node       node failure (NODE_FAIL, BOOT_FAIL, Xid, ECC, "fallen off the bus"), or a node that
               failed the node preflight (launch/preflight.py)
    oom        out of memory (CUDA OOM, torch.OutOfMemoryError, OOM killer, OUT_OF_MEMORY)
    cancelled  scancel ("CANCELLED AT", state CANCELLED)
    killed     a rank died from SIGKILL without OOM or node evidence (srun "task N: Killed", 137)
    nccl       collective communication error or watchdog timeout (NCCL, or gloo on CPU)
    stack      the job environment cannot import what the run needs: the sweep's canary failed
               (its points never start; moe-vlm status records them), or a run's own import did
    python     a Python exception (traceback)
    unknown    none of the above; the log tail says more

Used in three places: the run itself on an exception (moe_vlm/run/task.py), the batch script after
a failed srun step (`python -m moe_vlm.runtime.failures`, see launch/slurm.py:teardown) and
`moe-vlm status` / the sweeper for jobs that ended without a record (scancel, node loss).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moe_vlm.base.files import RUN_JSON, STEPS_JSONL, write_json_atomic
from moe_vlm.base.safety import scrub_text
from moe_vlm.config.spec import RunSpec
from moe_vlm.perf.metrics import summarize
from moe_vlm.record.records import REQUEUED, RUNNING, Failure, RunRecord, RunStatus, read_steps
from moe_vlm.runtime import dist_env, points
from moe_vlm.runtime.heartbeat import gone, read_heartbeat

LOG_TAIL_LINES = 30


def tail_lines(text: str, lines: int = LOG_TAIL_LINES) -> list[str]:
    """The last `lines` non-blank lines of a log or traceback: what run.json's failure keeps."""
    return [line for line in text.splitlines() if line.strip()][-lines:]


@dataclass(frozen=True)
class FailureClass:
    name: str
    states: frozenset[str]  # Slurm job states that mean this class
    pattern: re.Pattern[str] | None  # log evidence
    what: str


CLASSES: tuple[FailureClass, ...] = (
    FailureClass(
        "timeout",
        frozenset({"TIMEOUT", "DEADLINE"}),
        re.compile(r"DUE TO TIME LIMIT"),
        "hit the Slurm time limit",
    ),
    FailureClass("preempted", frozenset({"PREEMPTED"}), re.compile(r"DUE TO PREEMPTION"), "was preempted"),
    FailureClass(
        "node",
        frozenset({"NODE_FAIL", "BOOT_FAIL"}),
        re.compile(
            # "moe_vlm preflight: ... FAILED": a node below its rates (moe_vlm/launch/preflight.py).
            r"DUE TO NODE FAIL|Node failure|NODE_FAIL|\bXid\b|uncorrectable ECC|fallen off the bus"
            r"|moe_vlm preflight: .*FAILED",
            re.I,
        ),
        "lost a node or GPU",
    ),
    FailureClass(
        "oom",
        frozenset({"OUT_OF_MEMORY"}),
        re.compile(
            r"CUDA out of memory|OutOfMemoryError|out of memory|oom[-_]kill|Exceeded job memory limit"
            r"|\bMemoryError\b",
            re.I,
        ),
        "ran out of memory",
    ),
    # "*** JOB n ... CANCELLED AT" is scancel of the job; "*** STEP n.s ... CANCELLED AT" is scancel
    # of one step (a packed point) unless srun named a task that ended first: then srun ended the
    # step after that rank died (--kill-on-bad-exit), which the classes below explain
    # (see step_cancelled).
    FailureClass(
        "cancelled",
        frozenset({"CANCELLED"}),
        re.compile(r"\*\*\* JOB \S+ ON \S+ CANCELLED AT (?!.*DUE TO)"),
        "was cancelled",
    ),
    FailureClass(
        "killed",
        frozenset(),
        re.compile(r"task \d+: Killed|Killed by signal 9|signal 9\b|\bSIGKILL\b"),
        "had a rank killed by SIGKILL (no OOM or node evidence in the logs)",
    ),
    FailureClass(
        "nccl",
        frozenset(),
        re.compile(
            r"NCCL error|nccl(System|Internal|UnhandledCuda|Remote)Error"
            r"|Watchdog caught collective operation timeout|NCCL communicator was aborted|DistBackendError"
            r"|Gloo connectFullMesh failed|Connection closed by peer|Connection reset by peer",
        ),
        "failed in a collective (NCCL/gloo error or timeout)",
    ),
    FailureClass(
        "stack",
        frozenset(),
        re.compile(
            r"moe_vlm canary: FAILED|the Megatron stack does not import|the run would import \d+ thing"
            r"|^(ModuleNotFoundError|ImportError): |^OSError: \S+\.so[.\d]*: cannot open shared object file"
        ),
        "could not import its software stack in the job environment",
    ),
    FailureClass(
        "python", frozenset(), re.compile(r"Traceback \(most recent call last\)"), "raised a Python exception"
    ),
)
PRIORITY = [c.name for c in CLASSES] + ["unknown"]
STEP_CANCELLED = re.compile(r"\*\*\* STEP \S+ ON \S+ CANCELLED AT (?!.*DUE TO)")
# srun's line for one task that ended on its own ("task 1: Killed", "task 0: Exited with exit code 1");
# a cancelled step's tasks are named together afterwards ("tasks 0-1: Killed").
TASK_ENDED = re.compile(r"srun: error: \S+: task \d+: ")
# Lines Slurm writes when it requeues; they belong to the previous attempt, not to a failure.
IGNORED = re.compile(r"DUE TO JOB REQUEUE|Bypassing signal|moe_vlm: requeueing")
ATTEMPT_START = "Starting with JobEnvironment"


@dataclass(frozen=True)
class Diagnosis:
    name: str
    message: str
    evidence: str | None


def step_cancelled(lines: list[str]) -> str | None:
    """The STEP CANCELLED line of a step cancelled from outside; None when a task ended first."""
    for line in lines:
        if TASK_ENDED.search(line):
            return None
        if STEP_CANCELLED.search(line):
            return line
    return None


def classify(
    log_text: str,
    slurm_state: str | None = None,
    exit_code: int | None = None,
    signal_number: int | None = None,
) -> Diagnosis:
    lines = [line for line in log_text.splitlines() if not IGNORED.search(line)]
    state = (slurm_state or "").upper()
    for failure in CLASSES:
        if state in failure.states:
            return Diagnosis(failure.name, f"the job {failure.what} (Slurm state {state})", None)
        evidence = next((line for line in lines if failure.pattern and failure.pattern.search(line)), None)
        if evidence is None and failure.name == "cancelled":
            evidence = step_cancelled(lines)
        if evidence is None and failure.name == "killed" and (signal_number == 9 or exit_code == 137):
            evidence = f"exit code {exit_code}, signal {signal_number}"
        if evidence is not None:
            return Diagnosis(failure.name, f"the job {failure.what}", evidence.strip()[:300])
    detail = f"exit code {exit_code}" if exit_code is not None else "no exit code"
    if state:
        detail += f", Slurm state {state}"
    return Diagnosis("unknown", f"the run failed with no known failure pattern in its logs ({detail})", None)


def current_attempt(text: str) -> str:
    """Logs are appended across requeues; only the last attempt explains this failure."""
    start = text.rfind(ATTEMPT_START)
    if start < 0:
        return text
    return text[text.rfind("\n", 0, start) + 1 :]


def job_logs(log_dir: Path | None) -> tuple[str, list[str]]:
    """All task logs of a job (stderr first, task 0 last because srun and slurmstepd write there),
    and a labelled tail of the error logs."""
    if log_dir is None or not log_dir.is_dir():
        return "", []
    err = sorted(log_dir.glob("*_log.err"), key=lambda p: (p.name.endswith("_0_log.err"), p.name))
    out = sorted(log_dir.glob("*_log.out"))
    texts = {path: current_attempt(path.read_text(errors="replace")) for path in [*err, *out]}
    tail: list[str] = []
    for path in err:
        task = path.name.rsplit("_", 2)[-2]
        lines = tail_lines(texts[path], LOG_TAIL_LINES // 2)
        tail += [f"[task {task}] {line}" for line in lines]
    return "\n".join(texts.values()), tail[-LOG_TAIL_LINES:]


def _outranks(new: str, old: str) -> bool:
    return PRIORITY.index(new) < PRIORITY.index(old if old in PRIORITY else "unknown")


def failed_record(
    existing: dict[str, Any] | None,
    diagnosis: Diagnosis,
    log_tail: list[str],
    base: dict[str, Any],
    launch: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The failure record that replaces `existing`, or `existing` itself when it says more: a
    completed run, or a more specific failure (say oom from the rank that died, before another
    rank saw the broken collective)."""
    if existing and existing.get("status") == "completed":
        return existing
    if existing and existing.get("status") == "failed":
        old = (existing.get("failure") or {}).get("class", "unknown")
        if not _outranks(diagnosis.name, old):
            return existing
    failure = Failure(diagnosis.name, diagnosis.message, diagnosis.evidence, log_tail)
    return RunRecord.of(base).with_failure(failure, launch).to_json()


def write_failure(
    point_dir: Path,
    diagnosis: Diagnosis,
    log_tail: list[str],
    base: dict[str, Any],
    launch: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Record a failure in run.json unless the record there says more (see failed_record)."""
    read = points.read_run(point_dir)
    existing = read.to_json() if read else None
    record = failed_record(existing, diagnosis, log_tail, base, launch)
    if record is not existing:
        write_json_atomic(point_dir / RUN_JSON, record)
    return record


def record_exception(spec: Any, config: dict[str, Any], run_dir: Path, exc: BaseException) -> dict[str, Any]:
    """The run raised: classify the traceback and record it (called from moe_vlm/run/task.py)."""
    import traceback

    text = scrub_text("".join(traceback.format_exception(exc)))
    diagnosis = classify(text)
    tail = tail_lines(text)
    base = RunRecord.failed(spec, config).to_json()
    return write_failure(run_dir, diagnosis, tail, base, launch=launch_info())


def launch_info() -> dict[str, Any]:
    """Where this process runs in Slurm: job (an array task as ARRAY_TASK, the id its point.json
    holds), step, restarts of this point, and its place in a pack."""
    env = os.environ
    info: dict[str, Any] = {"slurm_job_id": dist_env.job_id_from_env(), "restarts": requeue_count()}
    if env.get("SLURM_STEP_ID"):
        info["slurm_step_id"] = env["SLURM_STEP_ID"]
    if env.get(dist_env.ENV_PACK_INDEX):
        info["pack"] = {
            "index": int(env[dist_env.ENV_PACK_INDEX]),
            "size": int(env.get(dist_env.ENV_PACK_SIZE) or 0),
        }
    return info


def requeue_count() -> int:
    """How often this point was stopped by a USR2 and rerun (launch/requeue.py sets it per point;
    outside a pack it is the job's restart count)."""
    env = os.environ
    return int(env.get(dist_env.ENV_POINT_RESTARTS) or env.get("SLURM_RESTART_COUNT") or 0)


def spec_of(config: dict[str, Any]) -> Any:
    """The RunSpec of a recorded config (None when it no longer builds: a record beats none)."""
    try:
        return RunSpec.from_recorded(config)
    except Exception:
        return None


def base_from_point(point_dir: Path) -> dict[str, Any]:
    """A run record for a point whose process could not write one: its running record when it
    started, else rebuilt from point.json (with the launch of a failure recorded before); with
    the steps it finished summarised."""
    point = points.read_point(point_dir) or {}
    run = points.read_run(point_dir)
    config = (run.config if run else None) or point.get("config") or {}
    spec = spec_of(config)
    if run and run.status in (RUNNING, REQUEUED):
        base = run.to_json()
    else:
        rebuilt = RunRecord.failed(spec, config) if spec is not None else None
        base = (
            rebuilt or RunRecord(status=RunStatus.failed, config=config, point_id=point.get("point_id"))
        ).to_json()
        if run is not None and run.launch:
            # A failure another rank recorded first (say rank 0 saw rank 1's death as a broken
            # collective): its place (Slurm step, pack, host) stays with the more specific class.
            base["launch"] = dict(run.launch)
    steps = read_steps(point_dir / STEPS_JSONL)
    if steps and spec is not None:
        base["summary"] = summarize(steps, spec)
    return base


def finished_steps(run_dir: Path) -> int:
    return len({s.step for s in read_steps(run_dir / STEPS_JSONL)})


def settle_running(run_dir: Path, record: RunRecord, write: bool = True) -> RunRecord:
    """A `running` record whose process is gone (heartbeat.gone): the run was killed before it could
    write its final record (SIGKILL, the OOM killer, a node lost outside Slurm). Returned as
    failed, class killed, with the steps it finished summarised; written to run.json with `write`.
    Any other record is returned as it is."""
    if record.status != RUNNING:
        return record
    raw = record.to_json()
    why = gone(raw, read_heartbeat(run_dir))
    if why is None:
        return record
    planned = record.config.get("train_iters")
    diagnosis = Diagnosis(
        "killed",
        "the run died without writing its final record (SIGKILL, the OOM killer or a lost node) after "
        f"{finished_steps(run_dir)} of {planned if planned is not None else '?'} step(s)",
        why,
    )
    base = base_from_point(run_dir)
    settled = (
        write_failure(run_dir, diagnosis, [], base) if write else failed_record(raw, diagnosis, [], base)
    )
    return RunRecord.from_json(settled)


def record_job_failure(
    point_dir: Path,
    job_id: str | None,
    slurm_state: str | None = None,
    exit_code: int | None = None,
    signal_number: int | None = None,
    restarts: int | None = None,
    step_id: str | None = None,
) -> dict[str, Any]:
    point = points.read_point(point_dir) or {}
    log_text, tail = job_logs(points.job_log_dir({**point, "job_id": job_id or point.get("job_id")}))
    diagnosis = classify(log_text, slurm_state, exit_code, signal_number)
    base = base_from_point(point_dir)
    recorded = (base.get("launch") or {}).get("restarts")
    # Its place in a pack (the batch script's environment) and its step, as a running record has
    # them: a rank that died before writing one leaves only this record.
    here = {key: value for key, value in launch_info().items() if key in ("pack", "slurm_step_id")}
    launch = {
        **here,
        **({"slurm_step_id": step_id} if step_id is not None else {}),
        "slurm_job_id": job_id,
        "slurm_state": slurm_state,
        "exit_code": exit_code,
        "signal": signal.Signals(signal_number).name if signal_number else None,
        "restarts": next(r for r in (restarts, recorded, requeue_count()) if r is not None),
    }
    return write_failure(point_dir, diagnosis, tail, base, launch)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m moe_vlm.runtime.failures",
        description="record a failed Slurm step in its point's run.json",
    )
    parser.add_argument("--point-dir", type=Path, required=True)
    parser.add_argument("--job-id", required=True)
    parser.add_argument("--exit-code", type=int, required=True)
    parser.add_argument("--step-id", help="the failed step's Slurm step id (a packed job's)")
    args = parser.parse_args(argv)
    # A shell reports death by signal N as 128 + N.
    signal_number = args.exit_code - 128 if args.exit_code > 128 else None
    record = record_job_failure(
        args.point_dir, args.job_id, None, args.exit_code, signal_number, step_id=args.step_id
    )
    failure = record.get("failure") or {}
    print(
        f"moe_vlm: {args.point_dir.name}: {record.get('status')} ({failure.get('class', '-')})",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
