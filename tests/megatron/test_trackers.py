"""A Bridge tracker that cannot open, or fails later, costs the run nothing (issue 33): Bridge's own
GlobalState property opens the real TensorBoard SummaryWriter, which fails because its directory's
name is taken by a file, or the real MLflow run, whose store then disappears; guarded, the failure
is recorded with its reason and the property says "no tracker", as Bridge's training loop reads it
(train_utils.py:865-880: `if writer:`)."""

from __future__ import annotations

import contextlib
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from moe_vlm.engines.megatron import trackers
from tests.megatron.conftest import RecipeCache, needs_stack
from tests.megatron.test_config_container import BASE, built


@pytest.fixture
def global_state(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Bridge's GlobalState class, its tracker properties restored after the test (guard swaps them)."""
    from megatron.bridge.training.state import GlobalState

    for name in trackers.PROPERTIES:
        monkeypatch.setattr(GlobalState, name, getattr(GlobalState, name))
    return GlobalState


@needs_stack
def test_a_tracker_that_cannot_open_is_recorded_not_fatal(
    recipes: RecipeCache, tmp_path: Path, global_state: Any
) -> None:
    GlobalState = global_state
    _, cfg = built(recipes, *BASE, "logger=tensorboard")
    taken = tmp_path / "tensorboard"
    taken.write_text("not a directory")
    cfg.logger.tensorboard_dir = str(taken)

    bare = GlobalState()
    bare._cfg = cfg  # the cfg setter would install Bridge's signal handler in the test process
    with pytest.raises(FileExistsError):  # unguarded, Bridge's property raises: the run died of it
        _ = bare.tensorboard_logger

    trackers.guard(GlobalState, tmp_path, "tensorboard")
    state = GlobalState()
    state._cfg = cfg
    assert state.tensorboard_logger is None and state.tensorboard_logger is None  # asked again: no retry
    recorded = trackers.failure(tmp_path)
    assert recorded is not None and recorded["status"] == "failed" and recorded["backend"] == "tensorboard"
    assert recorded["reason"].startswith("FileExistsError")
    assert json.loads((tmp_path / trackers.TRACKER_FILE).read_text()) == recorded


@needs_stack
def test_a_tracker_that_fails_after_opening_is_recorded_not_fatal(
    recipes: RecipeCache, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, global_state: Any
) -> None:
    import mlflow
    from mlflow.tracking import MlflowClient
    from mlflow.tracking._tracking_service import utils as tracking

    GlobalState = global_state
    # Bridge's property sets MLflow's process-wide URI (and MLFLOW_TRACKING_URI) and chains a
    # sys.excepthook: all three are restored after the test.
    monkeypatch.setattr(tracking, "_tracking_uri", None)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "")
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # T009: the plan asks for it
    store = tmp_path / "mlruns"
    uri = f"file://{store}"
    _, cfg = built(recipes, *BASE, "logger=mlflow", f"logger.tracking_uri={uri}")
    assert cfg.logger.mlflow_tracking_uri == uri and cfg.logger.mlflow_experiment

    trackers.guard(GlobalState, tmp_path, "mlflow")
    state = GlobalState()
    state._cfg = cfg  # the cfg setter would install Bridge's signal handler in the test process
    try:
        logger = state.mlflow_logger  # Bridge opens the run and logs the config as params
        assert logger and isinstance(logger, type(mlflow)) and logger == mlflow
        run = mlflow.active_run()
        assert run is not None
        assert logger.log_metrics({"lm loss": 2.5}, step=1) is None
        client = MlflowClient(uri)
        assert [m.value for m in client.get_metric_history(run.info.run_id, "lm loss")] == [2.5]
        assert len(client.get_run(run.info.run_id).data.params) > 100  # Bridge's flattened config

        shutil.rmtree(store)  # the store goes away under the open run
        with pytest.raises(Exception, match="does not exist"):  # unguarded, MLflow's call raises
            mlflow.log_metrics({"lm loss": 2.4}, step=2)
        assert logger.log_metrics({"lm loss": 2.4}, step=2) is None  # guarded: recorded, not raised
        recorded = trackers.failure(tmp_path)
        assert recorded is not None
        assert (recorded["backend"], recorded["status"], recorded["at"]) == (
            "mlflow",
            "failed",
            "log_metrics (mlflow_logger)",
        )
        assert "does not exist" in recorded["reason"]
        # Dropped: the property says "no tracker", and the wrapper Bridge already holds
        # (train_utils.py:630-666) is falsy and does nothing, without a second record.
        assert state.mlflow_logger is None
        (tmp_path / trackers.TRACKER_FILE).unlink()
        assert not logger and logger.log_metrics({"lm loss": 2.3}, step=3) is None
        assert trackers.failure(tmp_path) is None
    finally:
        with contextlib.suppress(Exception):  # its store is gone; the active run is cleared anyway
            mlflow.end_run()


@needs_stack
def test_an_opened_writer_still_reads_as_a_summary_writer(
    recipes: RecipeCache, tmp_path: Path, global_state: Any
) -> None:
    # Megatron Core's timers write only to an isinstance(writer, SummaryWriter) (core/timers.py:482).
    from torch.utils.tensorboard.writer import SummaryWriter

    GlobalState = global_state
    _, cfg = built(recipes, *BASE, "logger=tensorboard")
    cfg.logger.tensorboard_dir = str(tmp_path / "tensorboard")
    trackers.guard(GlobalState, tmp_path, "tensorboard")
    state = GlobalState()
    state._cfg = cfg
    writer = state.tensorboard_logger
    assert isinstance(writer, SummaryWriter) and writer is state.tensorboard_logger
    writer.add_scalar("lm loss", 2.5, 1)
    writer.close()
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert trackers.failure(tmp_path) is None


def test_no_failure_no_section(tmp_path: Path) -> None:
    assert trackers.failure(tmp_path) is None
