"""Pre-flight: one line for what does not compose.

Pre-flight: Hydra reports a bad override with a multi-line message and exit status 1. Before
Hydra starts (and before it creates any output directory) we compose the same overrides once;
when that fails we print one line naming the key, the allowed values and a fix, and exit 2.
Sweep overrides (``mbs=1,2,4``) are checked one value at a time, so a bad value anywhere in a
sweep fails before anything is launched.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import yaml
from hydra._internal.utils import get_args_parser
from hydra.errors import (
    ConfigCompositionException,
    HydraException,
    MissingConfigException,
    OverrideParseException,
)
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException, ValidationError
from omegaconf.nodes import AnyNode, EnumNode, StringNode

from moe_vlm.base.errors import BadInput
from moe_vlm.base.safety import check_credentials, check_override_text
from moe_vlm.config.compose import (
    CONF_DIR,
    Composed,
    _base,
    _is_group,
    _loader,
    _node_at,
    adopt,
    compose_config,
    compose_point,
    override_key,
    parse_override,
)
from moe_vlm.config.names import ascii_fold, closest, lookalike_error, meant
from moe_vlm.config.schema import DryRun, dry_run_mode

# --- pre-flight: one line for what does not compose ------------------------------------------------


def _available_keys(full_key: str, overrides: list[str]) -> list[str]:
    parent = full_key.rsplit(".", 1)[0] if "." in full_key else ""
    cfg = compose_config([o for o in overrides if not override_key(o).startswith(full_key)], hydra_node=True)
    node = OmegaConf.select(cfg, parent) if parent else cfg
    if node is None or not hasattr(node, "keys"):
        return []
    return sorted(str(k) for k in node if k != "hydra")


def _override_values(override: str) -> Iterator[str]:
    """One concrete override per value of a sweep (choice/range); the override itself otherwise."""
    parsed = parse_override(override)
    if not parsed.is_sweep_override():
        yield override
        return
    key = parsed.get_key_element()
    if parsed.is_choice_sweep() or parsed.is_range_sweep():
        for value in parsed.sweep_string_iterator():
            yield f"{key}={value}"
    # Glob sweeps select among existing options and cannot name a missing one.


GRAMMAR_FIX = (
    "Fix: write key=value; close brackets and quotes ([a,b], 'a b'); a sweep is key=a,b without empty "
    "values; quote a value holding spaces or any of ()[]{},='\"."
)


def _grammar_reason(message: str) -> str:
    """ANTLR's first line without its list of expected tokens."""
    reason = re.sub(r" expecting (\{[^}]*\}|\S+)", "", message.splitlines()[0] if message else "").strip()
    return (
        reason.replace("mismatched input '<EOF>'", "the override ends too early")
        or "not Hydra's override grammar"
    )


def explain(exc: Exception, overrides: list[str]) -> str:
    """One line: what is wrong, with which key, what is allowed, how to fix it."""
    if isinstance(exc, MissingConfigException):
        missing = exc.missing_cfg_file or ""
        group, _, option = missing.rpartition("/")
        options = ", ".join(exc.options or []) or "(none)"
        if group == "recipe":  # 36 long names: the closest few say more than all of them
            near = ", ".join(closest(option, exc.options or []))
            return (
                f"recipe={option}: no such Bridge perf recipe. Closest: {near}. Fix: recipe=<one of them>; "
                f"`moe-vlm recipes` lists all {len(exc.options or [])}."
            )
        if group:
            return f"{group}={option}: no such option. Allowed: {options}. {_pick(group, option, exc.options or [])}"
        return f"{missing}: no such config. Fix: check the name."
    if isinstance(exc, OverrideParseException):
        return f"{exc.override!r}: cannot parse this override ({_grammar_reason(exc.message)}). {GRAMMAR_FIX}"
    if isinstance(exc, ValueError) and "Config group override must be" in str(exc):
        return _not_an_option(overrides) or f"{exc}. Fix: check the overrides."
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
    return f"{' '.join(text.split()) if text.strip() else type(exc).__name__}. Fix: check the overrides."


def _not_an_option(overrides: list[str]) -> str | None:
    """A group choice that is not an option name (`model=1`): Hydra's ValueError names neither."""
    for override in overrides:
        parsed = parse_override(override)
        if _is_group(parsed.key_or_group) and not isinstance(parsed.value(), str | list):
            group = parsed.key_or_group
            options = _loader().repository.get_group_options(group)  # type: ignore[attr-defined]
            return (
                f"{override}: {group} is a config group and takes an option name. Allowed: "
                f"{', '.join(options)}. {_pick(group, str(parsed.value()), options)}"
            )
    return None


