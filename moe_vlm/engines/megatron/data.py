"""The Megatron engine's mock and synthetic data: the torch engine's seeded samples, fed to Bridge.

Bridge builds a run's datasets from ``cfg.dataset``: ``get_dataset_provider`` sends its own config
classes to its own builders and any other ``DatasetProvider`` to that object's
``build_datasets(context)`` (megatron/bridge/data/utils.py:103-146, data/base.py:85-98).
MoeVlmDatasetConfig is such a provider. Its dataset is sample i of the project's seeded source
(data/indexed.py: mock text, or synthetic images drawn from the data group's distribution), encoded
by the same byte tokenizer and Qwen3-VL image processor as on the torch engine, and nothing else:

- nothing is generated up front: a sample exists while a worker builds its batch, so host memory
  does not grow with the run (Bridge's MockVLMSFTDataset holds num_base_examples decoded images);
- Bridge's loader (data/loaders.py:321-337) walks it with MegatronPretrainingSampler and hands
  ``collate_fn`` to a torch DataLoader with ``num_workers`` workers, so the image processor and the
  collate run in those workers, not inside the training step;
- the collate turns the torch engine's batch into the dict Bridge's Qwen3-VL step reads
  (models/qwen_vl/qwen3_vl_step.py:42-98), with Bridge's label convention (qwen_vl/data/
  collate_fn.py:341-347): labels shifted left by one, IGNORE_INDEX where loss_mask is 0.

Imports megatron.bridge: only the engine, on a machine with the stack, imports this module.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import torch
from megatron.bridge.data.base import DatasetBuildContext, DatasetProvider
from megatron.bridge.data.packing.in_batch import build_mcore_thd_sequence_batch_from_rows
from megatron.bridge.training.utils.visual_inputs import GenericVisualInputs

from moe_vlm.config.schema import DataConfig, DataKind, ModelConfig, Packing
from moe_vlm.config.spec import RunSpec
from moe_vlm.data import indexed_samples
from moe_vlm.data.batch import IGNORE_INDEX, Batch
from moe_vlm.data.indexed import rank_indices
from moe_vlm.data.packer import Packer, assemble_rows
from moe_vlm.data.sequence import EncodedSample, assemble
from moe_vlm.data.workers import data_workers
from moe_vlm.knobs.bridge_fields import SEEDED_DATA_FIELDS, SEEDED_MODEL_FIELDS


@dataclass(kw_only=True)
class MoeVlmDatasetConfig(DatasetProvider):
    """Declarative: every field is a knob's value (bridge_fields.FIELD_MAP sets and checks them)."""

    kind: str  # mock | synthetic (| bridge_mock, with buffer packing)
    seq_length: int
    random_seed: int
    model_name: str
    # data.*: the synthetic distribution and the image processor's bounds
    min_images: int
    max_images: int
    min_long_side_px: int
    max_long_side_px: int
    aspect_ratios: list[float]
    min_text_tokens: int
    max_text_tokens: int
    min_pixels: int
    max_pixels: int
    # model.*: what the encoder needs (patching, special token ids)
    vision_patch_size: int
    vision_temporal_patch_size: int
    vision_spatial_merge_size: int
    image_token_id: int
    vision_start_token_id: int
    vision_end_token_id: int
    pad_token_id: int
    vocab_size: int
    dataloader_type: Literal["single"] | None = "single"
    # data.packing=in_batch. ConfigContainer.validate reads the first (training/config.py:1150) and
    # writes the CP/SP alignment into the second (:1236-1239), as for its own dataset configs.
    enable_in_batch_packing: bool = False
    in_batch_packing_pad_to_multiple_of: int = 1
    # data.packing=buffer (0: off): one dataset item is one packed row (PackedRows). The rows of DP
    # rank r are the torch engine's: rank r's sample stream packed by the same Packer, so the row
    # geometry and the sampler's walk (MBS, DP size) are part of the config.
    packing_buffer: int = 0
    packed_row_length: int = 0
    sample_multiple: int = 1
    micro_batch_size: int = 1
    data_parallel_size: int = 1

    def packing(self) -> Packing:
        if self.packing_buffer > 0:
            return Packing.buffer
        return Packing.in_batch if self.enable_in_batch_packing else Packing.none

    def data_config(self) -> DataConfig:
        # packing shapes bridge_mock's draw (longer answers when it packs, data/bridge_mock.py)
        return DataConfig(
            kind=DataKind(self.kind),
            packing=self.packing(),
            **{name: getattr(self, name) for name in SEEDED_DATA_FIELDS},
        )

    def model_config(self) -> ModelConfig:
        # The fields the tokenizer and image processor read; the model's sizes do not shape samples.
        fields = {name: getattr(self, name) for name in SEEDED_MODEL_FIELDS}
        return ModelConfig(name=self.model_name, **fields)

    def build_datasets(self, context: DatasetBuildContext) -> tuple[Any, Any, Any]:
        # With buffer packing Bridge's counts (train_samples = train_iters x GBS, training/data.py)
        # count dataset items, i.e. packed rows: GBS is rows per step, the samples they hold vary.
        dataset = PackedRows if self.packing_buffer > 0 else SeededSamples
        splits = (context.train_samples, context.valid_samples, context.test_samples)
        train, valid, test = (dataset(self, n) if n > 0 else None for n in splits)
        return train, valid, test


