"""The batch contract between data sources and engines.

Every data kind yields the same thing: real Qwen3-VL model inputs plus the accounting an
honest throughput figure needs (what was padding, what was text, what was image).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

IGNORE_INDEX = -100  # labels that carry no loss


@dataclass
class BatchStats:
    sequences: int
    padded_tokens: int  # positions computed: sequences x seq_length, padding included
    real_tokens: int  # non-padding positions: text + image placeholder tokens
    text_tokens: int
    image_tokens: int  # merged visual tokens placed in the sequence
    loss_tokens: int  # labels != IGNORE_INDEX
    images: int
    vision_patches: int  # ViT patches before the spatial merge
    sum_seq_len_squared: int  # sum over sequences of real length^2 (causal attention FLOPs)
    sum_patches_squared: int  # sum over images of patches^2 (ViT attention FLOPs)
    skipped_samples: int = 0  # bad samples dropped (with a warning) while building this batch

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass
class Batch:
    input_ids: torch.Tensor  # [mbs, seq_length] int64
    attention_mask: torch.Tensor  # [mbs, seq_length] 1 = real token
    labels: torch.Tensor  # [mbs, seq_length], IGNORE_INDEX on padding and image tokens
    mm_token_type_ids: torch.Tensor  # [mbs, seq_length] 1 on image placeholder tokens
    pixel_values: torch.Tensor | None  # [total_patches, C x T x P x P]
    image_grid_thw: torch.Tensor | None  # [images, 3]
    stats: BatchStats

    def model_inputs(self) -> dict[str, torch.Tensor]:
        inputs = {
            "input_ids": self.input_ids,
            "attention_mask": self.attention_mask,
            "labels": self.labels,
            "mm_token_type_ids": self.mm_token_type_ids,
        }
        if self.pixel_values is not None:
            inputs["pixel_values"] = self.pixel_values
            inputs["image_grid_thw"] = self.image_grid_thw  # type: ignore[assignment]
        return inputs
