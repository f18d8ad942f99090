"""The plan cache's keys: what changes them and what does not (moe_vlm/engines/megatron/plan_cache.py).

Computing a key imports nothing of Megatron; what a hit returns, and a corrupt entry rebuilt, is
checked against the real Bridge in tests/megatron/test_plan_cache.py.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from moe_vlm.engines.megatron import plan_cache
from moe_vlm.engines.megatron.plan_cache import effective_inputs, entry_path, stack_inputs
from tests.conftest import REPO, make_spec

POINT = ("cluster=gb200", "model=qwen3_vl_30b_a3b", "nodes=2", "dry_run=true")
INPUTS = {"effective": effective_inputs, "stack": stack_inputs}
ROOTS = plan_cache.EFFECTIVE_ROOTS


@pytest.fixture(autouse=True)
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(plan_cache.CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def effective_path(*overrides: str) -> Path:
    return entry_path("effective", effective_inputs(make_spec(*POINT, *overrides)))


def test_the_cache_lives_where_the_environment_says(cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert effective_path().parent == cache_dir / "plan"
    monkeypatch.delenv(plan_cache.CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", "/somewhere")
    assert plan_cache.cache_dir() == Path("/somewhere/moe_vlm")
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert plan_cache.cache_dir() == Path("~/.cache/moe_vlm").expanduser()


def test_a_knob_changes_the_key_and_dry_run_does_not() -> None:
    assert effective_path() == effective_path("dry_run=full")
    assert effective_path() != effective_path("mbs=2")
    assert effective_path() != effective_path("recompute=full")
    assert effective_path() != effective_path("train_iters=20")  # Bridge's scheduler holds it


def test_a_library_version_or_a_reinstall_changes_both_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = make_spec(*POINT)
    before = {kind: entry_path(kind, inputs(spec)) for kind, inputs in INPUTS.items()}
    found = plan_cache.installed()
    upgraded = plan_cache.Install({**found.versions, "megatron-core": "0.99.0"}, found.stamp)
    # A reinstall of the same version makes a new metadata directory.
    reinstalled = plan_cache.Install(found.versions, found.stamp[::-1])
    for change in (upgraded, reinstalled):
        monkeypatch.setattr(plan_cache, "installed", lambda change=change: change)
        for kind, inputs in INPUTS.items():
            assert entry_path(kind, inputs(spec)) != before[kind], (kind, change)


def test_installing_a_package_changes_what_installed_reads_and_writing_beside_it_does_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Versions from the metadata directories' names; the stamp from each metadata directory's
    own mtime, which a pip install makes anew (also for the same version). A directory or file
    written beside them (a run's outputs/ in the repository root, which holds the editable
    install's egg-info) leaves the stamp alone: CI once saw a second dry run miss the cache
    because a test on the other worker had written the repository root in between."""
    site = tmp_path / "site-packages"
    (site / "torch-2.14.1.dist-info").mkdir(parents=True)
    (site / "old_thing-1.0-py3.12.egg-info").mkdir()
    monkeypatch.setattr(sys, "path", [str(tmp_path / "no-such-dir"), str(site)])

    def read() -> plan_cache.Install:
        plan_cache.installed.cache_clear()
        return plan_cache.installed()

    try:
        before = read()
        assert before.versions == {"torch": "2.14.1", "old-thing": "1.0"}
        time.sleep(0.05)  # past the file system's timestamp granularity
        (site / "outputs").mkdir()
        (site / "notes.txt").write_text("x")
        assert read() == before
        (site / "deep_ep-1.2.0.dist-info").mkdir()
        after = read()
        assert after.versions["deep-ep"] == "1.2.0" and after.stamp != before.stamp
        # pip install --force-reinstall torch==2.14.1: the same name, a new directory
        (site / "torch-2.14.1.dist-info").rmdir()
        time.sleep(0.05)
        (site / "torch-2.14.1.dist-info").mkdir()
        again = read()
        assert again.versions == after.versions and again.stamp != after.stamp
    finally:
        plan_cache.installed.cache_clear()


def test_an_environment_variable_bridge_reads_changes_the_key_and_others_do_not(tmp_path: Path) -> None:
    """The environment the process started with: a fresh interpreter per environment."""
    script = (
        "from moe_vlm.engines.megatron.plan_cache import effective_inputs, entry_path\n"
        "from tests.conftest import make_spec\n"
        f"print(entry_path('effective', effective_inputs(make_spec(*{POINT!r}))))\n"
    )

    def path(**extra: str) -> str:
        env = {k: v for k, v in os.environ.items() if not k.startswith(plan_cache.ENV_PREFIXES)}
        env.update({plan_cache.CACHE_ENV: str(tmp_path), **extra})
        done = subprocess.run(
            [sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout.strip()

    before = path()
    assert path(MOE_VLM_UNRELATED="1") == before
    assert path(NCCL_ALGO="Ring") != before  # megatron/bridge/training/config.py:1058


def test_the_installed_versions_are_importlib_metadatas() -> None:
    found = plan_cache.installed()
    for name in (*plan_cache.LIBRARIES, "hydra-core", "omegaconf", "submitit"):
        try:
            expected = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            assert name not in found.versions
            continue
        assert found.versions[name] == expected, name


def test_the_code_version_follows_the_modules_the_build_imports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A copy of the package: editing a module the build imports (transitively, also inside a
    function) changes the version; editing one it never imports does not."""
    root = tmp_path / "src"
    shutil.copytree(Path(plan_cache.__file__).resolve().parents[2], root / "moe_vlm")
    monkeypatch.setattr(plan_cache, "_PACKAGE_ROOT", root)

    def version() -> str:
        plan_cache._project_modules.cache_clear()
        plan_cache._parsed.cache_clear()
        plan_cache.code_modules.cache_clear()
        plan_cache.code_version.cache_clear()
        return plan_cache.code_version(*ROOTS)

    try:
        before = version()
        # config.build_config imports megatron/data.py inside a function, which imports moe_vlm.data.
        for module in ("engines/megatron/data.py", "data/sequence.py", "config/arch.py"):
            path = root / "moe_vlm" / module
            text = path.read_text()
            path.write_text(text + "\n# changed\n")
            assert version() != before, module
            path.write_text(text)
        assert version() == before
        (root / "moe_vlm" / "report" / "diff.py").write_text("# not imported by the build\n")
        assert version() == before
    finally:
        plan_cache._project_modules.cache_clear()
        plan_cache._parsed.cache_clear()
        plan_cache.code_modules.cache_clear()
        plan_cache.code_version.cache_clear()
