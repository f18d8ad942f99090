"""The planning sweeper's work: plan every point, then launch (sweeper.py is the Hydra plugin).

For `python train.py -m mbs=1,2,4 recompute=full,selective` (or `sweep=<preset>`), it:

1. expands the grid (preset axes from `hydra.sweeper.params`, command-line sweeps win);
2. composes every point and builds its RunSpec; a point that cannot compose stops the sweep
   with one line (exit 2) before anything is submitted;
3. validates every point with the rule catalogue and, on what the rules let through on the
   Megatron engine, the library's own checks (LIB-*, the same as a one-point dry run, through the
   plan cache: identical inputs are checked once), when the Megatron stack imports here (else one
   LIB-STACK warning: the canary runs them on the cluster); points with error findings are never
   launched and get a `rejected` run.json naming the rules or the library's refusal;
4. names every point by its identity (hash of the resolved config and the code version) and
   skips points already completed in the sweep directory, or queued/running in Slurm:
   rerunning the command resumes the sweep; `hydra.sweeper.force=true` reruns completed ones;
5. with `dry_run=true`, prints each point's plan and, on Slurm, every job exactly as the
   launcher would submit it (one sbatch script per job, job array or pack, naming its points)
   and the canary the jobs wait on, and submits nothing; beyond COMPACT_ABOVE
   points it prints one line per point and a summary, and writes every plan and script to one
   file in the sweep directory (`dry_run=full` prints them all);
6. hands the rest to the launcher; on Slurm that returns once the jobs are queued.

With `hydra.sweeper.search=halving` the valid points go through successive halving instead
(_halving.py): rung by rung, through the same triage and launcher, waiting for each rung.
"""

# Hydra's plugin scan skips `_`-named modules: this one imports the rule catalogue, the plans and
# the Slurm rendering (and, with them, numpy) only when a sweep runs.
import importlib.util
import logging
import math
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext
from omegaconf import DictConfig, OmegaConf

from hydra_plugins.moe_vlm_sweeper import _halving as halving
from moe_vlm.base import noise
from moe_vlm.base.errors import EXIT_INVALID, BadInput
from moe_vlm.base.files import file_in_the_way
from moe_vlm.base.provenance import git_state
from moe_vlm.base.safety import scrub, scrub_text, secret_values
from moe_vlm.config.compose import compose_sweep_point, override_key, quote_override_value
from moe_vlm.config.preflight import COMPOSE_ERRORS, explain
from moe_vlm.config.schema import DryRun, Engine, dry_run_mode
from moe_vlm.config.spec import RunSpec
from moe_vlm.launch.halving import Search, search_of
from moe_vlm.launch.status import collect
from moe_vlm.perf.memory import MemoryEstimate
from moe_vlm.perf.rank_shapes import shape_key
from moe_vlm.predict.model import Prediction
from moe_vlm.record.records import RunRecord
from moe_vlm.rules import Finding, errors, validate
from moe_vlm.rules.shapes import NOT_RUN
from moe_vlm.run.library_worker import LibraryWorker, check_here
from moe_vlm.run.plan import (
    POINT_LINE_HEADER,
    gather,
    memory_of,
    point_line,
    prediction_of,
    render,
    shape_check,
)
from moe_vlm.run.plan_record import plan_of
from moe_vlm.runtime import points

log = logging.getLogger(__name__)
# A dry run of more points prints one line per point; its plans and scripts go to files.
COMPACT_ABOVE = 8
DRY_RUN_FILE = "dry_run.txt"  # the table
PLANS_FILE = "dry_run_plans.txt"  # every point's plan and sbatch script, as dry_run=full prints them


def checked(spec: RunSpec) -> list[Finding]:
    """The rules, then (for a point they let through) the shape check of its real micro-batch,
    cached per shape (moe_vlm/run/plan.py shape_check): a refused point is never submitted."""
    findings = validate(spec)
    return findings if errors(findings) else [*findings, *shape_check(spec)]


@dataclass
class Point:
    index: int
    overrides: list[str]
    point_id: str
    config: dict[str, Any]
    spec: RunSpec
    findings: list[Finding]

    @property
    def valid(self) -> bool:
        return not errors(self.findings)

    def label(self) -> str:
        return " ".join(self.overrides) or "(defaults)"


