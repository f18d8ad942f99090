"""Data sources: mock (image-free), synthetic (realistic images from the seed), real (shards).

Every kind goes through the same path, so token and patch counts are comparable:

    source (mock | synthetic | real)  ->  RawSample (uint8 images + byte-level text ids)
    -> SampleEncoder: Qwen3-VL image processor, placeholder tokens, seq_length policy
    -> collate: pad or pack into MBS rows x seq_length  ->  Batch (+ BatchStats)

torch and transformers are imported on first use, so that scripts/build_dataset.py (which
needs only the shard format in energon.py) starts in a moment.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moe_vlm.data.errors import DataError
from moe_vlm.schema import DataKind

if TYPE_CHECKING:
    from moe_vlm.data.batch import IGNORE_INDEX, Batch, BatchStats
    from moe_vlm.data.stats import DataStats
    from moe_vlm.spec import RunSpec

__all__ = ["IGNORE_INDEX", "Batch", "BatchStats", "DataError", "DataStats", "build_batches", "check_data"]

_LAZY = {
    "IGNORE_INDEX": "moe_vlm.data.batch",
    "Batch": "moe_vlm.data.batch",
    "BatchStats": "moe_vlm.data.batch",
    "DataStats": "moe_vlm.data.stats",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def build_batches(spec: RunSpec, rank: int, world_size: int) -> Iterator[Batch]:
    """Endless micro-batches of MBS rows for one data-parallel rank, deterministic from the seed.

    rank / world_size are data-parallel coordinates. Everything that can be checked up
    front (tokenizer ids, dataset path, metadata, this rank's shards) is checked here, so a
    DataError is raised by this call, not at the first batch.
    """
    from moe_vlm.data.mock import mock_samples
    from moe_vlm.data.real import rank_locations, real_samples
    from moe_vlm.data.sequence import RawSample, SampleEncoder, SkippedSample, collate
    from moe_vlm.data.synthetic import synthetic_samples
    from moe_vlm.data.tokenizer import ByteTokenizer
    from moe_vlm.data.vision import ImagePreprocessor

    tokenizer = ByteTokenizer(spec.model)
    encoder = SampleEncoder(tokenizer, ImagePreprocessor(spec.model, spec.data), spec.seq_length)
    kind = spec.data.kind
    samples: Iterator[RawSample | SkippedSample]
    if kind is DataKind.mock:
        samples = mock_samples(spec.seed, rank, spec.seq_length)
    elif kind is DataKind.synthetic:
        samples = synthetic_samples(spec.data, spec.seed, rank)
    else:
        samples = real_samples(rank_locations(_real_path(spec), rank, world_size), tokenizer, spec.seed, rank)
    return collate(samples, encoder, spec.mbs, spec.data.pack_sequences, spec.model.pad_token_id, kind.value)


def check_data(spec: RunSpec) -> None:
    """Raise DataError (one line) when the configured data cannot be read: a pre-flight check.

    Checks the tokenizer ids against the model and, for data=real, the metadata and the tar
    headers of every shard each data-parallel rank would read. No image is decoded.
    """
    from moe_vlm.data.real import rank_locations
    from moe_vlm.data.tokenizer import ByteTokenizer

    ByteTokenizer(spec.model)
    if spec.data.kind is DataKind.real:
        dp = max(spec.layout.dp, 1)
        for rank in range(dp):
            rank_locations(_real_path(spec), rank, dp)


def _real_path(spec: RunSpec) -> Path:
    if not spec.data.path:
        raise DataError(
            "data=real needs data.path=DIR. Fix: build one with scripts/build_dataset.py --skimage DIR."
        )
    return Path(spec.data.path).expanduser()
