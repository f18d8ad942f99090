"""From raw samples to model batches: one encoder and one collator for every data kind.

A sample becomes, in order,

    for each image:  <vision_start> <image> x (t*h*w / merge^2) <vision_end>
    then its text:   byte ids

Labels carry the text only (IGNORE_INDEX on markers, image placeholders and padding);
mm_token_type_ids is 1 exactly on the image placeholders, which is what Qwen3-VL's
multimodal RoPE needs.

Samples longer than seq_length: image tokens are never cut (the model would find fewer
placeholders than image features and fail). The text is shortened to fit and the cut is
counted (truncated_text_tokens); a sample whose images alone do not leave room for one
text token is skipped with a warning naming its key and counted (skipped_samples).

Padding (data.packing=none): one sample per row, padded to seq_length.
In-batch packing (data.packing=in_batch): the micro-batch's MBS samples, unpadded, one after
another in ONE row of their summed length, with `cu_seqlens` marking where each starts. Each
sample's first label is IGNORE_INDEX (as a padded row's first position, it is never predicted),
attention stays inside each sample and positions (mRoPE included) restart per sample; the engine
does that from cu_seqlens (torch_model.packed_position_ids). The packed row computes what the
padded rows computed, minus the padding: sum_seq_len_squared is the sum of the samples' squares.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import torch

from moe_vlm.config.schema import Packing
from moe_vlm.data.batch import IGNORE_INDEX, Batch, BatchStats
from moe_vlm.data.bins import padded_length
from moe_vlm.data.errors import NoUsableSamples
from moe_vlm.data.tokenizer import ByteTokenizer
from moe_vlm.data.vision import ImagePreprocessor

log = logging.getLogger(__name__)

# Warn for each of the first few skipped samples by key; the count in the stats covers the rest.
MAX_SKIP_WARNINGS = 20
# A source that yields this many skipped samples in a row has nothing usable left.
MAX_CONSECUTIVE_SKIPS = 1000


@dataclass
class RawSample:
    key: str  # unique and stable: names the sample in warnings
    images: list[torch.Tensor]  # uint8 [3, H, W]
    text_ids: list[int]


@dataclass(frozen=True)
class SkippedSample:
    key: str
    reason: str
    too_long: bool = False  # skipped for its length (the images alone fill seq_length), data/lengths.py


@dataclass
class EncodedSample:
    key: str
    input_ids: torch.Tensor  # [length] int64
    labels: torch.Tensor  # [length] int64
    mm_token_type_ids: torch.Tensor  # [length] int32
    pixel_values: torch.Tensor | None
    image_grid_thw: torch.Tensor | None
    original_hw: list[tuple[int, int]] = field(default_factory=list)
    resized_hw: list[tuple[int, int]] = field(default_factory=list)
    text_tokens: int = 0  # text ids kept (markers excluded)
    truncated_text_tokens: int = 0

    @property
    def length(self) -> int:
        return int(self.input_ids.numel())

    @property
    def images(self) -> int:
        return 0 if self.image_grid_thw is None else int(self.image_grid_thw.shape[0])


class SampleEncoder:
    """Raw sample -> token sequence with image placeholders, within seq_length."""

    def __init__(self, tokenizer: ByteTokenizer, preprocessor: ImagePreprocessor, seq_length: int) -> None:
        self.tokenizer = tokenizer
        self.preprocessor = preprocessor
        self.seq_length = seq_length

    def encode(self, sample: RawSample) -> EncodedSample | SkippedSample:
        if not sample.text_ids:
            return SkippedSample(sample.key, "sample has no text")
        processed = None
        image_tokens: list[int] = []
        if sample.images:
            try:
                processed = self.preprocessor(sample.images)
            except ValueError as exc:  # e.g. an aspect ratio past 200:1
                return SkippedSample(sample.key, f"image processor rejected it: {exc}")
            image_tokens = self.preprocessor.tokens_per_image(processed.image_grid_thw)
        image_span = sum(tokens + 2 for tokens in image_tokens)
        room_for_text = self.seq_length - image_span
        if room_for_text < 1:
            return SkippedSample(
                sample.key,
                f"its {len(image_tokens)} image(s) need {image_span} tokens, leaving no room for text in "
                f"seq_length={self.seq_length} (raise seq_length or lower data.max_pixels)",
                too_long=True,
            )
        text = sample.text_ids[:room_for_text]
        tok = self.tokenizer
        ids: list[int] = []
        types: list[int] = []
        for tokens in image_tokens:
            ids += [tok.vision_start_token_id, *([tok.image_token_id] * tokens), tok.vision_end_token_id]
            types += [0, *([1] * tokens), 0]
        ids += text
        types += [0] * len(text)
        input_ids = torch.tensor(ids, dtype=torch.long)
        mm_token_type_ids = torch.tensor(types, dtype=torch.int32)
        labels = torch.full_like(input_ids, IGNORE_INDEX)
        labels[image_span:] = input_ids[image_span:]
        return EncodedSample(
            key=sample.key,
            input_ids=input_ids,
            labels=labels,
            mm_token_type_ids=mm_token_type_ids,
            pixel_values=None if processed is None else processed.pixel_values,
            image_grid_thw=None if processed is None else processed.image_grid_thw,
            original_hw=[] if processed is None else processed.original_hw,
            resized_hw=[] if processed is None else processed.resized_hw,
            text_tokens=len(text),
            truncated_text_tokens=len(sample.text_ids) - len(text),
        )


class SkipCounter:
    """Counts skipped samples, warns by key for the first few, and notices a source gone bad."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.total = 0
        self.consecutive = 0

    def skip(self, skipped: SkippedSample) -> None:
        self.total += 1
        self.consecutive += 1
        if self.total <= MAX_SKIP_WARNINGS:
            log.warning("data=%s: skipped sample %s: %s", self.kind, skipped.key, skipped.reason)
            if self.total == MAX_SKIP_WARNINGS:
                log.warning(
                    "data=%s: further skipped samples are counted in data.stats, not listed", self.kind
                )
        if self.consecutive >= MAX_CONSECUTIVE_SKIPS:
            raise NoUsableSamples(
                f"data={self.kind}: the last {self.consecutive} samples were all skipped "
                f"(last: {skipped.key}: {skipped.reason}). "
                "Fix: check the dataset, seq_length and data.max_pixels."
            )

    def used(self) -> None:
        self.consecutive = 0


