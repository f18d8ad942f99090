"""Every knob of the config schema is honoured by each engine, or rejected there by a rule.

A knob an engine silently ignores is how dispatcher.fp8_dispatch and the torch engine's
data.num_workers shipped (fixed by D004 and E010 in 00735de). This test walks every leaf of
moe_vlm.config.schema.TrainConfig and, per engine, holds it to moe_vlm/knobs/support.py:

- honoured for every value: the engine READS it (tests/knob_reading.py). Torch: what the engine
  builds (loader, Trainer and two steps, or a tiny run of its own launch) changes when the knob
  does. Megatron: a bridge_fields.FIELD_MAP row names it and its value changes when the knob does
  (tests/megatron/test_knob_reading.py checks the real ConfigContainer the same way), or the knob
  is read outside the table (support.MEGATRON: the launch); a model knob: the transformers config
  both engines build from changes;
- honoured for some values only: a spec setting another value fires an error naming the knob,
  and the same spec with an accepted value does not; where two accepted values differ, the torch
  engine's build differs between them;
- inert: the knob that switches it on is restricted on that engine;
- ignored, with the reason written down;
- declared nowhere: then it must be rejected as above, against its default;
- or listed in NOT_ENGINE_KNOBS.
"""

from __future__ import annotations

import dataclasses
from enum import Enum
from functools import cache
from typing import Any

import pytest

from moe_vlm.config.compose import compose_spec
from moe_vlm.config.schema import Engine
from moe_vlm.config.spec import RunSpec
from moe_vlm.knobs.bridge_fields import FIELD_MAP
from moe_vlm.knobs.support import (
    FIELD_MAP_GROUP_READS,
    MEGATRON,
    MODEL_CONFIG_KNOBS,
    NOT_ENGINE_KNOBS,
    SHORTCUTS,
    SUPPORT,
    TORCH,
    Honoured,
    Ignored,
    Inert,
    support,
)
from moe_vlm.rules import errors, validate
from moe_vlm.rules.catalogue import CUDA_GRAPH_SCOPES, SELECTIVE_RECOMPUTE_MODULES
from tests.conftest import SCHEMA_LEAVES, knob_override
from tests.knob_reading import (
    MEGATRON_OUTSIDE_TABLE,
    TorchChecker,
    base_type,
    changed,
    megatron_outside_problem,
    megatron_pair,
    rows,
    torch_unobservable,
    value_of,
)

# Each engine as a spec reaches it (dry_run: the Megatron engine is planned on this CPU machine).
ON = {Engine.torch: ("engine=torch",), Engine.megatron: ("engine=megatron", "dry_run=true")}
# What puts a knob in play: the group choice it belongs to.
IN_PLAY = {"recompute.modules": ("recompute=selective",)}
# A list's "other value" is not implied by its type: the values a rule must reject are tried.
REJECT_WITH: dict[str, list[Any]] = {
    "recompute.modules": [[name] for name in SELECTIVE_RECOMPUTE_MODULES],
    "cuda_graph.scope": [[scope] for scope in CUDA_GRAPH_SCOPES],
}
# Float knobs: a value the engine would otherwise have to honour.
REJECT_FLOAT = 0.5

LEAVES = SCHEMA_LEAVES


@cache
def _spec(overrides: tuple[str, ...]) -> RunSpec:
    return compose_spec(list(overrides))


def _other_values(knob: str, current: Any, accepted: tuple[Any, ...] | None) -> list[Any]:
    """Values of the knob's type that are neither `current` nor accepted."""
    kind = base_type(LEAVES[knob])
    if knob in REJECT_WITH:
        candidates: list[Any] = REJECT_WITH[knob]
    elif kind is float:
        candidates = [REJECT_FLOAT]
    elif isinstance(kind, type) and issubclass(kind, Enum):
        candidates = list(kind)
    elif kind is bool:
        candidates = [True, False]
    elif kind is int:
        candidates = [(current or 0) + 1, max((a for a in accepted or () if a is not None), default=1) + 1]
    else:
        raise AssertionError(f"{knob}: give test_knob_coverage.REJECT_WITH values a rule must reject")
    return [
        v
        for v in candidates
        if v != current and not (accepted is not None and Honoured("", accepted).accepts(v))
    ]


def _names(knob: str) -> set[str]:
    """What a finding about this knob names: the knob, its group, or the other spelling of a shortcut."""
    aliases = {alias for alias, size in SHORTCUTS.items() if size == knob} | {SHORTCUTS.get(knob, knob)}
    return {knob, knob.split(".")[0], *aliases}


def _rejections(overrides: tuple[str, ...], knob: str) -> list[str]:
    return [f.code for f in errors(validate(_spec(overrides))) if _names(knob) & set(f.keys)]


def assert_rejected(engine: Engine, knob: str, accepted: tuple[Any, ...] | None) -> None:
    context = (*ON[engine], *IN_PLAY.get(knob, ()))
    current = value_of(_spec(context), knob)
    assert accepted is None or Honoured("", accepted).accepts(current), f"{knob}: the default is not accepted"
    assert not _rejections(context, knob), f"{knob}={current}: rejected on {engine.value} as configured"
    others = _other_values(knob, current, accepted)
    assert others, f"{knob}: no value to try"
    probe = (*context, knob_override(knob, others[0]))
    assert _rejections(probe, knob), (
        f"{knob} is silently ignored by the {engine.value} engine: `{' '.join(probe)}` validates. "
        "Honour it (knobs/support.py, bridge_fields.FIELD_MAP) or reject it with a rule."
    )


