"""data.packing=buffer: what the packer guarantees (issue 34), each on the real packer and data path.

(a) each skipped sample is counted once, in the batch that drew it (that the same stream gives the
    same rows: tests/unit/test_buffer_packing.py);
(b) over-length samples follow the encoder's one policy (text cut to seq_length, image tokens never;
    a sample whose images alone do not fit skipped and counted) exactly as the padded path does,
    and the counts reach what run.json records (DataStats);
(c) every row is a multiple of what the precision and the parallel split need: the collate
    multiple, and TE's token multiple on each rank's share (perf/rank_shapes.py; TE's own checks
    run on it where the stack is installed);
(d) a step's record counts the samples and real tokens its rows hold, exactly.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from itertools import islice, pairwise

import pytest
import torch

from moe_vlm.config.precision import profile
from moe_vlm.config.spec import RunSpec
from moe_vlm.data import build_batches, indexed_samples
from moe_vlm.data.batch import IGNORE_INDEX, Batch, BatchStats
from moe_vlm.data.indexed import rank_indices
from moe_vlm.data.packer import Packer, packed_batches
from moe_vlm.data.sequence import EncodedSample, SkipCounter
from moe_vlm.data.stats import DataStats
from moe_vlm.perf.rank_shapes import rank_shapes
from moe_vlm.record.records import StepRecord
from tests.conftest import make_spec

IMAGES = ("data=synthetic", "data.max_long_side_px=480", "data.max_text_tokens=96")
SMALL = (*IMAGES, "data.packing=buffer")


def keys(rows: list[list[EncodedSample]]) -> list[list[str]]:
    return [[sample.key for sample in row] for row in rows]


def fresh_stream(spec: RunSpec) -> Iterator[EncodedSample]:
    """The rank's sample stream from the seed, as a (re)started run reads it."""
    source = indexed_samples(spec.model, spec.data, spec.seed, spec.seq_length)
    return source.stream(rank_indices(0, 1, spec.mbs))


def packed(spec: RunSpec) -> tuple[Packer, Iterator[Batch], SkipCounter]:
    """The packer, its micro-batches over a fresh source (as data._buffer_packed builds them) and
    the source's running count of skipped samples."""
    source = indexed_samples(spec.model, spec.data, spec.seed, spec.seq_length)
    stream = source.stream(rank_indices(0, 1, spec.mbs))
    packer = Packer(stream, spec.packed_row_length, spec.data.packing_buffer, spec.collate_padding_multiple)
    batches = packed_batches(packer, source.skips, spec.mbs, spec.model.pad_token_id, spec.data.kind.value)
    return packer, batches, source.skips


def until_buffers_emptied(packer: Packer, batches: Iterator[Batch], buffers: int) -> list[Batch]:
    out: list[Batch] = []
    while not out or packer.pending or packer.drawn < buffers * packer.buffer:
        out.append(next(batches))
    return out


# seq_length 256 with images up to 480 px: some samples lose text, some (two images) cannot fit.
OVER = (*IMAGES, "seq_length=256", "mbs=1")


