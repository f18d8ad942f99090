"""data.packing=buffer on the Megatron engine, against the installed library (megatron-bridge 0.6.2, CPU).

- the engine's dataset (PackedRows, built by the real provider from the real ConfigContainer) walked by
  Bridge's own loader and sampler yields, per DP rank, the torch engine's packed micro-batches;
- resuming Bridge's loader at a consumed-samples position gives the rows a fresh run had there;
- vlm_step's batch preparation takes the batch as THD, and Qwen3-VL's own mRoPE builder
  (modelling_qwen3_vl/rope.py:339-365) restarts every sample's positions at its boundary, images
  included; a moved boundary is caught.

Each packed row's samples, handed to build_mcore_thd_sequence_batch_from_rows (data/packing/
in_batch.py:89-215, what Bridge's Qwen-VL collate packs with) with the same alignment multiple, give
the same tokens, the same cu_seqlens and cu_seqlens_padded (ours extend the row's last sample to the
row's end: the fixed row shape) and the same text positions, alignment padding included (Bridge
continues a sample's positions over its padding, :196-205, as packed_position_ids does).
"""

from __future__ import annotations

from itertools import islice
from typing import Any

import pytest
import torch

from moe_vlm.config.spec import RunSpec
from moe_vlm.data import build_batches, indexed_samples
from moe_vlm.data.batch import IGNORE_INDEX
from moe_vlm.data.indexed import rank_indices
from moe_vlm.data.packer import Packer, assemble_rows
from moe_vlm.engines.torch_model import build_model, packed_position_ids
from tests.conftest import make_spec
from tests.megatron.conftest import RecipeCache, model_parallel_rank, needs_stack, runtime_updated

pytestmark = needs_stack

ROW, MULTIPLE = 1024, 8


def test_buffer_rows_match_bridges_thd_builder() -> None:
    from megatron.bridge.data.packing.in_batch import build_mcore_thd_sequence_batch_from_rows

    spec = make_spec(
        "data=synthetic", "data.max_long_side_px=480", "data.max_text_tokens=96", "seq_length=1024"
    )
    source = indexed_samples(spec.model, spec.data, spec.seed, spec.seq_length)
    samples = list(islice(source.stream(rank_indices(0, 1, 1)), 16))
    packer = Packer(iter(samples), ROW, buffer=16, sample_multiple=MULTIPLE)
    rows = [next(packer) for _ in range(2)]
    pad = spec.model.pad_token_id
    batch = assemble_rows(rows, ROW, MULTIPLE, pad, "synthetic")
    model = build_model(spec.model, spec.recompute, torch.device("cpu"), seed=0)
    positions = packed_position_ids(model, batch)
    assert batch.cu_seqlens is not None and batch.cu_seqlens_padded is not None
    real, padded = batch.cu_seqlens.tolist(), batch.cu_seqlens_padded.tolist()
    first = 0
    for r, row in enumerate(rows):
        assert len(row) >= 2  # a packed row, or the boundaries below say nothing
        theirs = build_mcore_thd_sequence_batch_from_rows(
            [{"input_ids": s.input_ids, "position_ids": torch.arange(s.length)} for s in row],
            sequence_length=ROW,
            pad_token_id=pad,
            pad_to_multiple_of=MULTIPLE,
        )
        ours_real = [b - real[first] for b in real[first : first + len(row) + 1]]
        ours_padded = [b - r * ROW for b in padded[first : first + len(row) + 1]]
        first += len(row)
        assert theirs["cu_seqlens_q"].tolist() == ours_real
        their_padded = theirs["cu_seqlens_q_padded"].tolist()
        assert their_padded[:-1] == ours_padded[:-1] and ours_padded[-1] == ROW >= their_padded[-1]
        total = their_padded[-1]
        assert torch.equal(batch.input_ids[r, :total], theirs["input_ids"][0])
        assert torch.equal(positions[0, r, :total], theirs["position_ids"][0].to(positions.dtype))


BASE = ("engine=megatron", "dry_run=true", "model=qwen3_vl_30b_a3b", "cluster=gb200", "nodes=2")
SMALL = ("data=synthetic", "data.max_long_side_px=480", "data.max_text_tokens=96", "seq_length=1024")
BUFFER = (*BASE, *SMALL, "mbs=2", "data.packing=buffer", "data.packing_buffer=8")


def bridge_loader(dataset: Any, spec: RunSpec, rank: int, consumed: int = 0) -> Any:
    """Bridge's own data loader over `dataset`, as data/loaders.py:321-337 builds it for DP `rank`."""
    from megatron.bridge.data.samplers import build_pretraining_data_loader

    return build_pretraining_data_loader(
        dataset,
        consumed,
        "single",
        spec.mbs,
        0,
        True,
        collate_fn=dataset.collate_fn,
        pin_memory=False,
        data_parallel_rank=rank,
        data_parallel_size=spec.layout.dp,
        global_batch_size=spec.gbs,
    )


