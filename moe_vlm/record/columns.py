"""The report's column registry: which knobs a report row shows, where each lives in run.json,
and the kind of each column (RunRecord.knob and .setting read them; report and advise show them)."""

from __future__ import annotations

from dataclasses import fields as dataclass_fields
from dataclasses import is_dataclass
from enum import Enum
from typing import get_type_hints

from moe_vlm.config.schema import TrainConfig
from moe_vlm.config.spec import RunSpec
from moe_vlm.record.shape import BOOL, INT, NUMBER, STR, Kind


def _config_groups() -> tuple[str, ...]:
    """The config groups every run chooses: TrainConfig's fields that hold a group's dataclass (model,
    parallelism, ...); not `recipe` or `card`, which are optional (null) and name a set of the others'
    choices."""
    hints = get_type_hints(TrainConfig)
    return tuple(
        f.name
        for f in dataclass_fields(TrainConfig)
        if is_dataclass(hints[f.name]) and f.name not in ("recipe", "card")
    )


GROUPS = _config_groups()
# The field of a group's options that names the chosen one: `name`, except for these groups.
IDENTITY_FIELD = {"parallelism": "family", "data": "kind"}
# Where a RunSpec keeps a group, where its attribute is not the group's name.
SPEC_ATTR = {"vision_freeze": "freeze"}


def identity_field(group: str) -> str:
    return IDENTITY_FIELD.get(group, "name")


def choices(spec: RunSpec) -> dict[str, str]:
    """Each config group's chosen option, as `group=option` on the command line names it."""
    out = {}
    for group in GROUPS:
        value = getattr(getattr(spec, SPEC_ATTR.get(group, group)), identity_field(group))
        out[group] = str(value.value if isinstance(value, Enum) else value)
    return out


def _group(group: str) -> tuple[tuple[str, ...], ...]:
    return (
        ("spec", SPEC_ATTR.get(group, group), identity_field(group)),
        ("config", group, identity_field(group)),
    )


def _layout(key: str) -> tuple[tuple[str, ...], ...]:
    # ("layout", key): a record from before the spec held the layout.
    return (("spec", "layout", key), ("layout", key))


def _top(key: str) -> tuple[tuple[str, ...], ...]:
    return (("spec", key), ("config", key))


# The knobs a report row shows, and where each lives in run.json: the resolved RunSpec first, the
# Hydra config next (a record written without a spec, by a launcher on failure, still has its
# config). The order is the report's column order and the config identity of a saved baseline
# (report --save-baseline): a knob added here changes every identity, so old baselines stop matching.
KNOBS: dict[str, tuple[tuple[str, ...], ...]] = {
    "model": _group("model"),
    "parallelism": _group("parallelism"),
    "nodes": (("spec", "layout", "nodes"), ("config", "nodes")),
    **{key: _layout(key) for key in ("world_size", "tp", "pp", "vp", "cp", "ep", "etp")},
    **{group: _group(group) for group in ("dispatcher", "recompute", "cuda_graph", "vision_freeze", "data")},
    "packing": (("spec", "data", "packing"), ("config", "data", "packing")),
    **{group: _group(group) for group in ("cluster", "router")},
    # The number format (a precision option's `format`; each shipped option is named after it).
    "precision": (("spec", "precision", "format"), ("config", "precision", "format")),
    "engine": (("spec", "engine"), ("engine",)),
    **{key: _top(key) for key in ("mbs", "gbs", "seq_length", "train_iters")},
}
# Top-level settings that, with the groups, rebuild a run's command line (RunRecord.overrides).
REBUILD_KEYS = ("engine", "nodes", "nproc", "mbs", "gbs", "seq_length", "tp", "pp", "vp", "cp", "ep", "etp")


# The kind of each KNOBS value (a report column: one type per column) where it is not a string.
KNOB_KINDS: dict[str, Kind] = {
    **dict.fromkeys(
        (
            "nodes",
            "world_size",
            "tp",
            "pp",
            "vp",
            "cp",
            "ep",
            "etp",
            "mbs",
            "gbs",
            "seq_length",
            "train_iters",
        ),
        INT,
    ),
}
# Settings (RunRecord.setting) the report reads beside the knobs.
SETTING_KINDS: dict[tuple[str, ...], Kind] = {
    ("cluster", "gpu"): STR,
    ("cluster", "gpu_memory_gib"): NUMBER,
    ("router", "force_load_balancing"): BOOL,
}
