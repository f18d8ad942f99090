"""ViT patches per micro-batch: the image budget of each data kind, and Qwen2-VL's resize rule.

`resized_pixels` re-implements transformers' smart_resize so that planning stays light
(tests/unit/test_memory.py checks it against the real function).
"""

from __future__ import annotations

import functools
import io
import math
from dataclasses import dataclass
from pathlib import Path

from moe_vlm.config.schema import DataKind
from moe_vlm.config.spec import RunSpec
from moe_vlm.data.bridge_mock import BRIDGE_MOCK
from moe_vlm.perf.memory.estimate import REAL_DATA_SAMPLES_READ


@dataclass(frozen=True)
class ImageBudget:
    patches: int  # ViT patches in the largest micro-batch this estimate plans for
    images: int
    max_patches_per_image: int
    source: str  # where the figure comes from, in words


def _round_to(value: float, factor: int) -> int:
    return max(factor, round(value / factor) * factor)


def resized_pixels(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Qwen2-VL's smart_resize: multiples of `factor`, area clamped to [min_pixels, max_pixels]."""
    h_bar, w_bar = _round_to(height, factor), _round_to(width, factor)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def patches_for_image(spec: RunSpec, height: int, width: int) -> int:
    model, data = spec.model, spec.data
    factor = model.vision_patch_size * model.vision_spatial_merge_size
    h_bar, w_bar = resized_pixels(height, width, factor, data.min_pixels, data.max_pixels)
    return (h_bar // model.vision_patch_size) * (w_bar // model.vision_patch_size)


def _synthetic_largest_image(spec: RunSpec) -> int:
    data = spec.data
    largest = 0
    for ratio in data.aspect_ratios or [1.0]:
        long_side = data.max_long_side_px
        if ratio >= 1.0:
            height, width = max(1, round(long_side / ratio)), long_side
        else:
            height, width = long_side, max(1, round(long_side * ratio))
        largest = max(largest, patches_for_image(spec, height, width))
    return largest


@functools.lru_cache(maxsize=16)
def real_image_sizes(path: str, samples: int) -> tuple[tuple[int, int], ...]:
    """(height, width) from the image headers of the first `samples` samples (nothing decoded)."""
    from PIL import Image

    from moe_vlm.data.energon import IMAGE_PARTS, iter_samples, read_meta

    sizes: list[tuple[int, int]] = []
    for sample in iter_samples(read_meta(Path(path).expanduser())):
        part = next((p for p in IMAGE_PARTS if p in sample.parts), None)
        if part is not None:
            with Image.open(io.BytesIO(sample.parts[part])) as image:
                width, height = image.size
            sizes.append((height, width))
        if len(sizes) >= samples:
            break
    return tuple(sizes)


def image_budget(spec: RunSpec) -> ImageBudget:
    """ViT patches of the largest micro-batch the data kind can produce.

    A sample's image tokens must fit seq_length (the collator skips samples whose images do
    not), so a row holds at most merge^2 x seq_length patches whatever the distribution says.
    """
    data, model = spec.data, spec.model
    merge = model.vision_spatial_merge_size**2
    row_cap = merge * max(spec.seq_length - 1, 0)
    if data.kind is DataKind.mock:
        return ImageBudget(0, 0, 0, "mock data: no images")
    if data.kind is DataKind.bridge_mock:
        width, height = BRIDGE_MOCK.image_size
        per_image = patches_for_image(spec, height, width)
        per_row = min(per_image, row_cap)
        return ImageBudget(
            spec.mbs * per_row,
            spec.mbs,
            per_image,
            f"bridge_mock: one {width}x{height} image/sample -> {per_image} patches",
        )
    if data.kind is DataKind.synthetic:
        per_image = _synthetic_largest_image(spec)
        images = data.max_images
        source = (
            f"synthetic worst case: {images} image(s)/sample x {per_image} patches "
            f"({data.max_long_side_px} px long side, max_pixels={data.max_pixels})"
        )
    else:
        sizes: tuple[tuple[int, int], ...] = ()
        if data.path:
            try:
                sizes = real_image_sizes(str(data.path), REAL_DATA_SAMPLES_READ)
            except Exception:  # unreadable here (planning on a login node): fall back to the bound
                sizes = ()
        if sizes:
            per_image = max(patches_for_image(spec, h, w) for h, w in sizes)
            source = f"real data: largest of {len(sizes)} image headers in {data.path} -> {per_image} patches"
        else:
            per_image = data.max_pixels // model.vision_patch_size**2
            source = (
                f"real data without readable statistics: max_pixels={data.max_pixels} -> {per_image} patches"
            )
        images = 1  # one image per sample in the Energon captioning layout
    per_row = min(images * per_image, row_cap)
    return ImageBudget(spec.mbs * per_row, spec.mbs * images, per_image, source)
