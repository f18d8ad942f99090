"""Composition outside a Hydra app: the one compose helper, and pre-flight of the command line.

`compose_config` composes conf/train.yaml through Hydra's compose API; `compose_spec` turns
overrides into the RunSpec train.py would build (the advisor and the tests use it), and
`override_key` / `set_overrides` read and edit override lists the same way everywhere.

Pre-flight: Hydra reports a bad override with a multi-line message and exit status 1. Before
Hydra starts (and before it creates any output directory) we compose the same overrides once;
when that fails we print one line naming the key, the allowed values and a fix, and exit 2.
Sweep overrides (``mbs=1,2,4``) are checked one value at a time, so a bad value anywhere in a
sweep fails before anything is launched.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator, Sequence
from pathlib import Path

import yaml
from hydra import compose, initialize_config_dir
from hydra._internal.utils import get_args_parser
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException, ValidationError

from moe_vlm.errors import BadInput
from moe_vlm.spec import RunSpec

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
CONFIG_NAME = "train"


def compose_config(overrides: Sequence[str], hydra_node: bool = False) -> DictConfig:
    """conf/train.yaml composed with these overrides (hydra_node: keep the `hydra` node)."""
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
            return compose(config_name=CONFIG_NAME, overrides=list(overrides), return_hydra_config=hydra_node)
    finally:
        GlobalHydra.instance().clear()


def override_key(override: str) -> str:
    """`+a.b=1` -> `a.b`: the key an override sets, adds (+) or deletes (~)."""
    return override.split("=", 1)[0].lstrip("+~")


def set_overrides(overrides: list[str], *changes: str) -> list[str]:
    """overrides with each `key=value` of changes replacing the same key and the key's sub-keys."""
    out = list(overrides)
    for change in changes:
        key = override_key(change)
        out = [o for o in out if override_key(o) != key and not override_key(o).startswith(key + ".")]
        out.append(change)
    return out


_GROUPS_CACHE: dict[tuple[str, ...], DictConfig] = {}
_SPEC_CACHE: dict[tuple[str, ...], RunSpec] = {}


def _is_group_choice(override: str) -> bool:
    return (CONF_DIR / override_key(override)).is_dir()


def compose_spec(overrides: list[str], check: bool = False) -> RunSpec:
    """The RunSpec train.py would build from these overrides.

    Group choices (model=, recompute=, ...) are composed by Hydra once per combination; value
    overrides (mbs=4, pp=2, recompute.modules=[...]) are then set on a copy, in order, through
    the same structured config, so type errors still raise. check=True runs preflight first:
    user input that does not compose is one line (BadInput) naming the key and a fix.
    """
    key = tuple(overrides)
    if key not in _SPEC_CACHE:
        if check:
            preflight(list(overrides))
        groups = tuple(o for o in overrides if _is_group_choice(o))
        if groups not in _GROUPS_CACHE:
            _GROUPS_CACHE[groups] = compose_config(groups)
        cfg = copy.deepcopy(_GROUPS_CACHE[groups])
        for override in overrides:
            if not _is_group_choice(override):
                name, value = override.split("=", 1)
                OmegaConf.update(cfg, name.lstrip("+"), yaml.safe_load(value), merge=False)
        _SPEC_CACHE[key] = RunSpec.from_config(cfg)
    return _SPEC_CACHE[key]


def _available_keys(full_key: str, overrides: list[str]) -> list[str]:
    parent = full_key.rsplit(".", 1)[0] if "." in full_key else ""
    cfg = compose_config([o for o in overrides if not override_key(o).startswith(full_key)], hydra_node=True)
    node = OmegaConf.select(cfg, parent) if parent else cfg
    if node is None or not hasattr(node, "keys"):
        return []
    return sorted(str(k) for k in node if k != "hydra")


def _override_values(override: str) -> Iterator[str]:
    """One concrete override per value of a sweep (choice/range); the override itself otherwise."""
    parsed = OverridesParser.create().parse_override(override)
    if not parsed.is_sweep_override():
        yield override
        return
    key = parsed.get_key_element()
    if parsed.is_choice_sweep() or parsed.is_range_sweep():
        for value in parsed.sweep_string_iterator():
            yield f"{key}={value}"
    # Glob sweeps select among existing options and cannot name a missing one.


