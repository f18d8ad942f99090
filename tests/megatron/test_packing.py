"""data.packing=in_batch on the Megatron engine, against the installed library (CPU).

The issue's claims about megatron-bridge 0.6.2 / megatron-core 0.19.2, each checked by running the
library's code:
- ConfigContainer.validate hands a dataset that asks for in-batch packing the CP/SP alignment
  (training/config.py:1213-1218, 1236-1239) and marks the model config (_enable_in_batch_packing);
- Bridge's packing collate (data/packing/in_batch.py:89-215, what qwen2_5_collate_fn calls at
  models/qwen_vl/data/collate_fn.py:224-230) makes our samples one THD row with cu_seqlens;
- vlm_step's batch preparation (training/vlm_step.py:129-131, 159-195) turns it into packed-sequence
  parameters; qwen3_vl_step refuses it (models/qwen_vl/qwen3_vl_step.py:61-65);
- Megatron Core refuses variable_seq_lengths with the allgather dispatcher (transformer_config.py:
  2644-2649), and Bridge sets it for PP > 1 only after that check (models/transformer_config.py:183-189).
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import islice, pairwise
from pathlib import Path
from typing import Any

import pytest
import torch

from moe_vlm.data import build_batches
from moe_vlm.data.batch import IGNORE_INDEX
from moe_vlm.knobs.bridge_fields import QWEN3_VL_STEP, VLM_STEP, forward_step_path
from moe_vlm.rules import validate
from tests.conftest import make_spec
from tests.megatron.conftest import REPORT, RecipeCache, model_parallel_rank, needs_stack, runtime_updated

pytestmark = needs_stack

BASE = ("engine=megatron", "dry_run=true", "model=qwen3_vl_30b_a3b", "cluster=gb200", "nodes=2")
SMALL = ("data=synthetic", "data.max_long_side_px=480", "data.max_text_tokens=96", "mbs=3")
PACKED = (*BASE, *SMALL, "data.packing=in_batch")


def collated(cfg: Any, count: int) -> dict[str, Any]:
    from moe_vlm.engines.megatron.data import SeededSamples

    dataset = SeededSamples(cfg.dataset, 16)
    return dataset.collate_fn([dataset[index] for index in range(count)])


@pytest.fixture
def one_rank() -> Iterator[Any]:
    from megatron.core.process_groups_config import ProcessGroupCollection

    with model_parallel_rank():
        yield ProcessGroupCollection.use_mpu_process_groups()


def test_bridge_packs_our_samples_into_one_thd_row(recipes: RecipeCache, engine_environment: Any) -> None:
    spec, cfg = runtime_updated(recipes, engine_environment, *PACKED)
    assert forward_step_path(spec) == VLM_STEP
    assert type(cfg.dataset).__name__ == "MoeVlmDatasetConfig" and cfg.dataset.enable_in_batch_packing
    assert cfg.model._enable_in_batch_packing  # Bridge's validate marked the model (config.py:1236-1237)
    assert cfg.dataset.in_batch_packing_pad_to_multiple_of == 1  # no CP, no SP
    batch = collated(cfg, spec.mbs)
    # The torch engine's packed micro-batch of the same samples (rank 0: samples 0..mbs-1).
    ours = next(islice(build_batches(spec, rank=0, world_size=spec.layout.dp), 1))
    assert ours.cu_seqlens is not None
    bounds = ours.cu_seqlens.tolist()
    assert batch["cu_seqlens_q"].tolist() == bounds and "cu_seqlens_q_padded" not in batch
    assert batch["input_ids"].shape == (1, bounds[-1]) and torch.equal(batch["input_ids"], ours.input_ids)
    assert batch["attention_mask"] is None and int(batch["max_seqlen_q"]) == max(
        b - a for a, b in pairwise(bounds)
    )
    for start, end in pairwise(bounds):
        # Positions restart per sample; labels are the sample's own, shifted left (Bridge's convention).
        assert batch["position_ids"][0, start:end].tolist() == list(range(end - start))
        assert torch.equal(batch["labels"][0, start : end - 1], ours.labels[0, start + 1 : end])
        assert batch["labels"][0, end - 1] == IGNORE_INDEX  # never predicts the next sample's first token
    assert int(batch["loss_mask"].sum()) == ours.stats.loss_tokens
    visual = batch["visual_inputs"]
    assert ours.pixel_values is not None and ours.image_grid_thw is not None
    assert torch.equal(visual.pixel_values, ours.pixel_values)
    assert torch.equal(visual.image_grid_thw, ours.image_grid_thw)
    REPORT.append(
        f"in-batch packing: Bridge's packing collate made {spec.mbs} of our synthetic samples one THD row of "
        f"{bounds[-1]} tokens, cu_seqlens {bounds} (padded: {spec.mbs} x {spec.seq_length})"
    )


def test_cp_aligns_each_packed_sample(recipes: RecipeCache, engine_environment: Any) -> None:
    spec, cfg = runtime_updated(recipes, engine_environment, *PACKED, "parallelism=3d", "cp=2")
    multiple = cfg.dataset.in_batch_packing_pad_to_multiple_of
    assert multiple == 4  # 2 x CP (config.py:1216)
    assert "A011" in {finding.code for finding in validate(spec)}
    batch = collated(cfg, spec.mbs)
    real, padded = batch["cu_seqlens_q"], batch["cu_seqlens_q_padded"]
    assert all(int(bound) % multiple == 0 for bound in padded)
    lengths, slots = real[1:] - real[:-1], padded[1:] - padded[:-1]
    assert bool(((slots - lengths) < multiple).all()) and int(padded[-1]) == batch["input_ids"].shape[1]
    assert int(batch["loss_mask"].sum()) == int((batch["labels"] != IGNORE_INDEX).sum())


@pytest.mark.parametrize(
    ("layout", "multiple"),
    [(("cp=2",), 4), (("tp=2",), 2), (("cp=2", "tp=4"), 8), (("cp=4", "tp=2"), 8)],
    ids=["cp2", "tp2-sp", "cp2-tp4-sp", "cp4-tp2-sp"],
)
def test_the_packing_multiple_is_bridges(
    recipes: RecipeCache, engine_environment: Any, layout: tuple[str, ...], multiple: int
) -> None:
    """spec.collate_padding_multiple (rules A011, L007) is what ConfigContainer.validate hands the packer:
    lcm(2 x CP, CP x TP with SP) (training/config.py:1213-1220, 1239); with CP 2 and TP 4 that is 8,
    where lcm(2 x CP, TP) would say 4."""
    spec, cfg = runtime_updated(recipes, engine_environment, *PACKED, "parallelism=3d", "ep=2", *layout)
    assert cfg.dataset.in_batch_packing_pad_to_multiple_of == spec.collate_padding_multiple == multiple


def test_vlm_step_prepares_the_packed_batch_and_qwen3_vl_step_refuses_it(
    recipes: RecipeCache, engine_environment: Any, one_rank: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from megatron.bridge.models.qwen_vl import qwen3_vl_step
    from megatron.bridge.training import vlm_step
    from megatron.bridge.training.utils.packed_seq_utils import get_packed_seq_params

    spec, cfg = runtime_updated(recipes, engine_environment, *PACKED)
    batch = collated(cfg, spec.mbs)
    # The step moves every kept tensor to the GPU (vlm_step.py:150-152); there is none here, so the
    # move is the identity. Everything else is the library's code.
    monkeypatch.setattr(torch.Tensor, "cuda", lambda self, *args, **kwargs: self)
    tokens, labels, loss_mask, attention_mask, position_ids, packed, visual = vlm_step.get_batch(
        iter([batch]), cfg, pg_collection=one_rank
    )
    assert torch.equal(tokens, batch["input_ids"]) and torch.equal(labels, batch["labels"])
    assert torch.equal(loss_mask, batch["loss_mask"]) and attention_mask is None
    assert torch.equal(position_ids, batch["position_ids"]) and visual is not None
    assert packed is not None and torch.equal(packed["cu_seqlens_q"], batch["cu_seqlens_q"])
    params = get_packed_seq_params(packed)
    assert params.qkv_format == "thd" and params.cu_seqlens_q.tolist() == batch["cu_seqlens_q"].tolist()
    # The Qwen3-VL step, which padded runs use, refuses the same batch (qwen3_vl_step.py:61-65).
    assert forward_step_path(make_spec(*BASE, *SMALL)) == QWEN3_VL_STEP
    with pytest.raises(ValueError, match="does not support collate-time in-batch packing"):
        qwen3_vl_step.get_batch_from_iterator(iter([batch]), is_first_pp_stage=True, is_last_pp_stage=True)


def test_allgather_refuses_variable_lengths_and_bridge_sets_them_after_the_check(
    recipes: RecipeCache, engine_environment: Any
) -> None:
    from moe_vlm.engines.megatron.config import apply_overrides

    # Our table sets variable_seq_lengths for packing: Megatron Core's own check refuses allgather.
    spec = make_spec(*PACKED, "dispatcher=allgather")
    assert "A010" in {finding.code for finding in validate(spec)}
    cfg = recipes.config(spec)
    apply_overrides(cfg, spec)
    assert cfg.model.variable_seq_lengths and cfg.model.moe_token_dispatcher_type == "allgather"
    with pytest.raises(ValueError, match="does not support variable sequence length"):
        cfg.model.finalize()
    # Bridge alone (the recipe's fixed lengths, its in-batch flag, PP 2) sets variable_seq_lengths
    # only after Core's check ran (models/transformer_config.py:183-189): nothing refuses it there.
    bare = recipes.config(spec)
    bare.model.moe_token_dispatcher_type = "allgather"
    bare.model.pipeline_model_parallel_size = 2
    bare.model.variable_seq_lengths = False
    bare.model._enable_in_batch_packing = True
    bare.model.finalize()
    assert bare.model.variable_seq_lengths


def _te_accepts(quantizers: list[Any], tokens: int, hidden: int) -> bool:
    """Transformer Engine's own checks on a quantized GEMM's input of `tokens` x `hidden`: the
    dimension assert every TE linear runs (utils.py:704-714) and each quantizer's block check."""
    from transformer_engine.pytorch.utils import assert_dim_for_fp8_exec

    inp = torch.zeros(tokens, 1, hidden)
    try:
        assert_dim_for_fp8_exec(inp)
    except ValueError:
        return False
    return all(q.is_quantizable(inp) for q in quantizers)


