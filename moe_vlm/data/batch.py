"""The batch contract between data sources and engines.

Every data kind yields the same thing: real Qwen3-VL model inputs plus the accounting an
honest throughput figure needs (what was padding, what was text, what was image).
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # only annotations need it: BatchStats is imported where torch is not (recording)
    import torch

IGNORE_INDEX = -100  # labels that carry no loss
# Per row, the [start, end) positions of each packed sample, its padding included.
SampleSpans = tuple[tuple[tuple[int, int], ...], ...]


@dataclass
class BatchStats:
    """What a batch holds. The same names count a step (summed over its micro-batches: `+=`), in
    both engines (the Megatron engine's StepStats) and in steps.jsonl (record.StepRecord); all
    zero is the empty sum."""

    sequences: int = 0
    padded_tokens: int = 0  # positions computed: sequences x seq_length, padding included
    real_tokens: int = 0  # non-padding positions: text + image placeholder tokens
    text_tokens: int = 0
    image_tokens: int = 0  # merged visual tokens placed in the sequence
    # labels != IGNORE_INDEX after the next-token shift (a row's first label never counts)
    loss_tokens: int = 0
    images: int = 0
    vision_patches: int = 0  # ViT patches before the spatial merge
    sum_seq_len_squared: int = 0  # sum over sequences of real length^2 (causal attention FLOPs)
    sum_patches_squared: int = 0  # sum over images of patches^2 (ViT attention FLOPs)
    skipped_samples: int = 0  # bad samples dropped (with a warning) while building this batch
    samples: int = 0  # samples in this batch (more than `sequences` when packed)
    vision_marker_tokens: int = 0  # vision_start/vision_end ids; counted in text_tokens
    truncated_text_tokens: int = 0  # text cut from samples longer than seq_length (never image tokens)

    def to_dict(self) -> dict[str, int]:
        return asdict(self)

    def __iadd__(self, other: BatchStats) -> BatchStats:
        for name in BATCH_COUNTS:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        return self


BATCH_COUNTS = tuple(f.name for f in fields(BatchStats))


@dataclass
class Batch:
    input_ids: torch.Tensor  # [mbs, seq_length] int64
    attention_mask: torch.Tensor  # [mbs, seq_length] 1 = real token
    labels: torch.Tensor  # [mbs, seq_length], IGNORE_INDEX on padding and image tokens
    mm_token_type_ids: torch.Tensor  # [mbs, seq_length] 1 on image placeholder tokens
    pixel_values: torch.Tensor | None  # [total_patches, C x T x P x P]
    image_grid_thw: torch.Tensor | None  # [images, 3]
    stats: BatchStats
    data_kind: str = ""  # mock | synthetic | real: carried so no record can lose the label
    sample_keys: list[str] = field(default_factory=list)  # in row order
    images_per_sample: list[int] = field(default_factory=list)  # aligned with sample_keys
    image_original_hw: list[tuple[int, int]] = field(default_factory=list)  # before the processor's resize
    image_resized_hw: list[tuple[int, int]] = field(default_factory=list)  # what the ViT sees
    # data.packing=in_batch: [samples + 1] int32 sample boundaries in the single row; None = padded rows.
    # data.packing=buffer: the THD boundaries of the real tokens over the rows laid end to end.
    cu_seqlens: torch.Tensor | None = None
    # data.packing=buffer: [samples + 1] int32 boundaries of each sample padded to its multiple, the
    # last of a row to the row's end (where sample i starts in the flattened rows); None otherwise.
    cu_seqlens_padded: torch.Tensor | None = None

    @property
    def packed(self) -> bool:
        return self.cu_seqlens is not None

    def padded_bounds(self) -> list[int]:
        """Where each packed sample starts, its padding included, over the rows laid end to end, and
        where the last ends: in_batch has one row of samples back to back (cu_seqlens), buffer the
        padded starts (cu_seqlens_padded)."""
        assert self.cu_seqlens is not None, "a padded batch has one sample per row"
        return (self.cu_seqlens if self.cu_seqlens_padded is None else self.cu_seqlens_padded).tolist()

    def sample_spans(self) -> SampleSpans:
        """Where each sample of a packed micro-batch lies in its row: the spans the torch engine's
        attention keeps to (torch_model._varlen_sdpa). Read on the host from the boundaries the
        packer wrote, once per micro-batch, so no layer waits on the device to find them."""
        rows, row_length = self.input_ids.shape
        bounds = self.padded_bounds()
        assert bounds[-1] == rows * row_length, (
            f"samples cover {bounds[-1]} of {rows} x {row_length} positions"
        )
        spans: list[list[tuple[int, int]]] = [[] for _ in range(rows)]
        for start, end in itertools.pairwise(bounds):
            row = start // row_length
            assert end <= (row + 1) * row_length, f"sample [{start}, {end}) crosses row {row}'s end"
            spans[row].append((start - row * row_length, end - row * row_length))
        return tuple(tuple(row) for row in spans)

    def model_inputs(self) -> dict[str, torch.Tensor]:
        """transformers' keyword arguments. A packed row has no attention_mask: the engine adds the
        position ids that restart at each sample (torch_model.packed_position_ids) and the samples'
        spans (sample_spans), over which its attention runs one sample at a time
        (torch_model._varlen_sdpa)."""
        inputs = {
            "input_ids": self.input_ids,
            "labels": self.labels,
            "mm_token_type_ids": self.mm_token_type_ids,
        }
        if not self.packed:
            inputs["attention_mask"] = self.attention_mask
        if self.pixel_values is not None:
            inputs["pixel_values"] = self.pixel_values
            inputs["image_grid_thw"] = self.image_grid_thw  # type: ignore[assignment]
        return inputs
