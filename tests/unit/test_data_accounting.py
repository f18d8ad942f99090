"""Token and patch accounting of the shared data path, against hand-computed values."""

from __future__ import annotations

import logging
from itertools import islice

import pytest
import torch

from moe_vlm.config.schema import Packing
from moe_vlm.config.spec import RunSpec
from moe_vlm.data import DataStats, build_batches
from moe_vlm.data.batch import IGNORE_INDEX, Batch
from moe_vlm.data.errors import TokenizerMismatch
from moe_vlm.data.sequence import EncodedSample, RawSample, SampleEncoder, collate
from moe_vlm.data.tokenizer import ByteTokenizer
from moe_vlm.data.vision import ImagePreprocessor, image_tokens_for
from tests.conftest import make_spec

# The tiny model: patch 16, temporal patch 2, spatial merge 2; image 500, start 501, end 502, pad 503.
IMAGE, START, END, PAD = 500, 501, 502, 503
# Small synthetic images keep these tests fast; the realistic defaults are exercised in test_data_model.
SMALL_SYNTHETIC = ("data=synthetic", "data.max_long_side_px=480", "data.max_text_tokens=128")


def image(height: int, width: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (3, height, width), dtype=torch.uint8, generator=generator)


def encoder_for(spec: RunSpec) -> SampleEncoder:
    return SampleEncoder(ByteTokenizer(spec.model), ImagePreprocessor(spec.model, spec.data), spec.seq_length)


@pytest.fixture(scope="module")
def tiny() -> RunSpec:
    return make_spec("model=tiny_moe_vlm")


def test_224_image_is_196_patches_and_49_tokens(tiny: RunSpec) -> None:
    # 224 / 16 = 14 patches a side -> grid (1, 14, 14) = 196 ViT patches, each 3 ch x 2 t x 16 x 16
    # = 1536 values; the 2 x 2 merge leaves 196 / 4 = 49 placeholder tokens.
    # 224 x 224 = 50176 = min_pixels: no resize.
    processed = ImagePreprocessor(tiny.model, tiny.data)([image(224, 224)])
    assert processed.image_grid_thw.tolist() == [[1, 14, 14]]
    assert tuple(processed.pixel_values.shape) == (196, 1536)
    assert ImagePreprocessor(tiny.model, tiny.data).tokens_per_image(processed.image_grid_thw) == [49]
    assert image_tokens_for(tiny.model, tiny.data, 224, 224) == 49


@pytest.mark.parametrize(
    ("height", "width", "resized", "tokens"),
    [
        # Chelsea the cat: round(300 / 32) = 9 -> 288, round(451 / 32) = 14 -> 448; 288 x 448 = 129024 px
        # is within [50176, 1003520]: grid 18 x 28 = 504 patches, 126 tokens.
        (300, 451, (288, 448), 126),
        # The retina photo: 1408 x 1408 would exceed max_pixels, so scale by sqrt(1411^2 / 1003520) = 1.4085:
        # floor(1001.8 / 32) = 31 -> 992 a side: grid 62 x 62 = 3844 patches, 961 tokens.
        (1411, 1411, (992, 992), 961),
        # 150 x 200 rounds to 160 x 192 = 30720 px < min_pixels: scale up by sqrt(50176 / 30000) = 1.2933:
        # ceil(194.0 / 32) = 7 -> 224, ceil(258.7 / 32) = 9 -> 288: grid 14 x 18 = 252 patches, 63 tokens.
        (150, 200, (224, 288), 63),
    ],
)
def test_resize_to_patch_multiples_within_pixel_bounds(
    tiny: RunSpec, height: int, width: int, resized: tuple[int, int], tokens: int
) -> None:
    processed = ImagePreprocessor(tiny.model, tiny.data)([image(height, width)])
    assert processed.resized_hw == [resized]
    assert processed.original_hw == [(height, width)]
    assert processed.patches_per_image == [tokens * 4]
    assert image_tokens_for(tiny.model, tiny.data, height, width) == tokens


def test_sample_layout_markers_placeholders_and_labels(tiny: RunSpec) -> None:
    sample = encoder_for(tiny).encode(RawSample("k", [image(224, 224)], ByteTokenizer.encode("hi")))
    assert isinstance(sample, EncodedSample)
    ids = sample.input_ids.tolist()
    assert ids == [START, *([IMAGE] * 49), END, ord("h"), ord("i")]
    assert sample.mm_token_type_ids.tolist() == [0, *([1] * 49), 0, 0, 0]
    assert sample.labels.tolist() == [IGNORE_INDEX] * 51 + [ord("h"), ord("i")]