def _pick(group: str, typed: str, options: Sequence[str]) -> str:
    """The fix for a group option that does not exist: the option it looks like or is closest to
    (hybrIdep -> hybridep), else any one of them."""
    near = meant(typed, options)
    if near is not None:
        return f"Fix: {group}={near} (the option {typed!r} resembles)."
    return f"Fix: pick one, e.g. {group}={options[0] if options else '?'}."


def _first_quoted(text: str) -> str:
    match = re.search(r"'([^']+)'", text)
    return match.group(1) if match else "?"


# What composing a command line can raise: Hydra's and OmegaConf's errors, and the ValueError
# Hydra's defaults list raises for a group override it cannot read.
COMPOSE_ERRORS = (HydraException, OmegaConfBaseException, ValueError)


def preflight(argv: list[str], run_config: Callable[[], DictConfig] | None = None) -> None:
    """Raise BadInput with one line when the command line cannot compose or holds a credential.

    Credentials are refused first, as typed (before any message could echo one), then in each
    composed point (a config file or an interpolation can put one there): Hydra saves the
    overrides and the config in .hydra/ as soon as it starts.

    run_config: the single run's own composition of the command line's overrides (with its hydra
    node; config/one_run.py), checked as the point instead of composing it again.
    """
    args, _ = get_args_parser().parse_known_args(argv)
    overrides: list[str] = list(args.overrides or [])
    for override in overrides:
        _check_override_credentials(override)
    if args.help or args.hydra_help or args.shell_completion or args.info:
        return
    try:
        for override in overrides:
            _check_names(override)
            _reject_added_keys(override)
            _reject_read_only(override)
            if not args.multirun:
                _reject_sweep_only(override)
        fixed = [o for o in overrides if not parse_override(o).is_sweep_override()]
        base = compose_point(fixed) if run_config is None else adopt(fixed, run_config())
        _check_point(base)
        swept = [
            *(o for o in overrides if parse_override(o).is_sweep_override()),
            *_preset_sweeps(base.hydra_value("hydra.sweeper.params"), overrides),
        ]
        for sweep in swept:
            for concrete in _override_values(sweep):
                _check_point(compose_point([*fixed, concrete]))
    except COMPOSE_ERRORS as exc:
        raise BadInput(explain(exc, overrides)) from exc


def _check_override_credentials(override: str) -> None:
    """The override as typed, then its parsed value (`hydra.job.env_set={HF_TOKEN:...}`)."""
    check_override_text(override)
    try:
        parsed = parse_override(override)
    except OverrideParseException:
        return  # pre-flight words the grammar error; the text check above has run
    if not parsed.is_sweep_override():
        check_credentials(parsed.value(), parsed.get_key_element().lstrip("+~"))


def _dotted_keys(tree: Mapping[str, Any], prefix: str = "") -> Iterator[str]:
    for name, value in tree.items():
        yield prefix + name
        if isinstance(value, Mapping):
            yield from _dotted_keys(value, f"{prefix}{name}.")


def _check_names(override: str) -> None:
    """A key, group option or enum value typed with a non-ASCII look-alike: one line naming the
    character and what it resembles (moe_vlm/config/names.py); free text may hold any character, quoted."""
    if override.isascii():
        return
    typed_key, _, value = override.partition("=")
    key = typed_key.lstrip("+~")
    problem: str | None
    if not key.isascii():
        groups = [p.name for p in CONF_DIR.iterdir() if p.is_dir()] + ["hydra/launcher"]
        known = sorted({*groups, *_dotted_keys(compose_point([]).config)})
        problem = lookalike_error(typed_key, key, known, typed_key.replace(key, "{}") + f"={value}", "key")
    elif _is_group(key):
        options = _loader().repository.get_group_options(key)  # type: ignore[attr-defined]
        items = [item.strip("'\"") for item in value.split(",")]
        problem = next(
            (e for item in items if (e := lookalike_error(f"{key}={item}", item, options, f"{key}={{}}"))),
            None,
        )
    else:
        node = _node_at(_base([], ()).cfg, key)
        text = value.strip("'\"")
        if isinstance(node, StringNode | AnyNode) or node is None:
            try:
                parse_override(override)
                return  # quoted free text: any character is fine
            except OverrideParseException:
                problem = _text_lookalike(key, text)
        else:
            names = [m.name for m in node._metadata.ref_type] if isinstance(node, EnumNode) else []
            folded = ascii_fold(text)
            problem = lookalike_error(f"{key}={text}", text, names or [folded], f"{key}={{}}", "value")
    if problem:
        raise BadInput(problem)


# Keys typed as text (or Any) whose values are nevertheless a closed set (the launcher's executor:
# moe_vlm/launch/slurm.py refuses any other).
LAUNCHER_EXECUTORS = ("slurm", "local")
TEXT_CHOICES: dict[str, tuple[str, ...]] = {
    "dry_run": tuple(mode.value for mode in DryRun),
    "hydra.launcher.executor": LAUNCHER_EXECUTORS,
}


