"""Composition outside a Hydra app: the one compose helper.

`compose_config` composes conf/train.yaml through Hydra's config loader; `compose_point` is what
every planner uses (pre-flight, the sweeper, the launcher, the advisor): the same result, in a
fraction of the time; `compose_spec` turns overrides into the RunSpec train.py would build, and
`override_key` / `set_overrides` read and edit override lists the same way everywhere.

Why a fast path: a Hydra composition costs a quarter of a second on a 2-core machine, and a
sweep plan used to compose each point three or four times (pre-flight, the sweeper, the
launcher's check and its render). `compose_point` asks Hydra once per distinct set of
*structural* overrides (group choices, `+`/`~`, values that are lists, dicts or
interpolations, hydra.* settings) and applies the remaining scalar overrides (`mbs=4`,
`parallelism.tp=2`) to the cached result, converting each value through the very OmegaConf node
Hydra's own `OmegaConf.update` would set. Anything it cannot prove equivalent (a key that is not
a typed leaf, a read-only node, a value the node rejects, a scalar under a structural key) goes
to Hydra's compose of the whole point, so errors are Hydra's own. tests/unit/
test_compose_fastpath.py checks the two agree on a corpus of more than 500 points.

Pre-flight of the command line (one line for what does not compose) is moe_vlm/config/preflight.py.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from functools import cached_property
from pathlib import Path
from typing import Any

from hydra import initialize_config_dir
from hydra.core.config_loader import ConfigLoader
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, OverrideType
from hydra.errors import (
    HydraException,
    OverrideParseException,
)
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf, open_dict, read_write
from omegaconf.errors import OmegaConfBaseException
from omegaconf.nodes import AnyNode, ValueNode

from moe_vlm.config.schema import CONF_DIR, TrainConfig
from moe_vlm.config.spec import RunSpec

CONFIG_NAME = "train"
# hydra.* values a planner reads from a point (the launcher: its directory; pre-flight: a preset's axes).
HYDRA_KEYS = ("hydra.sweep.dir", "hydra.sweep.subdir", "hydra.sweeper.params")
# hydra.* keys a point sets after everything else, without a composition of its own: nothing reads
# them while Hydra composes (hydra.searchpath, by contrast, changes which configs exist). Hydra adds
# hydra.mode=MULTIRUN to a sweep's overrides; the launcher adds the sweep directory and subdir.
_LATE_HYDRA_KEYS = frozenset({"hydra.sweep.dir", "hydra.sweep.subdir", "hydra.mode"})
_POINTS_KEPT = 4096  # composed points kept: the launcher's check, render and canary find the sweeper's


# --- Hydra's own composition -------------------------------------------------------------------

_LOADER: list[ConfigLoader] = []


def _loader() -> ConfigLoader:
    """Hydra's config loader for conf/, made once per process.

    The compose API builds a new one for every call; GlobalHydra is left clear afterwards
    because train.py's @hydra.main initialises its own.
    """
    if not _LOADER:
        GlobalHydra.instance().clear()
        try:
            with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
                _LOADER.append(GlobalHydra.instance().config_loader())
        finally:
            GlobalHydra.instance().clear()
    return _LOADER[0]


def compose_config(overrides: Sequence[str], hydra_node: bool = False) -> DictConfig:
    """conf/train.yaml composed by Hydra with these overrides (hydra_node: keep the `hydra` node).

    What `hydra.compose(config_name="train", overrides=...)` returns, through one loader.
    """
    cfg = _loader().load_configuration(
        config_name=CONFIG_NAME, overrides=list(overrides), run_mode=RunMode.RUN, from_shell=False
    )
    if not hydra_node:
        with open_dict(cfg):
            del cfg["hydra"]
    return cfg


def override_key(override: str) -> str:
    """`+a.b=1` -> `a.b`: the key an override sets, adds (+) or deletes (~)."""
    return override.split("=", 1)[0].lstrip("+~")


def quote_override_value(value: str) -> str:
    """A value as one quoted Hydra override string (a path or id stays a string, never a float)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def set_overrides(overrides: list[str], *changes: str) -> list[str]:
    """overrides with each `key=value` of changes replacing the same key and the key's sub-keys."""
    out = list(overrides)
    for change in changes:
        key = override_key(change)
        out = [o for o in out if override_key(o) != key and not override_key(o).startswith(key + ".")]
        out.append(change)
    return out


