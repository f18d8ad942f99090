"""Experiment logging on the torch engine: TensorBoard, Weights & Biases or MLflow, from rank 0.

Rank 0 gathers every rank's step record (moe_vlm/engines/torch_engine.py); the logger turns each
step into one point per metric (``step_metrics``) and, at the end, the steady-window summary.
The Megatron engine logs through Bridge's own LoggerConfig (moe_vlm/knobs/bridge_fields.py)
with the same run name and the same TensorBoard directory inside the run directory.

Keys come from the environment (WANDB_API_KEY, MLFLOW_TRACKING_USERNAME / _PASSWORD / _TOKEN),
read by the trackers themselves: nothing here reads them, and the configuration each tracker
stores is scrubbed of every secret value first (moe_vlm/base/safety.py).

A tracker never costs a run (`Tracker`): the first exception it raises, opening, logging a step
or closing, is printed once, recorded in run.json's `tracker` section with its reason, and the
run goes on without it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moe_vlm.base.safety import scrub, scrub_text
from moe_vlm.config.schema import ExperimentLogger
from moe_vlm.record.profiling import TENSORBOARD_DIR

if TYPE_CHECKING:
    from moe_vlm.config.spec import RunSpec
    from moe_vlm.record.records import StepRecord

# The module each backend imports, and the pip distribution that provides it.
PACKAGES: dict[ExperimentLogger, tuple[str, str]] = {
    ExperimentLogger.tensorboard: ("tensorboard", "tensorboard"),
    ExperimentLogger.wandb: ("wandb", "wandb"),
    ExperimentLogger.mlflow: ("mlflow", "mlflow"),
}
MLFLOW_PARAM_CHARS = 500  # MLflow rejects longer parameter values
TRACKER_SECTION = "tracker"  # run.json's section: the backend, whether it logged, and why not
REASON_CHARS = 500  # of the tracker's exception text kept in run.json


def run_name(spec: RunSpec) -> str:
    """logger.run_name, or what distinguishes the run: model, cluster, layout, dispatcher, MBS."""
    if spec.logger.run_name:
        return spec.logger.run_name
    lay = spec.layout
    return (
        f"{spec.model.name}-{spec.cluster.name}-{spec.family.value}-{spec.dispatcher.name}-"
        f"{lay.nodes}x{lay.ranks_per_node}-mbs{spec.mbs}"
    )


def missing_package(backend: ExperimentLogger) -> str | None:
    """The pip distribution a backend needs when its module does not import here (None: it does)."""
    if backend not in PACKAGES:
        return None
    module, distribution = PACKAGES[backend]
    return None if importlib.util.find_spec(module) is not None else distribution


def local_store(tracking_uri: str | None) -> Path | None:
    """The directory an MLflow URI stores runs in when it is a local path (`file:` or no scheme),
    or None (a tracking server, a database, the default from the environment)."""
    if not tracking_uri:
        return None
    scheme, sep, rest = tracking_uri.partition(":")
    if not sep or len(scheme) == 1:  # no scheme (a Windows drive letter reads as one)
        return Path(tracking_uri).expanduser()
    if scheme.lower() == "file":
        return Path(rest.removeprefix("//").split("?", 1)[0] or "/")
    return None


def unwritable_store(store: Path) -> str | None:
    """Why a local store cannot be created or written here (None: it can): checked on its nearest
    existing ancestor, since MLflow creates the rest."""
    existing = store.absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is not a directory"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{existing} is not writable"
    return None


@dataclass(frozen=True)
class MlflowStore:
    """What the installed MLflow makes of a tracking URI, asked of MLflow itself (`mlflow_store`)."""

    version: str
    uri: str  # as the run will resolve it (the knob, else MLFLOW_TRACKING_URI, else MLflow's default), scrubbed
    schemes: tuple[str, ...]  # every scheme its tracking-store registry knows
    known: bool  # the URI's scheme is one of them
    file_store_refused: bool  # a FileStore, which this version refuses without MLFLOW_ALLOW_FILE_STORE=true


@cache
def _mlflow_tracking() -> Any:
    # Lazy: `import mlflow` takes seconds (pandas, FastAPI); only a plan with logger=mlflow pays it.
    import mlflow.tracking._tracking_service.utils as tracking

    return tracking


def mlflow_import_error() -> str | None:
    """Why `import mlflow` fails here (None: it imports; also None when it is not installed, which
    `missing_package` says)."""
    if importlib.util.find_spec("mlflow") is None:
        return None
    try:
        _mlflow_tracking()
    except Exception as exc:  # a broken install raises anything, not only ImportError
        return " ".join(f"{type(exc).__name__}: {exc}".split())[:REASON_CHARS]
    return None


def mlflow_store(tracking_uri: str | None) -> MlflowStore | None:
    """The installed MLflow's verdict on a tracking URI (None: MLflow does not import here).

    The scheme is looked up in MLflow's own tracking-store registry
    (mlflow/tracking/_tracking_service/utils.py:236-256: file and no scheme, databricks, http(s),
    the SQL engines only where SQLAlchemy imports, and plug-ins' entry points) through its
    get_store_builder (mlflow/tracking/registry.py:62-86), which builds nothing. A FileStore is
    refused on construction unless MLFLOW_ALLOW_FILE_STORE is true (mlflow/store/tracking/
    file_store.py:253-264, MLflow 3.x); a version without that variable does not refuse.
    """
    if importlib.util.find_spec("mlflow") is None or mlflow_import_error() is not None:
        return None
    tracking = _mlflow_tracking()
    from mlflow import environment_variables as env

    # MLflow's resolution order (utils.py:162-174) without its process-wide set_tracking_uri
    # value, which a plan never sets and the run's own process starts without.
    uri = tracking_uri or env.MLFLOW_TRACKING_URI.get() or tracking._get_default_tracking_uri()
    allow = getattr(env, "MLFLOW_ALLOW_FILE_STORE", None)
    # Rules T008 and T009 both ask, for every point: one registry lookup per URI and setting.
    return _mlflow_store(uri, allow.get() if allow is not None else None)


@cache
def _mlflow_store(uri: str, allow_file_store: bool | None) -> MlflowStore:
    tracking = _mlflow_tracking()
    from mlflow.exceptions import MlflowException
    from mlflow.version import VERSION

    registry = tracking._tracking_store_registry
    try:
        builder = registry.get_store_builder(uri)
    except MlflowException:  # UnsupportedModelRegistryStoreURIException, or a malformed database URI
        builder = None
    return MlflowStore(
        version=VERSION,
        uri=scrub_text(uri),
        schemes=tuple(sorted(registry._registry)),
        known=builder is not None,
        file_store_refused=builder is tracking._get_file_store and allow_file_store is False,
    )


def step_metrics(records: list[StepRecord]) -> dict[str, float]:
    """One step's points from every rank's record: what the console line shows, by name."""
    first = records[0]
    step_time = max(r.step_time_s for r in records)
    metrics = {
        "train/loss": sum(r.loss or 0.0 for r in records) / len(records),
        "perf/step_time_s": step_time,
        "perf/real_tokens_per_s_per_gpu": sum(r.real_tokens for r in records) / step_time / len(records),
        "perf/data_wait_s": max(r.data_wait_s or 0.0 for r in records),
        "memory/peak_gib": max(r.peak_memory_gib or 0.0 for r in records),
    }
    periods = [r.step_period_s for r in records if r.step_period_s is not None]
    if periods:  # to the next step's start (moe_vlm.record.records.StepRecord); none on the last step
        metrics["perf/step_period_s"] = max(periods)
    if first.grad_norm is not None:
        metrics["train/grad_norm"] = first.grad_norm
    if first.lr is not None:
        metrics["train/lr"] = first.lr
    for name, seconds in (first.components_s or {}).items():
        metrics[f"components/{name}_s"] = seconds
    return metrics


def summary_metrics(summary: dict[str, Any]) -> dict[str, float]:
    picked = {
        "summary/effective_tokens_per_s_per_gpu": summary.get("effective_tokens_per_s_per_gpu"),
        "summary/tflops_per_gpu": summary.get("tflops_per_gpu"),
        "summary/mfu": summary.get("mfu"),
        "summary/step_time_p50_s": (summary.get("step_time_s") or {}).get("p50"),
    }
    return {k: float(v) for k, v in picked.items() if isinstance(v, int | float)}


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts as one level of dotted keys (the console summary and the tracker's hparams)."""
    if isinstance(value, dict):
        flat: dict[str, Any] = {}
        for key, item in value.items():
            flat.update(flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return flat
    return {prefix: value}


class ExperimentLog:
    """One tracker; `log` per step, `close` once with the run's status."""

    def log(self, step: int, metrics: dict[str, float]) -> None:
        raise NotImplementedError

    def close(self, status: str) -> None:
        raise NotImplementedError


class TensorBoardLog(ExperimentLog):
    def __init__(self, run_dir: Path, config: dict[str, Any]) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.directory = run_dir / TENSORBOARD_DIR
        self.writer = SummaryWriter(log_dir=str(self.directory))
        self.writer.add_text("config", "```\n" + json.dumps(config, indent=1, default=str) + "\n```")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for name, value in metrics.items():
            self.writer.add_scalar(name, value, step)
        self.writer.flush()

    def close(self, status: str) -> None:
        self.writer.add_text("status", status)
        self.writer.close()


class WandbLog(ExperimentLog):
    def __init__(self, spec: RunSpec, run_dir: Path, config: dict[str, Any]) -> None:
        import wandb

        self.wandb = wandb
        self.run = wandb.init(
            project=spec.logger.project,
            entity=spec.logger.entity,
            name=run_name(spec),
            dir=str(run_dir),  # wandb writes its files under <run_dir>/wandb
            config=config,
        )

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(metrics, step=step)

    def close(self, status: str) -> None:
        self.run.finish(exit_code=0 if status == "completed" else 1)


class MlflowLog(ExperimentLog):
    def __init__(self, spec: RunSpec, config: dict[str, Any]) -> None:
        import mlflow

        self.mlflow = mlflow
        if spec.logger.tracking_uri:
            mlflow.set_tracking_uri(spec.logger.tracking_uri)
        mlflow.set_experiment(spec.logger.project)
        mlflow.start_run(run_name=run_name(spec))
        mlflow.log_params({k: str(v)[:MLFLOW_PARAM_CHARS] for k, v in flatten(config).items()})

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.mlflow.log_metrics(metrics, step=step)

    def close(self, status: str) -> None:
        self.mlflow.end_run(status="FINISHED" if status == "completed" else "FAILED")


def open_log(spec: RunSpec, config: dict[str, Any], run_dir: Path) -> ExperimentLog | None:
    """The run's tracker (None for logger=none), given the configuration with secrets masked."""
    clean = scrub({"config": config, "run_name": run_name(spec)})
    backend = spec.logger.backend
    if backend is ExperimentLogger.tensorboard:
        return TensorBoardLog(run_dir, clean)
    if backend is ExperimentLogger.wandb:
        return WandbLog(spec, run_dir, clean)
    if backend is ExperimentLogger.mlflow:
        return MlflowLog(spec, clean)
    return None


class Tracker:
    """The run's tracker, guarded: a tracker exception is its failure, recorded, never the run's.

    The first one (MLflow refusing a file store, a scheme the installed version lacks, a full
    disk under TensorBoard's directory) drops the tracker for the rest of the run: a tracker that
    failed once would fail or block at every step after it.
    """

    def __init__(self, spec: RunSpec, config: dict[str, Any], run_dir: Path) -> None:
        self.backend = spec.logger.backend
        self.failure: dict[str, str] | None = None
        self.log_: ExperimentLog | None = self._guarded("open", lambda: open_log(spec, config, run_dir))

    def _guarded(self, where: str, call: Callable[[], Any]) -> Any:
        try:
            return call()
        except Exception as exc:  # any tracker error: the run must not die of it
            reason = scrub_text(" ".join(f"{type(exc).__name__}: {exc}".split()))[:REASON_CHARS]
            self.failure = {"at": where, "reason": reason}
            self.log_ = None
            print(
                f"moe_vlm: warning: logger={self.backend.value} failed at {where} ({reason}); "
                f"training goes on without it (run.json {TRACKER_SECTION})",
                file=sys.stderr,
                flush=True,
            )
            return None

    def log(self, step: int, metrics: dict[str, float]) -> None:
        log = self.log_
        if log is not None:
            self._guarded(f"step {step}", lambda: log.log(step, metrics))

    def close(self, status: str) -> None:
        log, self.log_ = self.log_, None
        if log is not None:
            self._guarded("close", lambda: log.close(status))

    def section(self) -> dict[str, Any] | None:
        """run.json's tracker section (None for logger=none): logged, or failed with where and why."""
        if self.backend is ExperimentLogger.none:
            return None
        if self.failure is None:
            return {"backend": self.backend.value, "status": "logged"}
        return {"backend": self.backend.value, "status": "failed", **self.failure}