def explain(exc: Exception, overrides: list[str]) -> str:
    """One line: what is wrong, with which key, what is allowed, how to fix it."""
    if isinstance(exc, MissingConfigException):
        missing = exc.missing_cfg_file or ""
        group, _, option = missing.rpartition("/")
        options = ", ".join(exc.options or []) or "(none)"
        if group:
            return (
                f"{group}={option}: no such option. Allowed: {options}. "
                f"Fix: pick one, e.g. {group}={(exc.options or ['?'])[0]}."
            )
        return f"{missing}: no such config. Fix: check the name."
    if isinstance(exc, OverrideParseException):
        return f"cannot parse override: {str(exc).splitlines()[0]}. Fix: use key=value (quote values with spaces)."
    cause = exc.__cause__ if isinstance(exc, ConfigCompositionException) and exc.__cause__ else exc
    text = f"{exc} {cause}"
    if (
        isinstance(cause, ConfigKeyError)
        or "not in struct" in text
        or re.search(r"Key '[^']+' not in '", text)
    ):
        key = getattr(cause, "full_key", None) or _first_quoted(text)
        try:
            allowed = ", ".join(_available_keys(str(key), overrides))
        except Exception:
            allowed = "see `python train.py --cfg job`"
        return f"{key}: unknown key. Allowed here: {allowed}. Fix: correct the spelling (see --cfg job)."
    if isinstance(cause, ValidationError | OmegaConfBaseException):
        key = getattr(cause, "full_key", None) or _first_quoted(text)
        reason = str(getattr(cause, "msg", cause)).splitlines()[0]
        return f"{key}: {reason}. Fix: give {key} a value of the declared type (see --cfg job)."
    return f"{text.splitlines()[0] if text else type(exc).__name__}. Fix: check the overrides."


def _first_quoted(text: str) -> str:
    match = re.search(r"'([^']+)'", text)
    return match.group(1) if match else "?"


def preflight(argv: list[str]) -> None:
    """Raise BadInput with one line when the command line cannot compose."""
    args, _ = get_args_parser().parse_known_args(argv)
    if args.help or args.hydra_help or args.shell_completion or args.info:
        return
    overrides: list[str] = list(args.overrides or [])
    fixed = [o for o in overrides if not _is_sweep(o)]
    for override in overrides:
        _reject_added_keys(override)
    try:
        base = compose_config(fixed, hydra_node=True)
        swept = [*(o for o in overrides if _is_sweep(o)), *_preset_sweeps(base, overrides)]
        for sweep in swept:
            for concrete in _override_values(sweep):
                compose_config([*fixed, concrete], hydra_node=True)
    except (
        ConfigCompositionException,
        MissingConfigException,
        OverrideParseException,
        OmegaConfBaseException,
    ) as exc:
        raise BadInput(explain(exc, overrides)) from exc


def _preset_sweeps(cfg: DictConfig, overrides: list[str]) -> list[str]:
    """Axes a sweep preset adds (`hydra.sweeper.params`), unless the command line sets that key."""
    params = OmegaConf.select(cfg, "hydra.sweeper.params") or {}
    given = {override_key(o) for o in overrides}
    return [f"{key}={value}" for key, value in params.items() if key not in given]


def _reject_added_keys(override: str) -> None:
    """`+key=value` would add a key no code reads; only config groups and hydra keys may be added."""
    try:
        parsed = OverridesParser.create().parse_override(override)
    except OverrideParseException:
        return  # reported with the other parse errors
    key = parsed.get_key_element().lstrip("+~")
    if not parsed.is_add() or key.startswith("hydra") or (CONF_DIR / key).is_dir():
        return
    raise BadInput(
        f"{key}: unknown key (adding keys with '+' is not supported; every knob is declared in the schema). "
        "Fix: drop the override, or see `python train.py --cfg job` for the keys there are."
    )


def _is_sweep(override: str) -> bool:
    try:
        return OverridesParser.create().parse_override(override).is_sweep_override()
    except OverrideParseException:
        return False