def encoded_samples(
    samples: Iterable[RawSample | SkippedSample], encoder: SampleEncoder, skips: SkipCounter
) -> Iterator[EncodedSample]:
    for sample in samples:
        encoded = sample if isinstance(sample, SkippedSample) else encoder.encode(sample)
        if isinstance(encoded, SkippedSample):
            skips.skip(encoded)
            continue
        skips.used()
        yield encoded


def collate(
    samples: Iterable[RawSample | SkippedSample],
    encoder: SampleEncoder,
    mbs: int,
    packing: Packing,
    pad_token_id: int,
    data_kind: str,
) -> Iterator[Batch]:
    """Endless micro-batches of `mbs` samples from an endless sample stream."""
    skips = SkipCounter(data_kind)
    encoded = encoded_samples(samples, encoder, skips)
    return batches(encoded, skips, encoder.seq_length, mbs, packing, pad_token_id, data_kind)


def batches(
    encoded: Iterator[EncodedSample],
    skips: SkipCounter,
    seq: int,
    mbs: int,
    packing: Packing,
    pad_token_id: int,
    data_kind: str,
) -> Iterator[Batch]:
    """Micro-batches of `mbs` samples from encoded samples; `skips` counts what the stream dropped."""
    skipped_before = 0
    while True:
        try:
            samples = [next(encoded) for _ in range(mbs)]
        except StopIteration:
            return  # only a finite source ends; the data sources themselves repeat forever
        batch = (
            assemble_packed(samples, pad_token_id, data_kind)
            if packing is Packing.in_batch
            else assemble([[sample] for sample in samples], seq, pad_token_id, data_kind)
        )
        batch.stats.skipped_samples = skips.total - skipped_before
        skipped_before = skips.total
        yield batch


def assemble_packed(samples: list[EncodedSample], pad_token_id: int, data_kind: str) -> Batch:
    """The micro-batch in one unpadded row: [1, sum of lengths], with cu_seqlens at the boundaries."""
    length = sum(sample.length for sample in samples)
    return build_batch([samples], length, 1, Packing.in_batch, pad_token_id, data_kind)


