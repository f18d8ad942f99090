"""Every knob the Megatron engine declares Honoured reaches the real ConfigContainer it builds.

For each one (support.py; FIELD_MAP's knob column), a bridge_fields.FIELD_MAP row names it, and the
ConfigContainer the engine builds (the Bridge recipe, then apply_overrides) holds other values in
those rows' fields when the knob changes (tests/knob_reading.megatron_problem). The mutation tests
below remove a row, or make one ignore its knob, and see the checker turn red.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import pytest

from moe_vlm.config.schema import Engine
from moe_vlm.config.spec import RunSpec
from moe_vlm.engines.megatron.config import apply_overrides
from moe_vlm.knobs import bridge_fields
from moe_vlm.knobs.support import MODEL_CONFIG_KNOBS, NOT_ENGINE_KNOBS, Honoured, support
from tests.conftest import SCHEMA_LEAVES
from tests.knob_reading import MEGATRON_OUTSIDE_TABLE, megatron_problem
from tests.megatron.conftest import RecipeCache, needs_stack

pytestmark = needs_stack


def honoured_through_the_table() -> list[str]:
    """The knobs Megatron honours for every value through FIELD_MAP (the model's knobs reach it
    through the config.json its provider reads: test_knob_coverage checks that config)."""
    out = []
    for knob in SCHEMA_LEAVES:
        entry = support(Engine.megatron, knob)
        if knob in NOT_ENGINE_KNOBS or knob in MODEL_CONFIG_KNOBS or knob in MEGATRON_OUTSIDE_TABLE:
            continue
        if isinstance(entry, Honoured) and entry.values is None:
            out.append(knob)
    return out


KNOBS = honoured_through_the_table()


def builder(recipes: RecipeCache) -> Any:
    def build(spec: RunSpec) -> Any:
        cfg = recipes.config(spec)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            apply_overrides(cfg, spec)
        return cfg

    return build


def test_the_table_knobs_were_found() -> None:
    assert len(KNOBS) > 60 and "lr" in KNOBS and "router.aux_loss_coeff" in KNOBS


@pytest.mark.parametrize("knob", KNOBS)
def test_every_honoured_knob_changes_the_built_config_container(recipes: RecipeCache, knob: str) -> None:
    problem = megatron_problem(knob, builder(recipes))
    assert problem is None, problem


# --- the checker, checked: a mutation of the table turns it red --------------------------------

# A plain copy, a null-is-the-recipe's knob, a bool, a field of the seeded dataset config.
REPRESENTATIVE = ("lr", "router.aux_loss_coeff", "parallelism.nccl_ub", "data.min_images")
# (The seeded dataset's config object is built from the spec by its class row: a data row that
# ignores its knob still reaches the ConfigContainer through it, so data knobs are left out here.)
DEAF_ROWS = REPRESENTATIVE[:3]


@pytest.mark.parametrize("knob", REPRESENTATIVE)
def test_removing_a_knobs_rows_turns_the_checker_red(
    recipes: RecipeCache, monkeypatch: pytest.MonkeyPatch, knob: str
) -> None:
    assert megatron_problem(knob, builder(recipes)) is None
    kept = tuple(row for row in bridge_fields.FIELD_MAP if row.knob != knob)
    monkeypatch.setattr(bridge_fields, "FIELD_MAP", kept)
    problem = megatron_problem(knob, builder(recipes))
    assert problem is not None and "no bridge_fields.FIELD_MAP row names it" in problem


@pytest.mark.parametrize("knob", DEAF_ROWS)
def test_a_row_that_ignores_its_knob_turns_the_checker_red(
    recipes: RecipeCache, monkeypatch: pytest.MonkeyPatch, knob: str
) -> None:
    """The row stays, but writes the recipe's value whatever the knob says (KEEP): apply_overrides
    then leaves the recipe's field, and the built ConfigContainer no longer changes."""
    deaf = tuple(
        dataclasses.replace(row, value=lambda _spec: bridge_fields.KEEP) if row.knob == knob else row
        for row in bridge_fields.FIELD_MAP
    )
    monkeypatch.setattr(bridge_fields, "FIELD_MAP", deaf)
    problem = megatron_problem(knob, builder(recipes))
    assert problem is not None and "the built ConfigContainer holds the same" in problem
