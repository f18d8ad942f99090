"""The vendor's number decomposed: Bridge's logged FLOPs basis, ours, and the terms between.

Bridge's count itself is checked against the library's function in tests/megatron/test_flops_basis.py;
here: the terms add up, each is the assumption it names, the plan's expected sample, the report
and --diff views.
"""

from __future__ import annotations

from functools import cache

import pytest

from moe_vlm.config.spec import RunSpec
from moe_vlm.config.vendor import BRIDGE_MOCK_PATCHES, BRIDGE_MOCK_REAL_TOKENS
from moe_vlm.data.synthetic import image_hw
from moe_vlm.perf.flops import Workload, step_flops
from moe_vlm.perf.flops_basis import (
    _image_hw,
    expected_basis,
    expected_shape,
    flops_basis,
)
from moe_vlm.report.basis import diff_rows
from tests.conftest import make_spec

# Qwen3-VL-30B-A3B as its 8-GPU GB200 perf recipe runs it: EP 8, MBS 4, GBS 512, the provider's
# freeze state (language and vision frozen, the projector trains).
RECIPE_30B = (
    "model=qwen3_vl_30b_a3b",
    "cluster=gb200",
    "nodes=2",
    "parallelism=3d",
    "ep=8",
    "mbs=4",
    "gbs=512",
)
RECIPE_30B_FROZEN = (*RECIPE_30B, "vision_freeze=vision", "vision_freeze.language=true")


@cache
def spec(*overrides: str) -> RunSpec:
    return make_spec(*overrides)


def mock_step(rows: int) -> Workload:
    """Bridge's mock: 4,096 positions per row, about 232 real tokens, one 784-patch image."""
    real, patches = BRIDGE_MOCK_REAL_TOKENS, BRIDGE_MOCK_PATCHES
    return Workload(rows, rows * 4096, rows * real, rows * real**2, rows * patches, rows * patches**2)


def test_terms_add_up_to_ours_and_each_is_its_assumption() -> None:
    s = spec(*RECIPE_30B_FROZEN)
    basis = flops_basis(s, mock_step(512), "vendor mock")
    terms = {t.name: t.flops for t in basis.terms}
    assert basis.bridge_flops - sum(terms.values()) == pytest.approx(basis.model_flops, rel=1e-12)
    assert basis.model_flops == step_flops(s, mock_step(512)).model
    assert terms["vocabulary padding"] == 0  # 151,936 = 1,187 x 128 at TP 1
    # Nothing frozen: the frozen term is 0 and ours is larger by exactly the frozen parts' saving.
    unfrozen = flops_basis(spec(*RECIPE_30B), mock_step(512), "vendor mock")
    assert {t.name: t.flops for t in unfrozen.terms}["frozen parts"] == 0
    assert unfrozen.model_flops - basis.model_flops == pytest.approx(terms["frozen parts"])
    # Padding is the decoder's alone: the same step without padding has no padding term.
    unpadded = Workload(512, 512 * 232, 512 * 232, 512 * 232**2, 512 * 784, 512 * 784**2)
    assert {t.name: t.flops for t in flops_basis(s, unpadded, "").terms}["padding"] == pytest.approx(
        0, abs=1e3
    )


def test_the_30b_gb200_recipe_figure() -> None:
    """The decomposition quoted in docs/megatron.md: 4,096 positions, 232 real (5.7%), and with the
    recipe's frozen decoder and ViT 3.9% of Bridge's count is useful model work."""
    basis = flops_basis(spec(*RECIPE_30B_FROZEN), mock_step(512), "vendor mock", 1)
    assert basis.headline() == (
        "4,096 positions/sample, 232 real (5.7%); useful model FLOPs = 3.9% of Bridge's count"
    )
    assert basis.bridge_flops / 1e15 == pytest.approx(49.374, abs=1e-3)
    assert basis.model_flops / 1e15 == pytest.approx(1.915, abs=1e-3)


