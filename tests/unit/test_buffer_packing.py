"""data.packing=buffer: the packer (data/packer.py) and the torch engine's packed rows.

The packer's rows go through the real tiny Qwen3-VL-MoE beside the same samples each padded in a
row of its own: every sample's loss must agree, and perturbing one sample must leave every other
sample's logits untouched (attention never crosses a boundary). Both fail on a broken boundary
(positions that do not restart: the in_batch test's leak check shows the size of the effect).
"""

from __future__ import annotations

from itertools import islice, pairwise
from typing import Any

import pytest
import torch

from moe_vlm.config.spec import RunSpec
from moe_vlm.data import build_batches, indexed_samples
from moe_vlm.data.batch import Batch
from moe_vlm.data.bins import first_fit_decreasing
from moe_vlm.data.indexed import rank_indices
from moe_vlm.data.packer import Packer, assemble_rows
from moe_vlm.data.sequence import EncodedSample, assemble
from moe_vlm.engines import torch_model
from moe_vlm.engines.torch_model import build_model, forward_inputs
from moe_vlm.rules import validate
from tests.conftest import make_spec
from tests.unit.test_packing import TOLERANCE, padded_spans, per_sample_losses

SMALL = ("data.max_long_side_px=480", "data.max_text_tokens=96", "seq_length=1024", "data.packing=buffer")


def test_first_fit_decreasing_places_longest_first_in_the_first_row_with_room() -> None:
    assert first_fit_decreasing([3, 7, 5, 2, 4, 1], capacity=8) == [[1, 5], [2, 0], [4, 3]]
    # ties keep stream order, so the rows are a function of the stream alone
    assert first_fit_decreasing([4, 4, 4], capacity=8) == [[0, 1], [2]]
    with pytest.raises(ValueError, match="cannot fit"):
        first_fit_decreasing([9], capacity=8)


def stream(spec: RunSpec) -> tuple[object, list[EncodedSample]]:
    source = indexed_samples(spec.model, spec.data, spec.seed, spec.seq_length)
    return source, list(islice(source.stream(rank_indices(0, 1, spec.mbs)), 40))


def keys(rows: list[list[EncodedSample]]) -> list[list[str]]:
    return [[sample.key for sample in row] for row in rows]


