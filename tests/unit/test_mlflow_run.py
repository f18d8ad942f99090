"""`train.py logger=mlflow` on the torch engine with the real MLflow client (issue 33): a store it
can write gets the run's params and every step's metrics (read back with MlflowClient); a store
the plan refuses stops before the run (T009, exit 2); a server that does not answer costs the run
nothing, and run.json says why it was not logged."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from moe_vlm.base.files import RUN_JSON, STEPS_JSONL
from moe_vlm.record import explog
from tests.conftest import REPO

ITERS = 4


def train(tmp_path: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    return subprocess.run(
        [
            *(sys.executable, str(REPO / "train.py"), "logger=mlflow", "nproc=1", f"train_iters={ITERS}"),
            *args,
            f"hydra.run.dir={tmp_path}/run",
        ],
        cwd=tmp_path,
        env={**base, "PYTHONPATH": str(REPO), "MOE_VLM_SITE_FILE": "none", **env},
        capture_output=True,
        text=True,
        timeout=900,
    )


@pytest.mark.slow
def test_a_writable_store_holds_the_runs_params_and_every_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow.tracking import MlflowClient

    uri = f"file://{tmp_path}/mlruns"
    done = train(
        tmp_path,
        f"logger.tracking_uri={uri}",
        "logger.project=moe_vlm_test",
        "logger.run_name=e2e",
        env={"MLFLOW_ALLOW_FILE_STORE": "true"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads((tmp_path / "run" / RUN_JSON).read_text())
    assert record[explog.TRACKER_SECTION] == {"backend": "mlflow", "status": "logged"}

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # the reader opens the same FileStore
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("moe_vlm_test")
    assert experiment is not None
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == "e2e" and run.info.status == "FINISHED"
    assert len(run.data.params) > 50 and run.data.params["config.logger.backend"] == "mlflow"
    for name in ("train/loss", "perf/step_time_s", "perf/real_tokens_per_s_per_gpu", "memory/peak_gib"):
        history = client.get_metric_history(run.info.run_id, name)
        assert sorted(m.step for m in history) == list(range(1, ITERS + 1)), name
    summary = record["summary"]["effective_tokens_per_s_per_gpu"]
    assert run.data.metrics["summary/effective_tokens_per_s_per_gpu"] == pytest.approx(summary, rel=1e-6)


@pytest.mark.slow
def test_a_file_store_mlflow_refuses_is_refused_before_the_run(tmp_path: Path) -> None:
    done = train(tmp_path, f"logger.tracking_uri=file://{tmp_path}/mlruns", env={})
    assert done.returncode == 2, done.stderr[-3000:]
    assert "T009" in done.stdout + done.stderr and "MLFLOW_ALLOW_FILE_STORE=true" in done.stdout + done.stderr
    # Refused in the plan: no store made, no step run (what a refusal writes is issue 33's "outputs").
    assert not (tmp_path / "mlruns").exists() and not (tmp_path / "run" / STEPS_JSONL).exists()


@pytest.mark.slow
def test_a_server_that_does_not_answer_costs_the_run_nothing(tmp_path: Path) -> None:
    with socket.socket() as sock:  # a port nothing listens on once the socket closes
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    done = train(
        tmp_path,
        f"logger.tracking_uri=http://127.0.0.1:{port}",
        env={"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads((tmp_path / "run" / RUN_JSON).read_text())
    assert record["status"] == "completed"
    tracker = record[explog.TRACKER_SECTION]
    assert (tracker["backend"], tracker["status"], tracker["at"]) == ("mlflow", "failed", "open")
    assert f"127.0.0.1:{port}" in tracker["reason"]
    assert len((tmp_path / "run" / STEPS_JSONL).read_text().splitlines()) == ITERS  # training went on
