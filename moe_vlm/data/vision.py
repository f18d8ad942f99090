"""The Qwen3-VL image path shared by every data kind: transformers' own image processor.

Built offline from constructor arguments (no hub download): resize each image to a
multiple of patch_size x merge_size within [min_pixels, max_pixels], patchify, and return
pixel_values [patches, C x T x P x P] and image_grid_thw [images, 3]. One image becomes
t x h x w ViT patches and t x h x w / merge^2 placeholder tokens in the sequence.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from moe_vlm.config.schema import DataConfig, ModelConfig

# Qwen3-VL normalises with mean = std = 0.5 (Qwen2-VL used the CLIP statistics).
QWEN3_VL_IMAGE_MEAN = (0.5, 0.5, 0.5)
QWEN3_VL_IMAGE_STD = (0.5, 0.5, 0.5)


@dataclass(frozen=True)
class ProcessedImages:
    pixel_values: torch.Tensor  # [sum of patches, C x T x P x P] float32
    image_grid_thw: torch.Tensor  # [images, 3] int64
    original_hw: list[tuple[int, int]]
    resized_hw: list[tuple[int, int]]

    @property
    def patches_per_image(self) -> list[int]:
        return [int(n) for n in self.image_grid_thw.prod(dim=-1).tolist()]


class ImagePreprocessor:
    """Qwen2VLImageProcessor (the class Qwen3-VL's processor uses) configured from the RunSpec."""

    def __init__(self, model: ModelConfig, data: DataConfig) -> None:
        self.patch_size = model.vision_patch_size
        self.temporal_patch_size = model.vision_temporal_patch_size
        self.merge_size = model.vision_spatial_merge_size
        self.min_pixels = data.min_pixels
        self.max_pixels = data.max_pixels
        # transformers' image processor only where images are processed: importing it (torchvision,
        # torch._dynamo) costs seconds that a plan or a one-line input error must not pay.
        from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor

        self.processor = Qwen2VLImageProcessor(
            patch_size=self.patch_size,
            temporal_patch_size=self.temporal_patch_size,
            merge_size=self.merge_size,
            # An explicit size dict: the class default is shared and mutated by __init__.
            size={"shortest_edge": self.min_pixels, "longest_edge": self.max_pixels},
            image_mean=list(QWEN3_VL_IMAGE_MEAN),
            image_std=list(QWEN3_VL_IMAGE_STD),
        )

    def tokens_per_image(self, grid_thw: torch.Tensor) -> list[int]:
        return [int(n) // (self.merge_size**2) for n in grid_thw.prod(dim=-1).tolist()]

    def resized_hw(self, height: int, width: int) -> tuple[int, int]:
        """The processor's own resize arithmetic (raises ValueError past a 200:1 aspect ratio)."""
        from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize  # see __init__

        return smart_resize(
            height,
            width,
            factor=self.patch_size * self.merge_size,
            min_pixels=self.min_pixels,
            max_pixels=self.max_pixels,
        )

    def __call__(self, images: list[torch.Tensor]) -> ProcessedImages:
        """images: uint8 [3, H, W] tensors. Raises ValueError for an image the processor rejects."""
        out = self.processor(images=images, return_tensors="pt")
        grid = out["image_grid_thw"].to(torch.long)
        resized = [(int(h) * self.patch_size, int(w) * self.patch_size) for _, h, w in grid.tolist()]
        return ProcessedImages(
            pixel_values=out["pixel_values"],
            image_grid_thw=grid,
            original_hw=[(int(image.shape[-2]), int(image.shape[-1])) for image in images],
            resized_hw=resized,
        )


def image_tokens_for(model: ModelConfig, data: DataConfig, height: int, width: int) -> int:
    """Placeholder tokens one height x width image becomes (t = 1 for a still image)."""
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize  # see ImagePreprocessor

    factor = model.vision_patch_size * model.vision_spatial_merge_size
    resized_h, resized_w = smart_resize(
        height, width, factor=factor, min_pixels=data.min_pixels, max_pixels=data.max_pixels
    )
    return (resized_h // factor) * (resized_w // factor)
