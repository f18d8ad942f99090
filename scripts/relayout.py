#!/usr/bin/env python3
"""One scripted step: regroup moe_vlm/ into stage packages (moves only, issue 30).

    python scripts/relayout.py            # git mv every module, rewrite every reference
    python scripts/relayout.py --check GRAPH.json
                                          # the import graph after == the graph before, renamed

What it does, in order:
1. `git mv` each flat module (and the memory/ and advise/ packages) to its stage package, and
   writes each new package's one-line __init__.py (a docstring, no import).
2. Rewrites every reference in every tracked text file: dotted names (`moe_vlm.report_table` ->
   `moe_vlm.report.table`, in imports, strings, monkeypatch targets, the entry point and the
   contracts), paths (`moe_vlm/flops.py` -> `moe_vlm/perf/flops.py`), and splits
   `from moe_vlm import a, b` into one import per stage, aliased where the module's name changed.
   One regular-expression pass per file, so a rewritten name is never rewritten again.
3. ruff sorts the imports it touched.

--check proves that no import changed: the graph grimp builds now, with every old module name
mapped to its new one, equals the graph saved before the move (edges between our own modules).
Kept in git history only; the script is removed once the move has landed.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# old module (under moe_vlm.) -> new module (under moe_vlm.)
MOVES: dict[str, str] = {
    # base: the ground floor, nothing of ours below it
    "errors": "base.errors",
    "files": "base.files",
    "processes": "base.processes",
    "provenance": "base.provenance",
    "safety": "base.safety",
    "noise": "base.noise",
    # config: what a run may ask for, and the numbers derived from it
    "schema": "config.schema",
    "spec": "config.spec",
    "arch": "config.arch",
    "precision": "config.precision",
    "compose": "config.compose",
    "preflight": "config.preflight",
    "names": "config.names",
    "sharding": "config.sharding",
    "vendor": "config.vendor",
    # record: what a run writes
    "record": "record.records",
    "shape": "record.shape",
    "columns": "record.columns",
    "explog": "record.explog",
    "profiling": "record.profiling",
    # perf: FLOPs, memory, metrics, stragglers
    "flops": "perf.flops",
    "flops_basis": "perf.flops_basis",
    "metrics": "perf.metrics",
    "stragglers": "perf.stragglers",
    "memory": "perf.memory",  # a package
    # knobs: declarations (the vendor's recipes and the card's rows among them)
    "recipes": "knobs.recipes",
    "cards": "knobs.cards",
    # engines: only the engines use these
    "run_summary": "engines.run_summary",
    "timing": "engines.timing",
    # run: one run, planned or trained
    "run": "run.task",
    "plan": "run.plan",
    "plan_record": "run.plan_record",
    # report: what a sweep's records become
    "report": "report.build",
    "report_table": "report.table",
    "report_format": "report.markdown",
    "report_compare": "report.compare",
    "report_diff": "report.diff",
    "report_card": "report.card",
    "report_basis": "report.basis",
    "halving_report": "report.halving",
    "plots": "report.plots",
    "module_table": "report.module_table",
    # cli: the commands people type
    "cli": "cli.main",
    "help": "cli.train_help",
    "report_cli": "cli.report",
    "calibrate_cli": "cli.calibrate",
    "advise": "cli.advise",  # a package
}
PACKAGES_MOVED = {"memory", "advise"}

NEW_PACKAGES: dict[str, str] = {
    "base": "The ground floor: errors and exit codes, atomic files, child processes, provenance, secret scrubbing, library noise.",
    "config": "What a run may ask for: the schema, its composition and pre-flight, and the RunSpec with every derived number.",
    "record": "What a run writes: run.json and steps.jsonl, their shape, the report's columns, the experiment logger, profiling.",
    "perf": "What a run costs: FLOPs (ours and Bridge's), the per-GPU memory estimate, the metrics contract, stragglers.",
    "run": "One run: the Hydra task function, the dry-run plan and plan.json.",
    "report": "What a sweep's records become: the ranked table, report.md and its plots, --compare and --diff.",
    "cli": "The commands people type: `moe-vlm report | status | advise | calibrate | recipes` and `train.py --help`.",
}

_NAMES = "|".join(sorted(MOVES, key=len, reverse=True))
# `moe_vlm.<old>` not followed by a word character: `moe_vlm.report` but not `moe_vlm.report_table`.
DOTTED = re.compile(rf"\bmoe_vlm\.({_NAMES})(?!\w)")
# `moe_vlm/<old>.py` for a module, `moe_vlm/<old>` (then `/`, `'`, a space...) for a package.
PATH = re.compile(rf"\bmoe_vlm/({_NAMES})(\.py\b|(?![\w.]))")
FROM_IMPORT = re.compile(r"^([ \t]*)from moe_vlm import ([^\n(]+)$", re.M)


def new_dotted(old: str) -> str:
    return f"moe_vlm.{MOVES[old]}"


def new_path(match: re.Match[str]) -> str:
    old, tail = match.group(1), match.group(2)
    new = MOVES[old].replace(".", "/")
    if old in PACKAGES_MOVED:
        return f"moe_vlm/{new}{tail}"
    if tail == ".py":
        return f"moe_vlm/{new}.py"
    return match.group(0)  # `moe_vlm/record` with no .py: a folder that is not ours to rename


def split_from_import(match: re.Match[str]) -> str:
    indent, names = match.group(1), match.group(2)
    comment = ""
    if "#" in names:
        names, comment = names.split("#", 1)
        comment = "  #" + comment
    lines = []
    for item in (n.strip() for n in names.split(",") if n.strip()):
        name, _, alias = (part.strip() for part in item.partition(" as "))
        if name not in MOVES:
            lines.append(f"{indent}from moe_vlm import {item}")
            continue
        package, _, leaf = MOVES[name].rpartition(".")
        bound = alias or name
        suffix = "" if leaf == bound else f" as {bound}"
        lines.append(f"{indent}from moe_vlm.{package} import {leaf}{suffix}")
    lines[0] += comment
    return "\n".join(lines)


def rewrite(text: str, python: bool) -> str:
    text = DOTTED.sub(lambda m: new_dotted(m.group(1)), text)
    text = PATH.sub(new_path, text)
    # after the dotted pass: `from moe_vlm import x` holds no `moe_vlm.x`, and what it becomes
    # (`from moe_vlm.report import basis`) must not be read again as `moe_vlm.report`
    return FROM_IMPORT.sub(split_from_import, text) if python else text


def tracked_text_files() -> list[Path]:
    names = subprocess.run(["git", "ls-files"], cwd=REPO, check=True, capture_output=True, text=True)
    files = []
    for name in names.stdout.splitlines():
        path = REPO / name
        if path.suffix in (".png",) or not path.is_file():
            continue
        files.append(path)
    return files


def move() -> None:
    root = REPO / "moe_vlm"
    for package, purpose in NEW_PACKAGES.items():
        (root / package).mkdir(exist_ok=True)
        init = root / package / "__init__.py"
        if not init.exists():
            init.write_text(f'"""{purpose}"""\n')
            subprocess.run(["git", "add", str(init)], cwd=REPO, check=True)
    for old, new in MOVES.items():
        target = root / (new.replace(".", "/") + ("" if old in PACKAGES_MOVED else ".py"))
        source = root / (old if old in PACKAGES_MOVED else f"{old}.py")
        target.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "mv", str(source), str(target)], cwd=REPO, check=True)
    (root / "cli" / "__main__.py").write_text(
        '"""`python -m moe_vlm.cli`: the `moe-vlm` console script."""\n\n'
        "import sys\n\nfrom moe_vlm.cli.main import main\n\nsys.exit(main())\n"
    )
    subprocess.run(["git", "add", "moe_vlm/cli/__main__.py"], cwd=REPO, check=True)


def rewrite_all() -> None:
    changed = []
    for path in tracked_text_files():
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        new = rewrite(text, path.suffix == ".py")
        if new != text:
            path.write_text(new)
            changed.append(str(path.relative_to(REPO)))
    print(f"relayout: rewrote {len(changed)} files")
    ruff = REPO / ".venv" / "bin" / "ruff"
    py = [c for c in changed if c.endswith(".py")]
    subprocess.run([str(ruff), "check", "--select", "I", "--fix", "-q", *py], cwd=REPO, check=False)
    subprocess.run([str(ruff), "format", "-q", *py], cwd=REPO, check=False)


def old_contract_renamed() -> None:
    """The 22-layer contract with each module's new name (rewrite_all did that), less the four
    modules now inside a package that sits in another layer (import-linter refuses a layer that
    contains another): --check's graph comparison covers those four."""
    path = REPO / "pyproject.toml"
    text = path.read_text()
    for inside in ("knobs.cards", "knobs.recipes", "engines.run_summary", "engines.timing"):
        name = re.escape(f"moe_vlm.{inside}")
        text = re.sub(rf'\n    "{name}",', "", text)
        text = re.sub(rf" \| {name}(?=[ \"])", "", text)
    path.write_text(text)