def unshaped_note(planned: list[Point], canary: bool) -> str:
    """The valid points whose shape check did not run here (S000: no Transformer Engine on this
    machine), and what checks them before they start: said with the sweep's counts."""
    left = [p for p in planned if p.valid and any(f.code == NOT_RUN for f in p.findings)]
    if not left:
        return ""
    shapes = len({shape_key(p.spec) for p in left})
    who = (
        f"the canary checks their {shapes} distinct shape(s) on the cluster's stack and refuses a point before it starts"
        if canary
        else "nothing checks them before they start (the Slurm launcher's canary would)"
    )
    return f"; {len(left)} valid point(s) not shape-checked here (S000): {who}"


def dry_run_where(sweep_dir: Path) -> str:
    """Where a dry run left its plans, and the status command that lists them."""
    latest = sweep_dir.parent / points.LATEST
    shown = latest if latest.is_symlink() and latest.resolve() == sweep_dir.resolve() else sweep_dir
    return (
        f"moe_vlm: sweep directory {sweep_dir}; its points (planned, not submitted): moe-vlm status {shown}"
    )


def _predicted_rate(found: Prediction | str) -> float:
    if isinstance(found, str) or found.effective_tokens_per_s_per_gpu is None:
        return 0.0
    return found.effective_tokens_per_s_per_gpu


def wants_library(point: Point) -> bool:
    """Whether the library's own checks judge this point: one the rules let through, on Megatron."""
    return point.valid and point.spec.engine == Engine.megatron


def library_worker(enabled: bool) -> LibraryWorker | None:
    """A worker process for the sweep's library checks (run/library_worker.py), when they are on,
    the stack is installed here and this process has not imported it already (then it is faster
    here); it starts only at the first point the plan cache lacks."""
    if not enabled or "megatron.bridge" in sys.modules:
        return None
    try:
        installed = importlib.util.find_spec("megatron.bridge") is not None
    except (ImportError, ValueError):
        installed = False
    return LibraryWorker() if installed else None


def check_library(
    planned: list[Point], *, enabled: bool, canary: bool, worker: LibraryWorker | None = None
) -> None:
    """The library's own checks on every point the rules let through (engine=megatron), their
    findings added to the point's: a point they refuse is rejected like one the rules refuse.
    Identical inputs are judged once (plan_cache, on disk, across sweeps). Without the stack here:
    one LIB-STACK line for the sweep, not one per point. canary: the launcher's canary runs them
    again on the cluster before any point starts (moe_vlm/launch/canary.py). worker: the process
    the points were handed to while they were planned; the findings are the same either way."""
    todo = [p for p in planned if wants_library(p)]
    if not todo:
        return
    later = (
        "the canary runs them on the cluster's stack before any point starts, and a point they refuse "
        "never starts"
        if canary
        else "nothing runs them before the points start (the Slurm launcher's canary would)"
    )
    if not enabled:
        print(
            f"moe_vlm: hydra.sweeper.library_checks=false: the library's own checks did not run here; {later}"
        )
        return
    # The stack's import warnings are not the sweep's news: counted once for the sweep, not shown.
    stack: list[Finding] = []
    library_lines = 0
    for point in todo:
        checked = worker.checked(point.point_id, point.spec) if worker is not None else check_here(point.spec)
        library_lines += checked.library_lines
        stack = [f for f in checked.findings if f.code == "LIB-STACK"]
        if stack:  # the same machine for every point: said once
            break
        point.findings = [*point.findings, *checked.findings]
    if library_lines:
        print(f"moe_vlm: {library_lines} line(s) of library output while checking, not shown")
    if stack:
        print(scrub_text(f"moe_vlm: warning: LIB-STACK: {stack[0].message}; {later}"), file=sys.stderr)


DROPPED_NAMED = 20  # predict_keep names this many dropped points, then counts the rest


