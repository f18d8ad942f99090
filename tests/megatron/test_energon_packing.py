"""data=real with data.packing=buffer on the Megatron engine: Energon's own packing, our encoder (CPU).

Real shards (scripts/build_dataset.py --skimage), a local Qwen3-VL processor, the table's config at
cfg.dataset, and Energon's own loader with packing_buffer_size over the engine's task encoder
(engines/megatron/energon_packing.py):

- every row holds whole samples, none in two rows, each at most seq_length long, the row the RunSpec's
  packed_row_length; each sample's tokens, labels and pixels are what Bridge's unpacked Qwen-VL
  encoder makes of it, and its positions restart at its padded start;
- Energon's packs are the torch engine's Packer's rows over the same sample stream (one algorithm);
- vlm_step's own batch preparation takes the batch as THD;
- a loader saved and restored through Bridge's checkpoint functions continues with the rows the
  uninterrupted loader makes (the packing buffer's contents included), with 0 and 1 workers.
"""

from __future__ import annotations

import copy
import subprocess
import sys
from itertools import islice
from pathlib import Path
from typing import Any

import pytest
import torch

from moe_vlm.data.packer import Packer
from moe_vlm.engines.megatron.config import check_overrides
from moe_vlm.rules import validate
from tests.conftest import REPO, make_spec
from tests.megatron.conftest import RecipeCache, needs_stack, runtime_updated
from tests.megatron.test_data_path import BASE, built, qwen3_vl_checkpoint

pytestmark = needs_stack

BUFFER, SEQ = 8, 1024


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("energon_packing")
    shards = root / "photos"
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "build_dataset.py"), "--skimage", str(shards)],
        capture_output=True, text=True, cwd=REPO, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    probe = make_spec(*BASE, "data=real", f"data.path={shards}")
    return shards, qwen3_vl_checkpoint(root / "checkpoint", probe)


def real(photos: tuple[Path, Path], *extra: str) -> tuple[str, ...]:
    shards, processor = photos
    return (
        *BASE,
        "data=real",
        f"data.path={shards}",
        f"model.hf_model_id={processor}",
        f"seq_length={SEQ}",
        *extra,
    )


def energon_stream(path: Path, **kwargs: Any) -> Any:
    import megatron.energon as energon

    worker = energon.WorkerConfig(rank=0, world_size=1, num_workers=0)
    dataset = energon.get_train_dataset(
        str(path), shuffle_buffer_size=None, max_samples_per_sequence=None, worker_config=worker,
        split_part="train", **kwargs,
    )  # fmt: skip
    return iter(energon.get_loader(dataset))


def test_energon_packs_real_samples_whole_through_the_engines_encoder(
    recipes: RecipeCache, photos: tuple[Path, Path]
) -> None:
    from megatron.bridge.data.builders.energon import build_energon_task_encoder

    spec, cfg = built(recipes, *real(photos, "mbs=1", "data.packing=buffer", f"data.packing_buffer={BUFFER}"))
    assert check_overrides(cfg, spec) == []
    assert type(cfg.dataset).__name__ == "PackedEnergonDatasetConfig"
    assert (
        cfg.dataset.packing_buffer_size == BUFFER and cfg.dataset.packed_row_length == spec.packed_row_length
    )
    encoder = cfg.dataset.encoder()
    batches = list(islice(energon_stream(photos[0], batch_size=spec.mbs, task_encoder=encoder,
                                         packing_buffer_size=BUFFER), 4))  # fmt: skip

    # Bridge's own encoder, unpacked and unpadded, is the reference for every sample's tokens.
    _, plain = built(recipes, *real(photos))
    unpacked = copy.deepcopy(plain.dataset)
    unpacked.pad_to_multiple_of, unpacked.pad_to_max_length = 1, False
    reference = build_energon_task_encoder(unpacked)
    raw = {s.__key__: s for s in islice(energon_stream(photos[0], batch_size=None), 21)}

    seen: list[str] = []
    for batch in batches:
        tokens, labels, positions = batch["input_ids"][0], batch["labels"][0], batch["position_ids"][0]
        assert tokens.numel() == spec.mbs * spec.packed_row_length
        bounds, padded = batch["cu_seqlens_q"].tolist(), batch["cu_seqlens_q_padded"].tolist()
        assert padded[-1] == tokens.numel() and len(bounds) == len(batch["__keys__"]) + 1
        pixels = []
        for s, key in enumerate(batch["__keys__"]):
            start, length = padded[s], bounds[s + 1] - bounds[s]
            assert (
                length <= spec.seq_length
                and start // spec.packed_row_length == (padded[s + 1] - 1) // spec.packed_row_length
            )  # no sample crosses a row
            ref = reference.batch([reference.encode_sample(raw[key])])
            assert torch.equal(tokens[start : start + length], ref.input_ids[0])
            assert torch.equal(labels[start : start + length], ref.labels[0])
            assert torch.equal(positions[start : start + length], torch.arange(length))
            pixels.append(ref.visual_inputs.pixel_values)
        assert torch.equal(batch["visual_inputs"].pixel_values, torch.cat(pixels))
        seen += batch["__keys__"]
    assert len(seen) == len(set(seen))  # no sample in two rows
    assert max(len(b["__keys__"]) for b in batches) >= 2  # rows really pack, or the above says little