# --- parsing -------------------------------------------------------------------------------------

_PARSER: list[OverridesParser] = []
_PARSED: dict[str, Override] = {}


def parse_override(text: str) -> Override:
    """Hydra's parse of one override, cached; grammar errors (lexer or parser) and an empty key
    raise OverrideParseException with a one-line reason (`explain` words it)."""
    parsed = _PARSED.get(text)
    if parsed is not None:
        return parsed
    if not _PARSER:
        _PARSER.append(OverridesParser.create())
    try:
        parsed = _PARSER[0].parse_override(text)
    except HydraException as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise OverrideParseException(override=text, message=reason) from None
    if not parsed.key_or_group:
        raise OverrideParseException(override=text, message="no key: expected key=value")
    _PARSED[text] = parsed
    return parsed


_GROUPS: dict[str, bool] = {}


def _is_group(key: str) -> bool:
    """Whether Hydra reads `key=...` as a config group choice (conf/<key>/, or the ConfigStore's)."""
    if key not in _GROUPS:
        _GROUPS[key] = _loader().repository.group_exists(key)  # type: ignore[attr-defined]
    return _GROUPS[key]


# --- the fast path ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Composed:
    """One point as Hydra's compose of `overrides` gives it.

    config: OmegaConf.to_container(task config, resolve=True, enum_to_str=True);
    train: OmegaConf.to_object(task config); hydra: the HYDRA_KEYS values known without a
    composition of the whole point (hydra_value composes it when a key is missing). A point is
    kept and handed to every caller that asks for it again: read it, never modify it.
    """

    overrides: tuple[str, ...]
    config: dict[str, Any]
    train: TrainConfig
    hydra: Mapping[str, Any] = field(default_factory=dict)
    fast: bool = False  # applied to a cached composition; False: Hydra composed this point

    @cached_property
    def spec(self) -> RunSpec:
        return RunSpec.from_config(self.train)

    def hydra_value(self, key: str) -> Any:
        if key in self.hydra:
            return self.hydra[key]
        return _hydra_point(self.overrides).hydra[key]

    @property
    def point_dir(self) -> Path:
        """hydra.sweep.dir / hydra.sweep.subdir: where the launcher runs this point."""
        return Path(
            str(self.hydra_value("hydra.sweep.dir")), str(self.hydra_value("hydra.sweep.subdir"))
        ).absolute()


@dataclass
class _Base:
    """Hydra's composition of one set of structural overrides, and what points derive from it."""

    cfg: DictConfig  # with the hydra node; read only
    task: DictConfig  # without it; set and restored in place by points when config is None
    config: dict[str, Any] | None  # resolved; None when the task config holds interpolations
    train: TrainConfig | None
    hydra: dict[str, Any]


_BASES: dict[tuple[str, ...], _Base] = {}
_POINTS: dict[tuple[str, ...], Composed] = {}  # insertion-ordered: the oldest goes first


def _scalar_candidate(parsed: Override) -> bool:
    """Syntactically a `key=value` with one plain value that Hydra would OmegaConf.update."""
    if parsed.type is not OverrideType.CHANGE or parsed.package is not None or parsed.is_sweep_override():
        return False
    key = parsed.key_or_group
    if key.startswith("hydra") or "/" in key or _is_group(key):
        return False
    value = parsed.value()
    if isinstance(value, str):
        # "${...}" is an interpolation and "???" a missing value: both are Hydra's to set.
        return "${" not in value and value != "???"
    return value is None or isinstance(value, bool | int | float)


