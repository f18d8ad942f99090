"""The torch engine's knobs change what they should, on a real Qwen3-VL-MoE under FSDP2 (1 CPU rank).

Each test builds the engine's own Trainer (transformers model, freeze, recompute, fully_shard,
AdamW, the data group's batches) inside a one-rank gloo process group.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from moe_vlm.config.schema import RecomputeConfig, RecomputeGranularity
from moe_vlm.data import Batch, build_batches
from moe_vlm.engines.timing import COMPONENTS
from moe_vlm.engines.torch_engine import Trainer
from moe_vlm.engines.torch_model import RECOMPUTED_SDPA, apply_recompute, build_model, model_parts
from moe_vlm.record.records import StepRecord
from tests.conftest import make_spec

CPU = torch.device("cpu")
SHORT = ["nproc=1", "seq_length=128", "gbs=1", "data=mock"]
# Small synthetic photos (64-96 px, 16-36 patches each) keep the vision path real and cheap;
# they come after SHORT's data=mock and replace it.
IMAGES = [
    "data=synthetic",
    "data.min_long_side_px=64",
    "data.max_long_side_px=96",
    "data.min_pixels=4096",
    "data.max_pixels=9216",
    "data.min_text_tokens=16",
    "data.max_text_tokens=48",
]


@pytest.fixture(scope="module", autouse=True)
def one_rank_group() -> Iterator[None]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    threads = torch.get_num_threads()
    # One rank of the 2-rank default gets one core; a tiny model gains nothing from two threads.
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()
    torch.set_num_threads(threads)


def full(param: torch.Tensor) -> torch.Tensor:
    value = param.full_tensor() if isinstance(param, DTensor) else param
    return value.detach().clone()


class Counting:
    """Passes batches through and counts them: how many micro-batches a step consumed."""

    def __init__(self, batches: Iterator[Batch]) -> None:
        self.batches = batches
        self.taken = 0

    def __iter__(self) -> Counting:
        return self

    def __next__(self) -> Batch:
        self.taken += 1
        return next(self.batches)


def test_step_record_is_a_complete_steps_jsonl_line() -> None:
    spec = make_spec(*SHORT, *IMAGES)
    record = Trainer(spec, CPU, 0, 1).step(1)
    # Every field of the line contract, each of its type, nothing else (record.StepRecord).
    assert StepRecord.from_json(record.to_json(), strict=True) == record
    assert record.host and record.optimizer_s is not None and record.skipped_samples == 0
    assert set(record.components_s or {}) == set(COMPONENTS)
    assert record.memory_kind == "process_peak_rss" and (record.peak_memory_gib or 0) > 0
    assert record.images > 0 and record.image_tokens > 0 and record.vision_patches > 0
    assert record.padded_tokens == spec.mbs * spec.seq_length
    assert record.real_tokens == record.text_tokens + record.image_tokens
    assert (record.grad_norm or 0) > 0 and record.warmup is True


@pytest.mark.parametrize(("gbs", "mbs"), [(4, 1), (4, 2), (3, 1)])
def test_gradient_accumulation_reaches_gbs(gbs: int, mbs: int) -> None:
    spec = make_spec("nproc=1", "seq_length=64", f"gbs={gbs}", f"mbs={mbs}", "data=mock")
    counting = Counting(build_batches(spec, 0, 1))
    trainer = Trainer(spec, CPU, 0, 1, batches=counting)
    record = trainer.step(1)
    assert spec.accumulation_steps == gbs // mbs
    assert counting.taken == record.micro_batches == gbs // mbs
    assert record.sequences == gbs
    assert record.padded_tokens == gbs * spec.seq_length


def _saved_bytes(*overrides: str) -> int:
    """Bytes autograd keeps for backward in one forward of the engine's model."""
    spec = make_spec(*SHORT, *overrides)
    trainer = Trainer(spec, CPU, 0, 1, timing=False)
    batch = next(trainer.batches)
    saved = 0

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        nonlocal saved
        saved += tensor.numel() * tensor.element_size()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = trainer.model(**batch.model_inputs()).loss
    loss.backward()  # the recompute path must still produce gradients (mock data: decoder only)
    assert all(p.grad is not None for p in model_parts(trainer.model).parameters("language"))
    return saved


