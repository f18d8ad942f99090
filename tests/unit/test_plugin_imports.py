"""Hydra executes every module of `hydra_plugins` in every Hydra command (`--help` included): ours
must import nothing heavy (the scan once pulled torch in through the launcher's status import)."""

from __future__ import annotations

import json
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import hydra_plugins.moe_vlm_sweeper as plugins
from tests.conftest import REPO

HEAVY = ("torch", "transformers", "megatron", "pandas", "matplotlib", "scipy")


def _scanned() -> list[str]:
    """Our modules as Hydra's scan sees them (hydra/core/plugins.py: `_`-named ones are skipped)."""
    found = [plugins.__name__]
    for info in pkgutil.walk_packages(plugins.__path__, prefix=plugins.__name__ + "."):
        if not info.name.rsplit(".", 1)[-1].startswith("_"):
            found.append(info.name)
    return found


def _heavy_after(code: str) -> dict[str, list[str]]:
    """Run `code` in a fresh interpreter from the repository root; the heavy top-level packages it
    left in sys.modules, and the classes Hydra registered (when the code asked Hydra)."""
    probe = (
        f"{code}\nimport json, sys\n"
        f"heavy = sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r})\n"
        "from hydra.core.plugins import Plugins\n"
        "names = sorted(Plugins.instance().class_name_to_class) if 'hydra.core.plugins' in sys.modules else []\n"
        "print(json.dumps({'heavy': heavy, 'plugins': names}))"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, list[str]] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.parametrize("module", _scanned())
def test_a_plugin_module_imports_nothing_heavy(module: str) -> None:
    assert _heavy_after(f"import {module}")["heavy"] == []


def test_hydra_plugin_discovery_imports_nothing_heavy_and_finds_our_plugins() -> None:
    """Hydra's own scan, as every Hydra command runs it: our classes under their config paths."""
    assert {f"{plugins.__name__}.{m}" for m in ("sweeper", "launcher", "config")} <= set(_scanned())
    found = _heavy_after("from hydra.core.plugins import Plugins\nPlugins.instance()")
    assert found["heavy"] == []
    assert {
        "hydra_plugins.moe_vlm_sweeper.sweeper.PlanningSweeper",
        "hydra_plugins.moe_vlm_sweeper.launcher.SubmititLauncher",
    } <= set(found["plugins"])


def _imported_by(*argv: str, env_extra: dict[str, str] | None = None) -> set[str]:
    """The top-level packages a `python train.py ...` command imported (-X importtime's report)."""
    return {name.split(".")[0] for name in _modules_imported_by(*argv, env_extra=env_extra)}


def _modules_imported_by(*argv: str, env_extra: dict[str, str] | None = None) -> set[str]:
    """Every module a `python train.py ...` command imported (-X importtime's report)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | (env_extra or {})
    done = subprocess.run(
        [sys.executable, "-X", "importtime", str(REPO / "train.py"), *argv],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [line.split("|")[-1] for line in done.stderr.splitlines() if line.startswith("import time:")]
    return {name.strip() for name in lines}


# Also kept out of a plan on the CPU point (issue 33, start-up): only a calibration fit needs
# numpy, only a real dataset's images Pillow.
PLAN_HEAVY = ("numpy", "PIL")


def test_train_help_imports_nothing_heavy() -> None:
    assert _imported_by("--help") & {*HEAVY, *PLAN_HEAVY} == set()


def test_a_cpu_dry_run_imports_nothing_heavy(tmp_path: Path) -> None:
    assert _imported_by("dry_run=true", f"hydra.run.dir={tmp_path}") & {*HEAVY, *PLAN_HEAVY} == set()


def test_a_cpu_dry_run_imports_neither_the_job_side_nor_the_run_records_resolver(tmp_path: Path) -> None:
    """A plan never reaches the job side (moe_vlm/runtime: heartbeats, failures, a running job's
    records), and its pre-flight does not resolve hydra.sweep.dir, whose resolver imports it."""
    imported = _modules_imported_by("dry_run=true", f"hydra.run.dir={tmp_path}")
    assert "moe_vlm.run.plan" in imported
    assert sorted(m for m in imported if m.startswith("moe_vlm.runtime")) == []


# What a torch point's plan has no use for (issue 33, start-up; docs/configuration.md): the Megatron
# engine's planning, a run record's writer (perf/peaks.py quotes the MFU peaks without it) and the
# shard reader (only a real dataset's sizes are read). importlib.metadata is not asked either
# (base/distributions.py reads the metadata directories' names), but this venv's
# multi-storage-client Hydra plugin imports it in every Hydra command, so it is not checked here.
NOT_FOR_A_TORCH_PLAN = (
    "moe_vlm.engines.megatron",
    "moe_vlm.record.records",
    "moe_vlm.perf.metrics",
    "moe_vlm.data.energon",
)


def test_a_cpu_dry_run_imports_no_megatron_planning_no_record_writer_and_no_shard_reader(
    tmp_path: Path,
) -> None:
    imported = _modules_imported_by("dry_run=true", f"hydra.run.dir={tmp_path}")
    assert "moe_vlm.perf.peaks" in imported
    assert sorted(m for m in imported if m.startswith(NOT_FOR_A_TORCH_PLAN)) == []


def test_a_cached_gpu_point_on_a_machine_without_megatron_imports_nothing_heavy(tmp_path: Path) -> None:
    """A login node without the Megatron stack: the stack probe is cached like any plan section, and
    the effective configuration is not attempted (it would import transformers and torch first, fail,
    and, never cached, cost every plan tens of seconds). Megatron and TE are made unimportable by
    packages that raise as a missing one does, ahead of the venv on the path."""
    block = tmp_path / "block"
    for name in ("megatron", "transformer_engine"):
        (block / name).mkdir(parents=True)
        (block / name / "__init__.py").write_text(
            f"raise ModuleNotFoundError(\"No module named '{name}'\", name={name!r})\n"
        )
    env = {"PYTHONPATH": str(block), "MOE_VLM_CACHE_DIR": str(tmp_path / "cache")}
    point = ("cluster=gb200", "model=qwen3_vl_30b_a3b", "dry_run=true")
    _imported_by(*point, f"hydra.run.dir={tmp_path / 'first'}", env_extra=env)
    again = _imported_by(*point, f"hydra.run.dir={tmp_path / 'again'}", env_extra=env)
    assert again & {"torch", "transformers", "megatron", "transformer_engine"} == set()
    assert "the Megatron stack does not import here" in (tmp_path / "again" / "plan.txt").read_text()
