"""A submitit launcher that plans each point, submits, and returns.

Built on hydra-submitit-launcher's BaseSubmititLauncher (its job-side `__call__` composes the
point's config and runs the task through Hydra), with what release 1.2.0 lacks:

- resources per point from the RunSpec (nodes, tasks per node = GPUs per node, GPUs per node),
  not one set for the whole sweep;
- srun arguments (pyxis container image/mounts), `--segment`, site values, checked strings;
- submit-and-exit: `launch` returns once sbatch accepted every job (`moe-vlm status` follows);
- points with the same resources in one job array (one sbatch call for all of them), or with
  `points_per_job` > 1 packed into jobs that run them one srun step after another
  (launch/pack.py);
- a canary job per (cluster, container image) that the points depend on (afterok), so a
  broken job environment costs one short job, not every point's queue wait (launch/canary.py);
  one per sweep: a later launch (a halving rung) reuses a canary of the sweep that passed;
- in each task: a USR2 handler that marks the point for a requeue, attempt bookkeeping, the
  restart count in run.json, and a non-zero exit when the run failed (so srun ends the step).
"""

# No `from __future__ import annotations`: Hydra's plugin scan executes this module outside
# sys.modules, where dataclasses cannot resolve string annotations.
#
# Hydra's plugin scan executes this module in every Hydra command, so it imports only Hydra: each
# method imports the Slurm rendering, the run records and submitit where it needs them (the
# planned jobs are in _jobs.py, which the scan skips), and a job imports them as it runs.
import contextlib
import io
import logging
import pickle
import time
import uuid
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, run_job, setup_globals
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import BaseSubmititLauncher
from omegaconf import DictConfig, open_dict

if TYPE_CHECKING:
    from hydra_plugins.moe_vlm_sweeper._jobs import Numbered, PlannedJob, Submission
    from moe_vlm.launch import pack

# Our Slurm rendering, run records and submitit, imported by the methods that use them: see above.
log = logging.getLogger(__name__)
# SubmititLauncher.plan's results per launcher.
_PLANNED: "weakref.WeakKeyDictionary[Any, dict[tuple[str, ...], PlannedJob]]" = weakref.WeakKeyDictionary()
WAIT_POLL_S = 15.0  # submit_and_exit=false: seconds between polls of Slurm
# dry_run: the canary's job id is known only once sbatch accepted it.
CANARY_PLACEHOLDER = "CANARY_JOB_ID"


