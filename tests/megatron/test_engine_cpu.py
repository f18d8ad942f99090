"""The parts of engine=megatron that run without a GPU: offline recipe building, batch accounting,
and the refusal to start where there is no GPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from moe_vlm.engines.megatron.config import build_config, check_overrides
from moe_vlm.engines.megatron.recording import CountingIterator, StepStats
from tests.conftest import REPO, make_spec
from tests.megatron.conftest import needs_stack

MEG = ("engine=megatron", "dry_run=true", "cluster=b200", "model=qwen3_vl_30b_a3b")


@needs_stack
def test_recipe_builds_offline_from_the_model_group(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # No hub: the recipe's hard-coded hub id must be served from the materialised config.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    spec = make_spec(*MEG)
    built = build_config(spec, tmp_path)
    assert built.hub_ids_requested == ["Qwen/Qwen3-VL-30B-A3B-Instruct"]
    assert (built.hf_dir / "config.json").is_file()
    assert built.recipe.kind == "perf" and "b200" in built.recipe.function
    assert check_overrides(built.cfg, spec) == []
    assert built.cfg.model.num_moe_experts == spec.model.num_experts


@needs_stack
def test_a_local_checkpoint_dir_is_used_as_it_is(tmp_path: Path) -> None:
    from moe_vlm.engines.hf_config import write_hf_config

    # A user's checkpoint dir: here, the tiny model's config under a directory of its own.
    local = write_hf_config(make_spec("model=tiny_moe_vlm").model, tmp_path / "my-checkpoint")
    spec = make_spec(
        *MEG, "model=tiny_moe_vlm", f"model.hf_model_id={local}", "data=real", f"data.path={tmp_path}"
    )
    built = build_config(spec, tmp_path / "work")
    assert built.hf_dir == local.resolve()
    assert built.cfg.model.num_layers == 2
    assert built.cfg.dataset.task_encoder.hf_processor_path == str(local)  # mock/synthetic need no processor


def test_batch_accounting_counts_what_the_model_sees() -> None:
    """Two sequences of 8 in Bridge's collate format: pad id 0 here, 3 image placeholders."""
    pad, image = 0, 9
    tokens = torch.tensor([[5, 9, 9, 9, 6, 7, 0, 0], [5, 6, 7, 8, 0, 0, 0, 0]])
    grid = torch.tensor([[[1, 4, 6], [0, 0, 0]], [[0, 0, 0], [0, 0, 0]]])  # Qwen's batched [B, N, 3]

    class VisualInputs:  # the attributes Bridge's GenericVisualInputs carries
        pixel_values = None
        image_grid_thw = grid

    batch = {"input_ids": tokens, "loss_mask": (tokens > 6).float(), "visual_inputs": VisualInputs()}
    stats = StepStats()
    batches = iter([batch, batch])
    counted = list(CountingIterator(batches, stats, pad_token_id=pad, image_token_id=image))
    assert counted == [batch, batch]  # passed through unchanged
    assert stats.micro_batches == 2
    assert (stats.sequences, stats.padded_tokens, stats.real_tokens, stats.image_tokens) == (4, 32, 20, 6)
    assert stats.text_tokens == 20 - 6 and stats.loss_tokens == 2 * (4 + 2)
    assert (stats.images, stats.vision_patches, stats.sum_patches_squared) == (2, 48, 2 * 24**2)
    assert stats.sum_seq_len_squared == 2 * (6**2 + 4**2)


@pytest.mark.slow
@needs_stack
def test_running_without_a_gpu_is_refused_in_one_line(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "train.py", *MEG[:1], "cluster=b200", "model=qwen3_vl_30b_a3b", "train_iters=3",
         "warmup_steps=1", f"hydra.run.dir={run_dir}"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("moe_vlm: error:")]
    assert errors == [
        "moe_vlm: error: engine=megatron needs GPUs and this machine has none visible; "
        "plan with dry_run=true, or use engine=torch."
    ]
    # The run.json written when the run started is settled as a failure before any step: no steps.
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "failed" and record["failure"]["class"] == "stack", record
    assert not (run_dir / "steps.jsonl").exists()


@needs_stack
def test_forward_step_and_callbacks_fit_bridge_s_protocols(tmp_path: Path) -> None:
    from megatron.bridge.training.callbacks import CallbackManager
    from megatron.bridge.training.utils.train_utils import needs_global_state_injection

    from moe_vlm.engines.megatron.recording import StepRecorder, counting_forward_step

    recorder = StepRecorder(make_spec(*MEG), tmp_path)
    assert needs_global_state_injection(counting_forward_step(recorder))  # Bridge passes its GlobalState
    manager = CallbackManager()
    manager.add([recorder])
    for event in ("on_train_start", "on_train_step_start", "on_train_step_end", "on_train_end"):
        assert manager.has_callbacks(event), event
