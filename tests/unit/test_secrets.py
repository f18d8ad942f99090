"""No credential is ever written: one typed into a config value is refused before Hydra starts.

Every entry (a single run, `-m` on this machine, `-m` on Slurm with and without dry_run, the
bare command with a site file) gets a secret in a different place; each must exit 2 with one
line naming the key and the environment variable to use, create no run or sweep directory, and
leave the secret in no file and nowhere on the console. Each form (user-info, a query parameter, a
header, NAME=value) is planted at least once. Secrets the config reads from the environment
(`${oc.env:...}`) are allowed and masked by value wherever the run writes, unless their form says
credential (the same refusal); the scrubber also masks each form by pattern.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from moe_vlm.base import safety
from moe_vlm.base.errors import BadInput
from moe_vlm.config.compose import CONF_DIR
from moe_vlm.config.preflight import preflight
from moe_vlm.config.schema import TrainConfig
from tests.conftest import REPO

SECRET = "s3cretpw-7f2a91"
GPU_POINT = ["cluster=gb200", "model=qwen3_vl_30b_a3b", "nodes=2"]


def train(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "MOE_VLM_SITE_FILE": "none",
        **(env or {}),
    }
    dirs = [f"hydra.run.dir={tmp_path}/run", f"hydra.sweep.dir={tmp_path}/sweep"]
    return subprocess.run(
        [sys.executable, str(REPO / "train.py"), *args, *dirs],
        cwd=tmp_path,
        env=base,
        capture_output=True,
        text=True,
        timeout=300,
    )


def leaks(tmp_path: Path, done: subprocess.CompletedProcess[str], secret: str = SECRET) -> list[str]:
    """Where the secret is: files under tmp_path (the site file excepted) and the console."""
    found = [
        str(p.relative_to(tmp_path))
        for p in tmp_path.rglob("*")
        if p.is_file() and p.name != "site.yaml" and secret.encode() in p.read_bytes()
    ]
    return found + (["console"] if secret in done.stdout + done.stderr else [])


# Entry, arguments, environment, site file, the key the line names, the variable it proposes.
CASES: dict[str, tuple[list[str], dict[str, str], str | None, str, str]] = {
    "single run, tensorboard": (
        ["logger=tensorboard", f"logger.tracking_uri=https://alice:{SECRET}@host", "train_iters=4"],
        {},
        None,
        "logger.tracking_uri",
        "MLFLOW_TRACKING_PASSWORD",
    ),
    "single run, mlflow": (
        ["logger=mlflow", f"logger.tracking_uri=https://alice:{SECRET}@host", "train_iters=4"],
        {},
        None,
        "logger.tracking_uri",
        "MLFLOW_TRACKING_PASSWORD",
    ),
    "single run, a URL built by an interpolation": (
        ["logger.run_name=https://alice", f"logger.tracking_uri=${{logger.run_name}}:{SECRET}@host"],
        {},
        None,
        "logger.tracking_uri",
        "MLFLOW_TRACKING_PASSWORD",
    ),
    "single run, a token in the query string": (
        ["logger=tensorboard", f"logger.tracking_uri=https://host/x?token={SECRET}", "train_iters=4"],
        {},
        None,
        "logger.tracking_uri",
        "MLFLOW_TRACKING_TOKEN",
    ),
    "dry run, an api_key in the query string": (
        [f"logger.tracking_uri=https://host/?api_key={SECRET}", "dry_run=true"],
        {},
        None,
        "logger.tracking_uri",
        "MLFLOW_TRACKING_TOKEN",
    ),
    "-m local, an access_token in a sweep value": (
        ["-m", "logger=tensorboard", f"logger.tracking_uri=https://h,https://h/?access_token={SECRET}"],
        {},
        None,
        "logger.tracking_uri",
        "MLFLOW_TRACKING_TOKEN",
    ),
    "dry run, a password from the environment in the query string": (
        ["data=real", "data.path=${oc.env:MOE_VLM_TEST_URI}", "dry_run=true"],
        {"MOE_VLM_TEST_URI": f"file:///lustre/shards?password={SECRET}"},
        None,
        "data.path",
        "HF_TOKEN",
    ),
    "-m slurm dry run, a header in a setup line": (
        [
            "-m",
            "hydra/launcher=slurm_gb200",
            *GPU_POINT,
            "dry_run=true",
            f"hydra.launcher.setup=['curl -H \"Authorization: Bearer {SECRET}\" https://h/warm']",
        ],
        {},
        None,
        "hydra.launcher.setup",
        "HF_TOKEN",
    ),
    "-m local, a token under a secret-named key": (
        ["-m", "hydra/launcher=local", "train_iters=3,4", f"+hydra.job.env_set.WANDB_API_KEY={SECRET}"],
        {},
        None,
        "hydra.job.env_set.WANDB_API_KEY",
        "WANDB_API_KEY",
    ),
    "-m local, a dict value": (
        ["-m", "mbs=1,2", f"hydra.job.env_set={{HF_TOKEN:{SECRET}}}"],
        {},
        None,
        "hydra.job.env_set.HF_TOKEN",
        "HF_TOKEN",
    ),
    "-m local, a sweep value": (
        ["-m", "logger=mlflow", f"logger.tracking_uri=https://h,https://u:{SECRET}@h"],
        {},
        None,
        "logger.tracking_uri",
        "MLFLOW_TRACKING_PASSWORD",
    ),
    "-m slurm dry run, a setup line": (
        [
            "-m",
            "hydra/launcher=slurm_gb200",
            *GPU_POINT,
            "dry_run=true",
            f"hydra.launcher.setup=['export HF_TOKEN={SECRET}']",
        ],
        {},
        None,
        "hydra.launcher.setup",
        "HF_TOKEN",
    ),
    "-m slurm, an image from the environment": (
        ["-m", "hydra/launcher=slurm_gb200", *GPU_POINT],
        {"MOE_VLM_CONTAINER_IMAGE": f"docker://u:{SECRET}@nvcr.io/nvidia/nemo:25.09"},
        None,
        "hydra.launcher.container_image",
        "ENROOT_CONFIG_PATH",
    ),
    "-m slurm dry run, the site file": (
        ["-m", "hydra/launcher=slurm_gb200", *GPU_POINT, "dry_run=true"],
        {},
        f"account: a\ngb200:\n  srun_args: ['--export=ALL,HF_TOKEN={SECRET}']\n",
        "gb200.srun_args[0] in the site file",
        "HF_TOKEN",
    ),
    "bare command with a site file": (
        ["model=qwen3_vl_30b_a3b", "nodes=2"],
        {"MOE_VLM_GPUS_VISIBLE": "0"},
        f"cluster: gb200\nlauncher: slurm_gb200\ngb200:\n  setup: ['export HF_TOKEN={SECRET}']\n",
        "gb200.setup[0] in the site file",
        "HF_TOKEN",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_credential_is_refused_on_every_entry_and_written_nowhere(tmp_path: Path, case: str) -> None:
    args, env, site_text, key, variable = CASES[case]
    if site_text is not None:
        (tmp_path / "site.yaml").write_text(site_text)
        env = {**env, "MOE_VLM_SITE_FILE": str(tmp_path / "site.yaml")}
    done = train(tmp_path, *args, env=env)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"moe_vlm: error: {key}") and ": holds " in lines[0], lines[0]
    assert variable in lines[0], lines[0]
    assert not leaks(tmp_path, done)
    assert not (tmp_path / "run").exists() and not (tmp_path / "sweep").exists()


def test_without_the_secret_the_same_entry_writes(tmp_path: Path) -> None:
    """The control: the directories the case above finds missing are made when nothing is refused."""
    done = train(tmp_path, "logger.tracking_uri=https://host", "dry_run=true")
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "run" / ".hydra" / "overrides.yaml").is_file()


def test_help_and_cfg_do_not_echo_a_credential() -> None:
    for flag in ("--help", "--cfg=job", "--info=config"):
        with pytest.raises(BadInput, match=r"logger\.tracking_uri") as bad:
            preflight([flag, f"logger.tracking_uri=https://u:{SECRET}@h"])
        assert SECRET not in str(bad.value)


# --- secrets from the environment: allowed in the config, masked wherever the run writes -------


@pytest.mark.parametrize(
    "args",
    [
        ["data=real", "data.path=/data/${oc.env:MOE_VLM_TEST_TOKEN}", "train_iters=4"],
        # full: the whole plan, which prints data.path (dry_run=true's one screen does not)
        ["data=real", "data.path=/data/${oc.env:MOE_VLM_TEST_TOKEN}", "dry_run=full"],
        ["-m", "data=real", "data.path=/data/${oc.env:MOE_VLM_TEST_TOKEN}", "mbs=1,2"],
    ],
    ids=["run", "dry-run", "sweep"],
)
def test_an_environment_secret_is_masked_on_the_console_and_in_every_file(
    tmp_path: Path, args: list[str]
) -> None:
    done = train(tmp_path, *args, env={"MOE_VLM_TEST_TOKEN": SECRET})
    # A005 rejects the missing dataset, whose message names data.path: the path the secret is in.
    assert "A005" in done.stdout + done.stderr, done.stderr[-2000:]
    assert "***" in done.stdout + done.stderr
    assert not leaks(tmp_path, done)


@pytest.mark.parametrize(
    "text",
    [
        f"https://alice:{SECRET}@host/x",
        f"https://{SECRET}@host/x",
        f"mlflow.exceptions.MlflowException: API request to https://host/api?token={SECRET} failed",
        f"https://host/x?run=1&access_token={SECRET}#top",
        f"https://host/?api_key={SECRET}",
        f"file:///store?password={SECRET}",
        f"headers: {{'Authorization': 'Bearer {SECRET}'}}",
        f"X-API-Key: {SECRET}",
    ],
)
def test_the_scrubber_masks_a_credential_by_pattern_whatever_the_environment_holds(text: str) -> None:
    # A tracker's exception text or a URI from a variable named like no secret (MLFLOW_TRACKING_URI):
    # no known value to mask, only its form.
    clean = safety.scrub_text(text, [])
    assert SECRET not in clean and safety.MASK in clean
    assert safety.scrub({"a": [text]}, []) == {"a": [clean]}
    assert safety.scrub_text(clean, []) == clean  # masking twice changes nothing


# --- what counts as a credential ----------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    ["hf_token", "WANDB_API_KEY", "apiKey", "password", "db_passwd", "aws_secret_access_key", "credentials"],
)
def test_names_that_say_credential(name: str) -> None:
    assert safety.credential_name(name)


@pytest.mark.parametrize(
    "name",
    [
        "token_dispatcher",
        "max_text_tokens",
        "key_column",
        "linear_num_key_heads",
        "image_token_id",
        "TOKENIZERS_PARALLELISM",
        "exclude_keys",
        "kv_sep",
        "SSH_AUTH_SOCK",
        "keyboard",
    ],
)
def test_names_that_do_not(name: str) -> None:
    assert not safety.credential_name(name)


@pytest.mark.parametrize(
    "value",
    [
        "https://alice:pw@host",
        "mlflow at https://:tok@host/x",
        "https://ghp_abcdef@github.com/x",
        "export HF_TOKEN=hf_abc",
        "--export=ALL,WANDB_API_KEY=abc",
        "https://host/x?token=abc",
        "mlflow://host?run=1&access_token=abc#frag",
        "https://host/?api_key=abc",
        "file:///store?password=abc",
        "https://bucket.s3/x?X-Amz-Signature=abc",
        "curl -H 'Authorization: Bearer abc' https://h",
        "X-API-Key: abc",
    ],
)
def test_values_that_hold_one(value: str) -> None:
    found = safety.find_credential({"a": [value]})
    assert found is not None and found.key == "a[0]"
    assert "abc" not in found.message() and "pw" not in found.message().split(":", 1)[0]


@pytest.mark.parametrize(
    "value",
    [
        "ssh://git@github.com/org/repo",
        "nvcr.io/nvidia/nemo:25.09@sha256:0123abcd",
        "/lustre:/lustre:ro",
        "export HF_TOKEN=$HF_TOKEN",
        'export HF_TOKEN="${HF_TOKEN}"',
        "export TOKENIZERS_PARALLELISM=false",
        "python train.py [KEY=VALUE ...]",
        "https://mlflow.example:5000",
        "https://host/x?token=${oc.env:MLFLOW_TOKEN}",
        "https://host/x?max_text_tokens=4&run=1",
        "Authorization: Bearer $HF_TOKEN",
        "curl -H Authorization: Bearer $HF_TOKEN https://h/warm",
    ],
)
def test_values_that_do_not(value: str) -> None:
    assert safety.find_credential({"a": [value]}) is None


def test_a_reference_to_the_environment_under_a_secret_key_is_not_one() -> None:
    assert safety.find_credential({"HF_TOKEN": "${oc.env:HF_TOKEN}"}) is None
    assert safety.find_credential({"HF_TOKEN": None, "api_key": ""}) is None
    assert safety.find_credential({"api_key": "abc"}) is not None


def test_no_schema_key_and_no_shipped_config_is_a_false_positive() -> None:
    """Every key of the schema and every conf/ file (launchers, presets, sweeps) passes."""
    schema = dataclasses.asdict(TrainConfig())
    assert safety.find_credential(schema) is None
    # No key of the schema names a credential, whatever its value (a string there would be refused).
    assert not [key for key, _ in safety._walk("", schema) if safety._credential_path(key)]
    for path in sorted(CONF_DIR.rglob("*.yaml")):
        found = safety.find_credential(yaml.safe_load(path.read_text()) or {})
        assert found is None, (path, found)
