"""Issue 49, "Zero false accepts, third pass": each point that planned VALID and died after the queue,
the library code that refuses it run on CPU, and the finding that now refuses it in the plan.

1. MXFP8 with TP userbuffers: TE's all-gather fill wants each rank's shard a multiple of 128 rows
   (transformer_engine/pytorch/module/base.py:709-713), the quantizer only 32. The shape check runs
   that function on the point's own micro-batch (S004); the library check (LIB-TE-UB) on the buffers
   Bridge sizes (training/initialize.py:355-358).
3. Qwen3.5 with TP > 1 and no sequence parallelism: MoELayer.forward refuses it in training
   (megatron/core/transformer/moe/moe_layer.py:629-633), a check no config validation runs. Rule
   L015 refuses it; the library check LIB-MOE runs that forward up to the check.

Item 2 (the canary checks every distinct shape) is tests/megatron/test_canary_shapes.py; item 4 (a
half-installed TE) tests/megatron/test_half_installed_te.py.
"""

from __future__ import annotations

import pytest

from moe_vlm.engines.megatron.library_checks import Check, check_point, mxfp8_userbuffer_fill
from moe_vlm.rules import errors, validate
from moe_vlm.run.plan import shape_check
from tests.conftest import make_spec
from tests.megatron.conftest import needs_stack

pytestmark = needs_stack

GB = ("engine=megatron", "dry_run=true", "cluster=gb200", "nodes=1")
ITEM_1 = (*GB, "model=qwen3_vl_30b_a3b", "parallelism=3d", "precision=fp8mx", "tp=2", "seq_length=4160")
ITEM_3 = (*GB, "model=qwen35_vl_35b_a3b", "parallelism=3d", "tp=2")


def planned(*overrides: str) -> set[str]:
    """The error codes a dry run gives before the library's checks: the rules, then the shape check."""
    spec = make_spec(*overrides)
    found = errors(validate(spec))
    return {f.code for f in (found or errors(shape_check(spec)))}


def library(*overrides: str) -> list[str]:
    return [f.line() for f in check_point(make_spec(*overrides)) if f.refuses]


def test_tes_userbuffer_fill_wants_mxfp8_shards_of_128_rows() -> None:
    with pytest.raises(ValueError, match="Userbuffers requires MXFP8 tensor dims that are divisible by 128"):
        mxfp8_userbuffer_fill(2080, 2048)  # 4160 tokens over TP=2: a multiple of 32, not of 128
    mxfp8_userbuffer_fill(2048, 2048)  # past TE's rows check (the probe ends at the next one)


def test_mxfp8_with_the_recipes_tp_overlap_on_an_odd_shard_plans_invalid() -> None:
    assert planned(*ITEM_1) == {"S004"}
    (refused,) = library(*ITEM_1)
    assert refused.startswith(f"{Check.userbuffers.value}: ValueError: Userbuffers requires MXFP8")
    assert "shape=(2080, 2048)" in refused and "transformer_engine/pytorch/module/base.py:710" in refused
    # The fixes S004 names, each accepted by the library's own check.
    for fixed in ("overlap.tp_comm=false", "seq_length=4352"):
        assert planned(*ITEM_1, fixed) == set() and library(*ITEM_1, fixed) == [], fixed
    # Buffer-packed rows of that length: the same shard.
    assert planned(*ITEM_1, "data.packing=buffer", "dispatcher=alltoall") == {"S004"}


def test_qwen35_with_tp_and_no_sequence_parallelism_plans_invalid() -> None:
    assert planned(*ITEM_3) == {"L015"}
    (refused,) = library(*ITEM_3)
    assert refused.startswith(f"{Check.moe.value}: ValueError: During training, performance may degrade")
    assert "megatron/core/transformer/moe/moe_layer.py:630" in refused
    fixed = (*ITEM_3, "parallelism.sequence_parallel=true")
    assert planned(*fixed) == set() and library(*fixed) == []
    # Qwen3-VL's provider turns sequence parallelism on for TP > 1 (RunSpec.sequence_parallel).
    qwen3 = (*GB, "model=qwen3_vl_30b_a3b", "parallelism=3d", "tp=2")
    assert "L015" not in planned(*qwen3) and library(*qwen3) == []