def _overlaps(a: str, b: str) -> bool:
    a, b = a.replace("/", "."), b.replace("/", ".")
    return a == b or a.startswith(b + ".") or b.startswith(a + ".")


def _base_key(structural: list[Override]) -> tuple[str, ...]:
    """The cache key of a set of structural overrides: sorted where their order cannot matter
    (pre-flight and the sweeper list the same overrides in different orders).

    Group choices are read into the defaults list, whose order is the config's, and config
    overrides are applied after every group; so the order matters only among `+`/`~` overrides,
    package overrides and config overrides of overlapping keys.
    """
    lines = tuple(o.input_line or "" for o in structural)
    if any(o.type is not OverrideType.CHANGE or o.package is not None for o in structural):
        return lines
    keys = [o.key_or_group for o in structural]
    if len(set(keys)) != len(keys):
        return lines
    values = [k for k in keys if not _is_group(k)]
    if any(_overlaps(a, b) for i, a in enumerate(values) for b in values[i + 1 :]):
        return lines
    return tuple(sorted(lines))


def _node_at(root: DictConfig, key: str) -> Any:
    """The node at a dotted key, through DictConfigs only; None when there is none."""
    node: Any = root
    for part in key.split("."):
        if (
            not isinstance(node, DictConfig)
            or not part.isidentifier()
            or node._is_none()
            or node._is_missing()
        ):
            return None
        if node._is_interpolation():
            return None
        node = node._get_node(part, validate_access=False)
    return node


def _known_hydra(cfg: DictConfig) -> dict[str, Any]:
    """HYDRA_KEYS values that do not depend on interpolations (hydra.sweep.dir does by default)."""
    out: dict[str, Any] = {}
    for key in HYDRA_KEYS:
        node = _node_at(cfg, key)
        if node is None or _holds_interpolation(node):
            continue
        if node._is_none():
            out[key] = None
        elif isinstance(node, DictConfig):
            out[key] = OmegaConf.to_container(node, resolve=True)
        else:
            out[key] = node._value()
    return out


def _holds_interpolation(node: Any) -> bool:
    """An interpolation or a missing value (`???`) anywhere under node."""
    if node._is_interpolation() or node._is_missing():
        return True
    if isinstance(node, ValueNode) or node._is_none():
        return False
    content: Any = node._content  # a dict of nodes (DictConfig) or a list of them (ListConfig)
    children = content.values() if isinstance(node, DictConfig) else content
    return any(_holds_interpolation(child) for child in children)


def _task_of(cfg: DictConfig) -> DictConfig:
    """The config the task function sees: everything but the `hydra` node."""
    task = copy.deepcopy(cfg)
    with read_write(task), open_dict(task):
        task.pop("hydra", None)
    return task


def _plain_task(cfg: DictConfig) -> tuple[dict[str, Any], TrainConfig]:
    """_plain of what the task function sees (cfg without its `hydra` node), read in place: the
    node is set aside for the reading and put back where it was. _task_of's deepcopy of the whole
    composition (Hydra's run_job makes its own after) was a fiftieth of a CPU dry run."""
    content = cfg._content
    assert isinstance(content, dict), "a composition is a dict of nodes"
    kept = list(content.items())
    content.pop("hydra", None)
    try:
        return _plain(cfg)
    finally:
        content.clear()
        content.update(kept)


def _plain(task: DictConfig) -> tuple[dict[str, Any], TrainConfig]:
    config = OmegaConf.to_container(task, resolve=True, enum_to_str=True)
    assert isinstance(config, dict)
    train = OmegaConf.to_object(task)
    assert isinstance(train, TrainConfig), type(train)
    return {str(k): v for k, v in config.items()}, train