def _check_batch_consistency(batch: Batch, spec: RunSpec) -> None:
    s = batch.stats
    mbs, seq = spec.mbs, spec.seq_length
    assert tuple(batch.input_ids.shape) == (mbs, seq)
    assert s.padded_tokens == mbs * seq
    assert s.real_tokens == int(batch.attention_mask.sum()) == s.text_tokens + s.image_tokens
    assert s.image_tokens == int((batch.input_ids == IMAGE).sum()) == int(batch.mm_token_type_ids.sum())
    assert s.images == int((batch.input_ids == START).sum()) == int((batch.input_ids == END).sum())
    assert s.vision_marker_tokens == 2 * s.images
    # HF and Megatron predict labels[t] from position t - 1: a row's first label never carries loss.
    assert s.loss_tokens == int((batch.labels[:, 1:] != IGNORE_INDEX).sum())
    assert (batch.labels[batch.mm_token_type_ids == 1] == IGNORE_INDEX).all()
    assert (batch.input_ids[batch.attention_mask == 0] == PAD).all()
    assert (batch.labels[batch.attention_mask == 0] == IGNORE_INDEX).all()
    if s.images:
        assert batch.image_grid_thw is not None and batch.pixel_values is not None
        patches = batch.image_grid_thw.prod(dim=-1)
        assert s.vision_patches == int(patches.sum()) == batch.pixel_values.shape[0]
        assert s.image_tokens == s.vision_patches // 4
        assert s.sum_patches_squared == int((patches**2).sum())
        assert len(batch.image_original_hw) == len(batch.image_resized_hw) == s.images
        for (_, h, w), (rh, rw) in zip(batch.image_grid_thw.tolist(), batch.image_resized_hw, strict=True):
            assert (h * 16, w * 16) == (rh, rw)
    lengths = batch.attention_mask.sum(dim=1)
    assert s.sum_seq_len_squared == int((lengths**2).sum())


def test_mock_has_no_vision_work() -> None:
    spec = make_spec("data=mock", "mbs=2", "seq_length=256")
    stats = DataStats()
    for batch in islice(build_batches(spec, rank=0, world_size=2), 3):
        _check_batch_consistency(batch, spec)
        assert batch.pixel_values is None and batch.image_grid_thw is None
        assert batch.stats.images == batch.stats.vision_patches == batch.stats.image_tokens == 0
        assert batch.data_kind == "mock"
        stats.add(batch)
    record = stats.to_dict()
    assert (
        record["kind"] == "mock"
        and record["image_free"] is True
        and "not a performance proxy" in record["note"]
    )
    assert record["vision_patches"] == record["merged_patches"] == 0


def test_synthetic_images_carry_the_expected_counts() -> None:
    spec = make_spec(*SMALL_SYNTHETIC, "mbs=2")
    preprocessor = ImagePreprocessor(spec.model, spec.data)
    stats = DataStats()
    for batch in islice(build_batches(spec, rank=0, world_size=1), 3):
        _check_batch_consistency(batch, spec)
        assert batch.stats.images >= spec.mbs * spec.data.min_images
        for (h, w), (rh, rw) in zip(batch.image_original_hw, batch.image_resized_hw, strict=True):
            assert 336 <= max(h, w) <= 480
            assert preprocessor.resized_hw(h, w) == (rh, rw)
        stats.add(batch)
    record = stats.to_dict()
    assert record["kind"] == "synthetic" and record["image_free"] is False
    assert record["merged_patches"] * 4 == record["vision_patches"] > 0
    assert sum(record["images_per_sample"]["histogram"].values()) == record["samples"] == 6
    assert record["padding_fraction"] == pytest.approx(
        1 - record["real_tokens"] / record["padded_tokens"], abs=1e-4
    )


def test_synthetic_is_deterministic_from_seed_and_rank() -> None:
    def first(spec: RunSpec, rank: int) -> Batch:
        return next(build_batches(spec, rank=rank, world_size=2))

    spec = make_spec(*SMALL_SYNTHETIC)
    a, b = first(spec, 0), first(spec, 0)
    assert torch.equal(a.input_ids, b.input_ids) and a.image_original_hw == b.image_original_hw
    assert (
        a.pixel_values is not None
        and b.pixel_values is not None
        and torch.equal(a.pixel_values, b.pixel_values)
    )
    other_rank = first(spec, 1)
    other_seed = first(make_spec(*SMALL_SYNTHETIC, "seed=7"), 0)
    for other in (other_rank, other_seed):
        assert not torch.equal(a.input_ids, other.input_ids)


def test_mock_is_deterministic_from_seed() -> None:
    spec = make_spec("data=mock", "seq_length=256")
    assert torch.equal(next(build_batches(spec, 0, 1)).input_ids, next(build_batches(spec, 0, 1)).input_ids)
    assert not torch.equal(
        next(build_batches(spec, 0, 1)).input_ids, next(build_batches(spec, 1, 2)).input_ids
    )


