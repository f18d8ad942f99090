"""Data sources: mock (image-free), synthetic (realistic images from the seed), real (shards).

Every kind goes through the same path, so token and patch counts are comparable:

    source (mock | synthetic | real)  ->  RawSample (uint8 images + byte-level text ids)
    -> SampleEncoder: Qwen3-VL image processor, placeholder tokens, seq_length policy
    -> collate: MBS rows x seq_length, or (data.packing=in_batch) one unpadded row  ->  Batch (+ BatchStats)
       or (data.packing=buffer) the packer (packer.py): MBS rows each packed from a buffer of samples

torch and transformers are imported on first use, so that scripts/build_dataset.py (which
needs only the shard format in energon.py) starts in a moment.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moe_vlm.config.schema import DataConfig, DataKind, ModelConfig, Packing
from moe_vlm.data.errors import DataError

if TYPE_CHECKING:
    from moe_vlm.config.spec import RunSpec
    from moe_vlm.data.batch import IGNORE_INDEX, Batch, BatchStats
    from moe_vlm.data.indexed import IndexedSamples
    from moe_vlm.data.sequence import EncodedSample, SampleEncoder, SkipCounter
    from moe_vlm.data.stats import DataStats

__all__ = [
    "IGNORE_INDEX", "Batch", "BatchStats", "DataError", "DataStats", "build_batches", "check_data",
    "indexed_samples", "sample_encoder",
]  # fmt: skip

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
    DataError is raised by this call, not at the first batch. mock and synthetic read the
    sample indices Megatron's sampler gives this rank, so both engines feed it the same samples.
    """
    from moe_vlm.data.indexed import rank_indices
    from moe_vlm.data.real import rank_locations, real_samples
    from moe_vlm.data.sequence import SkipCounter, batches, collate, encoded_samples

    kind = spec.data.kind
    if kind is not DataKind.real:
        source = indexed_samples(spec.model, spec.data, spec.seed, spec.seq_length)
        stream = source.stream(rank_indices(rank, world_size, spec.mbs))
        if spec.data.packing is Packing.buffer:
            return _buffer_packed(spec, stream, source.skips)
        return batches(
            stream, source.skips, spec.seq_length, spec.mbs, spec.data.packing,
            spec.model.pad_token_id, kind.value,
        )  # fmt: skip
    encoder = sample_encoder(spec.model, spec.data, spec.seq_length)
    samples = real_samples(
        rank_locations(_real_path(spec), rank, world_size), encoder.tokenizer, spec.seed, rank
    )
    if spec.data.packing is Packing.buffer:
        skips = SkipCounter(kind.value)
        return _buffer_packed(spec, encoded_samples(samples, encoder, skips), skips)
    return collate(samples, encoder, spec.mbs, spec.data.packing, spec.model.pad_token_id, kind.value)


def _buffer_packed(spec: RunSpec, stream: Iterator[EncodedSample], skips: SkipCounter) -> Iterator[Batch]:
    from moe_vlm.data.packer import Packer, packed_batches

    packer = Packer(stream, spec.packed_row_length, spec.data.packing_buffer, spec.collate_padding_multiple)
    return packed_batches(packer, skips, spec.mbs, spec.model.pad_token_id, spec.data.kind.value)


def sample_encoder(model: ModelConfig, data: DataConfig, seq_length: int) -> SampleEncoder:
    """The byte tokenizer and the Qwen3-VL image processor of this run, within seq_length."""
    from moe_vlm.data.sequence import SampleEncoder
    from moe_vlm.data.tokenizer import ByteTokenizer
    from moe_vlm.data.vision import ImagePreprocessor

    return SampleEncoder(ByteTokenizer(model), ImagePreprocessor(model, data), seq_length)


def indexed_samples(model: ModelConfig, data: DataConfig, seed: int, seq_length: int) -> IndexedSamples:
    """mock, synthetic or bridge_mock sample i, encoded: what both engines feed (data/indexed.py)."""
    from functools import partial

    from moe_vlm.data.bridge_mock import bridge_mock, bridge_mock_sample
    from moe_vlm.data.indexed import Draw, IndexedSamples
    from moe_vlm.data.mock import mock_sample
    from moe_vlm.data.synthetic import synthetic_sample

    draw: Draw
    if data.kind is DataKind.mock:
        draw = partial(mock_sample, seed, seq_length)
    elif data.kind is DataKind.synthetic:
        draw = partial(synthetic_sample, data, seed)
    elif data.kind is DataKind.bridge_mock:
        # Bridge's workload: its own seed, whatever the run's; longer answers when it packs
        draw = partial(bridge_mock_sample, mock=bridge_mock(data.packing))
    else:
        raise ValueError(f"data={data.kind.value} is read from shards, not drawn by index")
    return IndexedSamples(draw, sample_encoder(model, data, seq_length), data.kind.value)


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
