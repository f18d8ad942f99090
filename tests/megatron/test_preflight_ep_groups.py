"""The node preflight times the run's EP all-to-all in Megatron Core's own EP groups
(moe_vlm/runtime/node_probe.py `ep_groups`): the same ranks as parallel_state's expert rank
generator, order tp-cp-ep-dp-pp with cp=1 and tp=ETP (parallel_state.py initialize_model_parallel)."""

from __future__ import annotations

import pytest

from moe_vlm.runtime.node_probe import ep_groups
from tests.megatron.conftest import needs_stack

# (world size, ETP, EP, PP): GB200-like layouts, ETP > 1, and PP > 1.
LAYOUTS = [(8, 1, 8, 1), (16, 1, 8, 1), (16, 2, 4, 1), (32, 4, 2, 2), (64, 1, 64, 1), (24, 2, 3, 2)]


@needs_stack
@pytest.mark.parametrize("world, etp, ep, pp", LAYOUTS)
def test_ep_groups_are_megatron_cores(world: int, etp: int, ep: int, pp: int) -> None:
    from megatron.core.parallel_state import RankGenerator

    generator = RankGenerator(
        tp=etp, ep=ep, dp=world // (etp * ep * pp), pp=pp, cp=1, order="tp-cp-ep-dp-pp", rank_offset=0
    )
    assert sorted(ep_groups(world, ep, etp)) == sorted(generator.get_ranks("ep"))
    assert ep_groups(world, 1, etp) == []
