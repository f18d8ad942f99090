"""The shape of the data a run consumed: what goes into run.json["data"]["stats"].

    stats = DataStats()
    for batch in batches: stats.add(batch)
    stats.merge(other_rank_stats)      # DataStats pickles, so ranks can gather them
    stats.to_dict()

Everything a reader needs to tell mock from real work: samples, images per sample, image
resolutions before and after the processor's resize, ViT patches before and after the
spatial merge, text tokens, padding. Mock data is labelled image-free in the record itself.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the rules read the constants below without importing torch
    from moe_vlm.data.batch import Batch

MOCK_NOTE = "image-free mock data: no vision work, not a performance proxy for a VLM"
# How much faster image-free mock runs came out than real multimodal input: the one statement of it.
MOCK_SPEEDUP = "about 2x"
MOCK_SPEEDUP_NOTE = f"image-free mock data ran {MOCK_SPEEDUP} faster than real multimodal input"
TOP_RESOLUTIONS = 10


@dataclass
class Spread:
    """Running min / mean / max of a per-item quantity."""

    count: int = 0
    total: float = 0.0
    minimum: float | None = None
    maximum: float | None = None

    def add(self, value: float) -> None:
        self.count += 1
        self.total += value
        self.minimum = value if self.minimum is None else min(self.minimum, value)
        self.maximum = value if self.maximum is None else max(self.maximum, value)

    def merge(self, other: Spread) -> None:
        if other.count == 0:
            return
        self.count += other.count
        self.total += other.total
        assert other.minimum is not None and other.maximum is not None
        self.minimum = other.minimum if self.minimum is None else min(self.minimum, other.minimum)
        self.maximum = other.maximum if self.maximum is None else max(self.maximum, other.maximum)

    def to_dict(self) -> dict[str, float | None]:
        mean = self.total / self.count if self.count else None
        return {"min": self.minimum, "mean": None if mean is None else round(mean, 2), "max": self.maximum}


@dataclass
class _Resolutions:
    long_side_px: Spread = field(default_factory=Spread)
    pixels: Spread = field(default_factory=Spread)
    counts: Counter[str] = field(default_factory=Counter)  # "HxW" -> images

    def add(self, height: int, width: int) -> None:
        self.long_side_px.add(max(height, width))
        self.pixels.add(height * width)
        self.counts[f"{height}x{width}"] += 1

    def merge(self, other: _Resolutions) -> None:
        self.long_side_px.merge(other.long_side_px)
        self.pixels.merge(other.pixels)
        self.counts.update(other.counts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "long_side_px": self.long_side_px.to_dict(),
            "pixels": self.pixels.to_dict(),
            "distinct": len(self.counts),
            "most_common_hxw": dict(self.counts.most_common(TOP_RESOLUTIONS)),
        }


@dataclass
class DataStats:
    kind: str = ""  # taken from the batches; mixing kinds is an error
    batches: int = 0
    sequences: int = 0
    samples: int = 0
    skipped_samples: int = 0
    images: int = 0
    images_per_sample: Counter[int] = field(default_factory=Counter)  # images in a sample -> samples
    original: _Resolutions = field(default_factory=_Resolutions)
    resized: _Resolutions = field(default_factory=_Resolutions)
    patches_per_image: Spread = field(default_factory=Spread)  # ViT patches, before the merge
    vision_patches: int = 0
    merged_patches: int = 0  # after the spatial merge = image placeholder tokens
    text_tokens: int = 0  # text ids, vision_start/vision_end markers excluded
    vision_marker_tokens: int = 0
    truncated_text_tokens: int = 0
    real_tokens: int = 0
    padded_tokens: int = 0
    loss_tokens: int = 0
    sum_seq_len_squared: int = 0
    sum_patches_squared: int = 0

    def _check_kind(self, kind: str) -> None:
        if self.kind and kind and kind != self.kind:
            raise ValueError(f"DataStats mixes data kinds {self.kind!r} and {kind!r}; keep one per run")
        self.kind = self.kind or kind

    def add(self, batch: Batch) -> None:
        self._check_kind(batch.data_kind)
        s = batch.stats
        self.batches += 1
        self.sequences += s.sequences
        self.samples += s.samples
        self.skipped_samples += s.skipped_samples
        self.images += s.images
        self.images_per_sample.update(batch.images_per_sample)
        for height, width in batch.image_original_hw:
            self.original.add(height, width)
        for height, width in batch.image_resized_hw:
            self.resized.add(height, width)
        if batch.image_grid_thw is not None:
            for patches in batch.image_grid_thw.prod(dim=-1).tolist():
                self.patches_per_image.add(int(patches))
        self.vision_patches += s.vision_patches
        self.merged_patches += s.image_tokens
        self.text_tokens += s.text_tokens - s.vision_marker_tokens
        self.vision_marker_tokens += s.vision_marker_tokens
        self.truncated_text_tokens += s.truncated_text_tokens
        self.real_tokens += s.real_tokens
        self.padded_tokens += s.padded_tokens
        self.loss_tokens += s.loss_tokens
        self.sum_seq_len_squared += s.sum_seq_len_squared
        self.sum_patches_squared += s.sum_patches_squared

    def merge(self, other: DataStats) -> None:
        self._check_kind(other.kind)
        for name in (
            "batches", "sequences", "samples", "skipped_samples", "images", "vision_patches",
            "merged_patches", "text_tokens", "vision_marker_tokens", "truncated_text_tokens",
            "real_tokens", "padded_tokens", "loss_tokens", "sum_seq_len_squared", "sum_patches_squared",
        ):  # fmt: skip
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.images_per_sample.update(other.images_per_sample)
        self.original.merge(other.original)
        self.resized.merge(other.resized)
        self.patches_per_image.merge(other.patches_per_image)

    def to_dict(self) -> dict[str, Any]:
        padding = self.padded_tokens - self.real_tokens
        per_sample = {str(n): count for n, count in sorted(self.images_per_sample.items())}
        record: dict[str, Any] = {
            "kind": self.kind,
            "image_free": self.images == 0,
            "batches": self.batches,
            "sequences": self.sequences,
            "samples": self.samples,
            "skipped_samples": self.skipped_samples,
            "images": self.images,
            "images_per_sample": {
                "mean": round(self.images / self.samples, 3) if self.samples else None,
                "histogram": per_sample,
            },
            "image_resolution_original": self.original.to_dict(),
            "image_resolution_resized": self.resized.to_dict(),
            "vision_patches": self.vision_patches,
            "vision_patches_per_image": self.patches_per_image.to_dict(),
            "merged_patches": self.merged_patches,
            "image_tokens": self.merged_patches,
            "text_tokens": self.text_tokens,
            "text_tokens_per_sample": round(self.text_tokens / self.samples, 2) if self.samples else None,
            "vision_marker_tokens": self.vision_marker_tokens,
            "truncated_text_tokens": self.truncated_text_tokens,
            "real_tokens": self.real_tokens,
            "padded_tokens": self.padded_tokens,
            "padding_tokens": padding,
            "padding_fraction": round(padding / self.padded_tokens, 4) if self.padded_tokens else None,
            "image_token_fraction": round(self.merged_patches / self.real_tokens, 4)
            if self.real_tokens
            else None,
            "loss_tokens": self.loss_tokens,
            "sum_seq_len_squared": self.sum_seq_len_squared,
            "sum_patches_squared": self.sum_patches_squared,
        }
        if self.kind == "mock":
            record["note"] = MOCK_NOTE
        return record
