"""Installing moe_vlm keeps the torch an environment already holds.

NVIDIA's NeMo/PyTorch containers build torch, Transformer Engine, DeepEP and NCCL together; a
`pip install -e .` that swapped their torch for a PyPI build would break every compiled extension
in the image. So pyproject.toml states ranges and constraints.txt holds the exact versions these
machines run. The slow test asks pip itself, against a real installed torch of another version.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from tests.conftest import REPO

LOCK = REPO / "constraints.txt"
# Another in-range pair than the lock's: torchvision pins the torch it was built with, so a
# container holds both, and pip must keep both.
OTHER = {"torch": "2.13.0", "torchvision": "0.28.0"}
# The GPU machine's image (torch 2.11) installs the project from carried wheels: keep it in range.
GPU_IMAGE_TORCH = "2.11.0"


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def project_requirements(extra: str | None = None) -> list[Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    lines = project["dependencies"] if extra is None else project["optional-dependencies"][extra]
    return [Requirement(line) for line in lines]


def locked() -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for line in LOCK.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[_norm(name)] = Version(version)
    return pins


def test_core_dependencies_are_ranges_the_lock_and_other_torches_satisfy() -> None:
    lock = locked()
    every = [*project_requirements(), *project_requirements("dev"), *project_requirements("megatron")]
    requirements = {_norm(r.name): r for r in every}
    for name in ("torch", "torchvision"):
        assert not any(s.operator in ("==", "===") for s in requirements[name].specifier), requirements[name]
        assert requirements[name].specifier.contains(OTHER[name]), (name, OTHER[name])
        assert lock[name] != Version(OTHER[name])
    assert requirements["torch"].specifier.contains(GPU_IMAGE_TORCH)
    for name, requirement in requirements.items():
        assert name in lock, f"{name} is not in constraints.txt"
        assert requirement.specifier.contains(lock[name], prereleases=True), (requirement, lock[name])


def _pip(*args: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "pip", *args], capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"pip {' '.join(args)}:\n{done.stderr[-3000:]}"
    return done


def _planned_installs(python: Path, report: Path, *extra: str) -> dict[str, str]:
    """What `pip install -e <repo>` would install into `python`'s environment (a dry run)."""
    _pip("--python", str(python), "install", "--dry-run", "--quiet", "--report", str(report), *extra,
         "-e", str(REPO))  # fmt: skip
    items = json.loads(report.read_text())["install"]
    return {_norm(item["metadata"]["name"]): item["metadata"]["version"] for item in items}


@pytest.mark.slow
def test_installing_into_an_environment_with_another_torch_keeps_it(tmp_path: Path) -> None:
    """A throwaway venv holding real torch 2.13.0 + torchvision 0.28.0 wheels from PyPI (about 20 s
    to fetch and unpack), then pip's own resolver, twice: without and with the lock."""
    wheels, env = tmp_path / "wheels", tmp_path / "container"
    _pip("download", "--quiet", "--no-deps", "--only-binary=:all:", "-d", str(wheels),
         *(f"{name}=={version}" for name, version in OTHER.items()))  # fmt: skip
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    python = env / "bin" / "python"
    _pip("--python", str(python), "install", "--quiet", "--no-deps", "--no-compile",
         *map(str, wheels.iterdir()))  # fmt: skip
    held = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m; print(m.version('torch'), m.version('torchvision'))"],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    assert held == [OTHER["torch"], OTHER["torchvision"]]

    plain = _planned_installs(python, tmp_path / "plain.json")
    assert "moe-vlm" in plain
    assert "torch" not in plain and "torchvision" not in plain, f"pip would replace the held torch: {plain}"

    # The control: with the lock, the same resolver on the same environment replaces both, so the
    # test sees the installed torch and can fail. Never pass constraints.txt inside a container.
    locked_plan = _planned_installs(python, tmp_path / "locked.json", "-c", str(LOCK))
    lock = locked()
    assert locked_plan.get("torch") == str(lock["torch"]), locked_plan
    assert locked_plan.get("torchvision") == str(lock["torchvision"]), locked_plan
