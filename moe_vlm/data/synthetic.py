"""Synthetic data: realistic image payloads without a dataset.

Image counts, sizes, aspect ratios and text lengths are drawn from the configured
distribution (uniform over each range, aspect ratio from data.aspect_ratios), so the
vision encoder sees the patch and token counts it would see on real photographs. Pixels
are random; their values cost the same as a photo's. Sample i is a function of (seed, i)
(see data/indexed.py): the same on both engines, whichever rank or worker draws it.
"""

from __future__ import annotations

import torch

from moe_vlm.config.schema import DataConfig
from moe_vlm.data.indexed import sample_generator
from moe_vlm.data.sequence import RawSample
from moe_vlm.data.tokenizer import BYTE_VOCAB

# Keeps the synthetic stream apart from mock's for the same seed.
SYNTHETIC_STREAM = 7_919


def image_hw(long_side: int, aspect_ratio: float) -> tuple[int, int]:
    """(height, width) of an image with this long side and width/height ratio."""
    if aspect_ratio >= 1.0:
        return max(1, round(long_side / aspect_ratio)), long_side
    return long_side, max(1, round(long_side * aspect_ratio))


def synthetic_sample(data: DataConfig, seed: int, index: int, attempt: int = 0) -> RawSample:
    generator = sample_generator(seed, SYNTHETIC_STREAM, index, attempt)
    ratios = list(data.aspect_ratios) or [1.0]

    def uniform(low: int, high: int) -> int:
        return int(torch.randint(low, high + 1, (1,), generator=generator))

    images = []
    for _ in range(uniform(data.min_images, data.max_images)):
        ratio = ratios[uniform(0, len(ratios) - 1)]
        height, width = image_hw(uniform(data.min_long_side_px, data.max_long_side_px), ratio)
        images.append(torch.randint(0, 256, (3, height, width), dtype=torch.uint8, generator=generator))
    text = torch.randint(
        0, BYTE_VOCAB, (uniform(data.min_text_tokens, data.max_text_tokens),), generator=generator
    )
    key = f"synthetic/{index}" + (f"/redraw{attempt}" if attempt else "")
    return RawSample(key=key, images=images, text_ids=text.tolist())