def _base(structural: list[Override], overrides: Sequence[str]) -> _Base:
    key = _base_key(structural)
    found = _BASES.get(key)
    if found is None:
        try:
            cfg = compose_config(key, hydra_node=True)
        except Exception:
            # The error a user sees is Hydra's for the overrides as given, in their order.
            compose_config(overrides, hydra_node=True)
            raise
        task = _task_of(cfg)
        config, train = (None, None) if _holds_interpolation(task) else _plain(task)
        found = _BASES[key] = _Base(cfg, task, config, train, _known_hydra(cfg))
    return found


def _leaf(base: _Base, key: str) -> ValueNode | None:
    """The typed leaf `key` names in the base, when setting it is a plain ValueNode._set_value."""
    leaf = _node_at(base.cfg, key)
    if not isinstance(leaf, ValueNode) or leaf._get_flag("readonly"):
        return None
    # DictConfig._set_item_impl sets the value in place only for typed nodes and AnyNode.
    if not (leaf._has_ref_type() or isinstance(leaf, AnyNode)):
        return None
    return leaf


def _converted(
    base: _Base, scalars: list[Override], structural: list[Override]
) -> list[tuple[str, Any]] | None:
    """Each scalar's key and the value its node would hold; None when that is not provable."""
    config_keys = [o.key_or_group for o in structural if not _is_group(o.key_or_group)]
    out = []
    for parsed in scalars:
        key = parsed.key_or_group
        if any(_overlaps(key, other) for other in config_keys):
            return None
        leaf = _leaf(base, key)
        if leaf is None:
            return None
        try:
            out.append((key, leaf.validate_and_convert(parsed.value())))
        except OmegaConfBaseException:
            return None  # Hydra's compose raises the error, worded and keyed as it words it
    return out


def _put(container: Any, path: list[str], value: Any) -> None:
    for part in path[:-1]:
        container = container[part] if isinstance(container, dict) else getattr(container, part)
    if isinstance(container, dict):
        container[path[-1]] = value
    else:
        setattr(container, path[-1], value)


