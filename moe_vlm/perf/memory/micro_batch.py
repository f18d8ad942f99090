"""What one micro-batch computes: padded positions, or (data.packing=in_batch) the data's own lengths.

Padded (data.packing=none), every micro-batch is MBS rows x seq_length, whatever the samples hold:
activations are sized on that, exactly. Packed, a micro-batch is its samples' real tokens and no
more, so its size follows the data. The estimate then sizes activations on a high percentile of
the data source's tokens (and ViT patches) per micro-batch, PERCENTILE, stated in every term:

- mock: image-free text of uniform seq_length/2 .. seq_length tokens (data/mock.py);
- bridge_mock: Bridge's mock as mock_vlm_sft.py draws it for this packing mode (data/bridge_mock.py:
  its 1,000 base examples' real tokens, 10-99 answer words when packed, one 784-patch image each);
- synthetic: the data group's distribution (image count, long side, aspect ratio, text length:
  data/synthetic.py), each image through the Qwen-VL resize (images.patches_for_image), each sample
  capped at seq_length as the encoder caps it (text cut, images kept);
- real: the image headers and caption sizes of the first REAL_SAMPLES samples of data.path (nothing
  decoded; a caption's byte count is its byte-tokenizer length, a JSON caption's is an upper bound),
  one image per sample; unreadable here (planning on a login node): the padded bound.

Buffer-packed (data.packing=buffer), a micro-batch is MBS rows of RunSpec.packed_row_length
positions, a fixed shape (activations and transformers' [rows, 1, L, L] mask are sized on it,
exactly); what follows the data is how many samples, and so images, a row holds: the drawn samples
are packed by the packer's own first-fit-decreasing (data/bins.py) over data.packing_buffer, and
the vision tower is sized on the PERCENTILE of patches per micro-batch of those rows.

A fixed-shape source (every sample alike) makes the percentile the exact size. Micro-batches are
drawn DRAWS times from a fixed seed, so a plan is reproducible. Static buffers sized by the
configuration (HybridEP's, memory/megatron.py) stay on MBS x seq_length: they are allocated for it.
"""

from __future__ import annotations

import functools
import io
import json
import math
import random
from dataclasses import dataclass
from pathlib import Path

from moe_vlm.config.schema import DataKind, Packing
from moe_vlm.config.spec import RunSpec
from moe_vlm.data.bins import first_fit_decreasing, padded_length
from moe_vlm.data.bridge_mock import bridge_mock
from moe_vlm.perf.memory.images import patches_for_image

PERCENTILE = 0.99  # of tokens (and patches) per micro-batch, when packed
DRAWS = 2000  # micro-batches drawn for the percentile
REAL_SAMPLES = 256  # samples of data.path read (headers only) for its statistics
SEED = 20_261_201
# Draws of synthetic samples tried before giving up on the ones the encoder would skip: an
# image-heavy distribution at a small seq_length skips most draws, and one that fits nothing
# (rule A006) would otherwise redraw forever.
MAX_SAMPLE_ATTEMPTS = 20 * DRAWS


@dataclass(frozen=True)
class MicroBatchShape:
    """Positions one micro-batch computes, and what the memory estimate sizes activations on."""

    packed: bool
    padded_positions: int  # MBS x seq_length: what a padded micro-batch computes
    mean_tokens: float | None  # real tokens per micro-batch, mean (None: unknown here)
    positions: int  # what activations are sized on: padded_positions, or the percentile when packed
    patches: int | None  # ViT patches per micro-batch at the percentile (packed); None: the image budget's
    source: str
    buffered: bool = False  # data.packing=buffer: positions are MBS x packed_row_length, fixed

    @property
    def padding_fraction(self) -> float | None:
        """Expected share of the padded micro-batch that is padding."""
        if self.mean_tokens is None or self.padded_positions < 1:
            return None
        return 1.0 - self.mean_tokens / self.padded_positions

    def text(self) -> str:
        mean = "unknown" if self.mean_tokens is None else f"{self.mean_tokens:,.0f}"
        padding = "" if self.padding_fraction is None else f" ({100 * self.padding_fraction:.0f}% padding)"
        if self.buffered:
            return (
                f"buffer-packed (data.packing=buffer): {self.positions:,} positions per micro-batch for {mean} "
                f"real tokens (mean){padding}, p{100 * PERCENTILE:.0f} {self.patches or 0:,} ViT patches; "
                f"{self.source}"
            )
        if not self.packed:
            return (
                f"padded: {self.padded_positions:,} positions per micro-batch for {mean} real tokens (mean)"
                f"{padding}; {self.source}"
            )
        return (
            f"packed (data.packing=in_batch): {self.positions:,} positions per micro-batch at p"
            f"{100 * PERCENTILE:.0f} for {mean} real tokens (mean), vs {self.padded_positions:,} padded"
            f"{padding}; {self.source}"
        )


