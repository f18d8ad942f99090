"""mock and synthetic sample i is a function of (seed, i): the order Megatron's sampler gives each
data-parallel rank, and a rejected draw replaced in place, so both engines feed the same samples."""

from __future__ import annotations

import logging
from itertools import islice

import pytest
import torch

from moe_vlm.data import build_batches, indexed_samples
from moe_vlm.data.indexed import rank_indices
from moe_vlm.data.synthetic import synthetic_sample
from tests.conftest import make_spec

SMALL = ("data=synthetic", "data.max_long_side_px=480", "data.max_text_tokens=64")


def test_rank_indices_follow_megatron_s_sequential_sampler() -> None:
    # MegatronPretrainingSampler: steps of mbs x DP indices; rank r takes [r x mbs, (r + 1) x mbs).
    assert list(islice(rank_indices(1, 3, 2), 6)) == [2, 3, 8, 9, 14, 15]
    assert list(islice(rank_indices(0, 1, 1), 3)) == [0, 1, 2]


def test_a_sample_is_the_same_whoever_draws_it() -> None:
    spec = make_spec(*SMALL, "mbs=1")
    second_of_rank_0 = list(islice(build_batches(spec, 0, 1), 2))[1]  # one rank: index 1
    first_of_rank_1 = next(build_batches(spec, 1, 2))  # two ranks: rank 1 starts at index 1
    assert second_of_rank_0.sample_keys == first_of_rank_1.sample_keys == ["synthetic/1"]
    assert torch.equal(second_of_rank_0.input_ids, first_of_rank_1.input_ids)
    a, b = synthetic_sample(spec.data, spec.seed, 7), synthetic_sample(spec.data, spec.seed, 7)
    assert a.text_ids == b.text_ids and all(
        torch.equal(x, y) for x, y in zip(a.images, b.images, strict=True)
    )
    assert synthetic_sample(spec.data, spec.seed + 1, 7).text_ids != a.text_ids


def test_a_rejected_draw_is_redrawn_for_the_same_index(caplog: pytest.LogCaptureFixture) -> None:
    # Two 672-900 px images need 2 x (up to 791 + 2) tokens: seq_length=1000 fits some, not all.
    tight = ("data=synthetic", "data.min_long_side_px=672", "data.max_long_side_px=900", "data.min_images=2",
             "data.max_text_tokens=64")  # fmt: skip
    spec = make_spec(*tight, "seq_length=1000")
    roomy = make_spec(*tight, "seq_length=4096")
    source = indexed_samples(spec.model, spec.data, spec.seed, spec.seq_length)
    roomy_source = indexed_samples(roomy.model, roomy.data, roomy.seed, roomy.seq_length)
    with caplog.at_level(logging.WARNING):
        results = [source.encoded(index) for index in range(8)]
    redrawn = [index for index, (_, skipped) in enumerate(results) if skipped]
    kept = [index for index, (_, skipped) in enumerate(results) if not skipped]
    assert redrawn and kept, "the case needs both"
    for index in redrawn:
        sample, skipped = results[index]
        assert sample.key == f"synthetic/{index}/redraw{skipped}" and sample.length <= 1000
        assert f"synthetic/{index}" in caplog.text and "no room for text" in caplog.text
    for index in kept:  # a redraw never shifts another index's sample (seq_length only cuts its text)
        tight_sample, roomy_sample = results[index][0], roomy_source.encoded(index)[0]
        assert tight_sample.key == roomy_sample.key == f"synthetic/{index}"
        assert tight_sample.pixel_values is not None and roomy_sample.pixel_values is not None
        assert torch.equal(tight_sample.pixel_values, roomy_sample.pixel_values)
    batch = next(build_batches(spec, 0, 1))
    assert batch.stats.skipped_samples == results[0][1]
