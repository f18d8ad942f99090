"""Every knob of the config schema is honoured by each engine, or rejected there by a rule.

A knob an engine silently ignores is how dispatcher.fp8_dispatch and the torch engine's
data.num_workers shipped (fixed by D004 and E010 in 00735de). This test walks every leaf of
moe_vlm.schema.TrainConfig and, per engine, holds it to moe_vlm/knobs/support.py:

- honoured for every value (for Megatron: a Bridge field in bridge_fields.FIELD_MAP that
  changes when the knob does, or the model's transformers config that changes when it does);
- honoured for some values only: a spec setting another value fires an error naming the knob,
  and the same spec with an accepted value does not;
- inert: the knob that switches it on is restricted on that engine;
- ignored, with the reason written down;
- declared nowhere: then it must be rejected as above, against its default;
- or listed in NOT_ENGINE_KNOBS.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from enum import Enum
from functools import cache
from typing import Any

import pytest

from moe_vlm.compose import compose_spec
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
from moe_vlm.schema import Engine
from moe_vlm.spec import RunSpec
from tests.conftest import SCHEMA_LEAVES, knob_override

# Each engine as a spec reaches it (dry_run: the Megatron engine is planned on this CPU machine).
ON = {Engine.torch: ("engine=torch",), Engine.megatron: ("engine=megatron", "dry_run=true")}
# What puts a knob in play: the group choice it belongs to.
IN_PLAY = {"recompute.modules": ("recompute=selective",)}
BRIDGE_HYBRIDEP = ("cluster=b200", "model=qwen3_vl_30b_a3b", "dispatcher=hybridep")
# A set value for each knob whose null means "the recipe's" (the changed value is derived from it).
NULL_KNOB_STARTS = {
    **{
        f"fusion.{name}": "true"
        for name in ("moe_permute_fusion", "moe_router_fusion", "bias_activation_fusion")
    },
    "fusion.cross_entropy": "native",
    "router.dtype": "fp32",
    "router.aux_loss_coeff": "0.001",
    "router.capacity_factor": "1.0",
    "router.pad_to_capacity": "true",
    **{
        f"overlap.{name}": "true"
        for name in ("grad_reduce", "param_gather", "grad_reduce_in_fp32", "tp_comm")
    },
    "overlap.bucket_size": "40000000",
    "cuda_graph.vision": "true",
    "gc.manual": "true",
    "gc.interval": "100",
}
# ... and, for the Bridge fields a knob reaches, what makes those rows read it.
BRIDGE_CONTEXT = {
    **IN_PLAY,
    "cuda_graph.scope": ("cuda_graph=te_moe",),
    # Qwen3-VL-MoE's provider turns sequence parallelism on whenever TP > 1; Qwen3.5's does not.
    "parallelism.sequence_parallel": ("model=qwen35_vl_35b_a3b", "tp=2"),
    # HybridEP's topology on a cluster whose NVLink domain is one node (MNNVL off unless asked).
    **{leaf: BRIDGE_HYBRIDEP for leaf in FIELD_MAP_GROUP_READS["dispatcher"][2:]},
    **{f"data.{name}": ("data=real", "data.path=/nonexistent") for name in ("min_pixels", "max_pixels")},
    "data.path": ("data=real",),
    **{
        f"model.vision_{name}": ("data=real", "data.path=/nonexistent")
        for name in ("patch_size", "spatial_merge_size", "temporal_patch_size")
    },
    "model.hf_model_id": ("data=real", "data.path=/nonexistent"),
    "data.num_workers": ("data.num_workers=2",),  # null resolves from the CPUs here; start from a number
    # null derives USE_MNNVL from the cluster; start from a forced value
    "dispatcher.hybridep_use_mnnvl": (*BRIDGE_HYBRIDEP, "dispatcher.hybridep_use_mnnvl=false"),
    # null keeps the recipe's value; start from a set one (the fusion, router, overlap and gc knobs).
    **{knob: (f"{knob}={value}",) for knob, value in NULL_KNOB_STARTS.items()},
    **{
        f"cuda_graph.{name}": ("cuda_graph.vision=true",)
        for name in ("vision_scope", "vision_max_seq_length")
    },
    # The window and ranks reach Bridge while a profiler runs; a tracker's fields while it is on.
    **{f"profiling.{name}": ("profiling=torch",) for name in ("steps", "ranks")},
    **{f"logger.{name}": ("logger=wandb",) for name in ("project", "run_name", "entity")},
    "logger.tracking_uri": ("logger=mlflow",),
}
# Values to try on list knobs (a list's "other value" is not implied by its type).
REJECT_WITH: dict[str, list[Any]] = {
    "recompute.modules": [[name] for name in SELECTIVE_RECOMPUTE_MODULES],
    "cuda_graph.scope": [[scope] for scope in CUDA_GRAPH_SCOPES],
    # Float knobs: a value the engine would otherwise have to honour.
    "router.aux_loss_coeff": [0.01],
    "router.capacity_factor": [1.0],
    "offload.optimizer_fraction": [0.5],
}


LEAVES = SCHEMA_LEAVES


def _base_type(kind: Any) -> Any:
    """int | None -> int; list[str] -> list."""
    if isinstance(kind, types.UnionType):
        kind = next(arg for arg in typing.get_args(kind) if arg is not type(None))
    return typing.get_origin(kind) or kind


_override = knob_override


@cache
def _spec(overrides: tuple[str, ...]) -> RunSpec:
    return compose_spec(list(overrides))


def _value(spec: RunSpec, knob: str) -> Any:
    if knob in SHORTCUTS.values():
        return getattr(spec.layout, knob)
    group, _, name = knob.rpartition(".")
    node: Any = spec.freeze if group == "vision_freeze" else getattr(spec, group) if group else spec
    return getattr(node, name)


def _other_values(knob: str, current: Any, accepted: tuple[Any, ...] | None) -> list[Any]:
    """Values of the knob's type that are neither `current` nor accepted."""
    kind = _base_type(LEAVES[knob])
    if knob in REJECT_WITH:
        candidates: list[Any] = REJECT_WITH[knob]
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
    current = _value(_spec(context), knob)
    assert accepted is None or Honoured("", accepted).accepts(current), f"{knob}: the default is not accepted"
    assert not _rejections(context, knob), f"{knob}={current}: rejected on {engine.value} as configured"
    others = _other_values(knob, current, accepted)
    assert others, f"{knob}: no value to try"
    probe = (*context, _override(knob, others[0]))
    assert _rejections(probe, knob), (
        f"{knob} is silently ignored by the {engine.value} engine: `{' '.join(probe)}` validates. "
        "Honour it (knobs/support.py, bridge_fields.FIELD_MAP) or reject it with a rule."
    )


