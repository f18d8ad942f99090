"""The profiling and experiment-logging rows of THE table: bridge_fields.FIELD_MAP splices ROWS in.

Bridge's ProfilingConfig and LoggerConfig (megatron/bridge/training/config.py:632-764, with
Megatron's training/config fields they extend), as (knob, dotted field, value, why). The window
and ranks are moe_vlm/record/profiling.py's, the run name moe_vlm/record/explog.py's (the torch engine logs the
same). Tracker fields stay None unless that tracker is on: Bridge starts a tracker (and its
LoggerConfig.finalize imports mlflow) whenever one of its fields is set (config.py:686-708). Keys
come from the environment (WANDB_API_KEY, MLFLOW_TRACKING_*), never from here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from moe_vlm.config.schema import ExperimentLogger, Profiler
from moe_vlm.knobs.keep import KEEP
from moe_vlm.record import explog, profiling

if TYPE_CHECKING:
    from moe_vlm.config.spec import RunSpec

Value = Callable[["RunSpec"], Any]

# Stands for this run's directory in a value: the plan prints it, the engine replaces it before
# Bridge runs (engines/megatron/config.place_in_run_dir); effective.py writes paths back with it.
RUN_DIR = "<run_dir>"


def in_run_dir(name: str) -> str:
    return f"{RUN_DIR}/{name}"


def tensorboard_dir(spec: RunSpec) -> str | None:
    # Bridge writes the PyTorch profiler's trace to <tensorboard_dir>/../torch_profile
    # (training/profiling.py:135-138), so profiling=torch needs the directory too.
    on = spec.logger.backend is ExperimentLogger.tensorboard or spec.profiling.tool is Profiler.torch
    return in_run_dir(profiling.TENSORBOARD_DIR) if on else None


def _keep() -> Any:
    return KEEP


def _tool_is(tool: Profiler) -> Value:
    return lambda s: s.profiling.tool is tool


def _while_profiling(value: Value) -> Value:
    return lambda s: _keep() if s.profiling.tool is Profiler.none else value(s)


def _snapshot_path(spec: RunSpec) -> Any:
    return in_run_dir(profiling.MEMORY_SNAPSHOT) if spec.profiling.tool is Profiler.memory else _keep()


def _logging_to(backend: ExperimentLogger, value: Value) -> Value:
    return lambda s: value(s) if s.logger.backend is backend else None


_WANDB, _MLFLOW = ExperimentLogger.wandb, ExperimentLogger.mlflow
_WINDOW = "Bridge counts completed steps (profiling.bridge_window): records steps first..last"

ROWS: tuple[tuple[str, str, Value, str], ...] = (
    (
        "logger",
        "logger.tensorboard_dir",
        tensorboard_dir,
        "logger=tensorboard, and profiling=torch: Bridge writes the trace to its ../torch_profile",
    ),
    *(
        ("logger", f"logger.{name}", lambda s: s.logger.backend is not ExperimentLogger.none, "")
        for name in ("log_timers_to_tensorboard", "log_memory_to_tensorboard")
    ),
    ("logger.project", "logger.wandb_project", _logging_to(_WANDB, lambda s: s.logger.project), ""),
    ("logger.run_name", "logger.wandb_exp_name", _logging_to(_WANDB, explog.run_name), ""),
    ("logger.entity", "logger.wandb_entity", _logging_to(_WANDB, lambda s: s.logger.entity), ""),
    (
        "logger",
        "logger.wandb_save_dir",
        _logging_to(_WANDB, lambda s: RUN_DIR),
        "wandb writes <run_dir>/wandb",
    ),
    ("logger.project", "logger.mlflow_experiment", _logging_to(_MLFLOW, lambda s: s.logger.project), ""),
    (
        "logger.run_name",
        "logger.mlflow_run_name",
        _logging_to(_MLFLOW, explog.run_name),
        "Bridge requires one with an experiment (training/config.py:686-687)",
    ),
    (
        "logger.tracking_uri",
        "logger.mlflow_tracking_uri",
        _logging_to(_MLFLOW, lambda s: s.logger.tracking_uri),
        "None: MLFLOW_TRACKING_URI, else ./mlruns",
    ),
    ("profiling", "profiling.use_nsys_profiler", _tool_is(Profiler.nsys), ""),
    ("profiling", "profiling.use_pytorch_profiler", _tool_is(Profiler.torch), ""),
    ("profiling", "profiling.record_memory_history", _tool_is(Profiler.memory), ""),
    ("profiling", "profiling.nvtx_ranges", _tool_is(Profiler.nsys), "MCore's NVTX ranges in the timeline"),
    (
        "profiling",
        "profiling.pytorch_profiler_collect_callstack",
        _tool_is(Profiler.torch),
        "call stacks name the modules: the per-module table",
    ),
    (
        "profiling.steps",
        "profiling.profile_step_start",
        _while_profiling(lambda s: profiling.bridge_window(s)[0]),
        _WINDOW,
    ),
    (
        "profiling.steps",
        "profiling.profile_step_end",
        _while_profiling(lambda s: profiling.bridge_window(s)[1]),
        _WINDOW,
    ),
    (
        "profiling.ranks",
        "profiling.profile_ranks",
        _while_profiling(profiling.ranks),
        "[] = every rank, listed: Bridge's memory recording reads [] as none (train_utils.py:208)",
    ),
    ("profiling", "profiling.memory_snapshot_path", _snapshot_path, "in the run dir, not Bridge's /nemo_run"),
)