def test_packer_rows_fit_and_are_deterministic() -> None:
    spec = make_spec("data=synthetic", *SMALL)
    _, samples = stream(spec)
    packer = Packer(iter(samples), row_length=1024, buffer=8, sample_multiple=4)
    rows = [next(packer) for _ in range(9)]
    for row in rows:
        assert sum(-(-s.length // 4) * 4 for s in row) <= 1024
    assert sum(len(row) for row in rows[:3]) > 3  # rows of several samples: it packed
    again = Packer(iter(samples), row_length=1024, buffer=8, sample_multiple=4)
    assert keys([next(again) for _ in range(9)]) == keys(rows)  # deterministic


def test_packed_rows_hold_thd_boundaries_at_the_sample_multiple() -> None:
    spec = make_spec("data=synthetic", *SMALL)
    _, samples = stream(spec)
    rows = [next(Packer(iter(samples), 1024, 8, sample_multiple=8)) for _ in range(1)]
    batch = assemble_rows(rows, 1024, 8, spec.model.pad_token_id, "synthetic")
    assert batch.cu_seqlens is not None and batch.cu_seqlens_padded is not None
    padded, real = batch.cu_seqlens_padded.tolist(), batch.cu_seqlens.tolist()
    assert padded[-1] == 1024 and all(p % 8 == 0 for p in padded)
    assert [b - a for a, b in pairwise(real)] == [s.length for s in rows[0]]
    assert batch.stats.sum_seq_len_squared == sum(s.length**2 for s in rows[0])
    assert batch.stats.real_tokens == real[-1] == int(batch.attention_mask.sum())


def packed_and_padded(spec: RunSpec) -> tuple[Batch, Batch, list[tuple[int, int, int]]]:
    """The first micro-batch of packed rows, the same samples padded one per row, and each packed
    sample's (row, start, end)."""
    packed = next(build_batches(spec, rank=0, world_size=1))
    _, samples = stream(spec)
    by_key = {sample.key: sample for sample in samples}
    padded = assemble(
        [[by_key[key]] for key in packed.sample_keys], spec.seq_length, spec.model.pad_token_id, "x"
    )
    assert packed.cu_seqlens is not None and packed.cu_seqlens_padded is not None
    row = spec.packed_row_length
    starts, bounds = packed.cu_seqlens_padded.tolist(), packed.cu_seqlens.tolist()
    spans = [
        (start // row, start % row, start % row + end - begin)
        for start, (begin, end) in zip(starts, pairwise(bounds), strict=False)
    ]
    return packed, padded, spans


@pytest.mark.parametrize("kind", ["synthetic", "mock"])
def test_buffer_packed_rows_give_each_sample_its_unpacked_loss(kind: str) -> None:
    spec = make_spec(f"data={kind}", *SMALL, "mbs=2", "data.packing_buffer=12")
    assert not [f for f in validate(spec) if f.level.value == "error"]
    packed, padded, spans = packed_and_padded(spec)
    if kind == "synthetic":  # mock samples are seq_length/2 .. seq_length long: one per row first
        assert packed.stats.samples > 2  # two rows, more samples: packed across the micro-batch
    assert packed.stats.real_tokens == padded.stats.real_tokens
    assert packed.stats.loss_tokens == padded.stats.loss_tokens
    model = build_model(spec.model, spec.recompute, torch.device("cpu"), seed=0)
    model.eval()
    with torch.no_grad():
        padded_out = model(**padded.model_inputs())
        packed_out = model(**forward_inputs(model, packed))
    ours = per_sample_losses(packed_out.logits, packed.labels, spans)
    theirs = per_sample_losses(padded_out.logits, padded.labels, padded_spans(padded))
    assert ours == pytest.approx(theirs, rel=TOLERANCE)


def test_attention_never_crosses_a_sample_boundary() -> None:
    spec = make_spec("data=synthetic", *SMALL, "mbs=1", "data.packing_buffer=12")
    packed, _, spans = packed_and_padded(spec)
    assert len(spans) >= 3
    model = build_model(spec.model, spec.recompute, torch.device("cpu"), seed=0)
    model.eval()
    # Perturb the text of the row's first sample (its last tokens: text, never image placeholders).
    row, start, end = spans[0]
    changed = Batch(**{**packed.__dict__, "input_ids": packed.input_ids.clone()})
    changed.input_ids[row, end - 8 : end] = (changed.input_ids[row, end - 8 : end] + 1) % 256
    with torch.no_grad():
        before = model(**forward_inputs(model, packed)).logits
        after = model(**forward_inputs(model, changed)).logits
    assert not torch.allclose(before[row, start:end], after[row, start:end])  # the perturbation bites
    for other_row, other_start, other_end in spans[1:]:
        torch.testing.assert_close(
            after[other_row, other_start:other_end],
            before[other_row, other_start:other_end],
            rtol=0,
            atol=1e-6,
        )


def test_packed_rows_pay_attention_per_sample_not_per_row(monkeypatch: pytest.MonkeyPatch) -> None:
    # What Megatron's THD attention computes: each sample's own causal square, never the row's.
    spec = make_spec("data=synthetic", *SMALL, "mbs=2", "data.packing_buffer=12")
    packed, _, _ = packed_and_padded(spec)
    assert packed.cu_seqlens_padded is not None
    row = spec.packed_row_length
    padded_starts = packed.cu_seqlens_padded.tolist()
    expected = [
        (start % row, start % row + (end - start)) for start, end in pairwise(padded_starts)
    ]  # each sample with its padding, within its row
    model = build_model(spec.model, spec.recompute, torch.device("cpu"), seed=0)
    model.eval()
    inputs = forward_inputs(model, packed)
    spans = inputs["sample_spans"]
    assert [span for row_spans in spans for span in row_spans] == expected
    # The spans and the positions agree: a span starts exactly where the text position restarts.
    restarts = (inputs["position_ids"][0] == 0).nonzero().tolist()
    assert restarts == [[index, start] for index, row_spans in enumerate(spans) for start, _ in row_spans]
    lengths: list[int] = []
    original = torch_model.sdpa_attention_forward

    def spy(module: torch.nn.Module, query: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        lengths.append(query.shape[2])
        return original(module, query, *args, **kwargs)

    monkeypatch.setattr(torch_model, "sdpa_attention_forward", spy)
    with torch.no_grad():
        model(**inputs)
    assert sorted(lengths) == sorted([end - start for start, end in expected] * spec.model.num_layers)
    assert max(lengths) < row


def test_a_packed_micro_batch_builds_no_attention_mask(monkeypatch: pytest.MonkeyPatch) -> None:
    # transformers would build a [rows, 1, T, T] block-diagonal mask from the restarting positions
    # that per-sample attention never reads; the padded micro-batch still gets its padding mask.
    spec = make_spec("data=synthetic", *SMALL, "mbs=2", "data.packing_buffer=12")
    packed, padded, _ = packed_and_padded(spec)
    model = build_model(spec.model, spec.recompute, torch.device("cpu"), seed=0)
    model.eval()
    built: list[torch.Tensor | None] = []
    original = torch_model.sdpa_mask

    def spy(*args: Any, **kwargs: Any) -> Any:
        mask = original(*args, **kwargs)
        built.append(mask)
        return mask

    monkeypatch.setattr(torch_model, "sdpa_mask", spy)
    with torch.no_grad():
        model(**forward_inputs(model, packed))
        assert built == []
        model(**forward_inputs(model, padded))
    assert len(built) == 1 and built[0] is not None and built[0].shape[-1] == spec.seq_length


def test_the_plan_sizes_buffer_packed_rows() -> None:
    from moe_vlm.perf.memory.micro_batch import (
        attention_mask_elements,
        micro_batch_positions,
        micro_batch_shape,
    )
    from moe_vlm.predict.workload import expected_workload

    padded = make_spec("data=synthetic", "mbs=2", "seq_length=4096")
    spec = make_spec("data=synthetic", "mbs=2", "seq_length=4096", "data.packing=buffer")
    assert micro_batch_positions(spec) == 2 * spec.packed_row_length
    assert attention_mask_elements(spec) == 0 < attention_mask_elements(padded)  # per-sample SDPA: no mask
    shape, padded_shape = micro_batch_shape(spec), micro_batch_shape(padded)
    assert shape.buffered and shape.mean_tokens is not None and padded_shape.mean_tokens is not None
    assert shape.mean_tokens > 2 * padded_shape.mean_tokens  # rows hold several samples
    work, padded_work = expected_workload(spec).workload, expected_workload(padded).workload
    assert work.padded_tokens == padded_work.padded_tokens  # the same GBS rows of seq_length
    assert work.real_tokens > 2 * padded_work.real_tokens and work.samples > work.sequences


def test_a_buffer_packed_shape_follows_its_own_buffer_and_row() -> None:
    """The shapes are cached per input: a sweep over the buffer or the row's multiple (precision, TP,
    CP) must not get another point's rows (a CI run got a buffer of 1's for a buffer of 64)."""
    from moe_vlm.perf.memory.micro_batch import micro_batch_shape

    base = ("data=synthetic", "mbs=2", "seq_length=4096", "data.packing=buffer")
    one, many = (micro_batch_shape(make_spec(*base, f"data.packing_buffer={n}")) for n in (1, 64))
    assert "buffers of 1" in one.source and "buffers of 64" in many.source
    assert one.mean_tokens is not None and many.mean_tokens is not None
    assert many.mean_tokens > one.mean_tokens
    odd = ("data=synthetic", "mbs=2", "seq_length=4004", "data.packing=buffer")
    bf16, fp8 = (make_spec(*odd, f"precision={p}") for p in ("bf16", "fp8mx"))
    assert bf16.packed_row_length != fp8.packed_row_length
    assert micro_batch_shape(bf16).positions == 2 * bf16.packed_row_length
    assert micro_batch_shape(fp8).positions == 2 * fp8.packed_row_length


def test_the_packing_preset_compares_none_in_batch_and_buffer_on_real_data() -> None:
    from itertools import product

    from tests.unit.test_sweep_presets import preset_params

    params = preset_params("packing")
    assert params["data"] == "real" and set(params["data.packing"].split(",")) == {
        "none",
        "in_batch",
        "buffer",
    }
    axes = [[f"{key}={value}" for value in values.split(",")] for key, values in params.items()]
    for point in product(*axes):
        spec = make_spec(*point, "data.path=/tmp/moe_vlm_packing_preset")
        assert not [f.code for f in validate(spec) if f.level.value == "error" and f.code != "A005"], point