def micro_batch_shape(spec: RunSpec) -> MicroBatchShape:
    data, model = spec.data, spec.model
    key: tuple[object, ...] = (
        data.kind, data.packing, spec.mbs, spec.seq_length, data.path, data.min_images, data.max_images,
        data.min_long_side_px, data.max_long_side_px, tuple(data.aspect_ratios), data.min_text_tokens,
        data.max_text_tokens, data.min_pixels, data.max_pixels, model.vision_patch_size,
        model.vision_spatial_merge_size,
    )  # fmt: skip
    if data.packing is Packing.buffer:  # _buffer_shape reads these too: points differing in one differ
        key += (data.packing_buffer, spec.packed_row_length, spec.collate_padding_multiple)
    if key not in _SHAPES:
        _SHAPES[key] = _shape(spec)
    return _SHAPES[key]


def micro_batch_positions(spec: RunSpec) -> int:
    """Positions (tokens, padding included) of one micro-batch that activations are sized on."""
    if spec.data.packing is Packing.none:
        return spec.mbs * spec.seq_length
    if spec.data.packing is Packing.buffer:
        return spec.mbs * spec.packed_row_length
    return micro_batch_shape(spec).positions


def positions_source(spec: RunSpec) -> str:
    """How micro_batch_positions was sized, for a term's detail."""
    if spec.data.packing is Packing.none:
        return f"MBS {spec.mbs} x seq {spec.seq_length}"
    if spec.data.packing is Packing.buffer:
        return f"buffer-packed: MBS {spec.mbs} x row {spec.packed_row_length}"
    return f"packed: p{100 * PERCENTILE:.0f} of the data's tokens per micro-batch, perf/memory/micro_batch.py"


def has_padding_mask(spec: RunSpec, padded: bool = True) -> bool:
    """Whether transformers builds a padding mask for the micro-batch: a padded one does when some
    row holds padding (`padded`, the planning default: the worst case). A packed one never does:
    its attention runs causal per sample (torch_model._varlen_sdpa)."""
    return padded and spec.data.packing is Packing.none


def attention_mask_elements(spec: RunSpec, padded: bool = True) -> int:
    """Elements of the [MBS, 1, seq, seq] padding mask, 0 where there is none."""
    return spec.mbs * spec.seq_length**2 if has_padding_mask(spec, padded) else 0


_SHAPES: dict[tuple[object, ...], MicroBatchShape] = {}


def _shape(spec: RunSpec) -> MicroBatchShape:
    samples, source = _sample_sizes(spec)
    if spec.data.packing is Packing.buffer:
        return _buffer_shape(spec, samples, source)
    padded_positions = spec.mbs * spec.seq_length
    packed = spec.data.packing is Packing.in_batch
    if not samples:
        return MicroBatchShape(packed, padded_positions, None, padded_positions, None, source)
    rng = random.Random(SEED)
    draws = [[samples[rng.randrange(len(samples))] for _ in range(spec.mbs)] for _ in range(DRAWS)]
    tokens = sorted(sum(s[0] for s in batch) for batch in draws)
    patches = sorted(sum(s[1] for s in batch) for batch in draws)
    at = min(len(tokens) - 1, math.ceil(PERCENTILE * len(tokens)) - 1)
    mean = sum(tokens) / len(tokens)
    if not packed:
        return MicroBatchShape(False, padded_positions, mean, padded_positions, None, source)
    return MicroBatchShape(True, padded_positions, mean, tokens[at], patches[at], source)


def _buffer_shape(spec: RunSpec, samples: list[tuple[int, int]], source: str) -> MicroBatchShape:
    """MBS rows of the packer's first-fit-decreasing over buffers of drawn samples."""
    row, multiple = spec.packed_row_length, spec.collate_padding_multiple
    positions = spec.mbs * row
    if not samples:
        return MicroBatchShape(True, positions, None, positions, None, source, buffered=True)
    rng = random.Random(SEED)
    buffer = max(spec.data.packing_buffer, 1)
    rows: list[tuple[int, int]] = []  # (real tokens, patches) per packed row
    while len(rows) < DRAWS * spec.mbs:
        drawn = [samples[rng.randrange(len(samples))] for _ in range(buffer)]
        lengths = [padded_length(min(tokens, spec.seq_length), multiple) for tokens, _ in drawn]
        for members in first_fit_decreasing(lengths, row):
            rows.append((sum(drawn[i][0] for i in members), sum(drawn[i][1] for i in members)))
    batches = [rows[i : i + spec.mbs] for i in range(0, DRAWS * spec.mbs, spec.mbs)]
    tokens = [sum(t for t, _ in batch) for batch in batches]
    patches = sorted(sum(p for _, p in batch) for batch in batches)
    at = min(len(patches) - 1, math.ceil(PERCENTILE * len(patches)) - 1)
    return MicroBatchShape(
        True, positions, sum(tokens) / len(tokens), positions, patches[at],
        f"{source}; packed first-fit-decreasing from buffers of {buffer}", buffered=True,
    )  # fmt: skip


