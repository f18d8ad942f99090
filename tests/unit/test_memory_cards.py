"""Every card row plans under its GPU's memory, and bridge_mock's packed micro-batch is sized on
Bridge's own sample lengths (issue 32)."""

from __future__ import annotations

from pathlib import Path

import pytest

from moe_vlm.data.bridge_mock import bridge_mock
from moe_vlm.perf.memory import estimate
from moe_vlm.perf.memory.micro_batch import micro_batch_positions, micro_batch_shape
from tests.conftest import make_spec

CARDS = sorted(p.stem for p in (Path(__file__).parents[2] / "conf" / "card").glob("*.yaml"))


def test_there_are_cards() -> None:
    assert "qwen3_next_35b_gb200" in CARDS and len(CARDS) >= 4


@pytest.mark.parametrize("card", CARDS)
def test_every_card_row_plans_under_its_gpu_memory(card: str) -> None:
    # Each row RAN (card.yaml): an estimate over the GPU's memory is wrong, or the card's assumptions are.
    found = estimate(make_spec(f"card={card}"))
    assert found.capacity_gib is not None
    assert found.fits, (card, round(found.total_gib, 2), found.capacity_gib)


def test_packed_bridge_mock_is_sized_on_bridges_sample_lengths() -> None:
    spec = make_spec("card=qwen3_next_35b_gb200", "data.packing=in_batch")
    lengths = [bridge_mock(spec.data.packing).real_tokens(i) for i in range(1000)]
    shape = micro_batch_shape(spec)
    # 16 samples of Bridge's packed mock (10-99 answer words, mock_vlm_sft.py:110) at p99: one ~4.5k row,
    # not the padded bound 16 x 4096 the real-data fallback gave.
    assert spec.mbs * min(lengths) <= micro_batch_positions(spec) <= spec.mbs * max(lengths)
    assert shape.mean_tokens == pytest.approx(spec.mbs * sum(lengths) / len(lengths), rel=0.02)
    assert shape.patches == spec.mbs * 784
    assert "bridge_mock" in shape.source


def test_padded_bridge_mock_stays_padded() -> None:
    spec = make_spec("card=qwen3_next_35b_gb200", "data.packing=none")
    assert micro_batch_positions(spec) == spec.mbs * spec.seq_length
    found = estimate(spec)
    # The padded card row: what Bridge's Qwen3.5 perf recipes feed (MBS rows x 4096) does not fit at MBS 16.
    assert not found.fits


@pytest.mark.parametrize("card", CARDS)
def test_a_card_that_packs_says_why(card: str) -> None:
    # The card rows do not say how samples became rows: packing is an assumption, with its reason.
    spec = make_spec(f"card={card}")
    if spec.data.packing.value != "none":
        why = spec.card.assumed.get("data.packing", "")
        assert "in_batch.py" in why and "vlm_step" in why, why
