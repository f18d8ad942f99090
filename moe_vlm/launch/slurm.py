"""Slurm: launcher settings -> sbatch parameters -> the rendered script, and batched polling.

One sbatch job per sweep point, points with the same resources submitted together as one job
array (one sbatch call), or with `points_per_job` > 1 several points packed into one job
(launch/pack.py). The script is rendered by submitit's own renderer
(`submitit.slurm.slurm._make_sbatch_string`, the function SlurmExecutor calls when it submits),
so what `dry_run=true` prints is what sbatch receives. What submitit and hydra-submitit-launcher
1.2.0 lack is added here: srun arguments (pyxis container image and mounts, --kill-on-bad-exit),
`--segment`, resources derived per point from the RunSpec (nodes, tasks per node = GPUs per
node), a prologue/teardown that requeues from outside the container and records failures, and
one `scontrol` call to poll every job of a sweep.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moe_vlm.base import safety
from moe_vlm.base.errors import BadInput
from moe_vlm.base.files import PREVIOUS_REQUEUE_MARKER, REQUEUE_MARKER
from moe_vlm.config.names import meant
from moe_vlm.config.preflight import LAUNCHER_EXECUTORS
from moe_vlm.config.schema import CONF_DIR, Engine
from moe_vlm.config.sharding import launcher_segment, segment_mismatch
from moe_vlm.config.spec import RunSpec
from moe_vlm.launch import site
from moe_vlm.launch.settings import PreflightSettings, SlurmSettings
from moe_vlm.record import profiling

# Exit status of a rank that was asked to stop for a requeue (EX_TEMPFAIL): not a failure.
EXIT_REQUEUE = 75
ENV_TIME_LIMIT_S = "MOE_VLM_TIME_LIMIT_S"
ENV_SIGNAL_DELAY_S = "MOE_VLM_SIGNAL_DELAY_S"
ENV_MAX_REQUEUES = "MOE_VLM_MAX_REQUEUES"
# When the allocation (or its latest requeue) started: a packed point starts long after it.
ENV_JOB_START_S = "MOE_VLM_JOB_START_S"
# Slurm's default MaxArraySize is 1001 (indices 0-1000): larger sweeps are split into several arrays.
MAX_ARRAY_TASKS = 1000
# Every job (points and canaries) runs offline: huggingface_hub and transformers read these once,
# at import, and a cluster node that tries the hub either hangs on a firewall or rate-limits.
OFFLINE_EXPORTS = ("export HF_HUB_OFFLINE=1", "export TRANSFORMERS_OFFLINE=1")
CANARY_RC_SUFFIX = ".rc"
# Held points whose canary failed are cancelled by Slurm instead of pending forever
# (Reason=DependencyNeverSatisfied); `moe-vlm status` accounts for them either way.
KILL_ON_INVALID_DEP = "kill_on_invalid_dep"


def settings_from(params: dict[str, Any]) -> SlurmSettings:
    known = set(SlurmSettings.__dataclass_fields__)
    values = {k: v for k, v in params.items() if k in known}
    if isinstance(values.get("preflight"), dict):
        known_preflight = set(PreflightSettings.__dataclass_fields__)
        values["preflight"] = PreflightSettings(
            **{k: v for k, v in values["preflight"].items() if k in known_preflight}
        )
    return SlurmSettings(**values)


def check_preflight(out: PreflightSettings) -> PreflightSettings:
    """hydra.launcher.preflight.*, checked: one line naming the key and a fix when one is off
    (Hydra's schema refuses a key that does not exist)."""
    for key in ("gemm_fraction", "collective_fraction", "relative_fraction"):
        value = getattr(out, key)
        if not isinstance(value, int | float) or not 0.0 <= float(value) <= 1.0:
            raise BadInput(
                f"hydra.launcher.preflight.{key}={value!r}: expected a fraction in [0, 1]. "
                f"Fix: hydra.launcher.preflight.{key}=0.5."
            )
    for key in ("gemm_tflops", "intra_gbps", "inter_gbps", "message_mib", "seconds"):
        value = getattr(out, key)
        if value is not None and (not isinstance(value, int | float) or not float(value) > 0):
            raise BadInput(
                f"hydra.launcher.preflight.{key}={value!r}: expected a positive number"
                + (" or null (the cluster preset's)" if key != "seconds" else "")
                + f". Fix: hydra.launcher.preflight.{key}={'0.3' if key == 'seconds' else 'null'}."
            )
    for key in ("collective_iters", "gemm_size"):
        value = getattr(out, key)
        if value is not None and (not isinstance(value, int) or value < 1):
            raise BadInput(
                f"hydra.launcher.preflight.{key}={value!r}: expected a whole number >= 1. "
                f"Fix: hydra.launcher.preflight.{key}={5 if key == 'collective_iters' else 'null'}."
            )
    return out


def checked(settings: SlurmSettings, spec: RunSpec) -> SlurmSettings:
    """Settings with site values filled in, every string that reaches sbatch/srun checked."""
    if settings.expects_cluster and settings.expects_cluster != spec.cluster.name:
        presets = launcher_presets()
        own = f"slurm_{spec.cluster.name}"
        pick = own if own in presets else "slurm"
        raise BadInput(
            f"hydra.launcher: this preset is for cluster={settings.expects_cluster} but the run has "
            f"cluster={spec.cluster.name}. Fix: add cluster={settings.expects_cluster}, or pick "
            f"hydra/launcher={pick} (presets: {', '.join(presets)})."
        )
    values = dict(vars(settings))
    explicit = {key: values.get(key) for key in site.SITE_KEYS}
    resolved = site.resolve(explicit, spec.cluster.name)
    site_setup = [] if settings.setup else list(resolved.get("setup") or [])
    values.update({k: v for k, v in resolved.items() if k != "setup"})
    values["setup"] = [*site_setup, *settings.setup]
    out = SlurmSettings(**values)
    # Launcher settings from the command line, MOE_VLM_* variables or a launcher preset reach the
    # job script (the site file's were checked when it was read).
    safety.check_credentials(
        vars(out), "hydra.launcher", " (from the command line, a MOE_VLM_* variable or the launcher preset)"
    )

    safety.check_word("hydra.launcher.name", out.name, example="moe_vlm")
    for key in ("account", "partition", "qos", "reservation", "constraint"):
        value = getattr(out, key)
        if value is not None:
            safety.check_word(f"hydra.launcher.{key}", str(value))
    if out.container_image is not None:
        safety.check_word(
            "hydra.launcher.container_image",
            out.container_image,
            safety.IMAGE_CHARS,
            "nvcr.io#nvidia/nemo:25.09",
        )
    for mount in out.container_mounts:
        safety.check_mount("hydra.launcher.container_mounts", str(mount))
    if out.container_workdir is not None:
        safety.check_word(
            "hydra.launcher.container_workdir", out.container_workdir, safety.MOUNT_PART_CHARS, "/work"
        )
    for name in out.container_env:
        safety.check_word("hydra.launcher.container_env", str(name), "A-Za-z0-9_", "HF_TOKEN")
    for line in out.setup:
        safety.check_setup_line("hydra.launcher.setup", str(line))
    for arg in out.srun_args:
        safety.check_no_control("hydra.launcher.srun_args", str(arg))
    for key, value in out.additional_parameters.items():
        safety.check_word("hydra.launcher.additional_parameters", str(key), "A-Za-z0-9_-", "mail_type")
        safety.check_no_control(f"hydra.launcher.additional_parameters.{key}", str(value))
    if out.segment not in (None, "auto") and not str(out.segment).isdigit():
        raise BadInput(
            f"hydra.launcher.segment={out.segment!r}: expected auto, a node count or null. Fix: segment=auto."
        )
    if out.segment not in (None, "auto") and spec.engine == Engine.megatron:
        problem = segment_mismatch(spec, str(out.segment))
        if problem:
            raise BadInput(f"hydra.launcher.segment={out.segment} with parallelism.dp_outer: {problem}")
    if not isinstance(out.points_per_job, int) or out.points_per_job < 1:
        raise BadInput(
            f"hydra.launcher.points_per_job={out.points_per_job!r}: expected a whole number >= 1 "
            "(1 = one job per point). Fix: hydra.launcher.points_per_job=4."
        )
    if out.executor not in LAUNCHER_EXECUTORS:
        raise BadInput(
            f"hydra.launcher.executor={out.executor!r}: expected slurm or local. "
            f"Fix: hydra.launcher.executor={meant(str(out.executor), LAUNCHER_EXECUTORS) or 'slurm'}."
        )
    check_preflight(out.preflight)
    return out


def launcher_presets() -> list[str]:
    """The `hydra/launcher=` options, as conf/hydra/launcher/ holds them."""
    return sorted(path.stem for path in (CONF_DIR / "hydra" / "launcher").glob("*.yaml"))


def segment_nodes(settings: SlurmSettings, spec: RunSpec) -> int | None:
    """Nodes per --segment: each segment must sit inside one NVLink domain (sharding.launcher_segment)."""
    return launcher_segment(spec, settings.segment)


def python_command(settings: SlurmSettings) -> str:
    return settings.python or shlex.quote(sys.executable)


def srun_arguments(settings: SlurmSettings) -> list[str]:
    # One dead rank ends the step at once, instead of the others hanging in a collective.
    args = ["--kill-on-bad-exit=1"]
    if settings.container_image:
        args.append(f"--container-image={settings.container_image}")
    if settings.container_mounts:
        args.append(f"--container-mounts={','.join(settings.container_mounts)}")
    if settings.container_workdir:
        args.append(f"--container-workdir={settings.container_workdir}")
    if settings.container_env:
        args.append(f"--container-env={','.join(settings.container_env)}")
    return [*args, *settings.srun_args]


def _shared_parameters(settings: SlurmSettings, spec: RunSpec) -> dict[str, Any]:
    """What a point and its canary share: where and how the job runs (partition, node shape,
    container, setup lines), so that the canary sees the points' environment."""
    additional: dict[str, Any] = {}
    if settings.reservation:
        additional["reservation"] = settings.reservation
    if settings.mem_gb is not None:
        # Passed verbatim: submitit's mem conversion cannot express --mem=0 (all of the node).
        additional["mem"] = f"{settings.mem_gb}G" if settings.mem_gb else "0"
    additional.update(settings.additional_parameters)
    return {
        "job_name": settings.name,
        "cpus_per_task": settings.cpus_per_task,
        "gpus_per_node": spec.layout.ranks_per_node if spec.cluster.is_gpu_cluster else None,
        "exclusive": True if settings.exclusive else None,
        "partition": settings.partition,
        "account": settings.account,
        "qos": settings.qos,
        "constraint": settings.constraint,
        # Ours first: a site that may reach the hub can export HF_HUB_OFFLINE=0 in its setup lines.
        "setup": [*OFFLINE_EXPORTS, *settings.setup],
        "srun_args": srun_arguments(settings),
        "additional_parameters": additional,
    }


def job_parameters(settings: SlurmSettings, spec: RunSpec, points: int = 1) -> dict[str, Any]:
    """Keyword arguments for submitit's SlurmExecutor (and its renderer) for one point, or for a
    job that runs `points` such points one after another (the sum of their time limits)."""
    layout = spec.layout
    minutes = settings.timeout_min * points
    params = _shared_parameters(settings, spec)
    additional: dict[str, Any] = {"requeue": True}
    segment = segment_nodes(settings, spec)
    if segment is not None:
        additional["segment"] = segment
    params.update(
        time=minutes,
        nodes=layout.nodes,
        ntasks_per_node=layout.ranks_per_node,
        signal_delay_s=settings.signal_delay_s,
        additional_parameters={**additional, **params["additional_parameters"]},
        setup=[
            *params["setup"],
            # The tasks read these to tell a time-limit signal from a preemption and to cap requeues.
            f"export {ENV_TIME_LIMIT_S}={minutes * 60}",
            f"export {ENV_SIGNAL_DELAY_S}={settings.signal_delay_s}",
            f"export {ENV_MAX_REQUEUES}={settings.max_requeues}",
            f'export {ENV_JOB_START_S}="$(date +%s)"',
        ],
    )
    # profiling=nsys: the profiled ranks' tasks run under nsys and write into the point's directory,
    # which the batch script names in moe_vlm_point (exported here, before any assignment to it).
    nsys = profiling.nsys_srun_words(spec, "moe_vlm_point")
    if nsys:
        params.update(
            srun_args=[*params["srun_args"], *nsys], setup=[*params["setup"], "export moe_vlm_point"]
        )
    return safety.scrub({k: v for k, v in params.items() if v is not None})


def canary_parameters(settings: SlurmSettings, spec: RunSpec, canary_dir: Path) -> dict[str, Any]:
    """The canary: one node and one task of the points' node shape, a short time limit, never
    requeued; the batch script writes srun's exit status next to its logs (outside the
    container, so even an interpreter that cannot start leaves a verdict)."""
    params = _shared_parameters(settings, spec)
    rc_file = shlex.quote(str(canary_dir)) + '/"$SLURM_JOB_ID"' + CANARY_RC_SUFFIX
    params.update(
        job_name=f"{settings.name}-canary",
        time=settings.canary_timeout_min,
        nodes=1,
        ntasks_per_node=1,
        teardown=["moe_vlm_rc=$?", f'echo "$moe_vlm_rc" > {rc_file}', 'exit "$moe_vlm_rc"'],
    )
    return safety.scrub({k: v for k, v in params.items() if v is not None})


def canary_command(
    python: str, overrides: Iterable[str], probe: bool = False, points_file: Path | None = None
) -> str:
    """The canary's task: the point's task overrides, each quoted for the shell (one line each);
    points_file: the list of the points it checks with the library's own checks (canary.py)."""
    quoted = [shlex.quote(safety.check_no_control("canary override", str(o))) for o in overrides]
    listed = ["--points", shlex.quote(str(points_file))] if points_file is not None else []
    return " ".join(
        [python, "-u -m moe_vlm.launch.canary", *(["--probe"] if probe else []), *quoted, *listed]
    )


def marker_lines() -> list[str]:
    """A requeue marker found before a point starts belongs to the attempt before this one (the
    task archives it), so the lines after srun cannot act on it again."""
    return [
        f'if [ -e "$moe_vlm_point/{REQUEUE_MARKER}" ]; then',
        f'  mv -f "$moe_vlm_point/{REQUEUE_MARKER}" "$moe_vlm_point/{PREVIOUS_REQUEUE_MARKER}"',
        "fi",
    ]


def bash_array(name: str, values: Iterable[object]) -> list[str]:
    return [f"{name}=(", *(f"  {shlex.quote(str(v))}" for v in values), ")"]


def prologue(point_dirs: Path | Sequence[Path]) -> list[str]:
    """Shell lines before srun: name the point (an array task picks its own by its index) and
    its job id, and set aside an earlier attempt's requeue marker."""
    if isinstance(point_dirs, Path) or len(point_dirs) == 1:
        point = point_dirs if isinstance(point_dirs, Path) else point_dirs[0]
        name = [f"moe_vlm_point={shlex.quote(str(point))}", 'moe_vlm_job="$SLURM_JOB_ID"']
    else:
        name = [
            *bash_array("moe_vlm_points", point_dirs),
            'moe_vlm_point="${moe_vlm_points[$SLURM_ARRAY_TASK_ID]}"',
            'moe_vlm_job="${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"',
        ]
    return [*name, *marker_lines()]


def teardown(python: str) -> list[str]:
    """Shell lines after srun, run by the batch script outside any container.

    A rank that got USR2 leaves a requeue marker in its point directory and exits; the
    requeue happens here because `scontrol` is not available inside pyxis containers. A
    failed step is classified from its exit status and logs into the point's run.json.
    """
    return [
        "moe_vlm_rc=$?",
        f'if [ -e "$moe_vlm_point/{REQUEUE_MARKER}" ]; then',
        '  echo "moe_vlm: requeueing job $SLURM_JOB_ID (restart ${SLURM_RESTART_COUNT:-0})" >&2',
        '  scontrol requeue "$SLURM_JOB_ID" && exit 0',
        'elif [ "$moe_vlm_rc" -ne 0 ]; then',
        f"  {record_failure(python)} || true",
        "fi",
        'exit "$moe_vlm_rc"',
    ]


def record_failure(python: str, step: str | None = None) -> str:
    """The line that records a failed step of `$moe_vlm_point` (exit status `$moe_vlm_rc`); `step`:
    the shell variable holding its Slurm step id (a packed job's loop counts its steps)."""
    return (
        f'{python} -m moe_vlm.runtime.failures --point-dir "$moe_vlm_point" --job-id "$moe_vlm_job" '
        '--exit-code "$moe_vlm_rc"' + (f' --step-id "${step}"' if step else "") + " >&2"
    )


def point_parameters(
    params: dict[str, Any],
    point_dirs: Path | Sequence[Path],
    python: str,
    canary_job_id: str | None = None,
) -> dict[str, Any]:
    """One job's full submission: the shared parameters plus its prologue and teardown (several
    point directories: one job array, a task per point), and when a canary guards it, the
    dependency on the canary's success."""
    out = {**params, "setup": [*params.get("setup", []), *prologue(point_dirs)], "teardown": teardown(python)}
    if canary_job_id is not None:
        out.update(canary_dependency(params, canary_job_id))
    return out


def canary_dependency(params: dict[str, Any], canary_job_id: str) -> dict[str, Any]:
    """afterok on the canary; Slurm cancels the held job when the canary fails unless the site
    says otherwise."""
    additional = dict(params.get("additional_parameters", {}))
    if not any(key.replace("-", "_") == KILL_ON_INVALID_DEP for key in additional):
        additional[KILL_ON_INVALID_DEP] = "yes"
    return {"dependency": f"afterok:{canary_job_id}", "additional_parameters": additional}


def render_sbatch(params: dict[str, Any], folder: str, python: str, command: str | None = None) -> str:
    """The sbatch script submitit writes for these parameters (see SlurmExecutor._submit_command);
    `command` replaces submitit's job runner (the canary runs its own module)."""
    from submitit.slurm.slurm import _make_sbatch_string

    if command is None:
        command = " ".join([python, "-u -m submitit.core._submit", shlex.quote(folder)])
    return _make_sbatch_string(command=command, folder=folder, **params)


class SbatchRefused(BadInput):
    """sbatch would not take a script; `reason` is its last line."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


def submit_script(script: Path, what: str = "the canary") -> str:
    """`sbatch --parsable SCRIPT` -> the job id; SbatchRefused with sbatch's last line when refused."""
    try:
        done = subprocess.run(
            ["sbatch", "--parsable", str(script)], capture_output=True, text=True, timeout=120
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BadInput(
            f"sbatch could not be run ({exc}). Fix: run the sweep where Slurm's sbatch works."
        ) from exc
    job_id = done.stdout.strip().split(";")[0]
    if done.returncode != 0 or not job_id:
        reason = ((done.stderr or done.stdout).strip().splitlines() or ["no message"])[-1]
        raise SbatchRefused(
            f"sbatch refused {what} {script}: {reason}. Fix: check hydra.launcher "
            "partition/account/qos (or the site file)"
            + (", or hydra.launcher.canary=false." if what == "the canary" else "."),
            reason,
        )
    return job_id


def srun_line(script: str) -> str:
    return next((line for line in script.splitlines() if line.startswith("srun ")), "")


# --- polling -----------------------------------------------------------------------------

PENDING_STATES = {
    "PENDING",
    "REQUEUED",
    "REQUEUE_HOLD",
    "REQUEUE_FED",
    "CONFIGURING",
    "RESIZING",
    "SUSPENDED",
}
RUNNING_STATES = {"RUNNING", "COMPLETING", "STAGE_OUT", "SIGNALING"}


@dataclass(frozen=True)
class JobState:
    job_id: str
    state: str  # Slurm's JobState, e.g. PENDING, RUNNING, COMPLETED, CANCELLED, TIMEOUT
    reason: str = ""
    exit_code: int | None = None
    signal: int | None = None
    restarts: int = 0

    @property
    def active(self) -> bool:
        return self.state in PENDING_STATES or self.state in RUNNING_STATES


def _fields(line: str) -> dict[str, str]:
    return dict(re.findall(r"(?:^|\s)([A-Za-z][A-Za-z/:_]*)=(\S*)", line))


def _exit(value: str) -> tuple[int | None, int | None]:
    match = re.fullmatch(r"(\d+):(\d+)", value or "")
    return (int(match.group(1)), int(match.group(2))) if match else (None, None)


def _array_indices(task_ids: str) -> list[str]:
    indices: list[str] = []
    for part in task_ids.split("%")[0].split(","):
        low, _, high = part.partition("-")
        if low.isdigit():
            indices += [str(i) for i in range(int(low), int(high or low) + 1)]
    return indices


def parse_scontrol(text: str) -> dict[str, JobState]:
    """`scontrol --oneliner show job` output -> state per job id ('123' or '123_4' for arrays)."""
    states: dict[str, JobState] = {}
    for line in text.splitlines():
        f = _fields(line)
        if "JobId" not in f:
            continue
        code, sig = _exit(f.get("ExitCode", ""))
        restarts = int(f["Restarts"]) if f.get("Restarts", "").isdigit() else 0
        ids = [f["JobId"]]
        if f.get("ArrayJobId") and f.get("ArrayTaskId"):
            ids = [f"{f['ArrayJobId']}_{i}" for i in _array_indices(f["ArrayTaskId"])]
        for job_id in ids:
            states[job_id] = JobState(
                job_id, f.get("JobState", "UNKNOWN"), f.get("Reason", ""), code, sig, restarts
            )
    return states


def parse_sacct(text: str) -> dict[str, JobState]:
    """`sacct -X -n -P -o JobID,State,ExitCode` output (the fallback once scontrol forgot a job)."""
    states: dict[str, JobState] = {}
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) < 3 or "." in parts[0]:
            continue
        code, sig = _exit(parts[2])
        state = parts[1].split()[0] if parts[1] else "UNKNOWN"  # "CANCELLED by 0" -> CANCELLED
        states[parts[0]] = JobState(parts[0], state, "", code, sig)
    return states


def _run(command: list[str]) -> str | None:
    if shutil.which(command[0]) is None:
        return None
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def query_jobs(job_ids: Iterable[str]) -> dict[str, JobState] | None:
    """States of these jobs with one `scontrol` call for all of them, plus one `sacct` call for
    any the controller has already forgotten (where accounting is enabled). Jobs Slurm no longer
    knows are absent from the result; None when the controller cannot be reached."""
    wanted = {j for j in job_ids if j}
    if not wanted:
        return {}
    shown = _run(["scontrol", "--oneliner", "show", "job"])
    if shown is None:
        return None
    known = parse_scontrol(shown)
    found = {j: s for j, s in known.items() if j in wanted}
    missing = sorted(wanted - set(found))
    if missing:
        bases = sorted({j.split("_")[0] for j in missing})
        text = _run(["sacct", "-X", "-n", "-P", "-o", "JobID,State,ExitCode", "-j", ",".join(bases)])
        found |= {j: s for j, s in parse_sacct(text or "").items() if j in wanted}
    return found