def _copy_tree(value: Any) -> Any:
    """copy.deepcopy for a tree of dicts, lists and dataclasses over immutable leaves, in a
    fraction of its time (every point gets its own objects: nothing is shared between points)."""
    if isinstance(value, dict):
        return {k: _copy_tree(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy_tree(v) for v in value]
    if hasattr(value, "__dataclass_fields__") and not isinstance(value, type):
        new = object.__new__(type(value))
        new.__dict__.update({k: _copy_tree(v) for k, v in value.__dict__.items()})
        return new
    return value


def _remember(key: tuple[str, ...], point: Composed) -> Composed:
    if len(_POINTS) >= _POINTS_KEPT:
        _POINTS.pop(next(iter(_POINTS)))  # the oldest
    _POINTS[key] = point
    return point


def _hydra_point(overrides: tuple[str, ...]) -> Composed:
    """The point as Hydra composes it, whole (what the fast path falls back to)."""
    found = _POINTS.get(overrides)
    if found is None or found.fast:
        cfg = compose_config(overrides, hydra_node=True)
        config, train = _plain_task(cfg)
        hydra: dict[str, Any] = {}
        for name in HYDRA_KEYS:
            try:  # hydra.sweep.subdir reads hydra.job.num, which only a running job has
                value = OmegaConf.select(cfg, name)
            except OmegaConfBaseException:
                continue
            hydra[name] = (
                OmegaConf.to_container(value, resolve=True) if isinstance(value, DictConfig) else value
            )
        found = _remember(overrides, Composed(overrides, config, train, hydra, fast=False))
    return found


def adopt(overrides: Sequence[str], cfg: DictConfig) -> Composed:
    """The point `cfg` is (Hydra's composition of `overrides`, with its hydra node), kept as
    compose_point's for them: a single run's own composition serves its pre-flight
    (config/one_run.py). Reads cfg only: Hydra runs the same object afterwards.

    Only the hydra values that need no resolving are taken (a single run's pre-flight reads
    hydra.sweeper.params); resolving hydra.sweep.dir would import the run records' module through
    its resolver. Marked fast, so asking for another composes the point whole, as for any fast one.
    """
    key = tuple(overrides)
    return _remember(key, Composed(key, *_plain_task(cfg), _known_hydra(cfg), fast=True))


def _late_hydra(parsed: Override) -> bool:
    """hydra.sweep.dir=..., hydra.sweep.subdir=..., hydra.mode=...: set after everything else."""
    if parsed.key_or_group not in _LATE_HYDRA_KEYS or parsed.type is not OverrideType.CHANGE:
        return False
    value = parsed.value()
    return parsed.package is None and isinstance(value, str) and "${" not in value


def compose_point(overrides: Sequence[str]) -> Composed:
    """What Hydra's compose of these overrides gives, composing each set of structural overrides once.

    Raises what Hydra's compose raises (OverrideParseException for grammar errors, with a
    one-line reason), or an OmegaConf error from building the TrainConfig. A point is composed
    once per process: the launcher's overrides (the sweeper's plus hydra.sweep.dir/subdir) find
    the sweeper's.
    """
    key = tuple(overrides)
    parsed = [parse_override(o) for o in key]
    late = [p for p in parsed if _late_hydra(p)]
    own = tuple(o for o, p in zip(key, parsed, strict=True) if not _late_hydra(p))
    found = _POINTS.get(own)
    if found is None:
        found = _remember(own, _compose(own, [p for p in parsed if not _late_hydra(p)]))
    if not late:
        return found
    hydra = dict(found.hydra)
    # Every composition has the same hydra.sweep and hydra.mode nodes.
    root = next(iter(_BASES.values())).cfg if _BASES else _base([], ()).cfg
    for p in late:
        leaf = _node_at(root, p.key_or_group)
        try:
            hydra[p.key_or_group] = leaf.validate_and_convert(p.value())
        except OmegaConfBaseException:
            return _hydra_point(key)
    return replace(found, overrides=key, hydra=hydra)


def _compose(key: tuple[str, ...], parsed: list[Override]) -> Composed:
    scalars = [p for p in parsed if _scalar_candidate(p)]
    structural = [p for p in parsed if not _scalar_candidate(p)]
    base = _base(structural, key)
    converted = _converted(base, scalars, structural)
    if converted is None:
        return _hydra_point(key)
    if base.config is None or base.train is None:
        return Composed(key, *_through_nodes(base, converted), base.hydra, fast=True)
    config = _copy_tree(base.config)
    train = _copy_tree(base.train)
    for name, value in converted:
        path = name.split(".")
        _put(config, path, value.name if isinstance(value, Enum) else value)
        _put(train, path, value)
    return Composed(key, config, train, base.hydra, fast=True)


def _through_nodes(base: _Base, task: list[tuple[str, Any]]) -> tuple[dict[str, Any], TrainConfig]:
    """A base whose task config holds interpolations: set the values on its nodes, resolve, restore
    (an interpolation may read any of them)."""
    saved = []
    try:
        for name, value in task:
            leaf = _node_at(base.task, name)
            saved.append((leaf, leaf._value()))
            leaf._set_value(value)
        return _plain(base.task)
    finally:
        for leaf, value in reversed(saved):
            leaf._set_value(value)


def compose_spec(overrides: list[str]) -> RunSpec:
    """The RunSpec train.py would build from these overrides (moe_vlm/config/preflight.py first, for one
    line naming the key and a fix when user input does not compose)."""
    return compose_point(overrides).spec


def compose_sweep_point(master: DictConfig, overrides: Sequence[str]) -> Composed:
    """A sweep point as Hydra's load_sweep_config(master, overrides) composes it: the sweep's
    hydra overrides (launcher, sweep directory) first, then the point's."""
    return compose_point([*(str(o) for o in master.hydra.overrides.hydra), *overrides])
