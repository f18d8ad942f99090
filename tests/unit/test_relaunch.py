"""One node, no Slurm: the Megatron engine restarts its run under torchrun from the point's own
overrides, not from ``sys.argv``.

The harness is a Hydra app on this repo's config (its sweeper, its launchers) whose task calls the
engine's own builder, ``torchrun_command(point_overrides(), run_dir, ranks_per_node)``, where
``launch()`` would call it after its GPU check (this machine has no GPU). It runs for real as
(a) a plain run, (b) a multirun under Hydra's basic launcher and (c) a multirun under submitit's
local executor (``hydra/launcher=local``), and each built command is checked two ways: its shape
(train.py of this repo, no ``-m``, no swept lists, this run's directory) and its meaning (Hydra's
compose API on its overrides gives the very config the point ran with).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser

from moe_vlm.engines.megatron.launch import torchrun_command
from moe_vlm.run.task import resolved_config
from tests.conftest import compose_cfg

REPO = Path(__file__).resolve().parents[2]

APP = f"""
import json, sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig

import moe_vlm.config.schema  # registers the schema, as train.py does
from moe_vlm.engines.megatron.launch import point_overrides, torchrun_command
from moe_vlm.run.task import resolved_config
from moe_vlm.config.spec import RunSpec


@hydra.main(version_base=None, config_path={str(REPO / "conf")!r}, config_name="train")
def main(cfg):
    spec = RunSpec.from_config(cfg)
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    command = torchrun_command(point_overrides(), run_dir, spec.layout.ranks_per_node)
    record = {{"argv": sys.argv, "command": command, "config": resolved_config(cfg), "run_dir": str(run_dir)}}
    (run_dir / "relaunch.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main()
"""

TRAIN = str(REPO / "train.py")
PREFIX = 5  # python -m torch.distributed.run --standalone --nproc-per-node=N
POINT = ["engine=megatron", "cluster=h200", "model=qwen3_vl_30b_a3b"]


def run_app(tmp_path: Path, *args: str) -> list[dict[str, Any]]:
    app = tmp_path / "app.py"
    app.write_text(APP)
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "MOE_VLM_SITE_FILE": "none",
    }
    done = subprocess.run(
        [sys.executable, str(app), *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(p.read_text()) for p in sorted(tmp_path.rglob("relaunch.json"))]


def task_overrides(command: list[str]) -> list[str]:
    """The overrides after train.py, without the hydra.* ones the builder appends."""
    assert command[PREFIX] == TRAIN
    return [arg for arg in command[PREFIX + 1 :] if not arg.startswith("hydra.")]


def check_command(record: dict[str, Any], ranks: int) -> list[str]:
    command = record["command"]
    assert command[:PREFIX] == [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={ranks}",
    ]
    assert "-m" not in command[PREFIX:] and "--multirun" not in command
    # Hydra reads it back as this run's directory, and the ranks leave .hydra/ as the run wrote it.
    run_dir = OverridesParser.create().parse_override(command[-2])
    assert run_dir.key_or_group == "hydra.run.dir" and run_dir.value() == record["run_dir"]
    assert command[-1] == "hydra.output_subdir=null"
    overrides = task_overrides(command)
    # The command composes the config the point ran with, nothing more or less.
    assert resolved_config(compose_cfg(*overrides)) == record["config"]
    return overrides


def test_a_plain_run_restarts_with_its_own_overrides(tmp_path: Path) -> None:
    [record] = run_app(tmp_path, *POINT, "mbs=2", f"hydra.run.dir={tmp_path / 'run'}")

    overrides = check_command(record, ranks=8)
    assert sorted(overrides) == sorted([*POINT, "mbs=2"])
    assert record["run_dir"] == str(tmp_path / "run")


@pytest.mark.parametrize("launcher", ["basic", "local"])
def test_each_multirun_point_restarts_as_that_point_alone(tmp_path: Path, launcher: str) -> None:
    args = ["-m", *POINT, "mbs=1,2", "recompute=none,selective", f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    if launcher == "local":
        args.append("hydra/launcher=local")
    records = run_app(tmp_path, *args)

    assert len(records) == 4
    seen = set()
    for record in records:
        if launcher == "local":
            # The case sys.argv got wrong: inside the job, argv is submitit's own script.
            assert Path(record["argv"][0]).parts[-3:] == ("submitit", "core", "_submit.py")
        else:
            assert "-m" in record["argv"]  # what the old relaunch replayed into every rank
        overrides = check_command(record, ranks=8)
        assert not any("," in value for value in overrides)
        mbs = [o for o in overrides if o.startswith("mbs=")]
        recompute = [o for o in overrides if o.startswith("recompute=")]
        assert len(mbs) == len(recompute) == 1
        assert record["config"]["mbs"] == int(mbs[0].removeprefix("mbs="))
        assert Path(record["run_dir"]).parent == tmp_path / "sweep"
        seen.add((mbs[0], recompute[0]))
    assert seen == {(f"mbs={m}", f"recompute={r}") for m in (1, 2) for r in ("none", "selective")}


def test_a_run_dir_hydra_would_misread_is_quoted(tmp_path: Path) -> None:
    run_dir = tmp_path / "a b,c=d's"
    command = torchrun_command(["mbs=1"], run_dir, 4)

    parsed = OverridesParser.create().parse_override(command[-2])
    assert parsed.value() == str(run_dir)
