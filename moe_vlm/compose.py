"""Pre-flight composition: turn Hydra's composition errors into one actionable line.

Hydra reports a bad override with a multi-line message and exit status 1. Before Hydra
starts (and before it creates any output directory) we compose the same overrides once
through Hydra's own compose API; when that fails we print one line naming the key, the
allowed values and a fix, and exit 2. Sweep overrides (``mbs=1,2,4``) are checked one
value at a time, so a bad value anywhere in a sweep fails before anything is launched.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra._internal.utils import get_args_parser
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException, ValidationError

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
CONFIG_NAME = "train"


class BadInput(Exception):
    """A user error, reported as a single line with exit status 2."""


def _available_keys(full_key: str, overrides: list[str]) -> list[str]:
    parent = full_key.rsplit(".", 1)[0] if "." in full_key else ""
    cfg = _compose(overrides=[o for o in overrides if not o.split("=")[0].lstrip("+~").startswith(full_key)])
    node = OmegaConf.select(cfg, parent) if parent else cfg
    if node is None or not hasattr(node, "keys"):
        return []
    return sorted(str(k) for k in node if k != "hydra")


def _compose(overrides: list[str]) -> DictConfig:
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return compose(config_name=CONFIG_NAME, overrides=overrides, return_hydra_config=True)


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
        base = _compose(fixed)
        swept = [*(o for o in overrides if _is_sweep(o)), *_preset_sweeps(base, overrides)]
        for sweep in swept:
            for concrete in _override_values(sweep):
                _compose([*fixed, concrete])
    except (
        ConfigCompositionException,
        MissingConfigException,
        OverrideParseException,
        OmegaConfBaseException,
    ) as exc:
        raise BadInput(explain(exc, overrides)) from exc
    finally:
        GlobalHydra.instance().clear()


def _preset_sweeps(cfg: DictConfig, overrides: list[str]) -> list[str]:
    """Axes a sweep preset adds (`hydra.sweeper.params`), unless the command line sets that key."""
    params = OmegaConf.select(cfg, "hydra.sweeper.params") or {}
    given = {o.split("=", 1)[0].lstrip("+~") for o in overrides}
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
