"""The sweep's library checks build a point's ConfigContainer from a copy of the recipe built once
per process (moe_vlm/engines/megatron/config.py config_from_base, issue 31): on the fuzzer's
points it is build_config's from-scratch ConfigContainer, every field of it, and the library
checks find the same on both; skipping any one row of THE table on the copy is seen."""

from __future__ import annotations

import dataclasses
import enum
import functools
import random
from pathlib import Path
from typing import Any

import pytest

from moe_vlm.config.spec import RunSpec
from moe_vlm.engines.megatron import config as config_module
from moe_vlm.knobs.bridge_fields import KEEP, bridge_overrides
from moe_vlm.knobs.bridge_recipe import select_recipe
from moe_vlm.rules import errors, validate
from tests.megatron.conftest import needs_stack
from tests.megatron.fuzz_space import assemble, draw, gpus_per_node

SEED = 31
SAMPLE = 12  # points of the fuzzer's space the rules let through, across clusters and models
HF_DIR = "/hf_config/"  # hf_config.hf_model_dir's folder under a build's scratch directory
_LEAF = (str, int, float, bool, type(None), bytes)


def flat(
    obj: Any, path: str = "cfg", out: dict[str, Any] | None = None, above: frozenset[int] = frozenset()
) -> dict[str, Any]:
    """Every value reachable from `obj` by its dotted path: dataclass fields and any other
    attribute, dict entries, list items, HF configs through to_dict, callables by qualified name
    (a partial with its arguments). Two builds of one configuration flatten alike."""
    out = {} if out is None else out
    if isinstance(obj, str) and HF_DIR in obj:
        # The HF config directory each build writes in its own scratch directory (gone after both).
        out[path] = "<scratch>" + obj[obj.index(HF_DIR) :]
        return out
    if isinstance(obj, _LEAF):
        out[path] = obj
        return out
    if id(obj) in above:  # a cycle (a config that points back at its parent)
        out[path] = f"<cycle {type(obj).__name__}>"
        return out
    above = above | {id(obj)}
    if isinstance(obj, enum.Enum):
        out[path] = f"{type(obj).__name__}.{obj.name}"
    elif isinstance(obj, functools.partial):
        out[path] = f"partial {obj.func.__module__}.{obj.func.__qualname__}"
        flat(list(obj.args), f"{path}.args", out, above)
        flat(dict(obj.keywords), f"{path}.keywords", out, above)
    elif isinstance(obj, type) or (callable(obj) and hasattr(obj, "__qualname__")):
        out[path] = f"callable {getattr(obj, '__module__', '')}.{obj.__qualname__}"
    elif isinstance(obj, dict):
        out[path] = f"dict of {len(obj)}"
        for key in sorted(obj, key=repr):
            flat(obj[key], f"{path}[{key!r}]", out, above)
    elif isinstance(obj, list | tuple | set | frozenset):
        items = sorted(obj, key=repr) if isinstance(obj, set | frozenset) else obj
        out[path] = f"{type(obj).__name__} of {len(items)}"
        for index, item in enumerate(items):
            flat(item, f"{path}[{index}]", out, above)
    elif (
        hasattr(obj, "to_dict")
        and type(obj).__name__.endswith("Config")
        and not dataclasses.is_dataclass(obj)
    ):
        out[path] = type(obj).__name__  # a transformers PretrainedConfig
        flat(obj.to_dict(), path + ".to_dict()", out, above)
    elif dataclasses.is_dataclass(obj) or hasattr(obj, "__dict__"):
        out[path] = type(obj).__name__
        names = {f.name for f in dataclasses.fields(obj)} if dataclasses.is_dataclass(obj) else set()
        names |= set(getattr(obj, "__dict__", {}))
        for name in sorted(names):
            flat(getattr(obj, name, "<unset>"), f"{path}.{name}", out, above)
    else:  # torch dtypes and the like: their repr is their value
        out[path] = f"{type(obj).__name__} {obj!r}"
    return out


def differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    return [
        f"{path}: {a.get(path, '<absent>')!r} != {b.get(path, '<absent>')!r}"
        for path in sorted(a.keys() | b.keys())
        if a.get(path, "<absent>") != b.get(path, "<absent>")
    ]


def sample() -> list[RunSpec]:
    """The first SAMPLE points of the fuzzer's space (seeded) that the rules let through with a recipe."""
    rng, per_node = random.Random(SEED), gpus_per_node()
    found: list[RunSpec] = []
    while len(found) < SAMPLE:
        spec = RunSpec.from_config(assemble(draw(rng, per_node)))
        if select_recipe(spec) is not None and not errors(validate(spec)):
            found.append(spec)
    return found


@pytest.fixture(scope="module")
def points() -> list[RunSpec]:
    return sample()


@needs_stack
def test_copy_of_the_base_is_the_from_scratch_config_with_the_same_findings(
    points: list[RunSpec], tmp_path: Path
) -> None:
    from moe_vlm.engines.megatron.library_checks import check_config

    assert len({(s.cluster.name, s.model.name) for s in points}) >= 4, "the sample spans clusters and models"
    for number, spec in enumerate(points):
        scratch = config_module.build_config(spec, tmp_path / str(number)).cfg
        copied = config_module.config_from_base(spec)
        assert differences(flat(scratch), flat(copied)) == [], number
        assert [f.line() for f in check_config(copied, spec)] == [
            f.line() for f in check_config(scratch, spec)
        ]


@needs_stack
def test_a_row_the_copy_skipped_is_seen(points: list[RunSpec], monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparison above is not blind: for every row of THE table that changes the recipe's
    value on a point, a copy that skips that row differs from the full copy at that field."""
    spec = points[0]
    full = flat(config_module.config_from_base(spec))
    rows = [r for r in bridge_overrides(spec) if r.value is not KEEP]
    # A class or named row replaces a whole config object: without it the rows of its fields fail
    # loudly (set_field), which no comparison is needed to see.
    structural = (*config_module.CLASS_ROWS, *config_module.NAMED_ROWS)
    seen = 0
    for skipped in (r for r in rows if r.field not in structural):
        monkeypatch.setattr(
            config_module,
            "bridge_overrides",
            lambda _s, skipped=skipped: [r for r in rows if r is not skipped],
        )
        partial = flat(config_module.config_from_base(spec))
        monkeypatch.undo()
        changes_value = differences(full, partial)
        if changes_value:
            seen += 1
            assert any(skipped.field.split(".")[-1] in line for line in changes_value), (
                skipped.field,
                changes_value[:3],
            )
    assert seen >= 10, f"only {seen} of {len(rows)} rows change the recipe's value on this point"
