"""A single run is composed once (moe_vlm/config/one_run.py): its pre-flight's composition is the
one Hydra runs, and what the run writes is what `@hydra.main` writes.

The composition count is Hydra's own `ConfigLoaderImpl.load_configuration` calls, counted by
cProfile in a real `python train.py` (before: three, the pre-flight's and `@hydra.main`'s two).
"""

from __future__ import annotations

import os
import pstats
import subprocess
import sys
from pathlib import Path

import pytest
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra._internal.utils import create_automatic_config_search_path
from hydra.core.global_hydra import GlobalHydra
from hydra.types import RunMode
from omegaconf import OmegaConf

import train
from moe_vlm.config import compose
from moe_vlm.config.compose import compose_config
from moe_vlm.config.one_run import RUN_MODE, KeepingLoader, OneRun
from tests.conftest import REPO

TRAIN = REPO / "train.py"


def _train(cwd: Path, *args: str, python: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "MOE_VLM_"))}
    env.update({"MOE_VLM_SITE_FILE": "none", "MOE_VLM_CACHE_DIR": str(cwd / "cache")})
    return subprocess.run(
        [sys.executable, *python, str(TRAIN), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _compositions(profile: Path) -> int:
    stats = pstats.Stats(str(profile)).stats  # type: ignore[attr-defined]
    return sum(
        calls[1]  # primitive calls
        for (file, _, name), calls in stats.items()
        if name == "load_configuration" and file.endswith("config_loader_impl.py")
    )


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("dry_run=true",), 1),
        (("dry_run=true", "model=qwen3_vl_30b_a3b", "mbs=2"), 1),
        # Not a plain single run's command line: @hydra.main composes as it always has (twice),
        # after the pre-flight's own composition.
        (("--config-name", "train", "dry_run=true"), 3),
    ],
)
def test_a_single_dry_run_composes_the_config_once(
    tmp_path: Path, args: tuple[str, ...], expected: int
) -> None:
    profile = tmp_path / "run.prof"
    done = _train(tmp_path, *args, "hydra.run.dir=run", python=("-m", "cProfile", "-o", str(profile)))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "== moe_vlm plan" in done.stdout
    assert _compositions(profile) == expected


def test_the_run_writes_what_hydra_main_writes(tmp_path: Path) -> None:
    """The same command once composed once and once through @hydra.main (`--config-name train`
    is the same config, and a command line OneRun leaves to Hydra): the same .hydra/ files, but
    for the directory each ran in."""
    written = {}
    for name, extra in (("once", ()), ("hydra_main", ("--config-name", "train"))):
        cwd = tmp_path / name
        cwd.mkdir()
        done = _train(cwd, *extra, "dry_run=true", "data=mock", "mbs=2", "hydra.run.dir=run")
        assert done.returncode == 0, done.stderr[-3000:]
        files = sorted(p.name for p in (cwd / "run" / ".hydra").iterdir())
        assert files == ["config.yaml", "hydra.yaml", "overrides.yaml"]
        written[name] = {f: (cwd / "run" / ".hydra" / f).read_text().replace(str(cwd), "CWD") for f in files}
        assert (cwd / "run" / "plan.json").is_file() and (cwd / "run" / "train.log").is_file()
    assert written["once"] == written["hydra_main"]
    assert "- hydra.mode=RUN" in written["once"]["hydra.yaml"]


@pytest.fixture
def loader() -> KeepingLoader:
    GlobalHydra.instance().clear()
    return KeepingLoader(create_automatic_config_search_path(str(TRAIN), None, train.CONFIG_PATH))


@pytest.mark.parametrize(
    "overrides",
    [[], ["dry_run=true", "mbs=2"], ["model=qwen3_vl_30b_a3b", "precision=fp8cs", "parallelism.tp=2"]],
)
def test_the_kept_composition_is_hydras_own_with_hydra_mode_run(
    loader: KeepingLoader, overrides: list[str]
) -> None:
    kept = loader.keep(train.CONFIG_NAME, overrides)
    own = ConfigLoaderImpl(loader.get_search_path()).load_configuration(
        train.CONFIG_NAME, [*overrides, RUN_MODE], RunMode.RUN
    )
    assert OmegaConf.to_container(kept, resolve=False) == OmegaConf.to_container(own, resolve=False)
    # Handed to Hydra's run once; any later request is composed anew.
    assert loader.load_configuration(train.CONFIG_NAME, [*overrides, RUN_MODE], RunMode.RUN) is kept
    again = loader.load_configuration(train.CONFIG_NAME, [*overrides, RUN_MODE], RunMode.RUN)
    assert again is not kept and OmegaConf.to_container(again) == OmegaConf.to_container(own)


def test_a_config_that_sets_hydra_mode_is_left_to_hydra(loader: KeepingLoader) -> None:
    """get_mode's answer is the config's own hydra.mode: then Hydra decides, composing as it does."""
    loader.keep(train.CONFIG_NAME, ["hydra.mode=RUN"])
    assert not loader.holds


@pytest.mark.parametrize(
    "argv",
    [
        ["-m", "mbs=1,2"],
        ["mbs=1,2"],
        ["--cfg", "job"],
        ["--config-dir", "/tmp"],
        ["hydra.mode=MULTIRUN"],
        ["--info"],
        ["mbs=[1"],
        ["--unknown-flag"],
    ],
)
def test_only_a_plain_single_run_is_composed_once(argv: list[str]) -> None:
    assert OneRun.of(train.task, train.CONFIG_PATH, train.CONFIG_NAME, argv) is None


def test_a_plain_single_run_is(argv: list[str] | None = None) -> None:
    one = OneRun.of(train.task, train.CONFIG_PATH, train.CONFIG_NAME, ["dry_run=true", "-r"])
    assert one is not None and one.task_name == "train" and one.overrides == ["dry_run=true"]


@pytest.mark.parametrize(
    "overrides",
    [["dry_run=true"], ["cluster=gb200", "model=qwen3_vl_30b_a3b", "recompute=selective", "mbs=2"]],
)
def test_the_task_config_read_in_place_is_the_copys_and_leaves_the_composition_as_it_was(
    overrides: list[str],
) -> None:
    """compose._plain_task reads the composition without its hydra node, in place, where _task_of
    copied it first: the same config and TrainConfig, and the composition after is the one before,
    its keys in their order (Hydra's run_job copies and writes it next)."""
    cfg = compose_config(overrides, hydra_node=True)
    before = OmegaConf.to_yaml(cfg)
    keys = list(cfg.keys())
    config, train = compose._plain_task(cfg)
    assert (config, train) == compose._plain(compose._task_of(cfg))
    assert "hydra" not in config
    assert list(cfg.keys()) == keys and "hydra" in keys
    assert OmegaConf.to_yaml(cfg) == before