def test_padding_one_sample_per_row(tiny: RunSpec) -> None:
    samples = [RawSample(f"s{i}", [], [65] * n) for i, n in enumerate((30, 40, 50, 60))]
    encoder = SampleEncoder(
        ByteTokenizer(tiny.model), ImagePreprocessor(tiny.model, tiny.data), seq_length=100
    )
    batches = list(
        collate(iter(samples), encoder, mbs=2, packing=Packing.none, pad_token_id=PAD, data_kind="mock")
    )
    assert [b.stats.samples for b in batches] == [2, 2]
    first = batches[0].stats
    assert (first.padded_tokens, first.real_tokens) == (200, 70)  # 2 rows x 100; 30 + 40 real
    assert first.sum_seq_len_squared == 30**2 + 40**2


def test_in_batch_packing_puts_the_micro_batch_in_one_unpadded_row(tiny: RunSpec) -> None:
    samples = [RawSample(f"s{i}", [], [65] * n) for i, n in enumerate((30, 40, 50, 60, 10))]
    encoder = SampleEncoder(
        ByteTokenizer(tiny.model), ImagePreprocessor(tiny.model, tiny.data), seq_length=100
    )
    stream = collate(
        iter(samples), encoder, mbs=2, packing=Packing.in_batch, pad_token_id=PAD, data_kind="mock"
    )
    batch, second = next(stream), next(stream)
    # The micro-batch's two samples, one after the other, nothing padded: [1, 30 + 40].
    assert batch.sample_keys == ["s0", "s1"] and second.sample_keys == ["s2", "s3"]
    assert tuple(batch.input_ids.shape) == (1, 70) and batch.cu_seqlens is not None
    assert batch.cu_seqlens.tolist() == [0, 30, 70]
    assert batch.stats.sequences == 1 and batch.stats.samples == 2
    assert batch.stats.real_tokens == batch.stats.padded_tokens == 70
    assert batch.labels[0, 30] == IGNORE_INDEX  # the second packed sample is not predicted from the first
    # 70 real tokens, less each sample's first label: the same loss tokens as two padded rows.
    assert batch.stats.loss_tokens == 70 - 2
    assert batch.stats.sum_seq_len_squared == 30**2 + 40**2  # attention confined to each sample
    assert "attention_mask" not in batch.model_inputs()  # positions confine attention (torch_model)


def test_long_text_is_shortened_never_the_image(tiny: RunSpec) -> None:
    encoder = SampleEncoder(
        ByteTokenizer(tiny.model), ImagePreprocessor(tiny.model, tiny.data), seq_length=64
    )
    encoded = encoder.encode(RawSample("long", [image(224, 224)], [65] * 20))
    assert isinstance(encoded, EncodedSample)
    # 1 + 49 + 1 image tokens leave 64 - 51 = 13 of the 20 text tokens.
    assert encoded.length == 64 and encoded.text_tokens == 13 and encoded.truncated_text_tokens == 7
    assert int(encoded.mm_token_type_ids.sum()) == 49


def test_images_that_do_not_fit_are_skipped_with_a_warning(
    tiny: RunSpec, caplog: pytest.LogCaptureFixture
) -> None:
    encoder = SampleEncoder(
        ByteTokenizer(tiny.model), ImagePreprocessor(tiny.model, tiny.data), seq_length=48
    )
    samples = [
        RawSample("too-big", [image(224, 224)], [65] * 5),  # 51 image tokens > 48
        RawSample("no-text", [image(224, 224)], []),
        RawSample("fine", [], [65] * 5),
    ]
    with caplog.at_level(logging.WARNING):
        batch = next(
            collate(
                iter(samples), encoder, mbs=1, packing=Packing.none, pad_token_id=PAD, data_kind="synthetic"
            )
        )
    assert batch.sample_keys == ["fine"] and batch.stats.skipped_samples == 2
    assert "too-big" in caplog.text and "no room for text" in caplog.text
    assert "no-text" in caplog.text and "no text" in caplog.text


def test_byte_ids_never_collide_with_special_ids() -> None:
    with pytest.raises(TokenizerMismatch, match="image_token_id=100"):
        ByteTokenizer(make_spec("model.image_token_id=100").model)


def test_stats_merge_adds_ranks_and_refuses_mixed_kinds() -> None:
    spec = make_spec("data=mock", "seq_length=128")
    per_rank = []
    for rank in range(2):
        stats = DataStats()
        for batch in islice(build_batches(spec, rank, 2), 2):
            stats.add(batch)
        per_rank.append(stats)
    merged = DataStats()
    for stats in per_rank:
        merged.merge(stats)
    assert merged.to_dict()["samples"] == 4
    assert merged.real_tokens == sum(s.real_tokens for s in per_rank)
    synthetic = DataStats(kind="synthetic")
    with pytest.raises(ValueError, match="mixes data kinds"):
        synthetic.merge(merged)
