"""data=real with data.packing=buffer on the Megatron engine: Energon's packing API, our Qwen-VL encoder.

Energon packs only through a task encoder that defines ``select_samples_to_pack`` and
``pack_selected_samples`` (megatron/energon/task_encoder/base.py:578-596); Bridge 0.6.2's
QwenVLTaskEncoder (models/qwen_vl/data/energon.py:175) defines neither, and Bridge's Energon builder
constructs only that class (data/builders/energon.py:230-256). So:

- PackingQwenVLTaskEncoder subclasses it. ``encode_sample`` keeps Bridge's normalisation (the HF
  conversation, media first, the image-count limit) and then runs Bridge's own per-sample Qwen
  collate (models/qwen_vl/data/collate_fn.py:153-222: the processor on one sample, unpadded, its
  assistant loss mask), so a sample's length is exact (text plus image tokens after the processor)
  before the buffer is packed, and its tokens are the unpacked encoder's.
- ``select_samples_to_pack`` is the torch engine's first-fit-decreasing (data/bins.py) on the padded
  lengths, ``pack_selected_samples`` keeps the row's samples, and ``batch`` lays MBS rows out with the
  torch engine's builder (data/packer.py assemble_rows) into the THD dict vlm_step reads
  (engines/megatron/data.py buffer_bridge_batch): one algorithm and one layout for every data kind.
- Energon's PackingDataset refills its buffer only once every pack of the last one was emitted
  (wrappers/packing_dataset.py:197-200, 323-335), as data/packer.py Packer does: both engines cut a
  sample stream into the same rows.
- PackedEnergonDatasetConfig is the DatasetProvider THE table puts at cfg.dataset for this case. It is
  not an EnergonDatasetConfig: Bridge's registry would send that to its own builder and its own
  encoder (data/utils.py:93-124); it builds Bridge's EnergonMultiModalDataModule with this encoder and
  the packing buffer, as EnergonDatasetBuilder.build does (data/builders/energon.py:285-312).

Over-length samples follow data/sequence.py's one policy: text cut to seq_length and counted
(truncated_text_tokens), a sample whose images alone pass seq_length skipped (Energon's SkipSample).

Imports megatron.bridge and Energon: only the engine, on a machine with the stack, imports this module.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Literal

import torch
from megatron.bridge.data.base import DatasetBuildContext, DatasetProvider
from megatron.bridge.data.builders.energon import QwenVLEnergonTaskEncoderConfig
from megatron.bridge.models.qwen_vl.data.collate_fn import qwen2_5_collate_fn
from megatron.bridge.models.qwen_vl.data.energon import QwenVLTaskEncoder
from megatron.energon import Sample, SkipSample, stateless

from moe_vlm.data.batch import IGNORE_INDEX
from moe_vlm.data.bins import first_fit_decreasing, padded_length
from moe_vlm.data.packer import assemble_rows
from moe_vlm.data.sequence import EncodedSample
from moe_vlm.engines.megatron.data import buffer_bridge_batch

_LOG = logging.getLogger(__name__)


@dataclass
class PackableSample(Sample):  # Energon's Sample: the restore keys its checkpoints replay by
    """One Energon sample encoded to its exact tokens: what the packing buffer holds."""

    sample: EncodedSample


@dataclass
class PackedRow(Sample):
    """One packed row's samples, in the order first-fit-decreasing placed them."""

    samples: list[EncodedSample]


