"""The derived facts on the RunSpec, each defined once and read by rules, memory, advise and the
Bridge field table: sequence parallelism as the engine runs it, the pipeline stage split, and the
engine / family / architecture enums."""

from __future__ import annotations

import pytest

from moe_vlm.cli.advise import _pipeline_split
from moe_vlm.config.arch import PROFILES
from moe_vlm.config.schema import Arch, Engine, ParallelismFamily
from moe_vlm.config.spec import PipelineSplit
from moe_vlm.knobs.bridge_fields import bridge_overrides
from moe_vlm.rules import validate
from tests.conftest import make_spec

B200_3D = ["cluster=b200", "parallelism=3d"]


def bridge_field(overrides: list[str], name: str) -> object:
    return next(o.value for o in bridge_overrides(make_spec(*overrides)) if o.field == name)


@pytest.mark.parametrize(
    ("model", "tp", "knob", "runs"),
    [
        ("qwen3_vl_30b_a3b", 2, False, True),  # Qwen3VLMoEModelProvider.finalize turns it on
        ("qwen3_vl_30b_a3b", 2, True, True),
        ("qwen3_vl_30b_a3b", 1, True, False),  # TransformerConfig.finalize turns it off
        ("qwen35_vl_35b_a3b", 2, False, False),  # the Qwen3.5 provider leaves the knob alone
        ("qwen35_vl_35b_a3b", 2, True, True),
    ],
)
def test_sequence_parallel_is_what_the_engine_runs(model: str, tp: int, knob: bool, runs: bool) -> None:
    overrides = [*B200_3D, f"model={model}", f"tp={tp}", f"parallelism.sequence_parallel={str(knob).lower()}"]
    spec = make_spec(*overrides)
    assert spec.sequence_parallel is runs
    assert spec.parallelism.sequence_parallel is knob  # the knob itself stays as typed (L009, L012 read it)
    assert bridge_field(overrides, "model.sequence_parallel") is runs  # the field table reads the spec


def test_stage_split_as_megatron_cuts_it() -> None:
    spec = make_spec("cluster=b200", "model=qwen3_vl_235b_a22b", "nodes=8", "parallelism=3d", "pp=8",
                     "parallelism.first_stage_layers=11", "parallelism.last_stage_layers=11")  # fmt: skip
    assert spec.stage_layer_counts == (11, 12, 12, 12, 12, 12, 12, 11)
    assert spec.stage_layer_indices(0) == range(0, 11)
    assert spec.stage_layer_indices(7) == range(83, 94)
    assert [i for s in range(8) for i in spec.stage_layer_indices(s)] == list(range(94))
    # Only the last stage set: Megatron spreads the rest evenly, the first stage included.
    only_last = make_spec("cluster=b200", "model=qwen3_vl_30b_a3b", "parallelism=3d", "pp=4",
                          "parallelism.last_stage_layers=18")  # fmt: skip
    assert only_last.stage_layer_counts == (10, 10, 10, 18)


def test_deepstack_rule_reads_the_stage_split() -> None:
    """L013 used `first_stage_layers or num_layers // pp`: 48 // 8 = 6 layers, 3 per VP chunk, enough
    for 3 deepstack levels. With only the last stage set (34 layers), Megatron gives the first stage
    (48 - 34) / 7 = 2 layers, 1 per chunk, and Qwen3VLModel's assert fails: L013 now says so."""
    base = ["cluster=b200", "model=qwen3_vl_30b_a3b", "parallelism=3d", "pp=8", "vp=2"]
    spec = make_spec(*base, "parallelism.last_stage_layers=34")
    assert spec.stage_layer_counts[0] == 2
    codes = {f.code for f in validate(spec)}
    assert "L013" in codes and "L004" not in codes
    assert "L013" not in {f.code for f in validate(make_spec(*base))}


@pytest.mark.parametrize(("layers", "pp", "expected"), [(48, 4, (0, 0)), (94, 8, (11, 11)), (47, 2, (23, 24)),
                                                        (94, 4, (23, 23)), (40, 3, (13, 13))])  # fmt: skip
def test_balanced_split_is_one_megatron_accepts(layers: int, pp: int, expected: tuple[int, int]) -> None:
    split = PipelineSplit.balanced(layers, pp)
    assert (split.first, split.last) == expected
    assert split.fits and split.even and sum(split.counts) == layers and min(split.counts) > 0
    extra = [f"parallelism.first_stage_layers={expected[0]}", f"parallelism.last_stage_layers={expected[1]}"]
    assert _pipeline_split(layers, pp) == [f"pp={pp}", *(extra if expected != (0, 0) else [])]


def test_engine_family_and_arch_are_enums_equal_to_their_values() -> None:
    spec = make_spec("cluster=local", "parallelism=3d", "model=qwen35_vl_35b_a3b")
    assert spec.engine is Engine.torch and spec.engine == "torch" and f"{spec.engine}" == "torch"
    assert spec.family is ParallelismFamily["3d"] and spec.family == "3d"
    assert spec.model.arch is Arch.qwen3_5_moe and spec.arch_profile is PROFILES[Arch.qwen3_5_moe]
    assert spec.to_dict()["parallelism"]["family"] == "3d" and spec.to_dict()["engine"] == "torch"
    assert set(PROFILES) == set(Arch)  # every architecture has its profile
