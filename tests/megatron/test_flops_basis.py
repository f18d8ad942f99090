"""Bridge's logged FLOPs, from the library's own function on the real ConfigContainer, against ours.

`moe_vlm.perf.flops.bridge_count` claims to be the number Bridge 0.6.2 logs for a step
(training/utils/flop_utils.py `num_floating_point_operations`, with the statistics qwen3_vl_step
hands it: whole padded rows, qwen3_vl_step.py:183-197, 282-288). Here the library computes it for
the vendor's workload (4,096 positions per row, 784 ViT patches per sample) and for a ragged
step, on the engine's own ConfigContainer for each in-scope model, and the two must agree.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest

from moe_vlm.perf.flops import Workload, bridge_count, step_flops
from moe_vlm.perf.flops_basis import flops_basis
from tests.megatron.conftest import REPORT, RecipeCache, needs_stack, runtime_updated

pytestmark = needs_stack

# The in-scope models at their 8-GPU GB200 perf-recipe layout (TP 1, EP 8, MBS 4, GBS 512), and a
# TP 2 point, where the vocabulary pads to 256.
POINTS = [
    ("model=qwen3_vl_30b_a3b", "cluster=gb200", "nodes=2", "parallelism=3d", "ep=8", "mbs=4", "gbs=512"),
    ("model=qwen35_vl_35b_a3b", "cluster=gb200", "nodes=2", "parallelism=3d", "ep=8", "mbs=4", "gbs=512"),
    ("model=qwen3_vl_235b_a22b", "cluster=gb200", "nodes=16", "parallelism=3d", "tp=2", "pp=8", "ep=8"),
]


def vendor_step(gbs: int, positions: int = 4096, real: int = 232, patches: int = 784) -> Workload:
    """The mock's step: every row padded to `positions`, one image of `patches` per sample."""
    return Workload(
        sequences=gbs,
        padded_tokens=gbs * positions,
        real_tokens=gbs * real,
        sum_seq_len_squared=gbs * real**2,
        vision_patches=gbs * patches,
        sum_patches_squared=gbs * patches**2,
    )


def library_count(cfg: Any, gbs: int, workload: Workload, row: int) -> float:
    """Bridge's function, given what its train loop gathers from qwen3_vl_step for this step."""
    from megatron.bridge.training.utils.flop_utils import num_floating_point_operations

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(
            num_floating_point_operations(
                cfg,
                batch_size=gbs,
                seqlen_sum=workload.padded_tokens,
                seqlen_squared_sum=gbs * row**2,  # cu_seqlens of whole rows
                num_vision_patches=workload.vision_patches,
            )
        )


@pytest.mark.parametrize("overrides", POINTS, ids=lambda o: o[0].split("=")[1])
def test_bridge_count_is_the_librarys(
    recipes: RecipeCache, engine_environment: Any, overrides: tuple[str, ...]
) -> None:
    spec, cfg = runtime_updated(recipes, engine_environment, *overrides)  # as the run's train loop has it
    step = vendor_step(spec.gbs)
    library = library_count(cfg, spec.gbs, step, 4096)
    ours = bridge_count(spec, step)
    assert ours == pytest.approx(library, rel=1e-9), (spec.model.name, ours, library)
    assert step_flops(spec, step).bridge == ours
    # The vision term alone (the library's vit_flops: one merger, patches per row).
    no_images = vendor_step(spec.gbs, patches=0)
    vision_library = library - library_count(cfg, spec.gbs, no_images, 4096)
    assert ours - bridge_count(spec, no_images) == pytest.approx(vision_library, rel=1e-9)
    basis = flops_basis(spec, step, "the vendor's mock step")
    REPORT.append(
        f"flops basis {spec.model.name} (GBS {spec.gbs}, TP {spec.layout.tp}): Bridge's count "
        f"{library / 1e15:.3f} PFLOP/step = ours within 1e-9; useful (frozen-aware, real tokens) "
        f"{basis.useful_fraction:.1%} of it with nothing frozen"
    )


def test_bridge_count_of_a_ragged_step_at_one_ep_rank(recipes: RecipeCache, engine_environment: Any) -> None:
    """EP 1, PP 1: rows are padded to the batch's longest (here 3,000), not to seq_length."""
    spec, cfg = runtime_updated(
        recipes, engine_environment, "model=qwen3_vl_30b_a3b", "cluster=gb200", "nodes=1", "parallelism=fsdp",
        "ep=1", "gbs=16",
    )  # fmt: skip
    step = Workload(
        sequences=16,
        padded_tokens=16 * 3000,
        real_tokens=16 * 2000,
        sum_seq_len_squared=16 * 2000**2,
        vision_patches=16 * 1024,
        sum_patches_squared=16 * 1024**2,
    )
    assert bridge_count(spec, step) == pytest.approx(library_count(cfg, 16, step, 3000), rel=1e-9)


@pytest.mark.parametrize("overrides", POINTS[:2], ids=lambda o: o[0].split("=")[1])
def test_packed_bridge_count_is_the_librarys(
    recipes: RecipeCache, engine_environment: Any, overrides: tuple[str, ...]
) -> None:
    """Packed rows (in-batch, MBS samples a row): Bridge's accumulator, run here on CPU with each row's
    cu_seqlens (flop_utils.py accumulate_flops_metadata), counts attention as the samples' squares, and
    its train loop passes batch_size = GBS. Ours must be that figure, not the row^2 one (issue 32)."""
    import torch
    from megatron.bridge.training.utils.flop_utils import (
        _accumulator_to_int,
        accumulate_flops_metadata,
        num_floating_point_operations,
    )

    from moe_vlm.data.bridge_mock import BRIDGE_MOCK_PACKED

    spec, cfg = runtime_updated(recipes, engine_environment, *overrides)
    lengths = [BRIDGE_MOCK_PACKED.real_tokens(i) for i in range(spec.gbs)]
    state = type("State", (), {})()
    for start in range(0, spec.gbs, spec.mbs):
        row = lengths[start : start + spec.mbs]
        cu = torch.tensor([0, *torch.tensor(row).cumsum(0).tolist()], dtype=torch.int32)
        accumulate_flops_metadata(state, torch.zeros(1, sum(row), dtype=torch.long), cu_seqlens=cu)
    seqlen_sum = _accumulator_to_int(state._flops_seqlen_sum)
    squares = _accumulator_to_int(state._flops_seqlen_sq_sum)
    assert seqlen_sum == sum(lengths) and squares == sum(s * s for s in lengths)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        library = float(
            num_floating_point_operations(
                cfg,
                batch_size=spec.gbs,
                seqlen_sum=seqlen_sum,
                seqlen_squared_sum=squares,
                num_vision_patches=0,
            )
        )
    step = Workload(
        sequences=spec.gbs // spec.mbs,
        padded_tokens=sum(lengths),
        real_tokens=sum(lengths),
        sum_seq_len_squared=squares,
        vision_patches=0,
        sum_patches_squared=0,
        samples=spec.gbs,
    )
    assert bridge_count(spec, step) == pytest.approx(library, rel=1e-9)
    # The row^2 count the project assumed before: packed rows as if one sequence each.
    as_rows = Workload(step.sequences, step.padded_tokens, step.real_tokens, 0, 0, 0)
    REPORT.append(
        f"packed Bridge count {spec.model.name} (GBS {spec.gbs}, MBS {spec.mbs} samples a row): the library's "
        f"{library / 1e15:.3f} PFLOP/step = ours; row^2 would say {bridge_count(spec, as_rows) / 1e15:.3f}"
    )