def dataset_config(spec: RunSpec) -> MoeVlmDatasetConfig:
    """The config THE table's class row puts at cfg.dataset for data=mock and data=synthetic (the
    table's data.packing row sets enable_in_batch_packing)."""
    return MoeVlmDatasetConfig(
        kind=spec.data.kind.value,
        seq_length=spec.seq_length,
        random_seed=spec.seed,
        model_name=spec.model.name,
        num_workers=data_workers(spec).count,
        packing_buffer=spec.data.packing_buffer if spec.data.packing is Packing.buffer else 0,
        packed_row_length=spec.packed_row_length,
        sample_multiple=spec.collate_padding_multiple,
        micro_batch_size=spec.mbs,
        # MegatronPretrainingSampler's data_parallel_size: pg_collection.dp (training/setup.py:471,
        # data/loaders.py:306-307), DP without CP: the layout's dp
        data_parallel_size=max(spec.layout.dp, 1),
        **{name: getattr(spec.data, name) for name in SEEDED_DATA_FIELDS},
        **{name: getattr(spec.model, name) for name in SEEDED_MODEL_FIELDS},
    )


class SeededSamples(torch.utils.data.Dataset[tuple[EncodedSample, int]]):
    """Samples 0..length-1 of the seeded source; each one is built when a loader asks for it."""

    def __init__(self, config: MoeVlmDatasetConfig, length: int) -> None:
        self.length = length
        self.kind = config.kind
        self.seq_length = config.seq_length
        self.pad_token_id = config.pad_token_id
        self.packing = config.enable_in_batch_packing
        self.pad_to_multiple_of = config.in_batch_packing_pad_to_multiple_of
        self.source = indexed_samples(
            config.model_config(), config.data_config(), config.random_seed, config.seq_length
        )

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[EncodedSample, int]:
        if not 0 <= index < self.length:
            raise IndexError(f"sample {index} of {self.length}")
        return self.source.encoded(index)

    def collate_fn(self, items: list[tuple[EncodedSample, int]]) -> dict[str, Any]:
        """One sample per row, padded to seq_length: the torch engine's batch, in Bridge's form; with
        in-batch packing, the micro-batch packed by Bridge's own packing collate (packed_bridge_batch)."""
        samples = [sample for sample, _ in items]
        skipped = sum(skipped for _, skipped in items)
        if self.packing:
            return packed_bridge_batch(samples, self.seq_length, self.pad_to_multiple_of, skipped)
        batch = assemble([[sample] for sample in samples], self.seq_length, self.pad_token_id, self.kind)
        batch.stats.skipped_samples = skipped
        return bridge_batch(batch)