@pytest.mark.parametrize("fmt", ["fp8cs", "fp8mx", "nvfp4"])
def test_a_packed_row_fails_tes_quantized_gemm_checks(
    recipes: RecipeCache, engine_environment: Any, monkeypatch: pytest.MonkeyPatch, fmt: str
) -> None:
    """Rule A012 against the library: the quantizers Megatron Core's recipe makes for this precision
    accept a GEMM input exactly at multiples of the profile's token_multiple (8, 32, 16), and Bridge's
    packer, with the multiple Bridge's validate hands it, makes a row of 5 + 6 = 11 tokens."""
    from megatron.bridge.data.packing.in_batch import build_mcore_thd_sequence_batch_from_rows

    from moe_vlm.config.precision import profile
    from moe_vlm.engines.megatron.library_checks import quantizers

    spec, cfg = runtime_updated(recipes, engine_environment, *PACKED, f"precision={fmt}")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")  # NVFP4's Hadamard signs
    made, hidden = quantizers(cfg.model), cfg.model.hidden_size
    needed = profile(fmt).token_multiple
    assert made and [n for n in range(1, 3 * needed + 1) if _te_accepts(made, n, hidden)] == [
        needed,
        2 * needed,
        3 * needed,
    ]
    rows = [{"input_ids": torch.arange(n), "position_ids": torch.arange(n)} for n in (5, 6)]
    multiple = cfg.dataset.in_batch_packing_pad_to_multiple_of
    row = build_mcore_thd_sequence_batch_from_rows(rows, pad_to_multiple_of=multiple)["input_ids"]
    assert row.shape == (1, 11) and not _te_accepts(made, row.shape[1], hidden)
    assert "A012" in {f.code for f in validate(spec) if f.is_error}
    assert "A012" not in {f.code for f in validate(make_spec(*PACKED, "precision=bf16"))}
    assert "A012" not in {f.code for f in validate(make_spec(*BASE, *SMALL, f"precision={fmt}"))}


