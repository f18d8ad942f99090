"""The real tiny Qwen3-VL-MoE model accepts every data kind's batches (forward and backward)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import Qwen3VLMoeForConditionalGeneration

from moe_vlm.config.spec import RunSpec
from moe_vlm.data import build_batches
from moe_vlm.engines.hf_config import transformers_config
from moe_vlm.engines.torch_model import forward_inputs
from tests.conftest import REPO, make_spec


@pytest.fixture(scope="module")
def model() -> Qwen3VLMoeForConditionalGeneration:
    spec = make_spec("model=tiny_moe_vlm")
    torch.manual_seed(0)
    return Qwen3VLMoeForConditionalGeneration(transformers_config(spec.model)).train()


def _train_step(model: Qwen3VLMoeForConditionalGeneration, spec: RunSpec) -> float:
    batch = next(build_batches(spec, rank=0, world_size=1))
    model.zero_grad(set_to_none=True)
    loss = model(**forward_inputs(model, batch)).loss
    loss.backward()
    if batch.stats.images:
        # The vision tower really ran: its patch embedding received gradient.
        assert model.model.visual.patch_embed.proj.weight.grad is not None
    return float(loss.detach())


@pytest.mark.slow
def test_tiny_model_takes_a_realistic_synthetic_batch(model: Qwen3VLMoeForConditionalGeneration) -> None:
    # The defaults: 1-2 images of 336-1344 px on the long side in seq_length 2048.
    assert torch.isfinite(torch.tensor(_train_step(model, make_spec("data=synthetic"))))


@pytest.mark.slow
def test_tiny_model_takes_mock_and_packed_batches(model: Qwen3VLMoeForConditionalGeneration) -> None:
    assert torch.isfinite(torch.tensor(_train_step(model, make_spec("data=mock", "seq_length=512", "mbs=2"))))
    packed = make_spec("data=synthetic", "data.max_long_side_px=480", "data.packing=in_batch", "mbs=2")
    assert torch.isfinite(torch.tensor(_train_step(model, packed)))


@pytest.mark.slow
def test_tiny_model_takes_a_real_photo_batch(
    model: Qwen3VLMoeForConditionalGeneration, tmp_path: Path
) -> None:
    out = tmp_path / "photos"
    subprocess.run(
        [sys.executable, str(REPO / "scripts" / "build_dataset.py"), "--skimage", str(out)], check=True
    )
    loss = _train_step(model, make_spec("data=real", f"data.path={out}", "mbs=2"))
    assert torch.isfinite(torch.tensor(loss))
