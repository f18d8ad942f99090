"""Seeded sources addressed by sample index, so both engines draw the same samples.

mock and synthetic samples are a function of (seed, index): sample i is the same tensor on the
torch engine and on the Megatron engine, in the main process or in any DataLoader worker. Each
data-parallel rank reads the indices Megatron's sampler gives it (``rank_indices``), so rank r's
k-th micro-batch holds the same samples on both engines.

A draw the encoder rejects (its images leave no room for text in seq_length) is replaced by the
next draw for the same index (attempt 1, 2, ...), and counted and warned about as a skipped
sample: the index keeps its place, so a skip never shifts the samples of later indices.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from itertools import count

import numpy as np
import torch

from moe_vlm.data.sequence import EncodedSample, RawSample, SampleEncoder, SkipCounter, SkippedSample

# draw(index, attempt) -> the raw sample; attempt > 0 only after the encoder rejected the earlier draws.
Draw = Callable[[int, int], RawSample]


def sample_generator(*parts: int) -> torch.Generator:
    """A generator seeded from integers; nearby tuples (index 7 vs 8) get unrelated streams."""
    state = np.random.SeedSequence([abs(p) for p in parts]).generate_state(1, np.uint64)[0]
    return torch.Generator().manual_seed(int(state) & (2**63 - 1))


def rank_indices(rank: int, world_size: int, mbs: int) -> Iterator[int]:
    """The sample indices data-parallel `rank` reads, in order: Megatron's sequential sampler.

    MegatronPretrainingSampler (megatron/bridge/data/samplers.py:125-195) walks the dataset in
    steps of mbs x world_size and gives rank r the slice [r x mbs, (r + 1) x mbs) of each step.
    """
    for step in count():
        first = (step * world_size + rank) * mbs
        yield from range(first, first + mbs)


class IndexedSamples:
    """Sample `index` of a seeded source, encoded; a rejected draw is redrawn for the same index."""

    def __init__(self, draw: Draw, encoder: SampleEncoder, kind: str) -> None:
        self.draw = draw
        self.encoder = encoder
        self.skips = SkipCounter(kind)

    def encoded(self, index: int) -> tuple[EncodedSample, int]:
        """The sample and how many draws for this index were skipped before it."""
        for attempt in count():
            encoded = self.encoder.encode(self.draw(index, attempt))
            if isinstance(encoded, SkippedSample):
                self.skips.skip(encoded)  # raises NoUsableSamples after MAX_CONSECUTIVE_SKIPS in a row
                continue
            self.skips.used()
            return encoded, attempt
        raise AssertionError("unreachable: count() is endless")

    def stream(self, indices: Iterator[int]) -> Iterator[EncodedSample]:
        for index in indices:
            yield self.encoded(index)[0]
