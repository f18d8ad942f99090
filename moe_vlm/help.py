"""`python train.py --help`: the groups and their options, the run keys, the presets, the commands.

conf/hydra/help/moe_vlm.yaml is Hydra's help template; its `${moe_vlm_help:PART}` interpolations
are rendered here from conf/ itself (the group directories, conf/train.yaml's defaults list and
the comments beside its keys, the sweep presets) and from `moe-vlm`'s own table of commands, so
the help never drifts from what a command line can name.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import yaml
from omegaconf import OmegaConf

from moe_vlm.cli import SUBCOMMANDS
from moe_vlm.compose import CONF_DIR

WIDTH = 100
RESOLVER = "moe_vlm_help"
# Groups the help shows in their own section (presets) or not at all (Hydra's own).
_NOT_GROUPS = ("hydra", "sweep")
# `key: value   # comment` at the top level of conf/train.yaml.
_KEY_LINE = re.compile(r"^([a-z_]+):\s*(\S+)\s*#\s*(.+)$")
_PLAIN_KEY = re.compile(r"^([a-z_]+):\s*(\S+)\s*$")


def _options(group: str, conf: Path = CONF_DIR) -> list[str]:
    return sorted(p.stem for p in (conf / group).glob("*.yaml"))


def _train_yaml(conf: Path) -> str:
    return (conf / "train.yaml").read_text()


def _defaults(conf: Path) -> dict[str, str | None]:
    """conf/train.yaml's defaults list: group -> default option."""
    found: dict[str, str | None] = {}
    for entry in yaml.safe_load(_train_yaml(conf)).get("defaults", []):
        if isinstance(entry, dict):
            for key, value in entry.items():
                found[str(key)] = None if value is None else str(value)
    return found


def groups(conf: Path = CONF_DIR) -> str:
    """One line per config group: its options, the default marked with *."""
    defaults = _defaults(conf)
    lines = []
    for group in sorted(p.name for p in conf.iterdir() if p.is_dir() and p.name not in _NOT_GROUPS):
        options = [f"*{o}" if o == defaults.get(group) else o for o in _options(group, conf)]
        lines.append(_wrapped(f"  {group:<14}", ", ".join(options)))
    return "\n".join(lines)


def keys(conf: Path = CONF_DIR) -> str:
    """The top-level keys with their defaults, described by the comments in conf/train.yaml: the one
    beside a key, or the one above a block of keys that have none (the tp ... etp shortcuts)."""
    rows: list[tuple[str, str]] = []
    block: list[str] = []  # consecutive keys without a comment of their own
    note = ""  # the comment line above them

    def flush() -> None:
        if block:
            rows.append((" ".join(block), note))
            block.clear()

    for line in _train_yaml(conf).split("\nhydra:", 1)[0].splitlines():
        if line.startswith((" ", "\t")):
            continue  # inside the defaults list
        if commented := _KEY_LINE.match(line):
            flush()
            rows.append((f"{commented.group(1)}={commented.group(2)}", commented.group(3).strip()))
            note = ""
        elif plain := _PLAIN_KEY.match(line):
            block.append(f"{plain.group(1)}={plain.group(2)}")
        else:
            flush()
            note = line.lstrip("#").strip() if line.startswith("#") else ""
    flush()
    width = min(max(len(left) for left, _ in rows), 20)
    return "\n".join(
        _wrapped(f"  {left:<{width}}  ", comment) if comment else f"  {left}" for left, comment in rows
    )


def presets(conf: Path = CONF_DIR) -> str:
    return _wrapped("  ", ", ".join(_options("sweep", conf)))


def launchers(conf: Path = CONF_DIR) -> str:
    return _wrapped("  ", ", ".join(_options("hydra/launcher", conf)))


def commands() -> str:
    return "\n".join(f"  moe-vlm {name:<8} {summary}" for name, (_, summary) in SUBCOMMANDS.items())


def _wrapped(head: str, text: str) -> str:
    return textwrap.fill(text, WIDTH, initial_indent=head, subsequent_indent=" " * len(head))


_PARTS = {"groups": groups, "keys": keys, "presets": presets, "launchers": launchers, "commands": commands}


def render(part: str) -> str:
    """One part of the help; `$` doubled because Hydra fills the template with string.Template."""
    if part not in _PARTS:
        raise ValueError(f"${{{RESOLVER}:{part}}}: no such part; parts: {', '.join(_PARTS)}")
    return _PARTS[part]().replace("$", "$$")


def register_resolver() -> None:
    OmegaConf.register_new_resolver(RESOLVER, render, replace=True)