class PackingQwenVLTaskEncoder(QwenVLTaskEncoder):
    """Bridge's Qwen-VL task encoder with Energon's packing API (data.packing=buffer, data=real)."""

    def __init__(
        self, *args: Any, row_length: int, sample_multiple: int, pad_token_id: int, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        if row_length % sample_multiple or row_length < self.seq_length:
            raise ValueError(
                f"row_length={row_length} must be >= seq_length={self.seq_length} and a multiple of "
                f"{sample_multiple}"
            )
        self.row_length = row_length
        self.sample_multiple = sample_multiple
        self.pad_token_id = pad_token_id
        # The id the processor expands per image, not Bridge's self.image_token_id: that one is looked
        # up as "<image>" (energon.py:79-93), which Qwen's tokenizer does not hold.
        self.image_pad_token_id = int(self.image_processor.image_token_id)
        # samples this worker's encoder dropped since its last batch: that batch counts them
        self.skipped = 0

    # Stateless for Energon: a restored checkpoint refills the packing buffer by re-encoding its
    # samples from their restore keys (wrappers/buffer.py:42-48 -> map_dataset.py:157-177), which
    # Energon allows only for a map marked so (task_encoder/base.py:761-766). The output depends on
    # the sample alone; `skipped` is a tally batch() reads and zeroes, so it is 0 whenever a batch has
    # just been handed out, the only point a loader's state is saved (with workers Energon replays
    # the samples since the worker's checkpoint, which re-counts the same skips).
    @stateless
    def encode_sample(self, sample: Any) -> PackableSample:
        task = super().encode_sample(sample)
        one = qwen2_5_collate_fn(
            [task.example],
            self.image_processor,
            min_pixels=self.min_pixels,
            max_pixels=self.max_pixels,
            require_assistant_matches=True,
            enable_in_batch_packing=True,  # the per-sample rows, unpadded (collate_fn.py:153-222)
        )
        return PackableSample.derive_from(sample, sample=self._encoded(task.__key__, one))

    def _encoded(self, key: str, one: dict[str, Any]) -> EncodedSample:
        input_ids = one["input_ids"][0]
        # Bridge's labels are shifted left (labels[t] is token t+1, collate_fn.py:198-209); the
        # project's hold the token at t, so shift right: the same targets, nothing lost (the last
        # shifted label is always IGNORE_INDEX).
        shifted = one["labels"][0]
        labels = torch.cat([shifted.new_full((1,), IGNORE_INDEX), shifted[:-1]])
        visual = one["visual_inputs"]
        pixel_values = getattr(visual, "pixel_values", None)
        grid = getattr(visual, "image_grid_thw", None)
        image = input_ids == self.image_pad_token_id
        images = 0 if grid is None else int(grid.shape[0])
        cut = max(0, int(input_ids.numel()) - self.seq_length)
        if cut:
            # Media come first (encode_sample's media_first), so a cut at seq_length keeps every
            # image token unless the images alone pass it.
            if bool(image[self.seq_length :].any()):
                _LOG.warning("Skipping sample %s: its image tokens pass seq_length=%d", key, self.seq_length)
                self.skipped += 1
                raise SkipSample()
            input_ids, labels, image = (t[: self.seq_length] for t in (input_ids, labels, image))
        image_tokens = int(image.sum())
        return EncodedSample(
            key=key,
            input_ids=input_ids.long(),
            labels=labels.long(),
            mm_token_type_ids=image.int(),
            pixel_values=pixel_values,
            image_grid_thw=grid,
            # the chat template's and the vision markers' tokens; build_batch adds 2 per image back
            text_tokens=int(input_ids.numel()) - image_tokens - 2 * images,
            truncated_text_tokens=cut,
        )

    def select_samples_to_pack(self, samples: list[PackableSample]) -> list[list[PackableSample]]:
        lengths = [padded_length(s.sample.length, self.sample_multiple) for s in samples]
        return [[samples[i] for i in row] for row in first_fit_decreasing(lengths, self.row_length)]

    @stateless
    def pack_selected_samples(self, samples: list[PackableSample]) -> PackedRow:
        return PackedRow.derive_from(samples[0], samples=[s.sample for s in samples])

    def batch(self, samples: list[PackedRow]) -> dict[str, Any]:
        rows = [row.samples for row in samples]
        batch = assemble_rows(rows, self.row_length, self.sample_multiple, self.pad_token_id, "real")
        batch.stats.skipped_samples, self.skipped = self.skipped, 0
        bridge = buffer_bridge_batch(batch)
        # which samples, in THD order (vlm_step passes keys it does not read as None, vlm_step.py:136-156)
        bridge["__keys__"] = [sample.key for row in rows for sample in row]
        return bridge

    def encode_batch(self, batch: dict[str, Any]) -> dict[str, Any]:
        return batch  # already the dict vlm_step reads (Bridge's reads a dataclass's fields)


@dataclass(kw_only=True)
class PackedEnergonDatasetConfig(DatasetProvider):
    """Declarative, EnergonDatasetConfig's fields that THE table sets, plus the packed row's geometry."""

    path: str | None  # rule A001 refuses data=real without data.path; finalize() as the engine does
    seq_length: int
    micro_batch_size: int
    task_encoder: QwenVLEnergonTaskEncoderConfig
    packing_buffer_size: int
    packed_row_length: int
    sample_multiple: int = 1
    pad_token_id: int = 0
    dataloader_type: Literal["external"] | None = "external"
    shuffle_buffer_size: int = 100
    max_samples_per_sequence: int | None = None
    # Rows shared with Bridge's Energon config (bridge_fields _if_bridge_data): buffer packing is
    # neither in-batch nor padded, so they hold what the table sets and nothing reads them.
    enable_in_batch_packing: bool = False
    defer_in_batch_packing_to_step: bool = False
    pad_to_max_length: bool = False

    def finalize(self) -> None:
        """The declarative checks of Bridge's EnergonDatasetConfig.validate (data/builders/energon.py:
        147-175), which ConfigContainer.validate runs only for its own class (training/config.py:
        1192-1196); it calls any dataset's finalize (config.py:1251), so a point without a path is
        refused in the engine's CPU pre-flight, not on the device when the loader is built."""
        if not isinstance(self.path, str) or not self.path.strip():
            raise ValueError("PackedEnergonDatasetConfig.path must be set to a non-empty dataset path.")
        for name in ("seq_length", "micro_batch_size", "packing_buffer_size", "packed_row_length"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be greater than 0.")
        if self.sample_multiple <= 0 or self.shuffle_buffer_size <= 0:
            raise ValueError("sample_multiple and shuffle_buffer_size must be greater than 0.")
        self.task_encoder.validate()

    def encoder(self) -> PackingQwenVLTaskEncoder:
        """As Bridge's builder makes its Qwen-VL encoder (data/builders/energon.py:230-256)."""
        from transformers import AutoTokenizer, Qwen3VLProcessor

        config = self.task_encoder
        config.validate()
        return PackingQwenVLTaskEncoder(
            tokenizer=AutoTokenizer.from_pretrained(config.hf_processor_path),
            image_processor=Qwen3VLProcessor.from_pretrained(config.hf_processor_path),
            temporal_patch_size=config.temporal_patch_size,
            spatial_merge_size=config.spatial_merge_size,
            patch_size=config.patch_size,
            max_padding_length=self.seq_length,
            min_pixels=config.min_pixels,
            max_pixels=config.max_pixels,
            max_num_images=config.max_num_images,
            max_num_frames=config.max_num_frames,
            max_visual_tokens=config.max_visual_tokens,
            row_length=self.packed_row_length,
            sample_multiple=self.sample_multiple,
            pad_token_id=self.pad_token_id,
        )

    def build_datasets(self, context: DatasetBuildContext) -> tuple[Any, Any, Any]:
        from megatron.bridge.data.energon.base_energon_datamodule import EnergonMultiModalDataModule

        if context.train_samples <= 0 and context.valid_samples <= 0:
            return None, None, None
        if not self.path:
            raise ValueError("PackedEnergonDatasetConfig.path must name an Energon dataset (data.path)")
        encoder = self.encoder()
        module = EnergonMultiModalDataModule(
            path=self.path,
            tokenizer=context.tokenizer,
            seq_length=self.seq_length,
            task_encoder=encoder,
            validation_task_encoder=encoder,
            micro_batch_size=self.micro_batch_size,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            shuffle_buffer_size=self.shuffle_buffer_size,
            max_samples_per_sequence=self.max_samples_per_sequence,
            packing_buffer_size=self.packing_buffer_size,
            pg_collection=context.pg_collection,
        )
        # Bridge's EnergonDataloader itself, not iter() of it as Bridge's builder returns
        # (data/builders/energon.py:310-311): its __iter__ hands out the bare cyclic generator
        # (energon/base_energon_datamodule.py:253-254), so the RerunDataIterator around it
        # (data/loaders.py:462-467) would lack save_state / restore_state, and Bridge's checkpoint
        # would skip the data position (training/checkpointing.py:1176-1181) or raise when
        # dataset.dataloader_save is set (:1717-1718). The loader has __next__, all the step needs.
        train = module.train_dataloader() if context.train_samples > 0 else None
        valid = module.val_dataloader() if context.valid_samples > 0 else None
        return train, valid, None