def _text_lookalike(key: str, text: str) -> str:
    """Unquoted non-ASCII in a text value: the value it resembles where the key's values are a closed
    set or the characters are look-alikes of ASCII ones; else quoting is the fix (free text)."""
    folded = ascii_fold(text)
    choices = TEXT_CHOICES.get(key)
    if choices is not None or (folded.isascii() and folded != text):
        found = lookalike_error(f"{key}={text}", text, choices or [folded], f"{key}={{}}", "value")
        if found is not None:
            return (
                found
                if choices is not None
                else f"{found[:-1]}, or quote it if the text is meant: {key}='{text}'."
            )
    return f"{key}: {text!r} holds non-ASCII characters; free text must be quoted. Fix: {key}='{text}'."


def _check_point(point: Composed) -> None:
    dry_run_mode(point.train.dry_run)
    load = point.train.router.assumed_load
    if load is not None and not 1.0 <= load < math.inf:
        # max / mean tokens per expert: the fullest expert holds at least the mean.
        raise BadInput(
            f"router.assumed_load={load:g}: not a routing load, which is >= 1 (the fullest expert's tokens "
            "over the mean). Fix: a value >= 1 such as a run's run.json router.load_factor (1.0 = balanced), "
            "or null (not modelled)."
        )
    check_credentials(point.config)
    recipe, card = point.train.recipe.name, point.train.card.row
    if recipe != "none" and card != "none":
        # Each sets every knob of one published configuration (train.yaml's defaults list: card
        # after recipe), so together the card's would silently replace the recipe's.
        raise BadInput(
            f"recipe={recipe} and card={card} exclude each other: each reproduces one published "
            "configuration, every knob of it. Fix: drop one; change a knob of the other on the command "
            "line (mbs=2), and the plan lists it as a difference."
        )


# The groups whose options publish facts (a card row's figure, a Bridge recipe's knobs): their
# fields are set by the option, never typed, so a plan and a report never show an edited figure as
# the published one.
READ_ONLY = {
    "card": "conf/card/<row>.yaml, from the card it names",
    "recipe": "conf/recipe/<name>.yaml, generated from Bridge",
}


def _reject_read_only(override: str) -> None:
    key = override_key(override).lstrip("+~")
    group, dot, _ = key.partition(".")
    if dot and group in READ_ONLY:
        raise BadInput(
            f"{key}: a published fact, read-only (its source: {READ_ONLY[group]}). Fix: drop it; to run "
            f"otherwise, override the knob itself (mbs=2): the plan lists each difference from the {group}."
        )


def _reject_sweep_only(override: str) -> None:
    """The planning sweeper's settings (search, halving, predict_keep, force, params) act only in a
    sweep: without -m Hydra runs one point and would ignore them silently."""
    key = override_key(override).lstrip("+~")
    if key.startswith("hydra.sweeper."):
        raise BadInput(
            f"{key}: a sweep setting, and this command runs one point (no -m), so it would be ignored. "
            "Fix: add -m (python train.py -m ...) to sweep, or drop it."
        )


def null_default_groups() -> frozenset[str]:
    """Config groups whose default in conf/train.yaml is null (no option chosen)."""
    defaults = yaml.safe_load((CONF_DIR / "train.yaml").read_text())["defaults"]
    return frozenset(
        str(group)
        for entry in defaults
        if isinstance(entry, dict)
        for group, option in entry.items()
        if option is None
    )


def accept_null(argv: list[str]) -> list[str]:
    """`group=null` for a group whose default is null, as Hydra's `~group` (its own spelling of no
    option, which it accepts there): the documented default, typed, is accepted."""
    groups = null_default_groups()
    out = []
    for arg in argv:
        key, eq, value = arg.partition("=")
        out.append(f"~{key}" if eq and key in groups and value.strip() in ("null", "None", "~") else arg)
    return out


def _preset_sweeps(params: Mapping[str, Any] | None, overrides: list[str]) -> list[str]:
    """Axes a sweep preset adds (`hydra.sweeper.params`), unless the command line sets that key."""
    given = {override_key(o) for o in overrides}
    return [f"{key}={value}" for key, value in (params or {}).items() if key not in given]


def _reject_added_keys(override: str) -> None:
    """`+key=value` would add a key no code reads; only config groups and hydra keys may be added."""
    parsed = parse_override(override)
    key = parsed.get_key_element().lstrip("+~")
    if not parsed.is_add() or key.startswith("hydra") or (CONF_DIR / key).is_dir():
        return
    raise BadInput(
        f"{key}: unknown key (adding keys with '+' is not supported; every knob is declared in the schema). "
        "Fix: drop the override, or see `python train.py --cfg job` for the keys there are."
    )