def train_dataset(config: Any, rows: int) -> Any:
    from megatron.bridge.data.base import DatasetBuildContext

    train, _, _ = config.build_datasets(
        DatasetBuildContext(train_samples=rows, valid_samples=0, test_samples=0)
    )
    return train


def test_bridges_loader_yields_the_torch_engines_packed_batches(
    recipes: RecipeCache, engine_environment: Any
) -> None:
    from moe_vlm.engines.megatron.config import check_overrides

    spec, cfg = runtime_updated(recipes, engine_environment, *BUFFER)
    assert check_overrides(cfg, spec) == [] and type(cfg.dataset).__name__ == "MoeVlmDatasetConfig"
    assert cfg.dataset.packing_buffer == 8 and cfg.dataset.packed_row_length == spec.packed_row_length
    assert spec.layout.dp >= 2  # two ranks' walks, or the rank mapping is not tested
    dataset = train_dataset(cfg.dataset, 64 * spec.gbs)
    assert type(dataset).__name__ == "PackedRows"
    for rank in (0, 1):
        ours = build_batches(spec, rank, spec.layout.dp)  # the torch engine's data path
        for batch, torch_batch in islice(zip(bridge_loader(dataset, spec, rank), ours, strict=False), 2):
            assert torch_batch.cu_seqlens is not None and torch_batch.cu_seqlens_padded is not None
            assert batch["input_ids"].shape == (1, spec.mbs * spec.packed_row_length)
            assert torch.equal(batch["input_ids"][0], torch_batch.input_ids.reshape(-1))
            assert torch.equal(batch["cu_seqlens_q"], torch_batch.cu_seqlens)
            assert torch.equal(batch["cu_seqlens_q_padded"], torch_batch.cu_seqlens_padded)
            assert len(torch_batch.cu_seqlens) - 1 > spec.mbs  # rows hold several samples each
            visual = batch["visual_inputs"]
            assert torch_batch.pixel_values is not None and torch_batch.image_grid_thw is not None
            assert torch.equal(visual.pixel_values, torch_batch.pixel_values)
            assert torch.equal(visual.image_grid_thw, torch_batch.image_grid_thw)
            assert int(batch["loss_mask"].sum()) == torch_batch.stats.loss_tokens


def test_resuming_bridges_loader_gives_the_same_rows_on_every_rank() -> None:
    """Rows are a function of their index: a loader restarted at Bridge's consumed-samples position
    (what its checkpoint saves, train_state.consumed_train_samples) gives the rows a run had there,
    on every DP rank (each rank's packer is its own stream's)."""
    from moe_vlm.engines.megatron.data import dataset_config

    dp = make_spec(*BUFFER).layout.dp
    assert dp >= 2  # several ranks, or the rank mapping of a resume is not tested
    spec = make_spec(*BUFFER, f"gbs={2 * dp}")  # one micro-batch a step
    steps = spec.gbs // (spec.mbs * spec.layout.dp)
    assert steps == 1  # one micro-batch a step: the third batch of a walk is the resumed one
    config = dataset_config(spec)
    firsts = []
    for rank in range(dp):
        straight = list(islice(bridge_loader(train_dataset(config, 64 * spec.gbs), spec, rank), 3))
        restarted = train_dataset(config, 64 * spec.gbs)  # a new process: no packer walked yet
        resumed = next(iter(bridge_loader(restarted, spec, rank, consumed=2 * spec.gbs)))
        for key in ("input_ids", "cu_seqlens_q", "cu_seqlens_q_padded", "loss_mask", "skipped_samples"):
            assert torch.equal(resumed[key], straight[2][key]), (rank, key)
        assert torch.equal(resumed["visual_inputs"].pixel_values, straight[2]["visual_inputs"].pixel_values)
        assert not torch.equal(straight[0]["input_ids"], straight[2]["input_ids"])  # a walk moves on
        firsts.append(straight[0]["input_ids"])
    assert not torch.equal(firsts[0], firsts[1])  # the ranks read different samples


_BOUNDS = ("cu_seqlens_q", "cu_seqlens_kv", "cu_seqlens_q_padded", "cu_seqlens_kv_padded")


def rope_mismatches(batch: dict[str, Any], spec: RunSpec, packed: Any) -> list[int]:
    """Samples of `batch` whose mRoPE positions in the packed stream (Qwen3-VL's builder with the
    packed params `packed`) differ from that sample's positions alone."""
    from megatron.bridge.models.qwen_vl.modelling_qwen3_vl.rope import get_rope_index

    m = spec.model
    rope = (m.vision_spatial_merge_size, m.image_token_id, -1, m.vision_start_token_id)
    grid = batch["visual_inputs"].image_grid_thw
    stream, _ = get_rope_index(*rope, batch["input_ids"], image_grid_thw=grid, packed_seq_params=packed)
    real, padded = batch["cu_seqlens_q"].tolist(), batch["cu_seqlens_q_padded"].tolist()
    wrong, image = [], 0
    for s, start in enumerate(padded[:-1]):
        length = real[s + 1] - real[s]
        ids = batch["input_ids"][:, start : start + length]
        images = int((ids == m.vision_start_token_id).sum())
        alone, _ = get_rope_index(*rope, ids, image_grid_thw=grid[image : image + images])
        image += images
        if not torch.equal(stream[:, :, start : start + length], alone.to(stream.dtype)):
            wrong.append(s)
    return wrong


