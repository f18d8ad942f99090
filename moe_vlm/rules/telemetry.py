"""Profiling and experiment-logging rules (T...): the window, the ranks, what needs a GPU, trackers.

The window and the steps a profiler slows are moe_vlm/record/profiling.py's; the trackers' packages are
moe_vlm/record/explog.py's.
"""

from __future__ import annotations

from collections.abc import Iterator

from moe_vlm.config.schema import Engine, ExperimentLogger, Profiler
from moe_vlm.config.spec import RunSpec
from moe_vlm.record import explog, profiling
from moe_vlm.rules.catalogue import Level, Violation, rule


def _window_ok(spec: RunSpec) -> bool:
    steps = spec.profiling.steps
    if len(steps) > 2:
        return False
    first, last = profiling.window(spec)
    return spec.warmup_steps < first <= last <= spec.train_iters


@rule("T001", Level.error, "profiled steps follow warm-up and fit in train_iters")
def _window(spec: RunSpec) -> Iterator[Violation]:
    if not profiling.active(spec) or _window_ok(spec):
        return
    yield Violation(
        ("profiling.steps", "warmup_steps", "train_iters"),
        f"profiling.steps={list(spec.profiling.steps)} must be [first, last] or [step] with "
        f"warmup_steps ({spec.warmup_steps}) < first <= last <= train_iters ({spec.train_iters}): "
        "warm-up steps measure start-up, not the steady state.",
        f"set profiling.steps=[{spec.warmup_steps + 1}] (the first step after warm-up; [] says the same), "
        "or raise train_iters.",
    )


@rule("T002", Level.error, "profiled ranks exist")
def _ranks(spec: RunSpec) -> Iterator[Violation]:
    world = spec.layout.world_size
    outside = [r for r in spec.profiling.ranks if not 0 <= r < world]
    if profiling.active(spec) and outside:
        yield Violation(
            ("profiling.ranks", "nodes", "nproc"),
            f"profiling.ranks {outside} are outside the job's {world} rank(s) (0-{world - 1}).",
            f"use ranks below {world}, e.g. profiling.ranks=[0], or [] for every rank.",
        )


@rule("T003", Level.error, "nsys and memory profiling record CUDA activity")
def _needs_gpu(spec: RunSpec) -> Iterator[Violation]:
    tool = spec.profiling.tool
    if tool in (Profiler.nsys, Profiler.memory) and not spec.cluster.is_gpu_cluster:
        what = (
            "nsys's capture range opens on the CUDA profiler API"
            if tool is Profiler.nsys
            else "the allocator history is the CUDA caching allocator's"
        )
        yield Violation(
            ("profiling", "cluster"),
            f"profiling={tool.value}: {what}, and cluster={spec.cluster.name} has no GPU, so the run "
            "would record nothing.",
            "use profiling=torch (CPU operators too), or a GPU cluster profile (cluster=gb200|b200|h100|...).",
        )


@rule("T004", Level.error, "Bridge saves a PyTorch trace when the step after the window starts (MB)")
def _bridge_torch_tail(spec: RunSpec) -> Iterator[Violation]:
    # Bridge stops and exports the torch profiler at profile_step_end = last + 1 (training/train.py:
    # 718-724, training/profiling.py:101-107), a step that must run.
    _, last = profiling.window(spec)
    torch_on_megatron = spec.profiling.tool is Profiler.torch and spec.engine is Engine.megatron
    if torch_on_megatron and _window_ok(spec) and last >= spec.train_iters:
        yield Violation(
            ("profiling.steps", "train_iters"),
            f"profiling=torch on engine=megatron: Bridge writes the trace when step {last + 1} starts, "
            f"and train_iters={spec.train_iters} ends before it.",
            f"raise train_iters to {last + 1} or more, or end the window earlier.",
        )


@rule("T005", Level.error, "the profiler leaves steady steps to measure")
def _steady_left(spec: RunSpec) -> Iterator[Violation]:
    if not profiling.active(spec) or not _window_ok(spec) or spec.warmup_steps >= spec.train_iters:
        return  # T001 and C003 report those
    excluded = set(profiling.excluded_steps(spec))
    if all(step in excluded for step in range(spec.warmup_steps + 1, spec.train_iters + 1)):
        yield Violation(
            ("profiling.steps", "train_iters"),
            f"profiling={spec.profiling.tool.value} slows steps {profiling.step_ranges(sorted(excluded))}; with warmup_steps={spec.warmup_steps} and train_iters={spec.train_iters} no steady step is "
            "left to measure.",
            f"raise train_iters to {max(excluded) + 1} or more.",
        )