def test_userbuffers_take_only_seq_length_x_mbs_tokens(recipes: RecipeCache, engine_environment: Any) -> None:
    """Rule A013 against the library: Bridge sizes TE's userbuffers once from seq_length x MBS / CP
    (training/initialize.py:355-358), TE copies each all-gather input into its chunk and its compiled
    core asserts the size is exact (no GPU here to run it: the assertion is read from the shared
    library), and the packed row Bridge's collate makes of our samples is shorter."""
    import inspect

    import transformer_engine_torch
    from megatron.bridge.training import initialize
    from transformer_engine.pytorch.module import base

    sizing = inspect.getsource(initialize._initialize_tp_communicators)
    assert "(model_config.seq_length * micro_batch_size) // model_config.context_parallel_size" in sizing
    fill = inspect.getsource(base.fill_userbuffers_buffer_for_all_gather)
    assert "comm.copy_into_buffer(local_tensor, local_chunk=True)" in fill
    assert b"input_size * _tp_size == ubuf_size" in Path(transformer_engine_torch.__file__).read_bytes()
    spec, cfg = runtime_updated(recipes, engine_environment, *PACKED, "parallelism=3d", "tp=2", "ep=4")
    assert cfg.model.tp_comm_overlap  # the GB200 recipe's, kept (RunSpec.tp_comm_overlap)
    batch = collated(cfg, spec.mbs)
    assert batch["input_ids"].shape[1] < cfg.model.seq_length * spec.mbs
    assert "A013" in {f.code for f in validate(spec) if f.is_error}