def _changed(value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, Enum):
        return next(member for member in type(value) if member != value)
    if isinstance(value, int | float):
        return value * 2 + 1  # past any rounding (synthetic num_images is a rounded mean)
    if isinstance(value, list):
        return value[:-1] if value else [1]
    return f"{value}_changed"


def _rows(knob: str) -> list[Any]:
    names = {knob, SHORTCUTS.get(knob, knob)}
    names |= {group for group, leaves in FIELD_MAP_GROUP_READS.items() if knob in leaves}
    return [row for row in FIELD_MAP if row.knob in names]


def assert_reaches_a_bridge_field(knob: str) -> None:
    context = (*ON[Engine.megatron], *BRIDGE_CONTEXT.get(knob, ()))
    spec = _spec(context)
    changed = _spec((*context, _override(knob, _changed(_value(spec, knob)))))
    rows = _rows(knob)
    assert any(row.value(spec) != row.value(changed) for row in rows), (
        f"{knob}: no FIELD_MAP row named for it ({[r.field for r in rows]}) changes when it does"
    )


def _hf_config(model: Any) -> dict[str, Any]:
    from moe_vlm.engines.hf_config import transformers_config

    return dict(transformers_config(model).to_dict())


def assert_reaches_the_model_config(knob: str) -> None:
    name = knob.removeprefix("model.")
    models = [_spec(("model=tiny_moe_vlm",)).model, _spec(("model=qwen35_vl_35b_a3b",)).model]
    changed = [dataclasses.replace(m, **{name: _changed(getattr(m, name))}) for m in models]
    assert any(_hf_config(m) != _hf_config(c) for m, c in zip(models, changed, strict=True)), (
        f"{knob}: the transformers config is the same whatever its value"
    )


CASES = [(engine, knob) for knob in LEAVES for engine in (Engine.torch, Engine.megatron)]


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
    elif knob in MODEL_CONFIG_KNOBS:
        assert_reaches_the_model_config(knob)
    elif engine is Engine.megatron and _rows(knob):
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