def keep_predicted_top(planned: list[Point], fraction: float) -> list[Point]:
    """hydra.sweeper.predict_keep=F: the best ceil(F x valid) valid points by predicted effective
    tokens/s/GPU, plus every rejected point (recorded as rejected, as always)."""
    if not 0.0 < fraction <= 1.0:
        raise BadInput(
            f"hydra.sweeper.predict_keep={fraction}: must be in (0, 1]; e.g. hydra.sweeper.predict_keep=0.25 "
            "keeps the predicted best quarter"
        )
    if fraction == 1.0:
        return planned
    valid = [p for p in planned if p.valid]
    speeds = {p.point_id: prediction_of(p.spec, p.findings) for p in valid}
    unpredicted = [p.label() for p in valid if _predicted_rate(speeds[p.point_id]) <= 0]
    if unpredicted:
        first = speeds[next(p.point_id for p in valid if p.label() == unpredicted[0])]
        why = first if isinstance(first, str) else first.note
        raise BadInput(
            f"hydra.sweeper.predict_keep={fraction}: {len(unpredicted)} point(s) have no prediction "
            f"({unpredicted[0]}: {why}); calibrate first (moe-vlm calibrate <sweep dir>) or drop predict_keep"
        )
    keep = max(1, math.ceil(fraction * len(valid)))
    best = sorted(valid, key=lambda p: -_predicted_rate(speeds[p.point_id]))[:keep]
    kept = {p.point_id for p in best}
    dropped = [p for p in valid if p.point_id not in kept]
    print(
        f"moe_vlm: predict_keep={fraction}: keeping the {len(kept)} of {len(valid)} valid point(s) predicted "
        f"fastest (effective tokens/s/GPU); {len(dropped)} dropped" + (":" if dropped else "")
    )
    # Named, so that a point a user expected to run is found here, not guessed at.
    for point in dropped[:DROPPED_NAMED]:
        print(
            f"  dropped {point.label()}: predicted {_predicted_rate(speeds[point.point_id]):,.0f} tokens/s/GPU"
        )
    if len(dropped) > DROPPED_NAMED:
        print(f"  + {len(dropped) - DROPPED_NAMED} more dropped (the grid's order above)")
    return [p for p in planned if not p.valid or p.point_id in kept]


