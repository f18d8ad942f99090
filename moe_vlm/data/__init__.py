"""Data sources: mock (image-free), synthetic (realistic images from the seed), real (shards)."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from moe_vlm.data.batch import IGNORE_INDEX, Batch, BatchStats
from moe_vlm.schema import DataKind
from moe_vlm.spec import RunSpec


def build_batches(spec: RunSpec, rank: int, world_size: int) -> Iterator[Batch]:
    """Endless micro-batches of MBS samples for one data-parallel rank, deterministic from the seed."""
    if spec.data.kind is DataKind.mock:
        return _mock_batches(spec, rank)
    raise NotImplementedError(f"data={spec.data.kind.value} is not implemented yet")


def _mock_batches(spec: RunSpec, rank: int) -> Iterator[Batch]:
    # Image-free text like Bridge's MockVLMSFTDatasetConfig(num_images=0): what mock data really is.
    generator = torch.Generator().manual_seed(spec.seed * 1000 + rank)
    vocab_text = min(256, spec.model.vocab_size)
    mbs, seq = spec.mbs, spec.seq_length
    while True:
        lengths = torch.randint(seq // 2, seq + 1, (mbs,), generator=generator)
        input_ids = torch.full((mbs, seq), spec.model.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((mbs, seq), dtype=torch.long)
        for row, length in enumerate(lengths.tolist()):
            input_ids[row, :length] = torch.randint(0, vocab_text, (length,), generator=generator)
            attention_mask[row, :length] = 1
        labels = input_ids.masked_fill(attention_mask == 0, IGNORE_INDEX)
        real = int(attention_mask.sum())
        yield Batch(
            input_ids=input_ids,
            attention_mask=attention_mask,
            labels=labels,
            mm_token_type_ids=torch.zeros_like(input_ids, dtype=torch.int32),
            pixel_values=None,
            image_grid_thw=None,
            stats=BatchStats(
                sequences=mbs,
                padded_tokens=mbs * seq,
                real_tokens=real,
                text_tokens=real,
                image_tokens=0,
                loss_tokens=int((labels != IGNORE_INDEX).sum()),
                images=0,
                vision_patches=0,
                sum_seq_len_squared=int((lengths**2).sum()),
                sum_patches_squared=0,
            ),
        )
