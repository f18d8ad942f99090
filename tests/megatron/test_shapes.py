"""The shape check against the installed library: a real micro-batch, Transformer Engine's own checks.

Each point here plans VALID in the rule catalogue (the static rules pass it); the shape check, which
builds the micro-batch through the engine's collate and runs TE's assert_dim_for_fp8_exec
(transformer_engine/pytorch/utils.py:704-714) and its block quantizers' is_quantizable on each
rank's operands, says whether TE runs it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from moe_vlm.engines.megatron.shape_check import cached_keys, micro_batch_rows, shape_evidence
from moe_vlm.launch.canary import CanaryFailed, check_shapes
from moe_vlm.rules import errors, validate
from moe_vlm.run.plan import shape_check
from tests.conftest import make_spec
from tests.megatron.conftest import needs_stack

pytestmark = needs_stack

BASE = ("engine=megatron", "model=qwen3_vl_30b_a3b", "cluster=gb200", "nodes=2", "mbs=1")
SMALL = ("data=synthetic", "data.max_long_side_px=480", "data.max_text_tokens=96")


def codes(*overrides: str) -> tuple[list[str], list[str]]:
    spec = make_spec(*BASE, *overrides)
    return [f.code for f in errors(validate(spec))], [f.code for f in shape_check(spec)]


def test_fp8_with_a_sequence_parallel_shard_te_refuses() -> None:
    """seq_length 4100 passes L007 (a multiple of CP x TP = 2) but each SP shard holds 2050 tokens, and
    TE's FP8 GEMMs need a multiple of 8: the first QKV GEMM would raise after the queue."""
    rules, shapes = codes("precision=fp8cs", "parallelism=3d", "tp=2", "seq_length=4100")
    assert rules == [] and shapes == ["S002"]
    assert codes("precision=fp8cs", "parallelism=3d", "tp=2", "seq_length=4096")[1] == []
    assert codes("precision=bf16", "parallelism=3d", "tp=2", "seq_length=4100")[1] == []  # no FP8 GEMM


@pytest.mark.parametrize("fmt", ["fp8mx", "nvfp4"])
def test_block_formats_need_whole_blocks_of_tokens(fmt: str) -> None:
    """4104 tokens pass the FP8 assert (a multiple of 8) and not MXFP8's 32 or NVFP4's 16 blocks."""
    rules, shapes = codes(f"precision={fmt}", "seq_length=4104", "parallelism=3d")
    assert rules == [] and shapes == ["S003"]
    assert codes(f"precision={fmt}", "seq_length=4096", "parallelism=3d")[1] == []
    assert codes("precision=fp8cs", "seq_length=4104", "parallelism=3d")[1] == []  # 8 is enough there


def test_a_packed_row_from_bridges_packer_fails_tes_assert_as_a012_says() -> None:
    spec = make_spec(
        *BASE, *SMALL, "mbs=3", "data.packing=in_batch", "precision=fp8cs", "dispatcher=alltoall"
    )
    rows, packed, _ = micro_batch_rows(spec)
    assert packed and len(rows) == 1 and rows[0] < 3 * spec.seq_length
    assert "A012" in {f.code for f in validate(spec)}
    found = shape_evidence(spec)
    if rows[0] % 8:
        assert [f.code for f in shape_check(spec)] == ["S002"]
    assert found.shapes is not None and found.checked == len(found.shapes.operands)


def test_bridge_mocks_packed_rows_are_built_from_its_replayed_draw() -> None:
    """Bridge's MockVLMSFTDataset needs its HF processor; the shape check packs the replay of its draw
    (data/bridge_mock.py) with Bridge's in-batch packer instead: the card row that packs 16 mock
    samples per micro-batch gets one row of about 16 x 267 positions, not S000."""
    spec = make_spec(*BASE, "mbs=16", "data=bridge_mock", "data.packing=in_batch")
    rows, packed, source = micro_batch_rows(spec)
    assert packed and len(rows) == 1 and 16 * 222 <= rows[0] <= 16 * 311 and "replayed" in source
    assert [f.code for f in shape_check(spec)] == []


def test_packing_with_real_data_cannot_be_built_and_says_so() -> None:
    spec = make_spec(*BASE, "mbs=2", "data=real", "data.path=/nonexistent", "data.packing=in_batch")
    assert [f.code for f in shape_check(spec)] == ["S000"]


def test_one_batch_per_shape_across_a_sweep() -> None:
    before = cached_keys()
    for dispatcher in ("alltoall", "deepep", "hybridep"):
        for recompute in ("none", "full"):
            shape_check(
                make_spec(
                    *BASE,
                    *SMALL,
                    "mbs=2",
                    "data.packing=in_batch",
                    f"dispatcher={dispatcher}",
                    f"recompute={recompute}",
                    "seq_length=2048",
                )
            )
    assert cached_keys() == before + 1


def test_the_canary_runs_the_shape_check(tmp_path: Path) -> None:
    with pytest.raises(CanaryFailed, match="S002"):
        check_shapes(make_spec(*BASE, "precision=fp8cs", "parallelism=3d", "tp=2", "seq_length=4100"))
    assert (
        check_shapes(make_spec(*BASE, "precision=fp8cs", "parallelism=3d", "tp=2")) == "; shape check passed"
    )