def test_recompute_reduces_saved_activations() -> None:
    none = _saved_bytes("recompute=none")
    selective = _saved_bytes("recompute=selective")  # core_attn
    full = _saved_bytes("recompute=full")
    assert full < selective < none, (full, selective, none)
    # Full recompute keeps only each layer's input: far below the attention-core saving alone.
    assert full < 0.6 * none


def test_selective_modules_are_checkpointed() -> None:
    spec = make_spec("recompute=selective", "recompute.modules=[core_attn,layernorm,moe]")
    model = build_model(spec.model, spec.recompute, CPU, spec.seed)
    config: Any = model.config
    assert config.text_config._attn_implementation == RECOMPUTED_SDPA
    assert config.vision_config._attn_implementation == "sdpa"
    recomputed = apply_recompute(model, spec.recompute)
    layers = spec.model.num_layers
    assert len(recomputed) == layers * 4  # core attention, two norms, the MoE block
    assert _saved_bytes("recompute=selective", "recompute.modules=[core_attn,layernorm,moe]") < _saved_bytes(
        "recompute=selective"
    )
    with pytest.raises(ValueError, match="moe_act"):
        apply_recompute(
            model, RecomputeConfig(granularity=RecomputeGranularity.selective, modules=["moe_act"])
        )


@pytest.mark.parametrize("freeze", ["vision", "vision_projector"])
def test_frozen_parts_do_not_change_and_the_rest_trains(freeze: str) -> None:
    spec = make_spec(*SHORT, *IMAGES, f"vision_freeze={freeze}", "lr=1e-2")
    trainer = Trainer(spec, CPU, 0, 1)
    parts = model_parts(trainer.model)
    frozen_parts = [part for part in ("vision", "projector", "language") if getattr(spec.freeze, part)]
    before = {part: [full(p) for p in parts.parameters(part)] for part in ("vision", "projector", "language")}
    optimized = {id(p) for group in trainer.optimizer.param_groups for p in group["params"]}

    for step in (1, 2):
        record = trainer.step(step)
        assert record.images > 0  # the vision path really ran
    for part in ("vision", "projector", "language"):
        params = list(parts.parameters(part))
        changed = [not torch.equal(old, full(new)) for old, new in zip(before[part], params, strict=True)]
        if part in frozen_parts:
            assert not any(changed), f"{part} is frozen but changed"
            assert all(not p.requires_grad and p.grad is None for p in params)
            assert not optimized & {id(p) for p in params}, f"{part} is frozen but in the optimizer"
        else:
            assert sum(changed) > len(params) // 2, f"{part} trains but barely changed"
            assert {id(p) for p in params} <= optimized
    # Nothing is computed backward through a frozen vision encoder.
    assert (record.components_backward_s or {})["vision_encoder"] == 0.0
    assert (record.components_forward_s or {})["vision_encoder"] > 0.0


def test_unfrozen_vision_gets_gradients() -> None:
    spec = make_spec(*SHORT, *IMAGES, "vision_freeze=none")
    trainer = Trainer(spec, CPU, 0, 1)
    batch = next(trainer.batches)
    trainer.model(**batch.model_inputs()).loss.backward()
    vision = list(model_parts(trainer.model).parameters("vision"))
    assert all(p.grad is not None and float(full(p.grad).abs().sum()) > 0 for p in vision)


def test_component_times_cover_each_part() -> None:
    spec = make_spec(*SHORT, *IMAGES)
    trainer = Trainer(spec, CPU, 0, 1)
    trainer.step(1)
    record = trainer.step(2)
    for name in COMPONENTS:
        assert (record.components_forward_s or {})[name] > 0, name
        assert (record.components_backward_s or {})[name] > 0, name
    assert sum((record.components_s or {}).values()) < record.step_time_s
    untimed = Trainer(spec, CPU, 0, 1, timing=False).step(1)
    assert untimed.components_s is None and "components_forward_s" not in untimed.to_json()


def test_loss_decreases_over_a_longer_run() -> None:
    spec = make_spec("nproc=1", "seq_length=64", "gbs=2", "mbs=2", "train_iters=30", "lr=2e-3", "data=mock")
    trainer = Trainer(spec, CPU, 0, 1, timing=False)
    losses = [trainer.step(step).loss or 0.0 for step in range(1, 31)]
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < first - 0.1, losses
