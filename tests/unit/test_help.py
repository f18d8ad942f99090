"""`python train.py --help` and `moe-vlm COMMAND --help`: exit 0, the arguments, an example."""

from __future__ import annotations

import dataclasses
import os
import re
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


def _examples() -> list[str]:
    """The commands under `== Examples` in `train.py --help` (literal in its template)."""
    template = yaml.safe_load((CONF_DIR / "hydra" / "help" / "moe_vlm.yaml").read_text())["template"]
    lines = str(template).splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("== Examples"))
    found = []
    for line in lines[start + 1 :]:
        if not line.strip():
            break
        found.append(line.strip())
    return found


def test_the_help_has_examples_on_cpu_and_on_a_gpu_cluster() -> None:
    examples = _examples()
    assert len(examples) >= 4 and all(e.startswith("python train.py ") for e in examples)
    assert any(
        "cluster=gb200" in e and "dry_run=true" in e and " -m " not in e for e in examples
    )  # one GPU plan
    assert any("dry_run" not in e and " -m " not in e for e in examples)  # one that trains on CPU


@pytest.mark.slow
@pytest.mark.parametrize("example", _examples())
def test_every_help_example_plans_cleanly_on_a_cpu_machine(example: str, tmp_path: Path) -> None:
    """Each example as the docs test runs commands (moe_vlm.run.plan's shallow plan, dry_run=true
    added where it would train): no rule refuses it (the old one asked for hybridep on CPU: E003)."""
    argv = example.split()[2:]
    if not any(a.startswith("dry_run=") for a in argv):
        argv.append("dry_run=true")
    if "-m" in argv:
        argv.append(f"hydra.sweep.dir={tmp_path / 'sweep'}")
    done = subprocess.run(
        [sys.executable, str(REPO / "train.py"), *argv],
        cwd=tmp_path,
        env={
            **os.environ,
            "PYTHONPATH": str(REPO),
            "MOE_VLM_SITE_FILE": "none",
            "MOE_VLM_PLAN_SHALLOW": "1",
        },
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    if "-m" in argv:  # a sweep shows what its rules reject; some of its points must be valid
        valid = re.search(r"moe_vlm: dry run: \d+ point\(s\), (\d+) valid", done.stdout)
        assert valid is not None and int(valid.group(1)) > 0, done.stdout[-3000:]
    else:
        assert "INVALID" not in done.stdout and "ERROR " not in done.stdout, done.stdout[-3000:]


def test_the_help_lists_the_keys_inside_groups_a_user_reaches_for_first() -> None:
    text = train_help.full()
    for key in ("data.packing=in_batch", "hydra.sweeper.search=halving", "hydra.sweeper.predict_keep="):
        assert key in text
    assert train_help.first_knobs() in text


def test_every_first_knob_is_a_key_a_command_line_can_set() -> None:
    from hydra_plugins.moe_vlm_sweeper.config import PlanningSweeperConf
    from moe_vlm.config.compose import compose_config
    from moe_vlm.launch.settings import SlurmSettings

    sweeper = {f.name for f in dataclasses.fields(PlanningSweeperConf)}
    launcher = {f.name for f in dataclasses.fields(SlurmSettings)}
    for key, value, comment in train_help.FIRST_KNOBS:
        assert comment and len(comment) <= 65, key  # one line beside the widest key
        if key.startswith("hydra.sweeper."):
            assert key.removeprefix("hydra.sweeper.") in sweeper, key
        elif key.startswith("hydra.launcher."):
            assert key.removeprefix("hydra.launcher.") in launcher, key
        else:
            cfg = compose_config([f"{key}={value}"])
            group, name = key.split(".", 1)
            assert str(cfg[group][name]).lower() == value.lower(), key


def test_moe_vlm_help_lists_every_group_with_its_options_and_the_first_knobs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert moe_vlm(["--help"]) == 0
    out = capsys.readouterr().out
    assert train_help.groups() in out and train_help.first_knobs() in out
    for group in (p for p in CONF_DIR.iterdir() if p.is_dir() and p.name not in ("hydra", "sweep")):
        assert any(line.strip().startswith(group.name + " ") for line in out.splitlines()), group.name