@rule("T006", Level.error, "the torch engine's tracker is installed")
def _tracker_installed(spec: RunSpec) -> Iterator[Violation]:
    # On engine=megatron the stack probe imports Bridge's tracker module (engines/megatron/stack.py
    # MLFLOW, WANDB), in the plan and on every node before distributed init.
    backend = spec.logger.backend
    if spec.engine is not Engine.torch:
        return
    missing = explog.missing_package(backend)
    if missing:
        yield Violation(
            ("logger",),
            f"logger={backend.value}: the {missing} package does not import in this environment, so "
            "the torch engine could not log to it.",
            f"pip install {missing}, or logger=tensorboard|none.",
        )
    broken = explog.mlflow_import_error() if backend is ExperimentLogger.mlflow else None
    if broken:
        yield Violation(
            ("logger",),
            f"logger=mlflow: `import mlflow` fails in this environment ({broken}), so the torch engine "
            "could not log to it.",
            "reinstall it (pip install --force-reinstall mlflow-skinny), or logger=tensorboard|none.",
        )


@rule("T007", Level.error, "MLflow's local store can be written")
def _tracker_store(spec: RunSpec) -> Iterator[Violation]:
    # Checked where the plan runs, which for a single run is where it writes; a sweep's jobs write
    # on their own nodes, where a shared path usually looks the same.
    store = (
        explog.local_store(spec.logger.tracking_uri)
        if spec.logger.backend is ExperimentLogger.mlflow
        else None
    )
    why = explog.unwritable_store(store) if store is not None else None
    if why:
        yield Violation(
            ("logger.tracking_uri",),
            f"logger.tracking_uri={spec.logger.tracking_uri}: MLflow's local store {store} cannot be created "
            f"({why}), so the tracker would fail on opening.",
            "point it at a directory you can write (file:///lustre/<you>/mlruns) or an http(s) tracking server.",
        )


def _mlflow_store(spec: RunSpec) -> explog.MlflowStore | None:
    # Imported only for logger=mlflow (seconds); None where MLflow does not import (T006 or the
    # Megatron engine's stack probe says so).
    if spec.logger.backend is not ExperimentLogger.mlflow:
        return None
    return explog.mlflow_store(spec.logger.tracking_uri)


@rule("T008", Level.error, "the installed MLflow knows the tracking URI's scheme")
def _tracker_scheme(spec: RunSpec) -> Iterator[Violation]:
    # Asked of MLflow's own tracking-store registry (record/explog.mlflow_store): an unknown scheme
    # raises on the first call the run makes (mlflow/tracking/registry.py:80-86), the SQL ones
    # included where SQLAlchemy is absent (mlflow-skinny; mlflow/tracking/_tracking_service/
    # utils.py:251-253), which is MLflow 3's default store, sqlite:///mlflow.db.
    store = _mlflow_store(spec)
    if store is None or store.known:
        return
    given = "" if spec.logger.tracking_uri else " (logger.tracking_uri=null: MLflow's default)"
    yield Violation(
        ("logger.tracking_uri",),
        f"logger.tracking_uri resolves to {store.uri}{given}, whose scheme the installed MLflow "
        f"{store.version} does not know (its tracking stores: "
        f"{', '.join(repr(s) for s in store.schemes)}), so the tracker would fail on opening.",
        "set logger.tracking_uri=http(s)://<your tracking server> (or file:///<dir>/mlruns with "
        "MLFLOW_ALLOW_FILE_STORE=true), or pip install mlflow (the full package brings SQLAlchemy for "
        "sqlite:// and the other databases).",
    )


@rule("T009", Level.error, "the installed MLflow opens a local file store")
def _tracker_file_store(spec: RunSpec) -> Iterator[Violation]:
    # MLflow 3.x refuses its FileStore on construction unless MLFLOW_ALLOW_FILE_STORE is true
    # (mlflow/store/tracking/file_store.py:253-264; the variable: mlflow/environment_variables.py:2040).
    # Read where the plan runs: a sweep's job inherits the submitting shell's environment.
    store = _mlflow_store(spec)
    if store is None or not store.file_store_refused:
        return
    yield Violation(
        ("logger.tracking_uri",),
        f"logger.tracking_uri resolves to the local file store {store.uri}, which the installed MLflow "
        f"{store.version} refuses unless MLFLOW_ALLOW_FILE_STORE=true, so the tracker would fail on opening.",
        "export MLFLOW_ALLOW_FILE_STORE=true, or use a database store (logger.tracking_uri=sqlite:///"
        "<dir>/mlflow.db, with the full mlflow package) or an http(s) tracking server.",
    )
