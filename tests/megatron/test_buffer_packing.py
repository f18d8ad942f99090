"""data.packing=buffer's rows against Bridge's own THD builder (megatron-bridge 0.6.2, CPU).

Each packed row's samples, handed to build_mcore_thd_sequence_batch_from_rows (data/packing/
in_batch.py:89-215, what Bridge's Qwen-VL collate packs with) with the same alignment multiple, give
the same tokens, the same cu_seqlens and cu_seqlens_padded (ours extend the row's last sample to the
row's end: the fixed row shape) and the same text positions, alignment padding included (Bridge
continues a sample's positions over its padding, :196-205, as packed_position_ids does).
"""

from __future__ import annotations

from itertools import islice

import torch

from moe_vlm.data import indexed_samples
from moe_vlm.data.indexed import rank_indices
from moe_vlm.data.packer import Packer, assemble_rows
from moe_vlm.engines.torch_model import build_model, packed_position_ids
from tests.conftest import make_spec
from tests.megatron.conftest import needs_stack

pytestmark = needs_stack

ROW, MULTIPLE = 1024, 8


def test_buffer_rows_match_bridges_thd_builder() -> None:
    from megatron.bridge.data.packing.in_batch import build_mcore_thd_sequence_batch_from_rows

    spec = make_spec(
        "data=synthetic", "data.max_long_side_px=480", "data.max_text_tokens=96", "seq_length=1024"
    )
    source = indexed_samples(spec.model, spec.data, spec.seed, spec.seq_length)
    samples = list(islice(source.stream(rank_indices(0, 1, 1)), 16))
    packer = Packer(iter(samples), ROW, buffer=16, sample_multiple=MULTIPLE)
    rows = [next(packer) for _ in range(2)]
    pad = spec.model.pad_token_id
    batch = assemble_rows(rows, ROW, MULTIPLE, pad, "synthetic")
    model = build_model(spec.model, spec.recompute, torch.device("cpu"), seed=0)
    positions = packed_position_ids(model, batch)
    assert batch.cu_seqlens is not None and batch.cu_seqlens_padded is not None
    real, padded = batch.cu_seqlens.tolist(), batch.cu_seqlens_padded.tolist()
    first = 0
    for r, row in enumerate(rows):
        assert len(row) >= 2  # a packed row, or the boundaries below say nothing
        theirs = build_mcore_thd_sequence_batch_from_rows(
            [{"input_ids": s.input_ids, "position_ids": torch.arange(s.length)} for s in row],
            sequence_length=ROW,
            pad_token_id=pad,
            pad_to_multiple_of=MULTIPLE,
        )
        ours_real = [b - real[first] for b in real[first : first + len(row) + 1]]
        ours_padded = [b - r * ROW for b in padded[first : first + len(row) + 1]]
        first += len(row)
        assert theirs["cu_seqlens_q"].tolist() == ours_real
        their_padded = theirs["cu_seqlens_q_padded"].tolist()
        assert their_padded[:-1] == ours_padded[:-1] and ours_padded[-1] == ROW >= their_padded[-1]
        total = their_padded[-1]
        assert torch.equal(batch.input_ids[r, :total], theirs["input_ids"][0])
        assert torch.equal(positions[0, r, :total], theirs["position_ids"][0].to(positions.dtype))
