"""data.packing=buffer: rows of several samples each, packed first-fit-decreasing from a buffer.

In-batch packing joins the MBS samples of one micro-batch; at MBS 1 it joins nothing. The packer
instead holds a buffer of ``data.packing_buffer`` encoded samples (each rank its own, from its own
sample stream), sorts them by their exact token length (text and image placeholders after the
Qwen3-VL processor, what SampleEncoder produced) and places each, longest first, into the first row
with room left (first-fit-decreasing). Every row of the buffer is emitted, in the order FFD opened
them; then the buffer refills. A micro-batch is MBS such rows, so GBS counts rows and a step's
samples vary (the records count samples and tokens per step exactly, BatchStats).

Layout (THD, as Megatron's packed sequences): each sample is padded to ``sample_multiple`` (the
collate padding multiple: CP's load-balanced split, SP's), the last sample of a row to the row's
end; rows are ``row_length`` positions (RunSpec.packed_row_length). ``cu_seqlens`` are the real
boundaries over the rows laid end to end, ``cu_seqlens_padded`` the padded ones; every sample's
first label is IGNORE_INDEX (nothing before it in its sample predicts it). The torch engine
restarts positions (mRoPE included) at each padded start (torch_model.packed_position_ids), which
confines attention to each sample; attention_mask is 1 on real tokens only (the router's padding
mask).

Over-length samples follow the one policy of SampleEncoder (data/sequence.py: text cut to fit
seq_length and counted, a sample whose images alone do not fit skipped and counted): every encoded
sample fits a row, so the packer itself drops nothing.

Deterministic: the rows depend only on the sample stream's order (ties in length keep stream
order), so a packer has no state worth saving. The torch engine reruns a requeued point from step 1
with the same rows; the Megatron engine reaches row k of a rank by packing its stream again
(engines/megatron/data.PackedRows), which resumes at Bridge's checkpointed position.
"""

from __future__ import annotations

from collections.abc import Iterator

from moe_vlm.config.schema import Packing
from moe_vlm.data.batch import Batch
from moe_vlm.data.bins import first_fit_decreasing, padded_length
from moe_vlm.data.sequence import EncodedSample, SkipCounter, build_batch


class Packer:
    """Endless packed rows from an endless stream of encoded samples."""

    def __init__(
        self,
        samples: Iterator[EncodedSample],
        row_length: int,
        buffer: int,
        sample_multiple: int = 1,
    ) -> None:
        if buffer < 1 or row_length % sample_multiple:
            raise ValueError(
                f"buffer={buffer} must be >= 1, row_length={row_length} a multiple of {sample_multiple}"
            )
        self.samples = samples
        self.row_length = row_length
        self.buffer = buffer
        self.multiple = sample_multiple
        self.drawn = 0
        self.pending: list[list[tuple[int, EncodedSample]]] = []

    def _fill(self) -> None:
        candidates: list[tuple[int, EncodedSample]] = []
        for _ in range(self.buffer):
            try:
                candidates.append((self.drawn, next(self.samples)))
            except StopIteration:
                break  # only a finite source ends; the data sources themselves repeat forever
            self.drawn += 1
        lengths = [padded_length(sample.length, self.multiple) for _, sample in candidates]
        self.pending = [
            [candidates[i] for i in row] for row in first_fit_decreasing(lengths, self.row_length)
        ]

    def __iter__(self) -> Iterator[list[EncodedSample]]:
        return self

    def __next__(self) -> list[EncodedSample]:
        if not self.pending:
            self._fill()
            if not self.pending:
                raise StopIteration
        return [sample for _, sample in self.pending.pop(0)]


def packed_batches(
    packer: Packer, skips: SkipCounter, mbs: int, pad_token_id: int, data_kind: str
) -> Iterator[Batch]:
    """Micro-batches of `mbs` packed rows; `skips` counts what the stream dropped on the way, and
    each batch counts only what was skipped while building it."""
    skipped_before = skips.total
    while True:
        try:
            rows = [next(packer) for _ in range(mbs)]
        except StopIteration:
            return
        batch = assemble_rows(rows, packer.row_length, packer.multiple, pad_token_id, data_kind)
        batch.stats.skipped_samples = skips.total - skipped_before
        skipped_before = skips.total
        yield batch


def assemble_rows(
    rows: list[list[EncodedSample]], row_length: int, multiple: int, pad_token_id: int, data_kind: str
) -> Batch:
    """len(rows) rows of row_length positions, each holding its samples at padded offsets (THD)."""
    return build_batch(rows, row_length, multiple, Packing.buffer, pad_token_id, data_kind)