class SubmititLauncher(BaseSubmititLauncher):
    def __init__(self, **params: Any) -> None:
        from moe_vlm.base.safety import scrub
        from moe_vlm.launch import slurm

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

    def plan(self, overrides: Sequence[str]) -> "PlannedJob":
        """Compose one point and derive its Slurm job; raises BadInput on unsafe settings.

        Once per point: the sweeper's check, a dry run's render and the canary ask for the same
        one (kept outside the instance, which is pickled into every job)."""
        planned = _PLANNED.setdefault(self, {})
        if tuple(overrides) not in planned:
            planned[tuple(overrides)] = self._plan(overrides)
        return planned[tuple(overrides)]

    def _plan(self, overrides: Sequence[str]) -> "PlannedJob":
        from hydra_plugins.moe_vlm_sweeper._jobs import PlannedJob
        from moe_vlm.config.compose import compose_sweep_point
        from moe_vlm.launch import preflight, slurm

        assert self.hydra_context is not None and self.config is not None
        # load_sweep_config's result, without a Hydra composition per call (moe_vlm/config/compose.py).
        point = compose_sweep_point(self.config, overrides)
        spec = point.spec
        # Nodes that failed this sweep's preflight stay out of its jobs (and canaries).
        settings = preflight.with_exclusions(slurm.checked(self.settings, spec), point.point_dir.parent)
        return PlannedJob(
            list(overrides), point.point_dir, spec, settings, slurm.job_parameters(settings, spec)
        )

    def check(self, overrides: Sequence[str]) -> None:
        self.plan(overrides)

    def job_arguments(self, job: "PlannedJob", number: int, state: Any = None) -> tuple[Any, ...]:
        """What `__call__` receives in the job (as hydra-submitit-launcher passes it)."""
        state = Singleton.get_state() if state is None else state
        return (job.overrides, "hydra.sweep.dir", number, f"job_id_for_{number}", state)

    def shared(self, chunk: list["Numbered"], state: Any) -> list["SharedPoint"]:
        """The jobs of a job array or a pack: the launcher, Hydra's state and every point's
        arguments in one pickle, and per point a reference to it (see SharedPoint)."""
        import cloudpickle  # submitit's pickler, imported with the submitting code only

        from moe_vlm.base.files import write_atomic

        path = self.submitit_root / f"shared-{uuid.uuid4().hex[:12]}.pkl"
        path.parent.mkdir(parents=True, exist_ok=True)
        arguments = [self.job_arguments(job, number, state)[:-1] for number, job in chunk]
        write_atomic(path, cloudpickle.dumps((self, state, arguments), pickle.HIGHEST_PROTOCOL))
        return [SharedPoint(str(path), index) for index in range(len(chunk))]

    def python(self, job: "PlannedJob") -> str:
        from moe_vlm.launch import slurm

        return slurm.python_command(job.settings)

    @property
    def uses_canary(self) -> bool:
        return self.settings.executor == "slurm" and self.settings.canary

    def render_jobs(self, job_overrides: Sequence[Sequence[str]], labels: Sequence[str]) -> list[str]:
        """What dry_run prints for these points' jobs, one section per sbatch call that `launch`
        would make (a job, a job array, a pack), each the script it would submit: the same
        grouping (`submissions`) and the same script code (`script`). labels: how the plan
        names each point ("3 (id ab12...)")."""
        from hydra_plugins.moe_vlm_sweeper._jobs import PACK_TOKEN_PLACEHOLDER
        from moe_vlm.launch import slurm

        if self.settings.executor != "slurm":
            return [
                f"(hydra/launcher executor={self.settings.executor}: runs on this machine, no sbatch script)"
            ]
        numbered = list(enumerate(self.plan(o) for o in job_overrides))
        canary = CANARY_PLACEHOLDER if self.uses_canary else None
        found = self.submissions(numbered)
        sections = []
        for count, submission in enumerate(found, start=1):
            script = self.script(submission, canary, PACK_TOKEN_PLACEHOLDER)
            names = ", ".join(labels[number] for number, _ in submission.points)
            srun = slurm.srun_line(script)
            sections.append(
                "\n".join(
                    [
                        f"===== job {count}/{len(found)}: {submission.describe(self.settings)}: {names} =====",
                        "-- sbatch script --",
                        script.rstrip(),
                        *(["", "-- srun command --", srun] if srun else []),
                    ]
                )
            )
        return sections

    @property
    def submitit_root(self) -> Path:
        """The submitit folder without its job-id part: where packed jobs keep their folders."""
        from submitit.core.utils import JobPaths

        return JobPaths.get_first_id_independent_folder(self.folder)

    def pack_script(
        self, first: "PlannedJob", pack_dir: Path, entries: Sequence["pack.PackEntry"], canary: str | None
    ) -> str:
        from moe_vlm.launch import pack, slurm

        params = slurm.job_parameters(first.settings, first.spec, points=len(entries))
        return pack.render(
            pack.pack_parameters(params, canary),
            pack_dir,
            entries,
            self.python(first),
            first.settings.timeout_min,
        )

    def render_canaries(self, job_overrides: Sequence[Sequence[str]]) -> str:
        """What dry_run prints for the canaries these points would wait on ("" when none)."""
        from moe_vlm.launch import slurm

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
    def canary_groups(planned: Sequence["PlannedJob"]) -> dict[tuple[str, str | None], "PlannedJob"]:
        """The first point of each (cluster, container image): the one its canary builds."""
        groups: dict[tuple[str, str | None], PlannedJob] = {}
        for job in planned:
            groups.setdefault(job.canary_key, job)
        return groups

    def canary_script(self, job: "PlannedJob") -> str:
        from moe_vlm.launch import slurm

        params = slurm.canary_parameters(job.settings, job.spec, job.canary_dir)
        from moe_vlm.runtime import points

        command = slurm.canary_command(
            self.python(job),
            job.task_overrides,
            job.settings.canary_probe,
            job.canary_dir / points.CANARY_POINTS,
        )
        return slurm.render_sbatch(params, str(job.canary_dir), self.python(job), command)

    def submit_canaries(self, planned: Sequence["PlannedJob"]) -> dict[tuple[str, str | None], str]:
        """Submit one canary per (cluster, container image) of the sweep; their job ids by that key (none
        for a key whose canary in this sweep directory already passed)."""
        from moe_vlm.base.files import write_json_atomic
        from moe_vlm.base.safety import scrub
        from moe_vlm.launch import slurm
        from moe_vlm.launch.status import passed_canary
        from moe_vlm.runtime import points

        submitted: dict[tuple[str, str | None], str] = {}
        for key, first in self.canary_groups(planned).items():
            passed = passed_canary(first.canary_dir)
            if passed is not None:
                # Its verdict holds for the sweep: a later launch (a halving rung, a rerun) pays
                # no second canary and needs no dependency on a job that already passed.
                print(
                    f"moe_vlm: canary job {passed} of this sweep passed for cluster={key[0]}; "
                    "its verdict is reused (one canary per sweep)"
                )
                continue
            first.canary_dir.mkdir(parents=True, exist_ok=True)
            # The points the canary runs the library's own checks on, before any of them starts.
            write_json_atomic(
                first.canary_dir / points.CANARY_POINTS,
                scrub(
                    {
                        "points": [
                            {"point_dir": str(job.point_dir), "overrides": job.task_overrides}
                            for job in planned
                            if job.canary_key == key
                        ]
                    }
                ),
            )
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
        from moe_vlm.launch import preflight
        from moe_vlm.runtime import points

        assert self.config is not None
        planned = [self.plan(overrides) for overrides in job_overrides]
        if self.settings.executor == "local":
            return self._launch_local(planned, initial_job_idx)
        sweep_dir = planned[0].point_dir.parent
        excluded = preflight.excluded_nodes(sweep_dir) if self.settings.preflight.exclude_failed else []
        if excluded:
            print(
                f"moe_vlm: excluding node(s) {', '.join(excluded)} from this sweep's jobs (--exclude): they "
                f"failed its node preflight ({sweep_dir / preflight.NODES / preflight.FAILING}); "
                "hydra.launcher.preflight.exclude_failed=false readmits them"
            )
        canaries = self.submit_canaries(planned) if self.uses_canary else {}
        self.submit_points(list(enumerate(planned, start=initial_job_idx)), canaries)
        returns = [
            JobReturn(
                overrides=job.overrides,
                working_dir=str(job.point_dir),
                status=JobStatus.UNKNOWN,
                _return_value=(points.read_point(job.point_dir) or {}).get("job_id"),
            )
            for job in planned
        ]
        return returns if self.settings.submit_and_exit else self._wait(planned)

    def submissions(self, numbered: Sequence["Numbered"]) -> list["Submission"]:
        """The sbatch calls for these points: packs of points_per_job, else one job array per
        group of points with the same resources (split at Slurm's array size), else one job
        per point. Submitting and a dry run both ask here."""
        from hydra_plugins.moe_vlm_sweeper._jobs import JobKind, Submission, chunks
        from moe_vlm.launch import slurm

        groups: dict[tuple[str, tuple[str, str | None]], list[Numbered]] = {}
        for item in numbered:
            groups.setdefault(item[1].resources, []).append(item)
        packed = self.settings.points_per_job > 1
        array = slurm.MAX_ARRAY_TASKS if self.settings.array else 1
        size = self.settings.points_per_job if packed else array
        out = []
        for group in groups.values():
            for chunk in chunks(group, size):
                kind = JobKind.pack if packed else JobKind.array if len(chunk) > 1 else JobKind.job
                out.append(Submission(kind, chunk))
        return out

    def executor(self, chunk: Sequence["Numbered"], canary: str | None, render_only: bool = False) -> Any:
        """submitit's SlurmExecutor for one job or one job array of these points (not packs);
        render_only: to write its sbatch script, on a machine that may have no Slurm tools."""
        import submitit

        from hydra_plugins.moe_vlm_sweeper._jobs import ScriptOnlyExecutor
        from moe_vlm.launch import slurm

        first = chunk[0][1]
        kind = ScriptOnlyExecutor if render_only else submitit.SlurmExecutor
        executor = kind(folder=self.folder, max_num_timeout=0, python=self.python(first))
        dirs = [job.point_dir for _, job in chunk]
        executor.update_parameters(**slurm.point_parameters(first.params, dirs, self.python(first), canary))
        return executor

    def script(self, submission: "Submission", canary: str | None, pack_token: str) -> str:
        """The sbatch script of one submission, as sbatch receives it: a pack's as `_submit_pack`
        writes it; a job's or an array's as submitit writes it (SlurmExecutor's own
        `_make_submission_file_text`; an array with map_count set, as submitit's
        `_internal_process_submissions` sets it on its copy of the executor)."""
        from hydra_plugins.moe_vlm_sweeper._jobs import JobKind
        from moe_vlm.launch import pack

        first = submission.points[0][1]
        if submission.kind is JobKind.pack:
            pack_dir = pack.pack_folder(self.submitit_root, pack_token)
            entries = pack.entries_for(pack_dir, [job.point_dir for _, job in submission.points])
            return self.pack_script(first, pack_dir, entries, canary)
        executor = self.executor(submission.points, canary, render_only=True)
        if submission.kind is JobKind.array:
            executor.parameters["map_count"] = len(submission.points)
        text: str = executor._make_submission_file_text(executor._submitit_command_str, "")
        return text

    def submit_points(self, numbered: list["Numbered"], canaries: dict[tuple[str, str | None], str]) -> int:
        """Submit every point, one sbatch call per `submissions` entry. Returns the sbatch calls."""
        from submitit.core.utils import FailedJobError, FailedSubmissionError

        from hydra_plugins.moe_vlm_sweeper._jobs import JobKind
        from moe_vlm.base.errors import BadInput
        from moe_vlm.launch import slurm

        started, calls, done = time.monotonic(), 0, 0
        state = Singleton.get_state()  # a deep copy of Hydra's state: once, not once per point
        for submission in self.submissions(numbered):
            chunk = submission.points
            canary = canaries.get(chunk[0][1].canary_key)
            try:
                if submission.kind is JobKind.pack:
                    self._submit_pack(chunk, canary, state)
                else:
                    self._submit_jobs(chunk, canary, state)
            except (FailedJobError, FailedSubmissionError, BadInput) as exc:
                reason = (str(exc).strip().splitlines() or ["no message"])[-1]
                if isinstance(exc, slurm.SbatchRefused):
                    reason = exc.reason
                first = chunk[0][1]
                raise BadInput(
                    f"sbatch refused {len(chunk)} point(s) from {first.point_dir.name} "
                    f"({' '.join(first.task_overrides)}): {reason}. {done} earlier point(s) are "
                    "queued. Fix: check hydra.launcher partition/account/qos (or the site file), "
                    "then rerun the command to submit the rest."
                ) from exc
            calls += 1
            done += len(chunk)
        print(
            f"moe_vlm: {done} point(s) submitted in {calls} sbatch call(s) in "
            f"{time.monotonic() - started:.2f} s"
            + (f" (up to {self.settings.points_per_job} per job)" if self.settings.points_per_job > 1 else "")
        )
        return calls

    def _submit_jobs(self, chunk: list["Numbered"], canary: str | None, state: Any) -> None:
        """One point: one job; several: one job array, its task i running point i (submitit's batch)."""
        first = chunk[0][1]
        executor = self.executor(chunk, canary)
        # submitit prints sbatch's stderr on failure; submit_points says it in one line.
        with contextlib.redirect_stderr(io.StringIO()):
            if len(chunk) == 1:
                submitted = [executor.submit(self, *self.job_arguments(first, chunk[0][0], state))]
            else:
                calls = self.shared(chunk, state)
                with executor.batch():
                    submitted = [executor.submit(call) for call in calls]
        array_id = submitted[0].job_id.split("_")[0]
        for index, ((_, job), handle) in enumerate(zip(chunk, submitted, strict=True)):
            script = handle.paths.submission_file
            if len(chunk) > 1:  # one script for the whole array, in its first task's folder
                script = Path(self.folder.replace("%j", array_id)) / f"{array_id}_submission.sh"
            self._record_submission(
                job,
                handle.job_id,
                canary,
                script,
                self.folder,
                array={"job_id": array_id, "index": index, "size": len(chunk)} if len(chunk) > 1 else None,
            )

    def _submit_pack(self, chunk: list["Numbered"], canary: str | None, state: Any) -> None:
        """One job running these points as srun steps, one after another (launch/pack.py)."""
        from submitit.core.utils import DelayedSubmission, JobPaths

        from hydra_plugins.moe_vlm_sweeper._jobs import JobKind, Submission
        from moe_vlm.launch import pack, slurm

        token = uuid.uuid4().hex[:12]
        pack_dir = pack.pack_folder(self.submitit_root, token)
        entries = pack.entries_for(pack_dir, [job.point_dir for _, job in chunk])
        pickles = []
        for (_, job), entry, call in zip(chunk, entries, self.shared(chunk, state), strict=True):
            entry.folder.mkdir(parents=True, exist_ok=True)
            delayed = DelayedSubmission(call)
            delayed.set_timeout(job.settings.timeout_min, 0)
            pickle = entry.folder / "submitted.pkl.tmp"
            delayed.dump(pickle)
            pickles.append(pickle)
        script = pack_dir / pack.PACK_SCRIPT
        script.write_text(self.script(Submission(JobKind.pack, chunk), canary, token))
        job_id = slurm.submit_script(script, "the packed job")
        # Named by the job id, as submitit's runner looks for it; a step that starts first waits for it.
        for pickle, entry in zip(pickles, entries, strict=True):
            JobPaths(entry.folder, job_id).move_temporary_file(pickle, "submitted_pickle")
        ids = [job.point_dir.name for _, job in chunk]
        for index, ((_, job), entry) in enumerate(zip(chunk, entries, strict=True), start=1):
            self._record_submission(
                job,
                job_id,
                canary,
                script,
                str(entry.folder),
                pack={"index": index, "size": len(chunk), "dir": str(pack_dir), "points": ids},
            )

    def _record_submission(
        self, job: "PlannedJob", job_id: str, canary: str | None, script: Path, folder: str, **placement: Any
    ) -> None:
        """point.json: the job (and its place in an array or a pack) and where its logs go."""
        from moe_vlm.runtime import points

        points.add_submission(
            job.point_dir,
            {
                "job_id": job_id,
                "executor": "slurm",
                "submitted_unix_s": points.now(),
                "script": str(script),
                **({"canary": {"job_id": canary, "dir": str(job.canary_dir)}} if canary else {}),
                **{key: value for key, value in placement.items() if value is not None},
            },
            submitit_folder=folder,
        )
        log.info("queued %s: job %s", job.point_dir.name, job_id)

    def _wait(self, planned: list["PlannedJob"]) -> list[JobReturn]:
        """submit_and_exit=false: poll (one Slurm call per round) until every job has ended."""
        from hydra_plugins.moe_vlm_sweeper._jobs import status_of
        from moe_vlm.launch.status import collect, in_flight

        sweep_dir = planned[0].point_dir.parent
        wanted = {job.point_dir.name for job in planned}
        while True:
            statuses = [s for s in collect(sweep_dir) if s.point_id in wanted]
            states = {s.point_id: s.state for s in statuses}
            waiting = sum(in_flight(s) for s in statuses)
            if not waiting:
                break
            log.info("waiting for %d of %d job(s)", waiting, len(planned))
            time.sleep(WAIT_POLL_S)
        return [
            JobReturn(
                overrides=job.overrides,
                working_dir=str(job.point_dir),
                status=status_of(states.get(job.point_dir.name)),
            )
            for job in planned
        ]

    def _launch_local(self, planned: list["PlannedJob"], initial_job_idx: int) -> Sequence[JobReturn]:
        """submitit's local executor: one process per point on this machine, waited for."""
        import submitit

        from moe_vlm.runtime import points
        from moe_vlm.runtime.failures import record_job_failure

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

        from hydra_plugins.moe_vlm_sweeper._jobs import record_launch
        from moe_vlm.launch import requeue
        from moe_vlm.runtime import dist_env

        assert self.hydra_context is not None and self.config is not None and self.task_function is not None
        Singleton.set_state(singleton_state)
        setup_globals()
        sweep_config: DictConfig = self.hydra_context.config_loader.load_sweep_config(
            self.config, sweep_overrides
        )
        point_dir = Path(str(sweep_config.hydra.sweep.dir), str(sweep_config.hydra.sweep.subdir)).absolute()
        checked = None
        if self.settings.executor == "slurm":
            requeue.prepare_attempt(point_dir)
            requeue.install(point_dir)
            if self.settings.preflight.enabled:
                from moe_vlm.launch import preflight

                # Every node of the allocation, before the run: raises (after recording why) on a bad one.
                checked = preflight.check_here(point_dir, self.settings.preflight)
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
        if dist_env.global_rank() == 0:
            record_launch(
                point_dir,
                environment.job_id,
                self.settings.executor,
                checked.seconds if checked else None,
                self.settings.container_image,
            )
        if result.status == JobStatus.FAILED:
            # Hydra caught the exception; raise it so the task exits non-zero and srun ends the step.
            raise result._return_value
        return result


@dataclass(frozen=True)
class SharedPoint:
    """One point's job in a job array or a pack, as submitit pickles it: the pickle its
    submission shares (launcher, Hydra's state, every point's arguments) and its place there.
    Pickling the launcher with Hydra's state costs tens of milliseconds; once per submission
    instead of once per point, a 1,000-point array is submitted in about a second."""

    path: str
    index: int

    def __call__(self) -> JobReturn:
        import pickle

        with open(self.path, "rb") as handle:
            launcher, state, arguments = pickle.load(handle)
        result: JobReturn = launcher(*arguments[self.index], state)
        return result
