"""Data rules (A...)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

from moe_vlm.data.stats import MOCK_SPEEDUP_NOTE
from moe_vlm.rules.catalogue import (
    Level,
    Violation,
    rule,
)
from moe_vlm.schema import (
    DataKind,
    Engine,
)
from moe_vlm.spec import RunSpec


@rule("A001", Level.error, "real data needs a path")
def _real_path(spec: RunSpec) -> Iterator[Violation]:
    if spec.data.kind is DataKind.real and not spec.data.path:
        yield Violation(
            ("data.path",),
            "data=real needs the directory of WebDataset shards.",
            "add data.path=DIR (build one with scripts/build_dataset.py).",
        )


@rule("A002", Level.error, "synthetic ranges are ordered")
def _synthetic_ranges(spec: RunSpec) -> Iterator[Violation]:
    d = spec.data
    pairs = {
        "images": (d.min_images, d.max_images),
        "long_side_px": (d.min_long_side_px, d.max_long_side_px),
        "text_tokens": (d.min_text_tokens, d.max_text_tokens),
        "pixels": (d.min_pixels, d.max_pixels),
    }
    for name, (low, high) in pairs.items():
        if low < 0 or high < low:
            yield Violation(
                (f"data.min_{name}", f"data.max_{name}"),
                f"data.min_{name}={low} / data.max_{name}={high} is not a valid range.",
                f"use 0 <= data.min_{name} <= data.max_{name}.",
            )


@rule("A003", Level.error, "in-batch packing needs MBS >= 2 (MB ConfigContainer)")
def _packing_mbs(spec: RunSpec) -> Iterator[Violation]:
    # Bridge packs the sequences of one micro-batch together (enable_in_batch_packing): with one
    # sequence per micro-batch there is nothing to pack, and ConfigContainer.validate rejects it.
    # Only Energon's config carries the field (data=real); A008 rejects packing on this engine anyway.
    if (
        spec.engine == Engine.megatron
        and spec.data.kind is DataKind.real
        and spec.data.pack_sequences
        and spec.mbs < 2
    ):
        yield Violation(
            ("data.pack_sequences", "mbs"),
            f"data.pack_sequences=true packs the sequences of one micro-batch; mbs={spec.mbs} has nothing "
            "to pack.",
            "set mbs=2 or more, or data.pack_sequences=false.",
        )


@rule("A004", Level.warning, "mock data is not a performance proxy")
def _mock_data(spec: RunSpec) -> Iterator[Violation]:
    if spec.data.kind is DataKind.mock:
        yield Violation(
            ("data",),
            f"{MOCK_SPEEDUP_NOTE}; its throughput is labelled mock and never ranked with real results.",
            "use data=synthetic or data=real before drawing throughput conclusions.",
        )
    elif spec.data.kind is DataKind.bridge_mock:
        yield Violation(
            ("data",),
            "data=bridge_mock is Bridge's perf-recipe workload: one 256x256 noise image and a few dozen text "
            f"tokens per sample (222-241 real tokens), padded to seq_length={spec.seq_length}; it reproduces "
            "the vendor's number, and is labelled mock and never ranked with real results.",
            "switch to data=synthetic or data=real (and router=real) before drawing throughput conclusions.",
        )


@rule("A005", Level.error, "real data path is an Energon-prepared WebDataset")
def _real_dataset_dir(spec: RunSpec) -> Iterator[Violation]:
    # Only what a directory listing shows; shards are opened and checked by data.check_data.
    path = spec.data.path
    if spec.data.kind is not DataKind.real or not path:
        return
    meta = Path(path).expanduser() / ".nv-meta"
    has_info = (meta / ".info.yaml").is_file() or (meta / ".info.json").is_file()
    if not Path(path).expanduser().is_dir():
        yield Violation(
            ("data.path",),
            f"data.path={path} does not exist.",
            "build a dataset with `python scripts/build_dataset.py --skimage DIR` and set data.path=DIR.",
        )
    elif not (has_info and (meta / "split.yaml").is_file()):
        yield Violation(
            ("data.path",),
            f"data.path={path} is not an Energon-prepared WebDataset (no .nv-meta/.info.yaml, split.yaml).",
            "build it with scripts/build_dataset.py (or run `energon prepare` on the shards).",
        )


def _image_tokens_bounds(spec: RunSpec) -> tuple[int, int]:
    """Fewest and most placeholder tokens one image can become.

    The Qwen-VL resize keeps height x width within [min_pixels, max_pixels] in multiples of
    patch x merge, so tokens = pixels / (patch x merge)^2 lies within these bounds.
    """
    factor = spec.model.vision_patch_size * spec.model.vision_spatial_merge_size
    return math.ceil(spec.data.min_pixels / factor**2), max(spec.data.max_pixels // factor**2, 1)


@rule("A006", Level.error, "the smallest image sample fits seq_length")
def _smallest_sample_fits(spec: RunSpec) -> Iterator[Violation]:
    if spec.data.kind is DataKind.mock:
        return
    images = spec.data.min_images if spec.data.kind is DataKind.synthetic else 1
    fewest, _ = _image_tokens_bounds(spec)
    needed = images * (fewest + 2) + 1  # vision_start/end per image, and one text token
    if images > 0 and needed > spec.seq_length:
        yield Violation(
            ("seq_length", "data.min_pixels"),
            f"even the smallest sample ({images} image(s) of >= {fewest} tokens at data.min_pixels="
            f"{spec.data.min_pixels}) needs {needed} tokens, more than seq_length={spec.seq_length}: "
            "every sample would be skipped (image tokens are never cut).",
            f"raise seq_length to {needed} or more, or lower data.min_pixels.",
        )


@rule("A007", Level.warning, "the largest synthetic images fit seq_length")
def _largest_sample_fits(spec: RunSpec) -> Iterator[Violation]:
    if spec.data.kind is not DataKind.synthetic:
        return
    _, most = _image_tokens_bounds(spec)
    needed = spec.data.max_images * (most + 2) + 1
    if spec.data.max_images > 0 and needed > spec.seq_length:
        yield Violation(
            ("seq_length", "data.max_images", "data.max_pixels"),
            f"{spec.data.max_images} image(s) at data.max_pixels={spec.data.max_pixels} need up to {needed} "
            f"tokens, more than seq_length={spec.seq_length}: such samples are skipped (counted in "
            "run.json data.stats.skipped_samples), which skews the image-size distribution.",
            f"raise seq_length to {needed}, or lower data.max_images / data.max_pixels.",
        )


@rule("A008", Level.error, "the Megatron engine does not pack sequences")
def _no_packing_on_megatron(spec: RunSpec) -> Iterator[Violation]:
    # Qwen3-VL defers packing to its step (defer_in_batch_packing_to_step), so the collate packs
    # nothing (data/builders/energon.py:203, data/datasets/direct_sft.py:91) and the step builds one
    # cu_seqlens segment per padded row (models/qwen_vl/qwen3_vl_step.py:192-197): rows never hold
    # two samples and no padding is saved, yet the batch turns THD with variable_seq_lengths.
    if spec.engine == Engine.megatron and spec.data.pack_sequences:
        yield Violation(
            ("data.pack_sequences",),
            "data.pack_sequences=true never packs on the Megatron engine: Bridge's Qwen3-VL step keeps one "
            "sample per row (models/qwen_vl/qwen3_vl_step.py:192-197) and only switches the batch to "
            "variable-length THD, which changes the workload without saving padding.",
            "set data.pack_sequences=false (engine=torch packs for real).",
        )


@rule("A009", Level.warning, "Megatron data loading runs outside the timed step")
def _loader_on_training_thread(spec: RunSpec) -> Iterator[Violation]:
    # Bridge's DataLoader with num_workers=0 builds each batch inside next(data_iterator), which
    # qwen3_vl_step calls inside the step (models/qwen_vl/qwen3_vl_step.py:60, 240-250).
    if spec.engine == Engine.megatron and spec.data.num_workers == 0:
        yield Violation(
            ("data.num_workers",),
            "data.num_workers=0: the Qwen image processor and the collate run on the training thread inside "
            "every step, so step times measure data preparation too (data_wait_s records how much).",
            "leave data.num_workers unset (null: from the CPUs per rank) or set it to 1 or more.",
        )