def test_energon_packs_as_the_torch_engine_packer(recipes: RecipeCache, photos: tuple[Path, Path]) -> None:
    spec, cfg = built(recipes, *real(photos, "mbs=1", "data.packing=buffer", f"data.packing_buffer={BUFFER}"))
    encoder = cfg.dataset.encoder()
    rows = [b["__keys__"] for b in islice(energon_stream(photos[0], batch_size=1, task_encoder=encoder,
                                                         packing_buffer_size=BUFFER), 6)]  # fmt: skip
    # The same stream, encoded by the same encoder, packed by the torch engine's Packer.
    encoded = [
        encoder.encode_sample(s).sample for s in islice(energon_stream(photos[0], batch_size=None), 21)
    ]
    packer = Packer(iter(encoded), spec.packed_row_length, BUFFER, spec.collate_padding_multiple)
    assert [[s.key for s in next(packer)] for _ in rows] == rows
    # Each sample's image tokens are the ones its image grid expands to (what the stats count).
    merge = spec.model.vision_spatial_merge_size**2
    for sample in encoded:
        assert sample.image_grid_thw is not None
        assert int(sample.mm_token_type_ids.sum()) == int(sample.image_grid_thw.prod(-1).sum()) // merge > 0


def test_vlm_step_takes_the_energon_packed_batch_as_thd(
    recipes: RecipeCache, photos: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from megatron.bridge.training import vlm_step
    from megatron.bridge.training.utils.packed_seq_utils import get_packed_seq_params
    from megatron.core.process_groups_config import ProcessGroupCollection

    from tests.megatron.conftest import model_parallel_rank

    _, cfg = built(recipes, *real(photos, "mbs=1", "data.packing=buffer", f"data.packing_buffer={BUFFER}"))
    batch = next(energon_stream(photos[0], batch_size=1, task_encoder=cfg.dataset.encoder(),
                                packing_buffer_size=BUFFER))  # fmt: skip
    monkeypatch.setattr(torch.Tensor, "cuda", lambda self, *args, **kwargs: self)  # no GPU: identity
    with model_parallel_rank():
        got = vlm_step.get_batch(
            iter([batch]), cfg, pg_collection=ProcessGroupCollection.use_mpu_process_groups()
        )
    tokens, _, _, attention_mask, _, packed, visual = got
    assert torch.equal(tokens, batch["input_ids"]) and attention_mask is None and visual is not None
    assert packed is not None and get_packed_seq_params(packed).qkv_format == "thd"


def test_real_buffer_packing_plans_valid_on_megatron(photos: tuple[Path, Path]) -> None:
    spec = make_spec(*real(photos, "mbs=1", "data.packing=buffer", "data.num_workers=1"))
    assert [v.code for v in validate(spec) if v.level.value == "error"] == []


def test_bridge_builds_the_packed_loader_from_the_validated_config(
    recipes: RecipeCache, engine_environment: Any, photos: tuple[Path, Path]
) -> None:
    """Bridge's own pre-flight takes the provider, and its own dispatch builds the loader from it."""
    from megatron.bridge.data.utils import get_dataset_provider

    packed = real(
        photos, "mbs=1", "data.packing=buffer", f"data.packing_buffer={BUFFER}", "data.num_workers=0"
    )
    spec, cfg = runtime_updated(recipes, engine_environment, *packed)
    train, valid, test = get_dataset_provider(cfg.dataset)([4, 0, 0], cfg.dataset, None, None)
    assert valid is None and test is None
    batch = next(train)
    assert batch["input_ids"].shape == (1, spec.mbs * spec.packed_row_length)
    assert int(batch["cu_seqlens_q_padded"][-1]) == batch["input_ids"].shape[1] and batch["__keys__"]


def test_the_engines_pre_flight_refuses_buffer_packing_without_a_path(
    recipes: RecipeCache, engine_environment: Any, photos: tuple[Path, Path]
) -> None:
    """Rule A001's engine side for our provider: ConfigContainer.validate calls its finalize, which
    refuses a missing path as Bridge's EnergonDatasetConfig.validate does (mutation: drop the path
    check in finalize and this passes the pre-flight)."""
    _, processor = photos
    bare = (*BASE, "data=real", f"model.hf_model_id={processor}", f"seq_length={SEQ}")
    with pytest.raises(ValueError, match="path must be set"):
        runtime_updated(recipes, engine_environment, *bare, "mbs=1", "data.packing=buffer")


def test_a_sample_over_seq_length_has_its_text_cut_and_counted(
    recipes: RecipeCache, photos: tuple[Path, Path]
) -> None:
    """The one over-length policy (data/sequence.py): text cut to seq_length, images kept, counted."""
    from megatron.bridge.data.builders.energon import build_energon_task_encoder

    spec, cfg = built(recipes, *real(photos, "mbs=1", "data.packing=buffer"))
    encoder = cfg.dataset.encoder()
    _, plain = built(recipes, *real(photos))
    unpacked = copy.deepcopy(plain.dataset)
    unpacked.pad_to_multiple_of, unpacked.pad_to_max_length = 1, False
    unpacked.seq_length = 4 * SEQ  # Bridge's collate cuts at its seq_length too: the whole sample here
    reference = build_energon_task_encoder(unpacked)
    cut = 0
    for raw in islice(energon_stream(photos[0], batch_size=None), 21):
        ours = encoder.encode_sample(raw).sample
        whole = reference.batch([reference.encode_sample(raw)]).input_ids[0]
        assert ours.length == min(whole.numel(), spec.seq_length)
        assert torch.equal(ours.input_ids, whole[: ours.length])
        assert ours.truncated_text_tokens == whole.numel() - ours.length
        cut += ours.truncated_text_tokens > 0
    assert cut >= 1  # the retina photograph's 1,098 tokens pass seq_length=1024


def packed_train_iterator(recipes: RecipeCache, prepare: Any, photos: tuple[Path, Path], workers: int) -> Any:
    """The engine's train iterator as Bridge's setup makes it: our provider through Bridge's dispatch,
    wrapped as an "external" loader (data/loaders.py:462-467, the table's dataloader_type)."""
    from megatron.bridge.data.utils import get_dataset_provider
    from megatron.core.rerun_state_machine import RerunDataIterator

    packed = real(
        photos, "mbs=1", "data.packing=buffer", f"data.packing_buffer={BUFFER}", f"data.num_workers={workers}"
    )
    _, cfg = runtime_updated(recipes, prepare, *packed)
    assert cfg.dataset.dataloader_type == "external"
    train, _, _ = get_dataset_provider(cfg.dataset)([4, 0, 0], cfg.dataset, None, None)
    return RerunDataIterator(train)


def same_batches(got: list[dict[str, Any]], want: list[dict[str, Any]]) -> None:
    assert [b["__keys__"] for b in got] == [b["__keys__"] for b in want]
    for mine, theirs in zip(got, want, strict=True):
        for key in ("input_ids", "labels", "cu_seqlens_q", "cu_seqlens_q_padded", "skipped_samples"):
            assert torch.equal(mine[key], theirs[key]), key
        assert torch.equal(mine["visual_inputs"].pixel_values, theirs["visual_inputs"].pixel_values)


@pytest.mark.parametrize("workers", [0, 1, 2])
def test_a_resumed_packed_loader_continues_with_the_uninterrupted_rows(
    recipes: RecipeCache, engine_environment: Any, photos: tuple[Path, Path], tmp_path: Path, workers: int
) -> None:
    """Take k batches, save the loader's state as Bridge's checkpoint does (maybe_save_dataloader_state,
    training/checkpointing.py:1695-1750), restore it into a fresh loader as Bridge's setup does
    (maybe_load_dataloader_state, checkpointing.py:1753-1818, called from training/setup.py:480-493):
    the next rows are the uninterrupted loader's, saved with samples still in the packing buffer.
    Mutations, each red: restore the state saved one batch earlier (other rows); build_datasets
    returning iter() of Bridge's EnergonDataloader (no save_state to call); encode_sample not marked
    stateless (Energon refuses to refill the buffer from restore keys)."""
    from megatron.bridge.training.checkpointing import (
        maybe_load_dataloader_state,
        maybe_save_dataloader_state,
    )
    from megatron.core.process_groups_config import ProcessGroupCollection

    from tests.megatron.conftest import model_parallel_rank

    # the workers' rows come round-robin: more of them so that each worker's share passes a refill
    k, after = 2, 3 + workers
    with model_parallel_rank():
        groups = ProcessGroupCollection.use_mpu_process_groups()
        first = packed_train_iterator(recipes, engine_environment, photos, workers)
        # what save_checkpoint asks before it saves to its default {checkpoint.save}/energon (:1176-1181)
        assert hasattr(first.iterable, "save_state")
        taken = sum(len(next(first)["__keys__"]) for _ in range(k))
        maybe_save_dataloader_state(None, first, k, str(tmp_path), pg_collection=groups)
        assert (tmp_path / f"iter_{k:07d}" / "train_dataloader_dprank000.pt").is_file()
        uninterrupted = [next(first) for _ in range(after)]
        # saved with samples still in the packing buffer (each worker's), resumed past a refill
        assert taken < BUFFER < taken + sum(len(b["__keys__"]) for b in uninterrupted)

        resumed = packed_train_iterator(recipes, engine_environment, photos, workers)
        maybe_load_dataloader_state(resumed, k, str(tmp_path), pg_collection=groups)
        same_batches([next(resumed) for _ in range(after)], uninterrupted)
