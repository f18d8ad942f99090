"""A submitit launcher that plans each point, submits, and returns.

Built on hydra-submitit-launcher's BaseSubmititLauncher (its job-side `__call__` composes the
point's config and runs the task through Hydra), with what release 1.2.0 lacks:

- resources per point from the RunSpec (nodes, tasks per node = GPUs per node, GPUs per node),
  not one set for the whole sweep;
- srun arguments (pyxis container image/mounts), `--segment`, site values, checked strings;
- submit-and-exit: `launch` returns once sbatch accepted every job (`moe-vlm status` follows);
- a canary job per (cluster, container image) that the points depend on (afterok), so a
  broken job environment costs one short job, not every point's queue wait (launch/canary.py);
- in each task: a USR2 handler that marks the point for a requeue, attempt bookkeeping, the
  restart count in run.json, and a non-zero exit when the run failed (so srun ends the step).
"""

# No `from __future__ import annotations`: Hydra's plugin scan executes this module outside
# sys.modules, where dataclasses cannot resolve string annotations.
import contextlib
import io
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, run_job, setup_globals
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import BaseSubmititLauncher
from omegaconf import DictConfig, open_dict
from submitit.core.utils import FailedJobError, FailedSubmissionError

from moe_vlm.errors import BadInput
from moe_vlm.launch import points, requeue, slurm
from moe_vlm.launch.safety import scrub
from moe_vlm.record import RUN_JSON, write_json_atomic
from moe_vlm.spec import RunSpec

log = logging.getLogger(__name__)
WAIT_POLL_S = 15.0  # submit_and_exit=false: seconds between polls of Slurm
# dry_run: the canary's job id is known only once sbatch accepted it.
CANARY_PLACEHOLDER = "CANARY_JOB_ID"


@dataclass
class PlannedJob:
    overrides: list[str]
    point_dir: Path
    spec: RunSpec
    settings: slurm.SlurmSettings
    params: dict[str, Any]

    @property
    def task_overrides(self) -> list[str]:
        """The point's own overrides, without the sweep directory the sweeper adds (and without
        dry_run, so that a dry run shows the canary command the real sweep submits)."""
        return [o for o in self.overrides if not o.startswith(("hydra.", "dry_run="))]

    @property
    def canary_key(self) -> tuple[str, str | None]:
        return (self.spec.cluster.name, self.settings.container_image)

    @property
    def canary_dir(self) -> Path:
        return points.canary_dir(self.point_dir.parent, *self.canary_key)


