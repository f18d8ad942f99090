"""`python train.py --help`: the groups and their options, the run keys, the presets, the commands.

conf/hydra/help/moe_vlm.yaml is Hydra's help template; its `${moe_vlm_help:PART}` interpolations
are rendered here from conf/ itself (the group directories, conf/train.yaml's defaults list, the
sweep presets), from the schema (the top-level keys: schema.knob's defaults and help) and from
`moe-vlm`'s own table of commands, so the help never drifts from what a command line can name.
"""

from __future__ import annotations

import dataclasses
import string
import textwrap
from enum import Enum
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf

from moe_vlm.cli.commands import SUBCOMMANDS
from moe_vlm.config.compose import CONF_DIR
from moe_vlm.config.schema import TrainConfig

WIDTH = 100
RESOLVER = "moe_vlm_help"
# Groups the help shows in their own section (presets) or not at all (Hydra's own).
_NOT_GROUPS = ("hydra", "sweep")
# Groups with too many options for one help line: where their list lives instead.
_LISTED_BY = {"recipe": "moe-vlm recipes"}


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
        if group in _LISTED_BY:
            lines.append(f"  {group:<14}{len(options)} options, listed by `{_LISTED_BY[group]}`")
            continue
        lines.append(_wrapped(f"  {group:<14}", ", ".join(options)))
    return "\n".join(lines)


def _shown(value: Any) -> str:
    """A default as a command line writes it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value.value if isinstance(value, Enum) else value)


def keys() -> str:
    """The top-level keys with their defaults and help, from the schema (schema.knob): consecutive
    keys with the same help share a line (the tp ... etp shortcuts)."""
    rows: list[tuple[list[str], str]] = []
    for f in dataclasses.fields(TrainConfig):
        if "help" not in f.metadata:
            continue  # a config group
        shown = f"{f.name}={_shown(f.default)}"
        if rows and rows[-1][1] == f.metadata["help"]:
            rows[-1][0].append(shown)
        else:
            rows.append(([shown], f.metadata["help"]))
    width = min(max(len(" ".join(left)) for left, _ in rows), 20)
    return "\n".join(_wrapped(f"  {' '.join(left):<{width}}  ", comment) for left, comment in rows)


FIRST_KNOBS_TITLE = "Keys inside groups, and of -m's sweeper and launcher, reached for first (KEY=EXAMPLE)"
# Keys inside the groups and Hydra's sweeper and launcher a user reaches for first: the key, a value
# to show, what it does. tests/unit/test_help.py checks that each composes (the task's keys) or is a
# field of the sweeper's or the launcher's config (moe_vlm_sweeper/config.py, launch/settings.py).
FIRST_KNOBS: tuple[tuple[str, str, str], ...] = (
    ("data.packing", "in_batch", "one unpadded row per micro-batch (default none: pad each sample)"),
    ("data.path", "DIR", "data=real: an Energon WebDataset (scripts/build_dataset.py)"),
    ("parallelism.dp_outer", "2", "HSDP: DP replicas outside the sharding group (default 1)"),
    ("cuda_graph.vision", "true", "CUDA graphs for the vision encoder too (default: the recipe's)"),
    ("vision_freeze.language", "true", "freeze the decoder too"),
    ("hydra.sweeper.search", "halving", "-m: successive halving, losers stop early (default grid)"),
    ("hydra.sweeper.predict_keep", "0.25", "-m: keep the predicted-fastest quarter of the valid points"),
    ("hydra.sweeper.force", "true", "-m: rerun points already completed (default: skip them, resume)"),
    ("hydra.launcher.points_per_job", "4", "Slurm: up to 4 points with the same resources in one job"),
    ("hydra.launcher.timeout_min", "60", "Slurm: each point's time limit in minutes"),
    ("hydra.launcher.canary", "false", "Slurm: no canary job before the points"),
)


def first_knobs() -> str:
    left = [f"{key}={value}" for key, value, _ in FIRST_KNOBS]
    width = max(len(text) for text in left)
    return "\n".join(
        _wrapped(f"  {text:<{width}}  ", comment)
        for text, (_, _, comment) in zip(left, FIRST_KNOBS, strict=True)
    )


def presets(conf: Path = CONF_DIR) -> str:
    return _wrapped("  ", ", ".join(_options("sweep", conf)))


def launchers(conf: Path = CONF_DIR) -> str:
    return _wrapped("  ", ", ".join(_options("hydra/launcher", conf)))


def commands() -> str:
    return "\n".join(f"  moe-vlm {name:<8} {summary}" for name, (_, summary) in SUBCOMMANDS.items())


def _wrapped(head: str, text: str) -> str:
    return textwrap.fill(text, WIDTH, initial_indent=head, subsequent_indent=" " * len(head))


_PARTS = {
    "groups": groups,
    "keys": keys,
    "knobs": first_knobs,
    "presets": presets,
    "launchers": launchers,
    "commands": commands,
}


def render(part: str) -> str:
    """One part of the help; `$` doubled because Hydra fills the template with string.Template."""
    if part not in _PARTS:
        raise ValueError(f"${{{RESOLVER}:{part}}}: no such part; parts: {', '.join(_PARTS)}")
    return _PARTS[part]().replace("$", "$$")


def register_resolver() -> None:
    OmegaConf.register_new_resolver(RESOLVER, render, replace=True)


# Hydra's own flags that print something else than the app's help: Hydra handles them.
_HYDRA_FLAGS = ("--hydra-help", "--cfg", "-c", "--info", "-i", "--shell-completion", "-sc", "--version")


def wants_help(argv: list[str]) -> bool:
    """`train.py --help` (or -h), with nothing that changes what Hydra would print: the help does not
    depend on the overrides, and a command that overrides the help template is Hydra's."""
    return (
        any(a in ("--help", "-h") for a in argv)
        and not any(a.split("=", 1)[0] in _HYDRA_FLAGS for a in argv)
        and not any(a.lstrip("+~").startswith(("hydra/help", "hydra.help")) for a in argv)
    )


def full(conf: Path = CONF_DIR) -> str:
    """What Hydra's `--help` prints from conf/hydra/help/moe_vlm.yaml, without composing the config:
    Hydra's help first lists the options of every config group, Hydra's included (seconds with our
    36 recipes), for the $APP_CONFIG_GROUPS our template does not use."""
    register_resolver()
    help_cfg = OmegaConf.create({"hydra": {"help": OmegaConf.load(conf / "hydra" / "help" / "moe_vlm.yaml")}})
    # Hydra's get_help: the resolved template through string.Template ($$ -> $), printed.
    return string.Template(str(help_cfg.hydra.help.template)).safe_substitute().rstrip("\n")
