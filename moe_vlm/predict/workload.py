"""The step's expected token and patch statistics, from the data distribution alone.

A prediction is made before anything runs, so it cannot read steps.jsonl: the workload is the
expectation of what the data kind draws (the memory estimate plans for the worst case instead).

``mock``       text only, each row uniform in [seq/2, seq] tokens (moe_vlm/data/mock.py).
``synthetic``  per sample a uniform image count, long side, aspect ratio and text length
               (moe_vlm/data/synthetic.py); patches through Qwen2-VL's resize rule
               (moe_vlm/perf/memory/images.py); a row holds at most seq_length tokens.
``bridge_mock`` Bridge's perf-recipe mock, draw for draw (moe_vlm/data/bridge_mock.py replays
               mock_vlm_sft.py:106-112): one 448x448 image (784 patches) and Bridge's own answer
               lengths per sample, 10-29 words (mean ~232 real tokens), 10-99 when packed (~267).
``real``       the mean patches of the first image headers the memory estimate reads, one image
               per sample, the configured text-length range; without readable headers, the
               synthetic expectation.
Rows are padded to seq_length unless ``data.packing=in_batch`` packs each micro-batch's samples;
packed, each sample is padded to the CP/SP multiple (Bridge's collate, training/config.py:1213-1239;
RunSpec.collate_padding_multiple).
``data.packing=buffer`` fills GBS rows of packed_row_length with as many samples as the packer's
first-fit-decreasing fits (its mean fill from perf/memory/micro_batch.py).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from moe_vlm.config.schema import DataKind, Packing
from moe_vlm.config.spec import RunSpec
from moe_vlm.config.vendor import BRIDGE_MOCK_PATCHES
from moe_vlm.data.bridge_mock import bridge_mock
from moe_vlm.perf.flops import Workload
from moe_vlm.perf.memory.estimate import REAL_DATA_SAMPLES_READ
from moe_vlm.perf.memory.images import patches_for_image, real_image_sizes
from moe_vlm.perf.memory.micro_batch import micro_batch_shape

LONG_SIDE_SAMPLES = 33  # long sides averaged over min..max (uniform draw), evenly spaced
IMAGE_FRAME_TOKENS = 2  # <|vision_start|> and <|vision_end|> around each image's tokens


@dataclass(frozen=True)
class SampleSpread:
    """One sample's ViT work as a random variable: P its patches, Q the sum of its images' squared
    patch counts (what the attention per image costs). Ranks draw different samples, so a step
    waits on the rank that drew the most (step.py's straggler term)."""

    p_mean: float = 0.0
    q_mean: float = 0.0
    p_var: float = 0.0
    q_var: float = 0.0
    pq_cov: float = 0.0


@functools.cache
def _spread_of(values: tuple[float, ...], images: tuple[int, int]) -> SampleSpread:
    return _spread(list(values), images)


def _spread(values: list[float], images: tuple[int, int]) -> SampleSpread:
    """Moments of a compound sum: a sample holds N images, N uniform on [low, high], each image's
    patch count drawn from `values`."""
    if not values:
        return SampleSpread()
    counts = list(range(images[0], images[1] + 1))
    n_mean = sum(counts) / len(counts)
    n_var = sum((c - n_mean) ** 2 for c in counts) / len(counts)
    m = len(values)
    p1 = sum(values) / m
    p2 = sum(v**2 for v in values) / m
    p3 = sum(v**3 for v in values) / m
    p4 = sum(v**4 for v in values) / m
    return SampleSpread(
        p_mean=n_mean * p1,
        q_mean=n_mean * p2,
        p_var=n_mean * (p2 - p1 * p1) + n_var * p1 * p1,
        q_var=n_mean * (p4 - p2 * p2) + n_var * p2 * p2,
        pq_cov=n_mean * (p3 - p1 * p2) + n_var * p1 * p2,
    )


@dataclass(frozen=True)
class ExpectedWorkload:
    workload: Workload
    source: str  # in words: where the figures come from
    spread: SampleSpread = SampleSpread()  # per sample; zero where every sample is alike


def _synthetic_patches(spec: RunSpec) -> list[float]:
    """The patch counts of synthetic images over the drawn ranges, evenly spaced (cached: a big
    dry run asks per point)."""
    data, model = spec.data, spec.model
    key = (
        data.min_long_side_px,
        data.max_long_side_px,
        tuple(data.aspect_ratios),
        data.min_pixels,
        data.max_pixels,
        model.vision_patch_size,
        model.vision_spatial_merge_size,
    )
    if key not in _PATCHES:
        _PATCHES[key] = _draw_patches(spec)
    return _PATCHES[key]


_PATCHES: dict[tuple[object, ...], list[float]] = {}


def _draw_patches(spec: RunSpec) -> list[float]:
    data = spec.data
    ratios = list(data.aspect_ratios) or [1.0]
    lo, hi = data.min_long_side_px, data.max_long_side_px
    steps = max(LONG_SIDE_SAMPLES - 1, 1)
    sides = sorted({round(lo + (hi - lo) * i / steps) for i in range(steps + 1)})
    values = []
    for side in sides:
        for ratio in ratios:
            height, width = (
                (max(1, round(side / ratio)), side) if ratio >= 1.0 else (side, max(1, round(side * ratio)))
            )
            values.append(float(patches_for_image(spec, height, width)))
    return values


def _moments(values: list[float]) -> tuple[float, float]:
    return sum(values) / len(values), sum(v * v for v in values) / len(values)


def _real_patches(spec: RunSpec) -> list[float] | None:
    if not spec.data.path:
        return None
    try:
        sizes = real_image_sizes(str(spec.data.path), REAL_DATA_SAMPLES_READ)
    except Exception:  # unreadable here (a login node without the data): the synthetic expectation
        return None
    if not sizes:
        return None
    return [float(patches_for_image(spec, h, w)) for h, w in sizes]


def _ceil(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def bridge_mock_lengths(spec: RunSpec) -> tuple[int, ...]:
    """Real tokens of each of Bridge's base examples (the mock cycles over them) for this packing."""
    mock = bridge_mock(spec.data.packing)
    return tuple(mock.real_tokens(i) for i in range(mock.base_examples))


def expected_workload(spec: RunSpec) -> ExpectedWorkload:
    """One optimizer step's expected statistics, summed over data-parallel ranks."""
    data, model, seq = spec.data, spec.model, spec.seq_length
    rows = spec.gbs  # sequences per step (every DP rank's micro-batches)
    merge = model.vision_spatial_merge_size**2
    lengths: list[int] = []  # each sample's real tokens, where the data kind's draw is known
    spread = SampleSpread()
    if data.kind is DataKind.mock:
        low, high = seq // 2, seq
        mean_len = (low + high) / 2
        mean_sq = (low * low + low * high + high * high) / 3
        images, patches, patches_sq = 0.0, 0.0, 0.0
        source = f"mock: text rows uniform in [{low}, {high}] tokens"
    elif data.kind is DataKind.bridge_mock:
        lengths = [min(n, seq) for n in bridge_mock_lengths(spec)]
        mean_len = sum(lengths) / len(lengths)
        mean_sq = sum(n * n for n in lengths) / len(lengths)
        images, patches = 1.0, float(BRIDGE_MOCK_PATCHES)
        patches_sq = patches * patches
        source = (
            f"bridge_mock: Bridge's mock drawn as mock_vlm_sft.py draws it, 1 image x {BRIDGE_MOCK_PATCHES} "
            f"patches, {min(lengths)}-{max(lengths)} real tokens/sample (mean {mean_len:.0f})"
        )
    else:
        found = _real_patches(spec) if data.kind is DataKind.real else None
        if found:
            images, (patches, patches_sq) = 1.0, _moments(found)
            spread = _spread(found, (1, 1))
            source = f"real: mean of {REAL_DATA_SAMPLES_READ} image headers in {data.path}, 1 image/sample"
        else:
            images = (data.min_images + data.max_images) / 2
            drawn = _synthetic_patches(spec)
            patches, patches_sq = _moments(drawn)
            spread = _spread_of(tuple(drawn), (data.min_images, data.max_images))
            source = (
                f"{data.kind.value}: {images:g} image(s)/sample x {patches:.0f} patches expected "
                f"({data.min_long_side_px}-{data.max_long_side_px} px)"
            )
        text = (data.min_text_tokens + data.max_text_tokens) / 2
        mean_len = min(text + images * (patches / merge + IMAGE_FRAME_TOKENS), seq)
        mean_sq = mean_len * mean_len
    if data.packing is Packing.buffer and mean_len > 0:
        buffered = _buffer_workload(spec, rows, mean_len, mean_sq, images, patches, patches_sq, source)
        return ExpectedWorkload(buffered.workload, buffered.source, spread)
    packed = data.packing is Packing.in_batch and mean_len > 0
    real = rows * mean_len
    multiple = spec.collate_padding_multiple
    # Packed: each sample padded to the CP/SP multiple, on average half a multiple (exact for the
    # drawn lengths of bridge_mock).
    if lengths:
        aligned = rows * sum(_ceil(n, multiple) for n in lengths) / len(lengths)
    else:
        aligned = real + rows * (multiple - 1) / 2
    sample_images = rows * images
    # data.packing=in_batch: each micro-batch's samples concatenated unpadded into one row, attention
    # confined to each sample (so the squared lengths stay per sample).
    return ExpectedWorkload(
        Workload(
            sequences=max(1, rows // spec.mbs) if packed else rows,
            padded_tokens=round(aligned) if packed else rows * seq,
            real_tokens=round(real),
            sum_seq_len_squared=round(rows * mean_sq),
            vision_patches=round(sample_images * patches),
            sum_patches_squared=round(sample_images * patches_sq),
            samples=rows if packed else 0,
        ),
        source + ("; samples packed per micro-batch" if packed else f"; rows padded to {seq}"),
        spread,
    )


def _buffer_workload(
    spec: RunSpec,
    rows: int,
    mean_len: float,
    mean_sq: float,
    images: float,
    patches: float,
    patches_sq: float,
    source: str,
) -> ExpectedWorkload:
    """GBS packed rows: their real tokens are the packer's mean fill, in samples of the mean length."""
    shape = micro_batch_shape(spec)
    row = spec.packed_row_length
    fill = (shape.mean_tokens or mean_len * spec.mbs) / (spec.mbs * row)
    samples = rows * fill * row / mean_len
    return ExpectedWorkload(
        Workload(
            sequences=rows,
            padded_tokens=rows * row,
            real_tokens=round(rows * fill * row),
            sum_seq_len_squared=round(samples * mean_sq),  # attention stays inside each sample
            vision_patches=round(samples * images * patches),
            sum_patches_squared=round(samples * images * patches_sq),
            samples=round(samples),
        ),
        f"{source}; {fill:.0%} of each {row}-position row filled by first-fit-decreasing (data.packing=buffer)",
    )