def packed_bridge_batch(
    samples: list[EncodedSample], seq_length: int, pad_to_multiple_of: int, skipped: int
) -> dict[str, Any]:
    """The micro-batch as ONE THD row, built by the function Bridge's Qwen-VL collate packs with
    (models/qwen_vl/data/collate_fn.py:224-230 -> data/packing/in_batch.py:89-215): per sample its ids,
    positions from 0, labels shifted left (Bridge's convention, collate_fn.py:196-201) and the loss
    mask; the images in sample order, as the torch engine's packed batch holds them."""
    rows = []
    for sample in samples:
        labels = torch.cat([sample.labels[1:], torch.tensor([IGNORE_INDEX])])
        rows.append(
            {
                "input_ids": sample.input_ids,
                "position_ids": torch.arange(sample.length),
                "labels": labels,
                "loss_mask": (labels != IGNORE_INDEX).float(),
            }
        )
    packed = build_mcore_thd_sequence_batch_from_rows(
        rows,
        sequence_length=seq_length,
        pad_token_id=0,  # Bridge's Qwen-VL collate aligns with 0 too (collate_fn.py:227)
        ignore_index=IGNORE_INDEX,
        pad_to_multiple_of=pad_to_multiple_of,
    )
    pixels = [s.pixel_values for s in samples if s.pixel_values is not None]
    grids = [s.image_grid_thw for s in samples if s.image_grid_thw is not None]
    packed["visual_inputs"] = GenericVisualInputs(
        pixel_values=torch.cat(pixels) if pixels else None, image_grid_thw=torch.cat(grids) if grids else None
    )
    packed["skipped_samples"] = torch.tensor(skipped)
    return packed


def bridge_batch(batch: Batch) -> dict[str, Any]:
    """The keys Bridge's Qwen3-VL step reads; `skipped_samples` is ours (the step ignores it)."""
    rows, seq = batch.input_ids.shape
    # Megatron predicts labels[t] at position t; ours (as HF's) hold the token at t.
    labels = torch.cat([batch.labels[:, 1:], torch.full((rows, 1), IGNORE_INDEX, dtype=torch.long)], dim=1)
    return {
        "input_ids": batch.input_ids,
        "attention_mask": batch.attention_mask,
        "position_ids": torch.arange(seq).unsqueeze(0).expand(rows, -1).contiguous(),
        "labels": labels,
        "loss_mask": (labels != IGNORE_INDEX).float(),
        "visual_inputs": GenericVisualInputs(
            pixel_values=batch.pixel_values, image_grid_thw=batch.image_grid_thw
        ),
        "skipped_samples": torch.tensor(batch.stats.skipped_samples),
    }


PackedRow = tuple[list[EncodedSample], int]  # a row's samples, and the draws replaced for them


