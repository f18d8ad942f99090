"""`python train.py --help` and `moe-vlm COMMAND --help`: exit 0, the arguments, an example."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from omegaconf import MISSING

from moe_vlm.cli import train_help
from moe_vlm.cli.main import SUBCOMMANDS
from moe_vlm.cli.main import main as moe_vlm
from moe_vlm.config.compose import CONF_DIR
from moe_vlm.config.schema import TrainConfig
from tests.conftest import REPO


def test_train_help_shows_groups_keys_presets_and_commands(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "train.py"), "--help"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert "Powered by Hydra" not in text and len(text.splitlines()) < 80
    for group in (p for p in CONF_DIR.iterdir() if p.is_dir() and p.name not in ("hydra", "sweep")):
        line = next(line for line in text.splitlines() if line.strip().startswith(group.name + " "))
        if group.name in train_help._LISTED_BY:  # too many for one line: counted, and where they are listed
            assert (
                f"{len(list(group.glob('*.yaml')))} options" in line
                and train_help._LISTED_BY[group.name] in line
            )
            continue
        for option in group.glob("*.yaml"):
            assert option.stem in line.replace("*", "").replace(",", " ").split(), (group.name, option.stem)
    assert "dispatcher    allgather, *alltoall" in text  # the default is marked
    assert "dry_run=false" in text and "full: every plan" in text
    for preset in (CONF_DIR / "sweep").glob("*.yaml"):
        assert preset.stem in text
    for launcher in (CONF_DIR / "hydra" / "launcher").glob("*.yaml"):
        assert launcher.stem in text
    for command in SUBCOMMANDS:
        assert f"moe-vlm {command}" in text
    assert not (tmp_path / "outputs").exists()  # help writes nothing


def test_the_help_is_rendered_from_conf_so_it_cannot_drift(tmp_path: Path) -> None:
    conf = tmp_path / "conf"
    shutil.copytree(CONF_DIR, conf, symlinks=True)
    (conf / "dispatcher" / "newdispatch.yaml").write_text("name: newdispatch\n")
    (conf / "widget").mkdir()
    (conf / "widget" / "blue.yaml").write_text("{}\n")
    groups = train_help.groups(conf)
    assert "newdispatch" in groups and "widget" in groups and "blue" in groups


def test_the_top_level_keys_are_declared_once_in_the_schema() -> None:
    """Every top-level knob: a default and a help line in moe_vlm/config/schema.py (schema.knob), none in
    conf/train.yaml, where a second default would silently win over the schema's."""
    keys = train_help.keys()
    for f in dataclasses.fields(TrainConfig):
        if f.default == MISSING or f.default_factory is not dataclasses.MISSING:
            continue  # a config group: its option files give its values (recipe: none unless chosen)
        assert f.metadata.get("help"), f"{f.name}: declare it with schema.knob(default, help)"
        assert f"{f.name}=" in keys
    train = yaml.safe_load((CONF_DIR / "train.yaml").read_text())
    assert set(train) == {"defaults", "hydra"}, f"conf/train.yaml sets {set(train) - {'defaults', 'hydra'}}"
    assert "mbs=1" in keys and "tp=null pp=null vp=null cp=null ep=null etp=null" in keys


def test_help_parts_escape_dollars_for_hydra_template() -> None:
    assert train_help.render("commands") == train_help.commands().replace("$", "$$")
    with pytest.raises(ValueError, match="no such part"):
        train_help.render("nope")


@pytest.mark.parametrize("command", list(SUBCOMMANDS))
def test_every_moe_vlm_command_has_help(command: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "moe_vlm.cli.main", command, "--help"],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: moe-vlm {command}")
    examples = [line for line in done.stdout.splitlines()[1:] if f"moe-vlm {command} " in line]
    assert examples, done.stdout  # at least one example


def test_moe_vlm_without_a_command_points_at_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert moe_vlm(["--help"]) == 0
    assert "moe-vlm advise --help" in capsys.readouterr().out