def test_over_length_samples_follow_the_one_policy_in_buffer_packing_and_reach_the_record() -> None:
    spec = make_spec(*OVER, "data.packing=buffer", "data.packing_buffer=8")
    packer, batches, _ = packed(spec)
    ours = until_buffers_emptied(packer, batches, buffers=2)
    samples = sum(b.stats.samples for b in ours)
    assert samples == 16
    padded_spec = make_spec(*OVER, "data.packing=none")
    theirs = list(islice(build_batches(padded_spec, rank=0, world_size=1), samples))
    assert sorted(k for b in ours for k in b.sample_keys) == sorted(k for b in theirs for k in b.sample_keys)
    recorded, padded_recorded = DataStats(), DataStats()
    for batch in ours:
        recorded.add(batch)
        assert batch.cu_seqlens is not None
        assert all(b - a <= spec.seq_length for a, b in pairwise(batch.cu_seqlens.tolist()))
        # image tokens are never cut: every image's merged patches are in the row
        merge = spec.model.vision_spatial_merge_size**2
        grid = batch.image_grid_thw
        assert batch.stats.image_tokens == (0 if grid is None else int(grid.prod(dim=-1).sum()) // merge)
    for batch in theirs:
        padded_recorded.add(batch)
    record, padded_record = recorded.to_dict(), padded_recorded.to_dict()
    assert record["skipped_samples"] > 0 and record["truncated_text_tokens"] > 0  # both sides of the policy
    for name in ("skipped_samples", "truncated_text_tokens", "samples", "images"):
        assert record[name] == padded_record[name], name


def test_each_skipped_sample_is_counted_once_in_the_batch_that_drew_it() -> None:
    spec = make_spec(*OVER, "data.packing=buffer", "data.packing_buffer=8")
    packer, batches, skips = packed(spec)
    counted = 0
    while packer.drawn < 3 * packer.buffer or packer.pending:
        before = skips.total
        batch = next(batches)
        assert batch.stats.skipped_samples == skips.total - before
        counted += batch.stats.skipped_samples
    assert counted == skips.total > 0


GRID = [(1, 1), (2, 1), (1, 2), (2, 2), (4, 1)]  # (tp, cp); Qwen3-VL's provider forces SP when TP > 1


def grid_spec(precision: str, tp: int, cp: int) -> RunSpec:
    # seq_length 1000: a multiple of 8 but of no per-rank share of it under FP8 with TP or CP
    spec = make_spec(
        "data=mock", "data.packing=buffer", "data.packing_buffer=4", "seq_length=1000", "mbs=1",
        f"precision={precision}", f"tp={tp}", f"cp={cp}",
    )  # fmt: skip
    assert spec.sequence_parallel is (tp > 1)
    return spec


def rank_token_counts(spec: RunSpec, batch: Batch) -> list[int]:
    rows = tuple(batch.input_ids.shape[1] for _ in range(batch.input_ids.shape[0]))
    shapes = rank_shapes(spec, rows, packed=True, source="the packer's rows")
    assert shapes.uneven == (), shapes.uneven  # CP's 2 x CP chunks and SP's TP shard divide
    return [op.shape[0] for op in shapes.operands if op.role == "input"]


@pytest.mark.parametrize("precision", ["bf16", "fp8cs", "fp8mx", "nvfp4"])
def test_packed_rows_honour_the_precisions_and_the_splits_multiples(precision: str) -> None:
    needed = profile(precision).token_multiple
    for tp, cp in GRID:
        spec = grid_spec(precision, tp, cp)
        for batch in islice(build_batches(spec, rank=0, world_size=1), 3):
            assert batch.input_ids.shape[1] == spec.packed_row_length >= spec.seq_length
            assert batch.cu_seqlens_padded is not None
            starts = batch.cu_seqlens_padded.tolist()
            assert all(s % spec.collate_padding_multiple == 0 for s in starts), (tp, cp, starts)
            tokens = rank_token_counts(spec, batch)
            assert all(t % needed == 0 for t in tokens), (precision, tp, cp, tokens)


@pytest.mark.parametrize("precision", ["fp8cs", "fp8mx", "nvfp4"])
def test_tes_own_checks_accept_every_ranks_share_of_a_packed_row(
    precision: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same grid against Transformer Engine's own checks: the dimension assert every TE linear
    runs on its local input (utils.py:704-714, module/linear.py:472) and the block quantizer's
    is_quantizable (mxfp8_tensor.py:125-133, nvfp4_tensor.py:261-271)."""
    from moe_vlm.engines.megatron.stack import stack_problem

    problem = stack_problem()
    if problem is not None:
        pytest.skip(f"Megatron stack unavailable: {problem}")
    import transformer_engine_torch as tex
    from transformer_engine.pytorch.tensor.mxfp8_tensor import MXFP8Quantizer
    from transformer_engine.pytorch.tensor.nvfp4_tensor import NVFP4Quantizer
    from transformer_engine.pytorch.utils import assert_dim_for_fp8_exec

    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")  # NVFP4's Hadamard signs
    quantizer = {
        "fp8cs": None,
        "fp8mx": lambda: MXFP8Quantizer(tex.DType.kFloat8E4M3),
        "nvfp4": lambda: NVFP4Quantizer(),
    }[precision]
    block = quantizer() if quantizer is not None else None
    for tp, cp in GRID:
        spec = grid_spec(precision, tp, cp)
        batch = next(build_batches(spec, rank=0, world_size=1))
        for tokens in set(rank_token_counts(spec, batch)):
            inp = torch.zeros(tokens, 1, 64)
            assert_dim_for_fp8_exec(inp)
            assert block is None or block.is_quantizable(inp), (precision, tp, cp, tokens)


def test_a_steps_record_counts_the_samples_and_real_tokens_its_rows_hold() -> None:
    spec = make_spec(*SMALL, "seq_length=1024", "mbs=2", "data.packing_buffer=12")
    batches = build_batches(spec, rank=0, world_size=1)
    rows = Packer(fresh_stream(spec), spec.packed_row_length, 12, spec.collate_padding_multiple)
    for step in range(3):
        stats = BatchStats()
        for _ in range(2):  # two micro-batches a step, summed as the torch engine sums them
            stats += next(batches).stats
        record = StepRecord.measured(
            stats, step=step, rank=0, warmup=False, time_unix_s=0.0, step_time_s=1.0, loss=None,
            grad_norm=None, lr=None, micro_batches=2, peak_memory_gib=None, memory_kind=None,
            components_s=None, data_wait_s=None,
        )  # fmt: skip
        line = StepRecord.from_json(json.loads(json.dumps(record.to_json())))
        emitted = [next(rows) for _ in range(4)]  # the step's 2 x MBS rows, from a packer of its own
        samples = [sample for row in emitted for sample in row]
        assert line.sequences == 4 and line.samples == len(samples) > 4
        assert line.real_tokens == sum(sample.length for sample in samples)
        assert line.loss_tokens == sum(int((s.labels[1:] != IGNORE_INDEX).sum()) for s in samples)
        assert line.sum_seq_len_squared == sum(sample.length**2 for sample in samples)
        assert line.padded_tokens == 4 * spec.packed_row_length