def assert_reaches_a_bridge_field(knob: str) -> None:
    """A FIELD_MAP row names the knob, and its value changes when the knob does (the table only;
    tests/megatron/test_knob_reading.py builds the real ConfigContainer)."""
    found = rows(knob)
    assert found, (
        f"{knob} is declared Honoured on the Megatron engine, but no bridge_fields.FIELD_MAP row names it"
    )
    probe = megatron_pair(knob)
    spec, other = _spec(probe.before), _spec(probe.after)
    assert any(row.value(spec) != row.value(other) for row in found), (
        f"{knob}: no FIELD_MAP row named for it ({[r.field for r in found]}) changes when it does"
    )


def _hf_config(model: Any) -> dict[str, Any]:
    from moe_vlm.engines.hf_config import transformers_config

    return dict(transformers_config(model).to_dict())


def assert_reaches_the_model_config(knob: str) -> None:
    name = knob.removeprefix("model.")
    models = [_spec(("model=tiny_moe_vlm",)).model, _spec(("model=qwen35_vl_35b_a3b",)).model]
    changed_models = [dataclasses.replace(m, **{name: changed(getattr(m, name))}) for m in models]
    assert any(_hf_config(m) != _hf_config(c) for m, c in zip(models, changed_models, strict=True)), (
        f"{knob}: the transformers config is the same whatever its value"
    )


CASES = [(engine, knob) for knob in LEAVES for engine in (Engine.torch, Engine.megatron)]
TORCH_CHECKER = TorchChecker()  # one per session: each spec's observation is made once


def assert_torch_reads(knob: str, accepted: tuple[Any, ...] | None = None) -> None:
    if why := torch_unobservable(knob):
        pytest.skip(why)
    problem = TORCH_CHECKER.problem(knob, accepted)
    assert problem is None, problem


def distinct_accepted(accepted: tuple[Any, ...]) -> bool:
    """Two accepted values that mean different things (null beside one value means that value)."""
    return len([v for v in accepted if v is not None]) >= 2


@pytest.mark.parametrize(("engine", "knob"), CASES, ids=[f"{e.value}-{k}" for e, k in CASES])
def test_every_knob_is_honoured_or_rejected(engine: Engine, knob: str) -> None:
    if knob in NOT_ENGINE_KNOBS:
        assert all(knob not in table for table in SUPPORT.values()), (
            f"{knob}: not an engine knob, yet declared"
        )
        return
    entry = support(engine, knob)
    if entry is None:
        assert_rejected(engine, knob, None)
    elif isinstance(entry, Ignored):
        assert entry.why
    elif isinstance(entry, Inert):
        switch = support(engine, entry.switch)
        assert entry.switch in LEAVES and entry.switch not in NOT_ENGINE_KNOBS, entry.switch
        assert switch is None or (isinstance(switch, Honoured) and switch.values is not None), (
            f"{knob} is inert only while {entry.switch} is restricted on {engine.value}"
        )
    elif entry.values is not None:
        assert_rejected(engine, knob, entry.values)
        if engine is Engine.torch and distinct_accepted(entry.values) and knob not in MODEL_CONFIG_KNOBS:
            assert_torch_reads(knob, entry.values)
    elif knob in MODEL_CONFIG_KNOBS:
        assert_reaches_the_model_config(knob)
    elif engine is Engine.torch:
        assert_torch_reads(knob)
    elif knob in MEGATRON_OUTSIDE_TABLE:
        assert knob in MEGATRON and not rows(knob), (
            f"{knob}: read outside the table, yet a FIELD_MAP row names it"
        )
        if MEGATRON_OUTSIDE_TABLE[knob] is None:
            pytest.skip(f"{knob}: read by the Megatron engine's step writer inside a running job (GPUs)")
        problem = megatron_outside_problem(knob)
        assert problem is None, problem
    else:
        assert_reaches_a_bridge_field(knob)


def test_the_declarations_name_schema_leaves() -> None:
    named = {*TORCH, *MEGATRON, *NOT_ENGINE_KNOBS, *MODEL_CONFIG_KNOBS}
    named |= {leaf for leaves in FIELD_MAP_GROUP_READS.values() for leaf in leaves}
    assert named - set(LEAVES) == set()
    assert set(FIELD_MAP_GROUP_READS) <= {row.knob for row in FIELD_MAP}


def test_the_torch_models_recompute_selectors_are_the_declared_ones() -> None:
    pytest.importorskip("transformers")
    import torch

    from moe_vlm.engines.torch_model import apply_recompute, build_model

    spec = _spec(("recompute=selective", "recompute.modules=[core_attn,layernorm,moe,mlp]"))
    model = build_model(spec.model, spec.recompute, torch.device("cpu"), seed=0)
    recomputed = apply_recompute(model, spec.recompute)  # asserts its selectors against support.TORCH
    assert any(name.endswith("input_layernorm") for name in recomputed)
