"""logger=none|tensorboard|wandb|mlflow: the torch engine's tracker, Bridge's fields, and keys that
never reach a record."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from moe_vlm.base.errors import BadInput
from moe_vlm.base.files import RUN_JSON, STEPS_JSONL
from moe_vlm.base.safety import SECRET_NAME
from moe_vlm.config.preflight import preflight
from moe_vlm.config.schema import ExperimentLogger
from moe_vlm.knobs.bridge_fields import KEEP, bridge_overrides
from moe_vlm.knobs.telemetry_fields import RUN_DIR
from moe_vlm.record import explog
from tests.conftest import REPO, make_spec

MEG = ("engine=megatron", "dry_run=true", "cluster=gb200", "model=qwen3_vl_30b_a3b")
SECRET = "sk-moevlm-test-5f1c9a77d2"  # what a WANDB_API_KEY looks like to the scrubber


def fields(*overrides: str) -> dict[str, object]:
    return {o.field: o.value for o in bridge_overrides(make_spec(*MEG, *overrides))}


# --- Bridge's LoggerConfig on the Megatron engine --------------------------------------------


def test_logger_none_starts_no_tracker() -> None:
    got = fields()
    assert got["logger.tensorboard_dir"] is None
    tracker_fields = ("wandb_project", "wandb_exp_name", "mlflow_experiment", "mlflow_run_name")
    assert all(got[f"logger.{name}"] is None for name in tracker_fields)


def test_tensorboard_lives_in_the_run_directory() -> None:
    assert fields("logger=tensorboard")["logger.tensorboard_dir"] == f"{RUN_DIR}/tensorboard"
    # Bridge writes the PyTorch trace beside it, so profiling=torch sets it too.
    assert fields("profiling=torch")["logger.tensorboard_dir"] == f"{RUN_DIR}/tensorboard"


def test_wandb_fields() -> None:
    got = fields("logger=wandb", "logger.project=vlm-perf", "logger.entity=team", "logger.run_name=a")
    assert (got["logger.wandb_project"], got["logger.wandb_entity"], got["logger.wandb_exp_name"]) == (
        "vlm-perf",
        "team",
        "a",
    )
    assert got["logger.wandb_save_dir"] == RUN_DIR and got["logger.mlflow_experiment"] is None


def test_mlflow_fields_and_a_derived_run_name() -> None:
    got = fields("logger=mlflow", "logger.tracking_uri=http://mlflow:5000")
    assert got["logger.mlflow_experiment"] == "moe_vlm"
    assert got["logger.mlflow_run_name"] == "qwen3_vl_30b_a3b-gb200-fsdp-hybridep-1x4-mbs1"
    assert got["logger.mlflow_tracking_uri"] == "http://mlflow:5000" and got["logger.wandb_project"] is None


def test_the_memory_snapshot_goes_to_the_run_directory_only_when_recorded() -> None:
    assert fields("profiling=memory")["profiling.memory_snapshot_path"] == f"{RUN_DIR}/memory_snapshot.pickle"
    assert fields()["profiling.memory_snapshot_path"] is KEEP


# --- keys --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["WANDB_API_KEY", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN", "COMET_API_KEY"]
)
def test_tracker_keys_are_secrets_to_the_scrubber(name: str) -> None:
    assert SECRET_NAME.search(name)


def test_credentials_in_the_tracking_uri_are_refused_before_hydra_starts() -> None:
    # tests/unit/test_secrets.py runs every entry; this is the tracker's own case.
    with pytest.raises(BadInput, match=r"logger\.tracking_uri: .*MLFLOW_TRACKING_PASSWORD") as bad:
        preflight([*MEG, "logger=mlflow", "logger.tracking_uri=https://me:hunter22@mlflow.example"])
    assert "hunter22" not in str(bad.value)


def test_a_tracker_that_does_not_import_is_named() -> None:
    # T006 reads this; tensorboard comes with Bridge's dependencies.
    assert explog.missing_package(ExperimentLogger.tensorboard) is None
    assert explog.missing_package(ExperimentLogger.none) is None


# --- a real run on the torch engine ----------------------------------------------------------


@pytest.fixture(scope="module")
def logged_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`train.py logger=tensorboard` on one CPU rank, with a key in the environment that the
    config even interpolates into a knob (the worst a user can do)."""
    run_dir = tmp_path_factory.mktemp("logged")
    done = subprocess.run(
        [
            sys.executable,
            "train.py",
            "logger=tensorboard",
            "logger.run_name=${oc.env:WANDB_API_KEY}",
            "nproc=1",
            "train_iters=3",
            f"hydra.run.dir={run_dir}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "WANDB_API_KEY": SECRET},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert SECRET not in done.stdout + done.stderr
    return run_dir


@pytest.mark.slow
def test_tensorboard_events_hold_each_step(logged_run: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = list((logged_run / "tensorboard").glob("events.out.tfevents.*"))
    assert events, "no event file under <run_dir>/tensorboard"
    accumulator = EventAccumulator(str(logged_run / "tensorboard"))
    accumulator.Reload()
    scalars = accumulator.Tags()["scalars"]
    for tag in ("train/loss", "perf/step_time_s", "perf/real_tokens_per_s_per_gpu", "memory/peak_gib"):
        assert [e.step for e in accumulator.Scalars(tag)] == [1, 2, 3], tag
    assert "components/vision_encoder_s" in scalars
    record = json.loads((logged_run / RUN_JSON).read_text())
    # The last summary point is run.json's number.
    (point,) = accumulator.Scalars("summary/effective_tokens_per_s_per_gpu")
    assert point.value == pytest.approx(record["summary"]["effective_tokens_per_s_per_gpu"], rel=1e-6)
    assert record[explog.TRACKER_SECTION] == {"backend": "tensorboard", "status": "logged"}


@pytest.mark.slow
def test_a_tracker_that_cannot_write_costs_the_run_nothing(tmp_path: Path) -> None:
    # A real failure of the real tracker: its directory's name is taken by a file, so TensorBoard's
    # SummaryWriter raises FileExistsError on opening. It killed the run; now it is recorded.
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "tensorboard").write_text("not a directory")
    done = subprocess.run(
        [
            sys.executable,
            "train.py",
            "logger=tensorboard",
            "nproc=1",
            "train_iters=3",
            f"hydra.run.dir={run_dir}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads((run_dir / RUN_JSON).read_text())
    assert record["status"] == "completed"
    tracker = record[explog.TRACKER_SECTION]
    assert (tracker["backend"], tracker["status"], tracker["at"]) == ("tensorboard", "failed", "open")
    assert tracker["reason"].startswith("FileExistsError") and "tensorboard" in tracker["reason"]
    assert len((run_dir / STEPS_JSONL).read_text().splitlines()) == 3  # training went on
    warnings = [line for line in done.stderr.splitlines() if line.startswith("moe_vlm: warning: logger=")]
    assert len(warnings) == 1 and "training goes on without it" in warnings[0]


@pytest.mark.slow
def test_the_key_reaches_no_file_of_the_run(logged_run: Path) -> None:
    files = [p for p in logged_run.rglob("*") if p.is_file()]
    assert any(p.parent.name == "tensorboard" for p in files) and any(p.name == RUN_JSON for p in files)
    leaked = [str(p.relative_to(logged_run)) for p in files if SECRET.encode() in p.read_bytes()]
    assert leaked == []
    record = json.loads((logged_run / RUN_JSON).read_text())
    assert record["config"]["logger"]["run_name"] == "***"
