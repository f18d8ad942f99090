"""The layering's own checks beyond `lint-imports` (docs/layout.md, pyproject.toml [tool.importlinter]).

lint-imports checks only the modules a contract names, and its acyclic contract compares siblings:
these tests keep moe_vlm/ to stage packages, make each name its layer, and find a cycle anywhere in
the import graph (a package and its own child included), lazy and TYPE_CHECKING imports counted.
"""

from __future__ import annotations

import graphlib
import pkgutil
import re
import tomllib
from pathlib import Path

import grimp

import moe_vlm

ROOT = Path(__file__).resolve().parents[2]


def layers_contract() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (contract,) = [c for c in config["contracts"] if c["id"] == "layers"]
    return contract["layers"]


def test_moe_vlm_holds_only_stage_packages() -> None:
    flat = [m.name for m in pkgutil.iter_modules(moe_vlm.__path__) if not m.ispkg]
    assert flat == [], "a module's home is the stage package its purpose names (docs/layout.md)"


def test_every_stage_package_has_a_layer() -> None:
    named = {name for layer in layers_contract() for name in re.split(r"\s*[|:]\s*", layer.strip())}
    packages = {f"moe_vlm.{m.name}" for m in pkgutil.iter_modules(moe_vlm.__path__)}
    assert packages - named == set(), "add these to a layer in pyproject.toml and docs/layout.md"
    assert named - packages - {"hydra_plugins.moe_vlm_sweeper"} == set(), "layers naming no package"
    assert len(layers_contract()) <= 8, "a few wide layers: a new package joins one"


def test_a_stage_face_imports_nothing_of_ours() -> None:
    """A stage package's __init__ says what the stage is for. Three faces import, each for a
    reason docs/layout.md gives: engines dispatches to an engine, rules registers every rule group
    (no reader can see half a catalogue), data keeps torch lazy behind its entry points."""
    graph = grimp.build_graph("moe_vlm", cache_dir=None)
    importing = {
        f"moe_vlm.{m.name}"
        for m in pkgutil.iter_modules(moe_vlm.__path__)
        if graph.find_modules_directly_imported_by(f"moe_vlm.{m.name}")
    }
    assert importing == {"moe_vlm.engines", "moe_vlm.rules", "moe_vlm.data"}


def test_the_import_graph_has_no_cycle() -> None:
    graph = grimp.build_graph("moe_vlm", "hydra_plugins", cache_dir=None)
    project = {m for m in graph.modules if m.startswith(("moe_vlm", "hydra_plugins.moe_vlm_sweeper"))}
    edges = {m: graph.find_modules_directly_imported_by(m) & project for m in project}
    try:
        list(graphlib.TopologicalSorter(edges).static_order())
    except graphlib.CycleError as exc:
        raise AssertionError(f"import cycle: {' -> '.join(exc.args[1])}") from None
