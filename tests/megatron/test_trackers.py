"""A Bridge tracker that cannot open costs the run nothing (issue 33): Bridge's own GlobalState
property opens the real TensorBoard SummaryWriter, which fails because its directory's name is
taken by a file; guarded, the failure is recorded with its reason and the property says "no
tracker", as Bridge's training loop reads it (train_utils.py:865-880: `if writer:`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from moe_vlm.engines.megatron import trackers
from tests.megatron.conftest import RecipeCache, needs_stack
from tests.megatron.test_config_container import BASE, built


@needs_stack
def test_a_tracker_that_cannot_open_is_recorded_not_fatal(
    recipes: RecipeCache, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from megatron.bridge.training.state import GlobalState

    for name in trackers.PROPERTIES:  # the class is restored after the test
        monkeypatch.setattr(GlobalState, name, getattr(GlobalState, name))
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


def test_no_failure_no_section(tmp_path: Path) -> None:
    assert trackers.failure(tmp_path) is None
