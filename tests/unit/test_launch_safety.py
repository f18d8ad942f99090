"""Strings that reach sbatch/srun are checked; secrets never reach a file."""

from __future__ import annotations

import pytest

from moe_vlm.base import safety
from moe_vlm.base.errors import BadInput


@pytest.mark.parametrize(
    "value", ["batch;rm -rf ~", "a b", "$(id)", "`id`", "x\ny", "a|b", "a&b", "q'uote", 'a"b', "a>b"]
)
def test_names_with_shell_metacharacters_are_rejected(value: str) -> None:
    with pytest.raises(BadInput) as bad:
        safety.check_word("hydra.launcher.partition", value)
    line = str(bad.value)
    assert "\n" not in line and "hydra.launcher.partition" in line and "Fix:" in line


@pytest.mark.parametrize("value", ["batch", "gb200_nvl72", "acct-01", "normal", "train.py"])
def test_plain_names_pass(value: str) -> None:
    assert safety.check_word("hydra.launcher.partition", value) == value


def test_images_and_mounts() -> None:
    safety.check_word("image", "nvcr.io#nvidia/nemo:25.09", safety.IMAGE_CHARS)
    safety.check_mount("mounts", "/lustre/data:/data:ro")
    for bad in ("/a:/b,/c:/d", "/a;/b", "/a:/b:ro:x", "/a::/b", "$HOME:/home"):
        with pytest.raises(BadInput):
            safety.check_mount("mounts", bad)


def test_setup_lines_may_not_write_a_secret() -> None:
    safety.check_setup_line("setup", "module load cuda/12.8")
    safety.check_setup_line("setup", "export HF_TOKEN=$HF_TOKEN")
    safety.check_setup_line("setup", "export NCCL_DEBUG=WARN")
    with pytest.raises(BadInput, match="HF_TOKEN"):
        safety.check_setup_line("setup", "export HF_TOKEN=hf_abcdefghijkl")
    with pytest.raises(BadInput):
        safety.check_setup_line("setup", "echo ok\nrm -rf ~")


def test_scrub_masks_environment_secrets_by_value() -> None:
    env = {
        "HF_TOKEN": "hf_abcdefghijkl",
        "WANDB_API_KEY": "0123456789abcdef",
        "MAX_TOKENS": "4096",
        "PATH": "/usr/bin",
    }
    secrets = safety.secret_values(env)
    assert secrets == ["0123456789abcdef", "hf_abcdefghijkl"]
    record = {
        "data": {"path": "/data/hf_abcdefghijkl/x"},
        "max_text_tokens": 512,
        "lines": ["k=0123456789abcdef"],
    }
    assert safety.scrub(record, secrets) == {
        "data": {"path": "/data/***/x"},
        "max_text_tokens": 512,  # a key that looks like a secret keeps its value
        "lines": ["k=***"],
    }