class PackedRows(torch.utils.data.Dataset[PackedRow]):
    """data.packing=buffer: item i is one packed row, the torch engine's row for the same seed.

    MegatronPretrainingSampler hands DP rank r the items [(s x dp + r) x mbs, +mbs) of step s
    (data/samplers.py:125-195), so item i is row k = s x mbs + (i mod mbs) of rank r's packer: the
    Packer (data/packer.py) over rank r's sample stream, exactly as data.build_batches builds it for
    the torch engine. Rows are stateless by index: row i is a function of (seed, i, the config), so
    Bridge's checkpointed position (consumed_train_samples, here rows; the sampler restarts at it,
    data/loaders.py:321-337) resumes the same rows with no packer state to save. The price: a packer
    reaches row k by packing rows 0..k-1 again, once per loader worker that starts (or resumes)
    there, and each worker walks every row of its rank (it keeps only its own batches').
    """

    def __init__(self, config: MoeVlmDatasetConfig, length: int) -> None:
        self.length = length
        self.config = config
        self.source = indexed_samples(
            config.model_config(), config.data_config(), config.random_seed, config.seq_length
        )
        self.packers: dict[int, tuple[Packer, int]] = {}  # rank -> its packer, rows it emitted
        self.replaced: dict[str, int] = {}  # sample key -> draws replaced before it (not yet in a row)

    def __len__(self) -> int:
        return self.length

    def locate(self, index: int) -> tuple[int, int]:
        """(DP rank, row of that rank's packer) of item `index`, the sampler's walk inverted."""
        mbs, dp = self.config.micro_batch_size, self.config.data_parallel_size
        step, within = divmod(index, mbs * dp)
        rank, column = divmod(within, mbs)
        return rank, step * mbs + column

    def _stream(self, rank: int) -> Iterator[EncodedSample]:
        for index in rank_indices(rank, self.config.data_parallel_size, self.config.micro_batch_size):
            sample, replaced = self.source.encoded(index)
            self.replaced[sample.key] = replaced
            yield sample

    def __getitem__(self, index: int) -> PackedRow:
        if not 0 <= index < self.length:
            raise IndexError(f"row {index} of {self.length}")
        rank, row = self.locate(index)
        packer, emitted = self.packers.get(rank, (None, 0))
        if packer is None or emitted > row:  # a row behind this packer: pack again from the start
            config = self.config
            packer = Packer(
                self._stream(rank), config.packed_row_length, config.packing_buffer, config.sample_multiple
            )
            emitted = 0
        while True:
            samples = next(packer)
            emitted += 1
            replaced = sum(self.replaced.pop(sample.key, 0) for sample in samples)
            if emitted > row:
                self.packers[rank] = (packer, emitted)
                return samples, replaced

    def collate_fn(self, items: list[PackedRow]) -> dict[str, Any]:
        config = self.config
        batch = assemble_rows(
            [samples for samples, _ in items],
            config.packed_row_length,
            config.sample_multiple,
            config.pad_token_id,
            config.kind,
        )
        batch.stats.skipped_samples = sum(replaced for _, replaced in items)
        return buffer_bridge_batch(batch)


def buffer_bridge_batch(batch: Batch) -> dict[str, Any]:
    """The MBS packed rows laid end to end as ONE THD row, in the form of Bridge's own builder
    (data/packing/in_batch.py:189-215) that vlm_step consumes (training/vlm_step.py:129-131, 159-195):
    cu_seqlens_q the samples' real bounds, cu_seqlens_q_padded the physical ones (a row's last sample
    owns the row's tail), positions from 0 at each padded start and continued over its padding (as
    Bridge's builder, :196-205; Qwen3-VL's model replaces them by mRoPE per packed range,
    modelling_qwen3_vl/rope.py:339-365), labels shifted left (Bridge's convention; the packer's first
    label of each sample is IGNORE_INDEX, so no sample predicts the next one's first token)."""
    assert batch.cu_seqlens is not None and batch.cu_seqlens_padded is not None
    tokens = batch.input_ids.reshape(1, -1)
    ours = batch.labels.reshape(1, -1)
    labels = torch.cat([ours[:, 1:], torch.full((1, 1), IGNORE_INDEX, dtype=ours.dtype)], dim=1)
    padded = batch.cu_seqlens_padded
    spans = (padded[1:] - padded[:-1]).long()
    starts = torch.repeat_interleave(padded[:-1].long(), spans)
    positions = (torch.arange(tokens.shape[1]) - starts).unsqueeze(0)
    return {
        "input_ids": tokens,
        "position_ids": positions,
        "attention_mask": None,
        "labels": labels,
        "loss_mask": (labels != IGNORE_INDEX).float(),
        "cu_seqlens_q": batch.cu_seqlens,
        "cu_seqlens_kv": batch.cu_seqlens,
        "cu_seqlens_q_padded": padded,
        "cu_seqlens_kv_padded": padded,
        "max_seqlen_q": spans.max().to(torch.int32),
        "max_seqlen_kv": spans.max().to(torch.int32),
        "visual_inputs": GenericVisualInputs(
            pixel_values=batch.pixel_values, image_grid_thw=batch.image_grid_thw
        ),
        "skipped_samples": torch.tensor(batch.stats.skipped_samples),
    }
