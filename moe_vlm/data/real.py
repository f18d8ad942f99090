"""Real data: image-text samples from Energon-layout WebDataset shards (see energon.py).

Data-parallel sharding as Energon does it: the split's samples, in shard order, are cut
into world_size contiguous, disjoint slices; rank r reads slice r, in an order reshuffled
every epoch from (seed, rank, epoch). A sample whose image does not decode, or that has no
image or no text, is skipped with a warning naming `shard/key`; a missing, empty or
corrupt shard stops the run with a DataError.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from moe_vlm.data.energon import IMAGE_PARTS, SampleLocation, ShardSample, index_shard, read_meta, read_sample
from moe_vlm.data.errors import DataError, NoUsableSamples
from moe_vlm.data.sequence import RawSample, SkippedSample
from moe_vlm.data.tokenizer import ByteTokenizer

REAL_STREAM = 104_729


def rank_slice(total: int, rank: int, world_size: int) -> range:
    return range(total * rank // world_size, total * (rank + 1) // world_size)


def rank_locations(path: Path, rank: int, world_size: int) -> list[SampleLocation]:
    """This rank's samples: a contiguous slice of the train split, disjoint from every other rank's."""
    meta = read_meta(path)
    mine = rank_slice(meta.total_samples, rank, world_size)
    if meta.total_samples < world_size:
        raise DataError(
            f"data.path={path}: {meta.total_samples} samples cannot feed {world_size} data-parallel ranks "
            "(a rank would get none). Fix: build a larger dataset or use fewer ranks."
        )
    locations: list[SampleLocation] = []
    first = 0
    for shard in meta.shards:
        if first + shard.count > mine.start and first < mine.stop:
            in_shard = index_shard(shard)
            locations += in_shard[max(mine.start - first, 0) : mine.stop - first]
        first += shard.count
    return locations


def _caption(sample: ShardSample) -> str:
    if "txt" in sample.parts:
        return sample.parts["txt"].decode("utf-8").strip()
    if "json" in sample.parts:
        payload = json.loads(sample.parts["json"])
        if isinstance(payload, dict):
            return str(payload.get("caption") or payload.get("text") or "").strip()
        if isinstance(payload, list) and payload:
            # A LLaVA-style conversation: the answer is the last turn.
            return str(payload[-1].get("value") or payload[-1].get("content") or "").strip()
    return ""


def decode(sample: ShardSample, tokenizer: ByteTokenizer) -> RawSample | SkippedSample:
    image_part = next((part for part in IMAGE_PARTS if part in sample.parts), None)
    if image_part is None:
        return SkippedSample(sample.full_key, f"no image member ({'/'.join(IMAGE_PARTS)})")
    try:
        caption = _caption(sample)
    except (UnicodeDecodeError, ValueError, AttributeError) as exc:
        return SkippedSample(sample.full_key, f"text does not decode: {exc}")
    if not caption:
        return SkippedSample(sample.full_key, "sample has no text")
    try:
        with Image.open(io.BytesIO(sample.parts[image_part])) as image:
            rgb = np.asarray(image.convert("RGB"))
    except (OSError, ValueError, Image.DecompressionBombError) as exc:
        return SkippedSample(sample.full_key, f"image does not decode: {exc}")
    pixels = torch.from_numpy(rgb.copy()).permute(2, 0, 1).contiguous()
    return RawSample(key=sample.full_key, images=[pixels], text_ids=tokenizer.encode(caption))


def real_samples(
    locations: list[SampleLocation], tokenizer: ByteTokenizer, seed: int, rank: int
) -> Iterator[RawSample | SkippedSample]:
    """Endless: this rank's slice (from rank_locations), reshuffled every epoch."""
    if not locations:  # an empty epoch would repeat forever without yielding
        raise NoUsableSamples(f"data=real: rank {rank} has no samples to read. Fix: check data.path.")
    epoch = 0
    while True:
        generator = torch.Generator().manual_seed((seed * 1000 + rank) * REAL_STREAM + epoch)
        for index in torch.randperm(len(locations), generator=generator).tolist():
            yield decode(read_sample(locations[index]), tokenizer)
        epoch += 1