def test_vlm_step_takes_the_rows_and_qwen3_vl_restarts_mrope_at_each_sample(
    recipes: RecipeCache, engine_environment: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from megatron.bridge.training import vlm_step
    from megatron.bridge.training.utils.packed_seq_utils import get_packed_seq_params
    from megatron.core.process_groups_config import ProcessGroupCollection

    spec, cfg = runtime_updated(recipes, engine_environment, *BUFFER)
    batch = next(iter(bridge_loader(train_dataset(cfg.dataset, 64 * spec.gbs), spec, 0)))
    # The step moves every kept tensor to the GPU (vlm_step.py:150-152); there is none here, so the
    # move is the identity. Everything else is the library's code.
    monkeypatch.setattr(torch.Tensor, "cuda", lambda self, *args, **kwargs: self)
    with model_parallel_rank():
        got = vlm_step.get_batch(
            iter([batch]), cfg, pg_collection=ProcessGroupCollection.use_mpu_process_groups()
        )
    tokens, labels, loss_mask, attention_mask, _, packed, visual = got
    assert torch.equal(tokens, batch["input_ids"]) and attention_mask is None and visual is not None
    assert packed is not None and torch.equal(packed["cu_seqlens_q_padded"], batch["cu_seqlens_q_padded"])
    params = get_packed_seq_params(packed)
    assert params.qkv_format == "thd" and int(params.cu_seqlens_q_padded[-1]) == tokens.shape[1]
    # cu_seqlens_q are cumulative real lengths, cu_seqlens_q_padded the physical offsets
    real, padded = batch["cu_seqlens_q"].tolist(), batch["cu_seqlens_q_padded"].tolist()
    for s, start in enumerate(padded[:-1]):
        end = start + real[s + 1] - real[s]
        assert labels[0, end - 1] == IGNORE_INDEX  # a sample never predicts the next one's first token
        assert bool((loss_mask[0, end : padded[s + 1]] == 0).all())  # its padding carries no loss
    assert rope_mismatches(batch, spec, params) == []
    # A lost boundary (samples 0 and 1 as one sequence) is seen: sample 1's positions run on.
    merged = {key: torch.cat([packed[key][:1], packed[key][2:]]) for key in _BOUNDS if key in packed}
    assert rope_mismatches(batch, spec, get_packed_seq_params({**packed, **merged})) == [1]


def test_the_shape_check_sees_buffer_packed_rows() -> None:
    """The S rules' evidence (engines/megatron/shape_check.py) is the engine's own packed micro-batch:
    MBS rows end to end as one THD row, not MBS padded rows of seq_length."""
    from moe_vlm.engines.megatron.shape_check import micro_batch_rows, shape_evidence

    spec = make_spec(*BUFFER)
    rows, packed, source = micro_batch_rows(spec)
    assert rows == (spec.mbs * spec.packed_row_length,) and packed and "buffer-packed" in source
    evidence = shape_evidence(spec)
    assert evidence.shapes is not None and evidence.shapes.rows == rows and evidence.shapes.packed
    # data=real: Energon's rows have the same fixed shape, stated without building any
    real = make_spec(*BASE, "data=real", "data.path=/nonexistent", "data.packing=buffer")
    assert micro_batch_rows(real)[:2] == ((real.mbs * real.packed_row_length,), True)


def test_bridge_mock_packs_by_buffer_on_the_engines_dataset(
    recipes: RecipeCache, engine_environment: Any
) -> None:
    """Bridge's mock has no packer: with buffer packing the table puts the engine's dataset at
    cfg.dataset drawing that workload (kind bridge_mock), packed as the torch engine packs it."""
    from moe_vlm.engines.megatron.config import check_overrides

    spec, cfg = runtime_updated(
        recipes,
        engine_environment,
        *BASE,
        "data=bridge_mock",
        "mbs=1",
        "data.packing=buffer",
        "data.packing_buffer=16",
    )
    assert check_overrides(cfg, spec) == []
    assert type(cfg.dataset).__name__ == "MoeVlmDatasetConfig" and cfg.dataset.kind == "bridge_mock"
    batch = next(iter(bridge_loader(train_dataset(cfg.dataset, 64 * spec.gbs), spec, 0)))
    ours = next(build_batches(spec, 0, spec.layout.dp))
    assert torch.equal(batch["input_ids"][0], ours.input_ids.reshape(-1))
    assert ours.cu_seqlens is not None
    assert torch.equal(batch["cu_seqlens_q"], ours.cu_seqlens) and len(ours.sample_keys) > 1
    assert all(key.startswith("bridge_mock/") for key in ours.sample_keys)
