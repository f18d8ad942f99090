"""The plan's MLflow checks (T008, T009) agree with the installed MLflow's own code (issue 33):
each URI is handed to MLflow's tracking-store registry (`_get_store`, what `mlflow.start_run`
reaches), and the rule fires exactly where MLflow raises."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from moe_vlm.record import explog
from moe_vlm.rules import validate
from tests.conftest import REPO, make_spec

MEG = ("engine=megatron", "dry_run=true", "cluster=gb200", "model=qwen3_vl_30b_a3b")


def codes(*overrides: str) -> set[str]:
    return {finding.code for finding in validate(make_spec(*overrides))}


def mlflow_refuses(uri: str | None) -> str | None:
    """The exception class MLflow's own store lookup raises for this URI (None: it builds a store)."""
    from mlflow.tracking._tracking_service import utils

    try:
        utils._get_store(uri)
    except Exception as exc:
        return type(exc).__name__
    return None


@pytest.fixture
def clean_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No tracker settings from the caller's shell; the working directory (MLflow's default store's
    home) is empty."""
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_ALLOW_FILE_STORE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("engine", [(), MEG], ids=["torch", "megatron"])
def test_a_scheme_the_installed_mlflow_lacks_is_refused_as_mlflow_would(
    clean_env: Path, engine: tuple[str, ...]
) -> None:
    for uri in ("s3://bucket/mlruns", "gs://bucket/mlruns", "ftp://host/mlruns"):
        assert mlflow_refuses(uri) == "UnsupportedModelRegistryStoreURIException", uri
        assert "T008" in codes(*engine, "logger=mlflow", f"logger.tracking_uri={uri}"), uri
    assert mlflow_refuses("http://mlflow.example:5000") is None  # a REST store: built, not contacted
    assert "T008" not in codes(*engine, "logger=mlflow", "logger.tracking_uri=http://mlflow.example:5000")
    assert "T008" not in codes(*engine, "logger=tensorboard", "logger.tracking_uri=s3://bucket/mlruns")


def test_the_default_store_is_judged_as_the_run_resolves_it(clean_env: Path) -> None:
    # logger.tracking_uri=null: MLflow 3's default is sqlite:///mlflow.db, whose store needs SQLAlchemy
    # (absent from mlflow-skinny). Whatever is installed, the rule says what MLflow does.
    refused = mlflow_refuses(None)
    assert ("T008" in codes("logger=mlflow")) == (refused == "UnsupportedModelRegistryStoreURIException")
    store = explog.mlflow_store(None)
    assert store is not None and store.uri.startswith("sqlite:")


def test_a_file_store_needs_mlflows_opt_in(clean_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    uri = f"file://{clean_env}/refused/mlruns"
    assert mlflow_refuses(uri) == "MlflowException"  # MLflow's own FileStore refuses it
    assert "T009" in codes("logger=mlflow", f"logger.tracking_uri={uri}")
    (finding,) = [
        f for f in validate(make_spec("logger=mlflow", f"logger.tracking_uri={uri}")) if f.code == "T009"
    ]
    assert "MLFLOW_ALLOW_FILE_STORE=true" in finding.fix and "sqlite:///" in finding.fix
    # The same store from the environment, and a plain path (no scheme): the same store class.
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    assert "T009" in codes("logger=mlflow")
    assert "T009" in codes(*MEG, "logger=mlflow", f"logger.tracking_uri={clean_env}/plain/mlruns")

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    allowed = f"file://{clean_env}/allowed/mlruns"  # a new path: MLflow caches the stores it built
    assert mlflow_refuses(allowed) is None and (clean_env / "allowed" / "mlruns").is_dir()
    assert "T009" not in codes("logger=mlflow", f"logger.tracking_uri={allowed}")
    assert "T009" not in codes(*MEG, "logger=mlflow", f"logger.tracking_uri={clean_env}/plain/mlruns")


def test_a_plan_without_mlflow_does_not_import_it() -> None:
    # `import mlflow` takes seconds: only a plan that logs to it pays.
    script = (
        "import sys; from moe_vlm.rules import validate; from tests.conftest import make_spec; "
        "validate(make_spec('logger=tensorboard')); assert 'mlflow' not in sys.modules, 'imported'; "
        "validate(make_spec('logger=mlflow', 'logger.tracking_uri=http://h:5000')); "
        "assert 'mlflow' in sys.modules"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300, env=os.environ
    )
    assert done.returncode == 0, done.stderr[-2000:]