def project_graph() -> tuple[set[str], set[tuple[str, str]]]:
    import grimp

    graph = grimp.build_graph("moe_vlm", "hydra_plugins", cache_dir=None)
    modules = {m for m in graph.modules if m.startswith(("moe_vlm", "hydra_plugins.moe_vlm_sweeper"))}
    edges = {(a, b) for a in modules for b in graph.find_modules_directly_imported_by(a) if b in modules}
    return modules, edges


def renamed(module: str) -> str:
    return DOTTED.sub(lambda m: new_dotted(m.group(1)), module)


def check(saved: Path) -> int:
    before = json.loads(saved.read_text())
    old_modules = {renamed(m) for m in before["modules"]}
    old_edges = {(renamed(a), renamed(b)) for a, b in before["edges"]}
    modules, edges = project_graph()
    new_packages = {f"moe_vlm.{p}" for p in NEW_PACKAGES} | {"moe_vlm.cli.__main__"}
    # moe_vlm/__init__ importing moe_vlm.base.noise passes through moe_vlm.base (a package init)
    added_modules = modules - old_modules - new_packages
    lost_modules = old_modules - modules
    added = {e for e in edges - old_edges if not set(e) & new_packages}
    lost = old_edges - edges
    print(f"before: {len(before['modules'])} modules, {len(before['edges'])} imports")
    print(f"after:  {len(modules)} modules ({len(new_packages)} new package faces), {len(edges)} imports")
    for label, items in (
        ("modules added", added_modules),
        ("modules lost", lost_modules),
        ("imports added", added),
        ("imports lost", lost),
    ):
        print(f"{label}: {len(items)}", *sorted(map(str, items)), sep="\n  " if items else "")
    return 1 if (added_modules or lost_modules or added or lost) else 0


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", type=Path, metavar="GRAPH.json", help="compare with a saved graph")
    args = parser.parse_args()
    if args.check:
        return check(args.check)
    move()
    rewrite_all()
    old_contract_renamed()
    return 0


if __name__ == "__main__":
    sys.exit(main())