def assemble(rows: list[list[EncodedSample]], seq: int, pad_token_id: int, data_kind: str) -> Batch:
    """One batch of len(rows) rows x seq positions, each row one sample padded to seq."""
    return build_batch(rows, seq, 1, Packing.none, pad_token_id, data_kind)


def build_batch(
    rows: list[list[EncodedSample]],
    row_length: int,
    multiple: int,
    packing: Packing,
    pad_token_id: int,
    data_kind: str,
) -> Batch:
    """THE batch builder of every layout: len(rows) rows of row_length positions.

    A row's samples lie one after another, each from the padded end of the one before it
    (padded_length(length, multiple)), the last one's padding running to the row's end. Each
    sample's first label is IGNORE_INDEX: nothing before it in its own sample predicts it (the
    label at a row's position 0 is never read anyway: both engines shift labels left).

    `packing` names the layout, and so which boundaries the batch carries: none (one sample per
    row) none; in_batch (one row of the micro-batch back to back, multiple 1) cu_seqlens; buffer
    (data/packer.py) cu_seqlens of the real tokens and cu_seqlens_padded of the padded starts, over
    the rows laid end to end (THD).
    """
    mbs = len(rows)
    input_ids = torch.full((mbs, row_length), pad_token_id, dtype=torch.long)
    labels = torch.full((mbs, row_length), IGNORE_INDEX, dtype=torch.long)
    attention_mask = torch.zeros((mbs, row_length), dtype=torch.long)
    mm_token_type_ids = torch.zeros((mbs, row_length), dtype=torch.int32)
    cu_seqlens, cu_padded = [0], [0]
    samples = [sample for row in rows for sample in row]
    for r, row in enumerate(rows):
        offset = 0
        for position, sample in enumerate(row):
            end = offset + sample.length
            last = position == len(row) - 1
            following = row_length if last else offset + padded_length(sample.length, multiple)
            if max(end, following) > row_length:
                raise ValueError(f"row {r}: its samples need more than {row_length} positions")
            input_ids[r, offset:end] = sample.input_ids
            labels[r, offset:end] = sample.labels
            labels[r, offset] = IGNORE_INDEX
            mm_token_type_ids[r, offset:end] = sample.mm_token_type_ids
            attention_mask[r, offset:end] = 1
            offset = following
            cu_seqlens.append(cu_seqlens[-1] + sample.length)
            cu_padded.append(r * row_length + offset)
    visual = [
        (s.pixel_values, s.image_grid_thw)
        for s in samples
        if s.pixel_values is not None and s.image_grid_thw is not None
    ]
    grid = torch.cat([g for _, g in visual]) if visual else None
    patches = [] if grid is None else [int(n) for n in grid.prod(dim=-1).tolist()]
    images = sum(sample.images for sample in samples)
    markers = 2 * images
    stats = BatchStats(
        sequences=mbs,
        padded_tokens=mbs * row_length,
        real_tokens=int(attention_mask.sum()),
        text_tokens=sum(sample.text_tokens for sample in samples) + markers,
        image_tokens=int((mm_token_type_ids == 1).sum()),
        # The label of a row's first position is never predicted (next-token loss shifts by one).
        loss_tokens=int((labels[:, 1:] != IGNORE_INDEX).sum()),
        images=images,
        vision_patches=sum(patches),
        # causal attention inside each sample only: the sum of the samples' squares
        sum_seq_len_squared=sum(sample.length**2 for sample in samples),
        sum_patches_squared=sum(n * n for n in patches),
        samples=len(samples),
        vision_marker_tokens=markers,
        truncated_text_tokens=sum(sample.truncated_text_tokens for sample in samples),
    )
    return Batch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        labels=labels,
        mm_token_type_ids=mm_token_type_ids,
        pixel_values=torch.cat([p for p, _ in visual]) if visual else None,
        image_grid_thw=grid,
        stats=stats,
        data_kind=data_kind,
        sample_keys=[sample.key for sample in samples],
        images_per_sample=[sample.images for sample in samples],
        image_original_hw=[hw for sample in samples for hw in sample.original_hw],
        image_resized_hw=[hw for sample in samples for hw in sample.resized_hw],
        cu_seqlens=None if packing is Packing.none else torch.tensor(cu_seqlens, dtype=torch.int32),
        cu_seqlens_padded=torch.tensor(cu_padded, dtype=torch.int32) if packing is Packing.buffer else None,
    )