def _sample_sizes(spec: RunSpec) -> tuple[list[tuple[int, int]], str]:
    """(tokens, ViT patches) of sample draws from the data source, each capped at seq_length."""
    data, seq = spec.data, spec.seq_length
    merge = spec.model.vision_spatial_merge_size**2
    rng = random.Random(SEED + 1)
    if seq < 1:
        return [], f"seq_length={seq} holds no sample (rule C001): the padded bound"
    if data.kind is DataKind.mock:
        sizes = [(rng.randint(seq // 2, seq), 0) for _ in range(DRAWS)]
        return sizes, f"mock: uniform {seq // 2}-{seq} text tokens per sample"
    if data.kind is DataKind.bridge_mock:
        # Bridge's own draws (replayed in data/bridge_mock.py), not the real-data fallback: packed, a
        # micro-batch of MBS samples is ~MBS x 267 tokens, where the padded bound says MBS x seq_length.
        mock = bridge_mock(data.packing)
        width, height = mock.image_size
        patches = patches_for_image(spec, height, width)
        sizes = [(min(mock.real_tokens(i), seq), patches) for i in range(mock.base_examples)]
        low, high = min(t for t, _ in sizes), max(t for t, _ in sizes)
        return sizes, (
            f"bridge_mock: Bridge's {mock.base_examples} base examples, {low}-{high} real tokens and "
            f"{patches} patches per sample (answers of {mock.answer_words[0]}-{mock.answer_words[1] - 1} words)"
        )
    if data.kind is DataKind.synthetic:
        ratios = list(data.aspect_ratios) or [1.0]
        sizes = []
        for _ in range(MAX_SAMPLE_ATTEMPTS):
            if len(sizes) >= DRAWS:
                break
            images = []
            for _ in range(rng.randint(data.min_images, data.max_images)):
                long_side, ratio = (
                    rng.randint(data.min_long_side_px, data.max_long_side_px),
                    rng.choice(ratios),
                )
                height, width = (
                    (max(1, round(long_side / ratio)), long_side)
                    if ratio >= 1.0
                    else (long_side, max(1, round(long_side * ratio)))
                )
                images.append(patches_for_image(spec, height, width))
            span = sum(p // merge + 2 for p in images)
            if span >= seq:
                continue  # the encoder skips it (and seeded data redraws it)
            text = rng.randint(data.min_text_tokens, data.max_text_tokens)
            sizes.append((min(span + text, seq), sum(images)))
        if not sizes:
            return [], (
                f"synthetic: no sample of {MAX_SAMPLE_ATTEMPTS:,} drawn fits seq_length={seq} (rule A006): "
                "the padded bound"
            )
        return sizes, "synthetic: drawn from the data group's distribution"
    shapes = _real_shapes(str(data.path or ""), REAL_SAMPLES)
    sizes = []
    for height, width, caption in shapes:
        patches = patches_for_image(spec, height, width)
        span = patches // merge + 2
        if span < seq:
            sizes.append((min(span + caption, seq), patches))
    if not sizes:
        return [], "real data without readable statistics here: the padded bound"
    return sizes, f"real: image headers and caption sizes of {len(shapes)} samples of {data.path}"


@functools.lru_cache(maxsize=16)
def _real_shapes(path: str, samples: int) -> tuple[tuple[int, int, int], ...]:
    """(height, width, caption bytes) of the first `samples` samples (image headers only)."""
    if not path:
        return ()
    # Here, not at the top: only a real dataset's images are opened, and Pillow's and the shard
    # reader's imports were part of every plan's start-up (issue 33).
    from PIL import Image

    from moe_vlm.data.energon import IMAGE_PARTS, iter_samples, read_meta

    shapes: list[tuple[int, int, int]] = []
    try:
        for sample in iter_samples(read_meta(Path(path).expanduser())):
            part = next((p for p in IMAGE_PARTS if p in sample.parts), None)
            text = sample.parts.get("txt") or sample.parts.get("json") or b""
            if part is None or not text:
                continue
            with Image.open(io.BytesIO(sample.parts[part])) as image:
                width, height = image.size
            if "txt" not in sample.parts:
                json.loads(text)  # a caption the reader could use; its size bounds the caption's
            shapes.append((height, width, len(text.strip())))
            if len(shapes) >= samples:
                break
    except Exception:  # unreadable here (planning on a login node): the padded bound
        return ()
    return tuple(shapes)
