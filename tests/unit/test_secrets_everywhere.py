"""Secrets by pattern, in every file (issue 33): the tracker keys a user exports (WANDB_API_KEY,
HF_TOKEN, MLFLOW_TRACKING_PASSWORD), each pulled into the config by `${oc.env:...}` (the worst a
user can do), reach no file a real torch run, a two-point sweep on the basic launcher and a dry run
write (outputs, .hydra/, plan.json, run.json, steps.jsonl, logs, TensorBoard events) and neither
stdout nor stderr. The forms a value can carry without a secret name (user-info, `?token=`,
`?api_key=`, a header) are refused before anything is written: tests/unit/test_secrets.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

SECRETS = {
    "WANDB_API_KEY": "wandbkey-3f9c2a71",
    "HF_TOKEN": "hf_tok-8d1e4b22",
    "MLFLOW_TRACKING_PASSWORD": "mlflowpw-5a7c9e13",
}
PLANTED = [
    "logger=tensorboard",
    "logger.run_name=${oc.env:WANDB_API_KEY}",
    "logger.project=${oc.env:HF_TOKEN}",
    "logger.entity=${oc.env:MLFLOW_TRACKING_PASSWORD}",
    "nproc=1",
    "train_iters=2",
    "warmup_steps=1",
]


def _train(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            str(REPO / "train.py"),
            *args,  # -m first: Hydra's parser takes flags before the overrides
            *PLANTED,
            f"hydra.run.dir={tmp_path}/run",
            f"hydra.sweep.dir={tmp_path}/sweep",
        ],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO), "MOE_VLM_SITE_FILE": "none", **SECRETS},
        capture_output=True,
        text=True,
        timeout=900,
    )


@pytest.mark.slow
@pytest.mark.parametrize("args", [[], ["-m", "mbs=1,2"], ["dry_run=true"]], ids=["run", "sweep", "dry-run"])
def test_no_exported_key_reaches_a_file_or_the_console(tmp_path: Path, args: list[str]) -> None:
    done = _train(tmp_path, *args)
    assert done.returncode == 0, done.stderr[-3000:]
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.name in ("run.json", "plan.json") for p in files), [str(p) for p in files]
    leaked = [
        f"{name} in {p.relative_to(tmp_path)}"
        for p in files
        for name, value in SECRETS.items()
        if value.encode() in p.read_bytes()
    ]
    leaked += [
        f"{name} on the console" for name, value in SECRETS.items() if value in done.stdout + done.stderr
    ]
    assert leaked == []
