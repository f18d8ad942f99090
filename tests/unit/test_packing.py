"""data.packing=in_batch on the torch engine: the same samples, packed or padded, give the same loss.

One micro-batch of synthetic image-text samples (and one of image-free mock text) goes through the
real tiny Qwen3-VL-MoE twice: as MBS padded rows (attention mask, HF's own positions) and as one
packed row (no mask, packed_position_ids). Each sample's loss, summed over its own label tokens
from its own slice of the logits, must agree: it only can if attention stays inside each sample,
positions and mRoPE restart per sample and every image's vision tokens land in their own sample.
"""

from __future__ import annotations

from itertools import islice, pairwise

import pytest
import torch
from torch.nn import functional

from moe_vlm.config.spec import RunSpec
from moe_vlm.data import build_batches
from moe_vlm.data.batch import IGNORE_INDEX, Batch
from moe_vlm.engines.torch_model import build_model, forward_inputs
from tests.conftest import make_spec

# Relative. fp32 on CPU: the two layouts differ by ~1e-10 here; a leak across samples moves a later
# sample's loss by ~3e-4 (test_attention_leaking_across_samples_would_be_caught).
TOLERANCE = 1e-6
SMALL = ("data.max_long_side_px=480", "data.max_text_tokens=96", "mbs=3", "seq_length=1024")


def per_sample_losses(
    logits: torch.Tensor, labels: torch.Tensor, spans: list[tuple[int, int, int]]
) -> list[float]:
    """Summed next-token loss of each sample, from (row, start, end) of its positions."""
    losses = []
    for row, start, end in spans:
        target = labels[row, start + 1 : end]
        log_probs = functional.log_softmax(logits[row, start : end - 1].double(), dim=-1)
        keep = target != IGNORE_INDEX
        losses.append(float(-log_probs[keep].gather(-1, target[keep, None]).sum()))
    return losses


def padded_spans(batch: Batch) -> list[tuple[int, int, int]]:
    return [(row, 0, int(batch.attention_mask[row].sum())) for row in range(batch.input_ids.shape[0])]


def packed_spans(batch: Batch) -> list[tuple[int, int, int]]:
    assert batch.cu_seqlens is not None
    bounds = batch.cu_seqlens.tolist()
    return [(0, start, end) for start, end in pairwise(bounds)]


def first_batch(spec: RunSpec) -> Batch:
    return next(islice(build_batches(spec, rank=0, world_size=1), 1))


@pytest.mark.parametrize("kind", ["synthetic", "mock"])
def test_packed_and_padded_give_each_sample_the_same_loss(kind: str) -> None:
    padded_spec = make_spec(f"data={kind}", *SMALL)
    packed_spec = make_spec(f"data={kind}", *SMALL, "data.packing=in_batch")
    padded, packed = first_batch(padded_spec), first_batch(packed_spec)
    assert padded.sample_keys == packed.sample_keys and len(packed.sample_keys) == 3
    assert packed.stats.padded_tokens == packed.stats.real_tokens == padded.stats.real_tokens
    assert packed.stats.loss_tokens == padded.stats.loss_tokens
    if kind == "synthetic":
        assert packed.stats.images == padded.stats.images >= 3
        assert packed.pixel_values is not None and padded.pixel_values is not None
        assert torch.equal(packed.pixel_values, padded.pixel_values)

    model = build_model(padded_spec.model, padded_spec.recompute, torch.device("cpu"), seed=0)
    model.eval()  # same weights, no dropout: the two layouts are the only difference
    with torch.no_grad():
        padded_out = model(**padded.model_inputs())
        inputs = forward_inputs(model, packed)
        positions = inputs["position_ids"]
        packed_out = model(**inputs)

    ours = per_sample_losses(packed_out.logits, packed.labels, packed_spans(packed))
    theirs = per_sample_losses(padded_out.logits, padded.labels, padded_spans(padded))
    assert ours == pytest.approx(theirs, rel=TOLERANCE)
    # The batch loss HF computes (mean over the same label tokens) agrees too.
    assert float(packed_out.loss) == pytest.approx(float(padded_out.loss), rel=TOLERANCE)
    # The positions restart: sample 2's text positions start at 0 again, and its mRoPE rows equal
    # the ones HF gives the same sample in its padded row.
    bounds = packed.cu_seqlens.tolist() if packed.cu_seqlens is not None else []
    assert positions[0, 0, bounds[1]] == 0
    padded_mrope, _ = model.model.get_rope_index(
        padded.input_ids,
        padded.mm_token_type_ids,
        padded.image_grid_thw,
        attention_mask=padded.attention_mask,
    )
    length = bounds[2] - bounds[1]
    assert torch.equal(positions[1:, 0, bounds[1] : bounds[2]], padded_mrope[:, 1, :length])


def test_attention_leaking_across_samples_would_be_caught() -> None:
    # Without the restarting positions the packed row is one long sequence: samples 2 and 3 then
    # attend to the samples before them and their losses move. The comparison above can fail.
    spec = make_spec("data=mock", *SMALL, "data.packing=in_batch")
    packed = first_batch(spec)
    model = build_model(spec.model, spec.recompute, torch.device("cpu"), seed=0)
    model.eval()
    with torch.no_grad():
        confined = model(**forward_inputs(model, packed))
        leaking = model(**packed.model_inputs())
    spans = packed_spans(packed)
    first_ok, *rest_ok = per_sample_losses(confined.logits, packed.labels, spans)
    first_bad, *rest_bad = per_sample_losses(leaking.logits, packed.labels, spans)
    assert first_ok == pytest.approx(first_bad, rel=1e-5)  # the first sample sees nothing before it
    # Each later sample's loss moves by more than the equivalence test's tolerance.
    assert all(b != pytest.approx(a, rel=TOLERANCE) for a, b in zip(rest_ok, rest_bad, strict=True))