class SubmititLauncher(BaseSubmititLauncher):
    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        # The base class leaves params untyped.
        resolved: dict[str, Any] = self.params  # type: ignore[has-type]
        self.params = scrub(resolved)  # the launcher is pickled into every job
        self.settings = slurm.settings_from(self.params)
        self._EXECUTOR = self.settings.executor

    # --- submitting side -------------------------------------------------------------------

    @property
    def folder(self) -> str:
        return str(Path(self.settings.submitit_folder).expanduser().absolute())

    def plan(self, overrides: Sequence[str]) -> PlannedJob:
        """Compose one point and derive its Slurm job; raises BadInput on unsafe settings."""
        assert self.hydra_context is not None and self.config is not None
        cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
        spec = RunSpec.from_config(points.task_config(cfg))
        settings = slurm.checked(self.settings, spec)
        point_dir = Path(str(cfg.hydra.sweep.dir), str(cfg.hydra.sweep.subdir)).absolute()
        return PlannedJob(list(overrides), point_dir, spec, settings, slurm.job_parameters(settings, spec))

    def check(self, overrides: Sequence[str]) -> None:
        self.plan(overrides)

    def job_arguments(self, job: PlannedJob, number: int) -> tuple[Any, ...]:
        """What `__call__` receives in the job (as hydra-submitit-launcher passes it)."""
        return (job.overrides, "hydra.sweep.dir", number, f"job_id_for_{number}", Singleton.get_state())

    def python(self, job: PlannedJob) -> str:
        return slurm.python_command(job.settings)

    @property
    def uses_canary(self) -> bool:
        return self.settings.executor == "slurm" and self.settings.canary

    def render(self, overrides: Sequence[str]) -> str:
        """What dry_run prints for a point: the sbatch script and the srun line, nothing submitted."""
        job = self.plan(overrides)
        if self.settings.executor != "slurm":
            return (
                f"(hydra/launcher executor={self.settings.executor}: runs on this machine, no sbatch script)"
            )
        canary = CANARY_PLACEHOLDER if self.uses_canary else None
        params = slurm.point_parameters(job.params, job.point_dir, self.python(job), canary)
        script = slurm.render_sbatch(params, self.folder, self.python(job))
        return "\n".join(
            ["-- sbatch script --", script.rstrip(), "", "-- srun command --", slurm.srun_line(script)]
        )

    def render_canaries(self, job_overrides: Sequence[Sequence[str]]) -> str:
        """What dry_run prints for the canaries these points would wait on ("" when none)."""
        if not self.uses_canary:
            return ""
        sections = []
        for job in self.canary_groups([self.plan(o) for o in job_overrides]).values():
            script = self.canary_script(job)
            cluster, image = job.canary_key
            sections += [
                f"-- canary for cluster={cluster}, image {image or '(none)'}: sbatch script --",
                script.rstrip(),
                "",
                "-- canary srun command --",
                slurm.srun_line(script),
                "",
            ]
        return "\n".join(sections).rstrip()

    # --- the canary --------------------------------------------------------------------------

    @staticmethod
    def canary_groups(planned: Sequence[PlannedJob]) -> dict[tuple[str, str | None], PlannedJob]:
        """The first point of each (cluster, container image): the one its canary builds."""
        groups: dict[tuple[str, str | None], PlannedJob] = {}
        for job in planned:
            groups.setdefault(job.canary_key, job)
        return groups

    def canary_script(self, job: PlannedJob) -> str:
        params = slurm.canary_parameters(job.settings, job.spec, job.canary_dir)
        command = slurm.canary_command(self.python(job), job.task_overrides)
        return slurm.render_sbatch(params, str(job.canary_dir), self.python(job), command)

    def submit_canaries(self, planned: Sequence[PlannedJob]) -> dict[tuple[str, str | None], str]:
        """Submit one canary per (cluster, container image); their job ids by that key."""
        submitted: dict[tuple[str, str | None], str] = {}
        for key, first in self.canary_groups(planned).items():
            first.canary_dir.mkdir(parents=True, exist_ok=True)
            path = first.canary_dir / "canary.sbatch"
            path.write_text(self.canary_script(first))
            job_id = slurm.submit_script(path)
            write_json_atomic(
                first.canary_dir / points.CANARY_JSON,
                scrub(
                    {
                        "job_id": job_id,
                        "cluster": key[0],
                        "container_image": key[1],
                        "overrides": first.task_overrides,
                        "point_ids": [job.point_dir.name for job in planned if job.canary_key == key],
                        "dir": str(first.canary_dir),
                        "script": str(path),
                        "submitted_unix_s": points.now(),
                    }
                ),
            )
            print(
                f"moe_vlm: canary job {job_id} checks the job environment of cluster={key[0]} first; "
                "the points start only if it passes (hydra.launcher.canary=false skips it)"
            )
            submitted[key] = job_id
        return submitted

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        assert self.config is not None
        planned = [self.plan(overrides) for overrides in job_overrides]
        if self.settings.executor == "local":
            return self._launch_local(planned, initial_job_idx)
        import submitit

        canaries = self.submit_canaries(planned) if self.uses_canary else {}
        returns: list[JobReturn] = []
        for number, job in enumerate(planned, start=initial_job_idx):
            canary = canaries.get(job.canary_key)
            executor = submitit.SlurmExecutor(folder=self.folder, max_num_timeout=0, python=self.python(job))
            executor.update_parameters(
                **slurm.point_parameters(job.params, job.point_dir, self.python(job), canary)
            )
            try:
                # submitit prints sbatch's stderr on failure; the error below says it in one line.
                with contextlib.redirect_stderr(io.StringIO()):
                    submitted = executor.submit(self, *self.job_arguments(job, number))
            except (FailedJobError, FailedSubmissionError) as exc:
                reason = (str(exc).strip().splitlines() or ["no message"])[-1]
                raise BadInput(
                    f"sbatch refused {job.point_dir.name} ({' '.join(job.overrides[:-2])}): {reason}. "
                    f"{len(returns)} earlier point(s) are queued. Fix: check hydra.launcher "
                    "partition/account/qos (or the site file), then rerun the command to submit the rest."
                ) from exc
            points.add_submission(
                job.point_dir,
                {
                    "job_id": submitted.job_id,
                    "executor": "slurm",
                    "submitted_unix_s": points.now(),
                    "script": str(submitted.paths.submission_file),
                    **({"canary": {"job_id": canary, "dir": str(job.canary_dir)}} if canary else {}),
                },
            )
            points.update_point(job.point_dir, submitit_folder=self.folder)
            log.info("queued %s: job %s", job.point_dir.name, submitted.job_id)
            returns.append(
                JobReturn(
                    overrides=job.overrides,
                    working_dir=str(job.point_dir),
                    status=JobStatus.UNKNOWN,
                    _return_value=submitted.job_id,
                )
            )
        return returns if self.settings.submit_and_exit else self._wait(planned)

    def _wait(self, planned: list[PlannedJob]) -> list[JobReturn]:
        """submit_and_exit=false: poll (one Slurm call per round) until every job has ended."""
        from moe_vlm.launch.status import collect

        sweep_dir = planned[0].point_dir.parent
        wanted = {job.point_dir.name for job in planned}
        while True:
            states = {s.point_id: s.state for s in collect(sweep_dir) if s.point_id in wanted}
            waiting = sum(state in ("queued", "running") for state in states.values())
            if not waiting:
                break
            log.info("waiting for %d of %d job(s)", waiting, len(planned))
            time.sleep(WAIT_POLL_S)
        return [
            JobReturn(
                overrides=job.overrides,
                working_dir=str(job.point_dir),
                status=_status(states.get(job.point_dir.name)),
            )
            for job in planned
        ]

    def _launch_local(self, planned: list[PlannedJob], initial_job_idx: int) -> Sequence[JobReturn]:
        """submitit's local executor: one process per point on this machine, waited for."""
        import submitit

        executor = submitit.LocalExecutor(folder=self.folder, max_num_timeout=0)
        executor.update_parameters(timeout_min=self.settings.timeout_min, tasks_per_node=1, nodes=1)
        jobs = []
        for number, job in enumerate(planned, start=initial_job_idx):
            submitted = executor.submit(self, *self.job_arguments(job, number))
            points.add_submission(
                job.point_dir,
                {"job_id": submitted.job_id, "executor": "local", "submitted_unix_s": points.now()},
            )
            points.update_point(job.point_dir, submitit_folder=self.folder)
            jobs.append((job, submitted))
        returns: list[JobReturn] = []
        for job, submitted in jobs:
            try:
                returns.append(submitted.results()[0])
            except Exception as exc:  # the point's run.json says why; keep the sweep going
                from moe_vlm.launch.failures import record_job_failure

                if points.run_status(job.point_dir) is None:
                    record_job_failure(job.point_dir, submitted.job_id)
                returns.append(
                    JobReturn(
                        overrides=job.overrides,
                        working_dir=str(job.point_dir),
                        status=JobStatus.FAILED,
                        _return_value=exc,
                    )
                )
        return returns

    # --- job side: runs in every Slurm task --------------------------------------------------

    def __call__(
        self,
        sweep_overrides: list[str],
        job_dir_key: str,
        job_num: int,
        job_id: str,
        singleton_state: dict[type, Singleton],
    ) -> JobReturn:
        import submitit

        assert self.hydra_context is not None and self.config is not None and self.task_function is not None
        Singleton.set_state(singleton_state)
        setup_globals()
        sweep_config: DictConfig = self.hydra_context.config_loader.load_sweep_config(
            self.config, sweep_overrides
        )
        point_dir = Path(str(sweep_config.hydra.sweep.dir), str(sweep_config.hydra.sweep.subdir)).absolute()
        if self.settings.executor == "slurm":
            requeue.prepare_attempt(point_dir)
            requeue.install(point_dir)
        environment = submitit.JobEnvironment()
        with open_dict(sweep_config.hydra.job):
            sweep_config.hydra.job.id = environment.job_id
            sweep_config.hydra.job.num = job_num
        result = run_job(
            hydra_context=self.hydra_context,
            task_function=self.task_function,
            config=sweep_config,
            job_dir_key=job_dir_key,
            job_subdir_key="hydra.sweep.subdir",
        )
        if requeue.global_rank() == 0:
            _record_launch(point_dir, environment.job_id, self.settings.executor)
        if result.status == JobStatus.FAILED:
            # Hydra caught the exception; raise it so the task exits non-zero and srun ends the step.
            raise result._return_value
        return result


def _status(state: str | None) -> JobStatus:
    return JobStatus.COMPLETED if state == "completed" else JobStatus.FAILED


def _record_launch(point_dir: Path, job_id: str, executor: str) -> None:
    run = points.read_run(point_dir)
    if not run:
        return
    launch = {
        **run.get("launch", {}),
        "executor": executor,
        "slurm_job_id": job_id if executor == "slurm" else None,
        "restarts": requeue.restart_count(),
        "attempts_before": len(list((point_dir / points.ATTEMPTS).glob("*"))),
        "host": os.uname().nodename,
    }
    write_json_atomic(point_dir / RUN_JSON, {**run, "launch": launch})
