"""The shape check's pure half (moe_vlm/perf/rank_shapes.py) and the S rules on evidence built here."""

from __future__ import annotations

from moe_vlm.perf.rank_shapes import Operand, ShapeEvidence, Verdict, rank_shapes, shape_key
from moe_vlm.rules.shapes import SHAPE_RULES, shape_findings
from tests.conftest import make_spec

BASE = ("engine=megatron", "model=qwen3_vl_30b_a3b", "cluster=gb200", "nodes=2")


def codes(spec: object, found: ShapeEvidence) -> list[str]:
    return [f.code for f in shape_findings(spec, found)]  # type: ignore[arg-type]


def test_cp_and_sp_split_the_tokens_per_rank() -> None:
    spec = make_spec(*BASE, "parallelism=3d", "tp=2", "cp=2", "mbs=2", "seq_length=4096")
    shapes = rank_shapes(spec, (4096, 4096), False, "padded")
    assert (shapes.tokens, shapes.cp_tokens, shapes.sp_tokens) == (8192, 4096, 2048)
    by = {(op.gemm, op.role): op.shape for op in shapes.operands}
    hidden = spec.model.hidden_size
    # Column-parallel input: the SP shard; row-parallel input: the CP rank's tokens, features over TP.
    assert by[("attention qkv", "input")] == (2048, hidden)
    assert by[("attention proj", "input")] == (
        4096,
        spec.model.num_attention_heads * spec.model.head_dim // 2,
    )
    assert by[("expert fc2", "weight")] == (hidden, spec.model.moe_ffn_hidden_size)  # ETP 1
    assert not shapes.uneven


def test_s001_fires_on_a_row_the_cp_split_does_not_divide_and_is_quiet_on_one_it_does() -> None:
    spec = make_spec(*BASE, "parallelism=3d", "cp=2", "mbs=1")
    uneven = ShapeEvidence(rank_shapes(spec, (4098,), True, "packed"))
    even = ShapeEvidence(rank_shapes(spec, (4096,), True, "packed"))
    assert codes(spec, uneven) == ["S001"] and codes(spec, even) == []


def test_s002_and_s003_read_tes_verdicts() -> None:
    spec = make_spec(*BASE, "precision=fp8mx", "mbs=1")
    shapes = rank_shapes(spec, (4104,), False, "padded")
    op = Operand("attention qkv", "input", (4104, 2048))
    assert codes(spec, ShapeEvidence(shapes, (Verdict(op, "assert_dim_for_fp8_exec", "x"),), 1)) == ["S002"]
    block = ShapeEvidence(shapes, (Verdict(op, "MXFP8Quantizer.is_quantizable", "returned False"),), 1)
    assert codes(spec, block) == ["S003"]
    assert codes(spec, ShapeEvidence(shapes, (), len(shapes.operands))) == []


def test_s000_says_when_the_check_did_not_run() -> None:
    spec = make_spec(*BASE)
    assert codes(spec, ShapeEvidence(None, not_run="ImportError: no TE")) == ["S000"]
    assert [rule.code for rule in SHAPE_RULES] == ["S000", "S001", "S002", "S003", "S004"]


def test_the_key_holds_what_shapes_the_batch_and_nothing_else() -> None:
    spec = make_spec(*BASE, "dispatcher=alltoall")
    assert shape_key(spec) == shape_key(make_spec(*BASE, "dispatcher=deepep"))
    assert shape_key(spec) != shape_key(make_spec(*BASE, "dispatcher=alltoall", "seq_length=2048"))
    assert shape_key(spec) != shape_key(
        make_spec(*BASE, "dispatcher=alltoall", "data.packing=in_batch", "mbs=2")
    )