class Planner:
    """One sweep's planning and launch, for sweeper.PlanningSweeper (the Hydra plugin, which holds
    the settings and Hydra's context and hands every sweep here)."""

    def __init__(
        self,
        *,
        params: dict[str, str],
        force: bool,
        search: str,
        halving: Any,
        predict_keep: float,
        library_checks: bool = True,
        config: DictConfig,
        hydra_context: HydraContext,
        launcher: Launcher,
    ) -> None:
        self.params = params
        self.force = force
        self.search = search
        self.halving = halving
        self.predict_keep = predict_keep
        self.library_checks = library_checks
        self.config: DictConfig | None = config
        self.hydra_context: HydraContext | None = hydra_context
        self.launcher: Launcher | None = launcher

    # --- planning ----------------------------------------------------------------------------

    @property
    def uses_canary(self) -> bool:
        return bool(getattr(self.launcher, "uses_canary", False))

    def grid(self, arguments: list[str]) -> list[list[str]]:
        assert self.hydra_context is not None
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        lines = [f"{key}={value}" for key, value in self.params.items()] + list(arguments)
        return BasicSweeper.split_arguments(parser.parse_overrides(lines), None)[0]

    def plan(self, grid: list[list[str]], worker: LibraryWorker | None = None) -> list[Point]:
        """Every point of the grid, composed and judged by the rules; each point the library's
        checks will judge is handed to `worker` as soon as it is planned."""
        assert self.hydra_context is not None and self.config is not None
        code_version = git_state()["commit"]
        secrets = secret_values()
        planned: dict[str, Point] = {}
        for index, overrides in enumerate(grid):
            try:
                # load_sweep_config's result; Hydra composes each set of group choices once.
                composed = compose_sweep_point(self.config, overrides)
                spec = composed.spec
            except COMPOSE_ERRORS as exc:
                raise BadInput(f"sweep point {' '.join(overrides)}: {explain(exc, overrides)}") from exc
            # Always scrubbed: a credential by pattern (a ?token= from ${oc.env:...}) needs no known secret.
            config = scrub(composed.config, secrets)
            point_id = points.identity(config, code_version)
            # Two spellings of one point (mbs=1 and mbs=01) run once.
            if point_id not in planned:
                point = planned[point_id] = Point(index, overrides, point_id, config, spec, checked(spec))
                if worker is not None and wants_library(point):
                    worker.submit(point_id, spec)
        return list(planned.values())

    def job_overrides(self, point: Point, sweep_dir: Path) -> list[str]:
        return [
            *point.overrides,
            f"hydra.sweep.dir={quote_override_value(str(sweep_dir))}",
            f"hydra.sweep.subdir={quote_override_value(point.point_id)}",  # 12e45 would be a float
        ]

    # --- the sweep ---------------------------------------------------------------------------

    def sweep(self, arguments: list[str]) -> Any:
        try:
            return self._sweep(arguments)
        except BadInput as bad:
            print(f"moe_vlm: error: {bad}", file=sys.stderr)
            sys.exit(EXIT_INVALID)

    def _sweep(self, arguments: list[str]) -> Any:
        assert self.config is not None and self.launcher is not None
        sweep_dir = Path(str(self.config.hydra.sweep.dir)).absolute()
        blocked = file_in_the_way(sweep_dir)
        if blocked is not None:  # before any planning: nothing is written, nothing is lost
            raise BadInput(
                f"hydra.sweep.dir={sweep_dir}: {blocked} is a file, not a directory; a sweep writes a directory "
                f"per point under it. Fix: name a directory that is one or does not exist yet (e.g. "
                f"hydra.sweep.dir={str(sweep_dir).replace(str(blocked), f'{blocked}.d', 1)}), or move the file away."
            )
        search = search_of(self.search)
        settings = halving.settings_of(self.halving) if search is Search.halving else None
        # With predict_keep < 1 only the kept points are checked, after the keeping: no worker.
        worker = library_worker(self.library_checks and self.predict_keep == 1.0)
        try:
            planned = keep_predicted_top(self.plan(self.grid(arguments), worker), self.predict_keep)
            check = getattr(self.launcher, "check", None)
            for point in planned:
                if check is not None:
                    check(self.job_overrides(point, sweep_dir))
            # After the launcher's own checks: a credential is refused before the sweep reads any
            # library verdict (the worker's output is captured, and the plan cache keeps no secret).
            check_library(
                planned,
                enabled=self.library_checks,
                canary=self.uses_canary,
                worker=worker,
            )
        finally:
            if worker is not None:
                worker.close()
        if settings is not None:
            settings = halving.schedule_of(planned, settings)  # refused here: nothing written yet

        sweep_dir.mkdir(parents=True, exist_ok=True)
        if sweep_dir.parent.name == "multirun":  # Hydra's default place, not a directory the user named
            points.mark_latest(sweep_dir)
        dry = [p for p in planned if p.spec.dry_run]
        if dry:
            self.print_dry_run(dry, sweep_dir)
            if settings is not None:
                print(halving.plan_of(dry, settings))
            planned = [p for p in planned if not p.spec.dry_run]
            if not planned:
                return []

        sweep_dir.mkdir(parents=True, exist_ok=True)
        (sweep_dir / "multirun.yaml").write_text(scrub_text(OmegaConf.to_yaml(self.config)))
        if settings is not None:
            return halving.search(self, planned, sweep_dir, settings)
        to_launch, counts = self.triage(planned, sweep_dir)
        valid = len(planned) - counts["rejected"]
        print(
            f"moe_vlm: sweep {sweep_dir}: {len(planned)} point(s): {len(to_launch)} to run, "
            f"{counts['skipped_completed']} already completed, {counts['skipped_in_flight']} in flight, "
            f"{counts['rejected']} rejected"
            + (
                ""
                if self.force or not counts["skipped_completed"]
                else " (hydra.sweeper.force=true reruns them)"
            )
            + unshaped_note(to_launch, self.uses_canary)
        )
        if valid == 0:
            print("moe_vlm: every point was rejected; nothing was submitted.", file=sys.stderr)
            sys.exit(EXIT_INVALID)
        if not to_launch:
            return []
        results = self.launch(to_launch, sweep_dir)
        queued = [r for r in results if r.status.name == "UNKNOWN"]
        if queued:
            # Points and jobs apart: a packed job runs several points, an array task one.
            jobs = {str((points.read_point(Path(str(r.working_dir))) or {}).get("job_id")) for r in queued}
            print(
                f"moe_vlm: {len(queued)} point(s) queued in {len(jobs)} job(s). Follow them with: "
                f"moe-vlm status {sweep_dir} --watch 30"
            )
        else:
            finished = [points.run_status(sweep_dir / p.point_id) or "no record" for p in to_launch]
            tally = ", ".join(f"{finished.count(s)} {s}" for s in sorted(set(finished)))
            print(
                f"moe_vlm: sweep {sweep_dir} done: {tally}. Table: moe-vlm status {sweep_dir}; "
                f"ranking: moe-vlm report {sweep_dir}"
            )
        return results

    def triage(self, planned: list[Point], sweep_dir: Path) -> tuple[list[Point], dict[str, int]]:
        """The points to launch: rejected ones get their record, completed ones (unless force) and
        queued or running ones are skipped; the others' earlier attempts are archived."""
        existing = {status.point_id: status for status in collect(sweep_dir)}
        to_launch: list[Point] = []
        counts = {"rejected": 0, "skipped_completed": 0, "skipped_in_flight": 0}
        for point in planned:
            point_dir = sweep_dir / point.point_id
            before = existing.get(point.point_id)
            if not point.valid:
                self.record_rejected(point, point_dir)
                counts["rejected"] += 1
                continue
            if before is not None and before.state in ("queued", "running"):
                print(
                    f"moe_vlm: {point.label()}: already {before.state} (job {before.job_id}); not resubmitted"
                )
                counts["skipped_in_flight"] += 1
                continue
            if before is not None and before.state == "completed" and not self.force:
                counts["skipped_completed"] += 1
                continue
            points.archive_attempt(point_dir)
            self.write_plan(point, point_dir)
            to_launch.append(point)
        return to_launch, counts

    def launch(self, to_launch: list[Point], sweep_dir: Path) -> list[JobReturn]:
        assert self.launcher is not None
        jobs = [self.job_overrides(p, sweep_dir) for p in to_launch]
        if hasattr(self.launcher, "plan"):  # moe_vlm's submitit launcher: submits every point itself
            return list(self.launcher.launch(jobs, initial_job_idx=0))
        # In-process launchers (Hydra's basic one) run points one by one; a point that exits
        # (a failed run calls sys.exit) must not end the sweep: its run.json says why.
        results: list[JobReturn] = []
        for number, (point, job) in enumerate(zip(to_launch, jobs, strict=True)):
            try:
                results.extend(self.launcher.launch([job], initial_job_idx=number))
            except SystemExit as exc:
                if exc.code not in (0, None):
                    print(
                        f"moe_vlm: {point.label()}: exited with status {exc.code}; continuing",
                        file=sys.stderr,
                    )
        return results

    def record_rejected(self, point: Point, point_dir: Path) -> None:
        self.write_plan(point, point_dir)
        RunRecord.rejected(point.spec, point.config, point.findings).write(point_dir)
        codes = ", ".join(f"{f.code} ({f.message})" for f in errors(point.findings))
        print(scrub_text(f"moe_vlm: rejected {point.label()}: {codes}"), file=sys.stderr)

    @property
    def launcher_overrides(self) -> list[str]:
        """The command line's launcher choice and settings: what reruns a point where it ran
        (`moe-vlm advise` keeps them in the commands it suggests)."""
        assert self.config is not None
        given = [str(o) for o in self.config.hydra.overrides.hydra]
        return [
            o
            for o in given
            if override_key(o) == "hydra/launcher" or override_key(o).startswith("hydra.launcher.")
        ]

    def write_plan(self, point: Point, point_dir: Path) -> None:
        previous = points.read_point(point_dir) or {}
        points.write_point(
            point_dir,
            {
                "point_id": point.point_id,
                "overrides": point.overrides,
                "launcher_overrides": self.launcher_overrides,
                "config": point.config,
                "valid": point.valid,
                # Why it is refused, for `moe-vlm status` (a dry run's point has no run.json).
                "refused": [{"code": f.code, "message": f.message} for f in errors(point.findings)],
                "planned_unix_s": points.now(),
                "submissions": previous.get("submissions", []),
            },
        )

    def print_dry_run(self, dry: list[Point], sweep_dir: Path) -> None:
        full = any(dry_run_mode(p.config.get("dry_run")) is DryRun.full for p in dry)
        if len(dry) > COMPACT_ABOVE and not full:
            self.print_compact_dry_run(dry, sweep_dir)
            return
        # The libraries' own output while the plans build (Megatron log lines, warnings) stays off
        # the console, as a single plan's does (moe_vlm/base/noise.py); dry_run=full prints it.
        with noise.captured(not full) as library_output:
            sections = list(self.plans(dry, sweep_dir, deep=True))
        for section in sections:
            print(section)
        if library_output:
            print(
                f"moe_vlm: {len(library_output)} line(s) of library output while planning, not shown (dry_run=full shows them)"
            )
        rejected = sum(not p.valid for p in dry)
        print(
            f"moe_vlm: dry run: {len(dry)} point(s), {len(dry) - rejected} valid, "
            f"{rejected} would be rejected{unshaped_note(dry, self.uses_canary)}; nothing was submitted."
        )
        print(dry_run_where(sweep_dir))

    def plans(
        self,
        dry: list[Point],
        sweep_dir: Path,
        deep: bool,
        memory: list[MemoryEstimate | str] | None = None,
        predicted: list[Prediction | str] | None = None,
    ) -> Iterator[str]:
        """Each point's plan; then, on Slurm, every job as the launcher would submit it (one
        sbatch script per job, job array or pack, naming its points) and the canary's."""
        secrets = secret_values()
        clean: Callable[[Any], Any] = lambda value: scrub(value, secrets)  # noqa: E731
        for number, point in enumerate(dry, start=1):
            found = memory[number - 1] if memory else None
            speed = predicted[number - 1] if predicted else None
            header = f"===== point {number}/{len(dry)}: {point.label()}  (id {point.point_id}) ====="
            got = gather(point.spec, point.findings, deep=deep, memory=found, prediction=speed)
            # Each point's plan.json where its run would write run.json.
            point_dir = sweep_dir / point.point_id
            point_dir.mkdir(parents=True, exist_ok=True)
            plan_of(point.spec, point.findings, got).write(point_dir, clean)
            if points.read_point(point_dir) is None:
                # `moe-vlm status` lists it as planned, not submitted; a point this sweep already
                # submitted keeps its record (the dry run names the same directory as the sweep).
                self.write_plan(point, point_dir)
            yield f"{header}\n{scrub_text(render(point.spec, point.findings, gathered=got))}\n"
        valid = [(number, p) for number, p in enumerate(dry, start=1) if p.valid]
        overrides = [self.job_overrides(p, sweep_dir) for _, p in valid]
        jobs = getattr(self.launcher, "render_jobs", None)
        if valid and jobs is not None:
            for section in jobs(overrides, [f"point {number} (id {p.point_id})" for number, p in valid]):
                yield scrub_text(section) + "\n"
        canaries = getattr(self.launcher, "render_canaries", None)
        canary = scrub_text(canaries(overrides)) if valid and canaries is not None else ""
        if canary:
            yield f"===== canary: runs first; the jobs above depend on it =====\n{canary}\n"

    def print_compact_dry_run(self, dry: list[Point], sweep_dir: Path) -> None:
        """One line per point and a summary; every plan and sbatch script in one file (one file,
        not one per point: on a parallel file system each file created costs a metadata round trip)."""
        memory = [memory_of(point.spec, point.findings) for point in dry]
        predicted = [prediction_of(point.spec, point.findings) for point in dry]
        lines = [f"{'#':>5}  {'point id':<16}  {POINT_LINE_HEADER}  overrides"]
        codes: dict[str, int] = {}
        numbered = list(enumerate(zip(dry, memory, predicted, strict=True), start=1))
        # Ranked: valid points by predicted effective tokens/s/GPU (best first), then the rest.
        numbered.sort(key=lambda item: (not item[1][0].valid, -_predicted_rate(item[1][2])))
        for number, (point, found, speed) in numbered:
            for code in {f.code for f in errors(point.findings)}:
                codes[code] = codes.get(code, 0) + 1
            line = point_line(point.spec, point.findings, found, speed)
            lines.append(f"{number:>5}  {point.point_id:<16}  {line}  {point.label()}")
        sweep_dir.mkdir(parents=True, exist_ok=True)
        with (sweep_dir / PLANS_FILE).open("w") as out:
            out.writelines(
                f"{section}\n"
                for section in self.plans(dry, sweep_dir, deep=False, memory=memory, predicted=predicted)
            )
        rejected = sum(not p.valid for p in dry)
        why = ", ".join(
            f"{code} x{count}" for code, count in sorted(codes.items(), key=lambda kv: (-kv[1], kv[0]))
        )
        scripts = " and every job's sbatch script" if getattr(self.launcher, "render_jobs", None) else ""
        summary = [
            f"moe_vlm: dry run: {len(dry)} point(s), {len(dry) - rejected} valid, {rejected} would be rejected"
            + (f" ({why})" if why else "")
            + f"{unshaped_note(dry, self.uses_canary)}; nothing was submitted.",
            f"moe_vlm: every point's plan{scripts}: {sweep_dir / PLANS_FILE} (dry_run=full prints them); "
            f"this table: {sweep_dir / DRY_RUN_FILE}",
            dry_run_where(sweep_dir),
        ]
        (sweep_dir / DRY_RUN_FILE).write_text("\n".join(lines + summary) + "\n")
        print("\n".join(lines + summary))