def test_the_bridge_mock_hook_is_read_from_the_data_kind() -> None:
    """The hook for data=bridge_mock (helper `recipes`): until its option exists, a DataConfig whose
    kind says bridge_mock gets Bridge's mock sample shape."""
    s = spec(*RECIPE_30B_FROZEN)
    mocked = type("Kind", (), {"value": "bridge_mock"})()
    data = type(s.data)(**{**vars(s.data), "kind": mocked})
    shape = expected_shape(RunSpec(**{**vars(s), "data": data}))
    assert not isinstance(shape, str)
    assert (shape.positions, shape.real_tokens, shape.patches, shape.images) == (4096, 232, 784, 1)


def test_expected_shapes_of_our_data_kinds() -> None:
    mock = expected_shape(spec(*RECIPE_30B, "data=mock"))
    assert not isinstance(mock, str) and mock.real_tokens == (2048 + 4096) / 2 and mock.patches == 0
    synthetic = expected_shape(spec(*RECIPE_30B))
    assert not isinstance(synthetic, str) and synthetic.images == 1.5 and 0 < synthetic.real_tokens < 4096
    assert isinstance(expected_shape(spec(*RECIPE_30B, "data=real", "data.path=/nowhere")), str)
    assert isinstance(expected_basis(spec(*RECIPE_30B, "data.packing=in_batch")), str)


@pytest.mark.parametrize("ratio", [1.0, 0.75, 1.333, 0.5625, 1.778])
def test_image_shape_is_the_synthetic_datas(ratio: float) -> None:
    for side in (336, 777, 1344):
        assert _image_hw(side, ratio) == image_hw(side, ratio)


def test_diff_rows_show_every_term() -> None:
    a = {
        "flops_basis": flops_basis(spec(*RECIPE_30B_FROZEN), mock_step(512), "").to_dict(),
        "tflops_per_gpu": 1.0,
    }
    b = {"flops_basis": flops_basis(spec(*RECIPE_30B), mock_step(512), "").to_dict()}
    names = [row[0] for row in diff_rows(a, b)]
    for term in ("padding", "vocabulary padding", "vision accounting", "frozen parts"):
        assert f"- {term} (PFLOP/step)" in names
    assert "Bridge's count (PFLOP/step)" in names and "ours / Bridge" in names
    assert diff_rows({}, {}) == []


def test_packed_bridge_mock_basis_counts_samples_as_bridge_does() -> None:
    """data=bridge_mock packed: the plan's basis is Bridge's packed mock (10-99 answer words: 212 + 54.6
    = 267 real tokens a sample over its 1,000 examples, not the padded mock's 232), Bridge's batch is GBS samples and its attention the samples'
    squares; run.json's fields recompute Bridge's attention term by hand (issue 32)."""
    from moe_vlm.config.arch import attention_shape
    from moe_vlm.data.bridge_mock import BRIDGE_MOCK_PACKED
    from moe_vlm.perf.flops import layer_counts
    from moe_vlm.perf.flops_basis import expected_basis

    spec = make_spec(
        "engine=megatron", "model=qwen3_vl_30b_a3b", "cluster=gb200", "nodes=2", "parallelism=3d", "ep=8",
        "data=bridge_mock", "data.packing=in_batch", "mbs=4", "gbs=512",
    )  # fmt: skip
    basis = expected_basis(spec)
    assert not isinstance(basis, str)
    lengths = [BRIDGE_MOCK_PACKED.real_tokens(i) for i in range(1000)]
    mean = sum(lengths) / 1000
    assert 266 < mean < 268 and basis.real_tokens_per_sample == pytest.approx(mean, abs=0.01)
    assert basis.packed and basis.rows == 512 and "packed rows" in basis.headline()
    record = basis.to_dict()
    assert record["bridge_sum_squares"] == record["real_sum_squares"]
    assert record["bridge_sum_squares"] == pytest.approx(512 * sum(n * n for n in lengths) / 1000, abs=1)
    # By hand: Bridge's attention term = 3 x 2 x q x full-attention layers x its sum of squares,
    # which row^2 (4 samples a row) would overstate by about 4x.
    model = spec.model
    per_square = 3 * 2 * attention_shape(model).query * layer_counts(model)["full_attention"]
    positions = record["positions_per_step"]
    row_squares = positions**2 / 128
    assert row_squares / record["bridge_sum_squares"] > 3.5
    rows_count = record["bridge_flops"] + per_square * (row_squares - record["bridge_sum_squares"])
    assert rows_count > record["bridge_flops"]
