"""One place for the names of a run's files (moe_vlm/base/files.py: RunPaths and its constants)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from moe_vlm.base import files, safety
from moe_vlm.base.files import RunPaths
from moe_vlm.record.records import SCHEMA_VERSION, RunRecord, RunStatus
from moe_vlm.runtime import failures, points

ROOT = Path(__file__).resolve().parents[2]
NAMES = {
    files.RUN_JSON,
    files.STEPS_JSONL,
    files.HEARTBEAT_JSON,
    files.POINT_JSON,
    files.REQUEUE_MARKER,
    files.PREVIOUS_REQUEUE_MARKER,
    files.CANARY_JSON,
}


def spelled(path: Path) -> list[str]:
    """String literals (f-string parts included) naming a run file, outside docstrings."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name}:{node.lineno}: {node.value!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
        and any(node.value == name or node.value.endswith(f"/{name}") for name in NAMES)
    ]


def test_only_files_py_spells_a_run_file_name() -> None:
    sources = [ROOT / "train.py", *(ROOT / "moe_vlm").rglob("*.py"), *(ROOT / "hydra_plugins").rglob("*.py")]
    found = [
        hit for path in sources if path != ROOT / "moe_vlm" / "base" / "files.py" for hit in spelled(path)
    ]
    assert found == [], "use moe_vlm.base.files (RunPaths or its constants):\n" + "\n".join(found)


def test_the_checker_sees_a_spelled_name(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        '"""run.json in a docstring is fine."""\nPATH = "x/steps.jsonl"\nNAME = f"{1}run.json"\n'
    )
    assert [hit.split(": ", 1)[1] for hit in spelled(probe)] == ["'x/steps.jsonl'", "'run.json'"]


def test_archive_moves_every_attempt_file(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path)
    for path in (
        paths.run_json,
        paths.steps,
        paths.heartbeat,
        paths.requeue_marker,
        paths.previous_requeue_marker,
        paths.preflight,
    ):
        path.write_text("{}")
    paths.point_json.write_text("{}")
    target = points.archive_attempt(tmp_path)
    assert target == paths.attempts / "1"
    assert sorted(p.name for p in target.iterdir()) == sorted(RunPaths.ATTEMPT_FILES)
    assert paths.attempt_files() == [] and paths.point_json.exists()


def test_one_atomic_writer() -> None:
    """Only write_atomic renames a file over another (energon.py and bridge_processor.py rename a
    staging directory into place)."""
    allowed = {
        ROOT / "moe_vlm" / "base" / "files.py",
        ROOT / "moe_vlm" / "data" / "energon.py",
        ROOT / "moe_vlm" / "data" / "bridge_processor.py",
    }
    sources = [*(ROOT / "moe_vlm").rglob("*.py"), *(ROOT / "hydra_plugins").rglob("*.py")]
    found = [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for path in sources
        if path not in allowed
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute) and node.attr in {"replace", "rename"} and _is_os(node.value)
    ]
    assert found == [], "write through moe_vlm.base.files.write_atomic:\n" + "\n".join(found)


def _is_os(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id == "os"


def test_scrub_files_writes_through_write_atomic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_abcdefghijklmnopqrstuvwxyz0123")
    path = tmp_path / "run.txt"
    path.write_text("token hf_abcdefghijklmnopqrstuvwxyz0123\n")
    written: list[Path] = []

    def write_atomic(p: Path, data: bytes | str) -> None:
        written.append(p)
        files.write_atomic(p, data)

    monkeypatch.setattr(safety, "write_atomic", write_atomic)
    safety.scrub_files([path])
    assert written == [path] and "hf_abc" not in path.read_text()
    assert [p.name for p in tmp_path.iterdir()] == ["run.txt"]


def test_a_point_without_a_spec_fails_through_the_record_type(tmp_path: Path) -> None:
    """failures.base_from_point: a config that no longer builds a RunSpec still gets the run.json a
    RunRecord writes (the current schema version, status failed)."""
    points.write_point(tmp_path, {"point_id": "abc123", "config": {"removed_knob": 1}})
    base = failures.base_from_point(tmp_path)
    assert base == RunRecord(status=RunStatus.failed, config={"removed_knob": 1}, point_id="abc123").to_json()
    assert base["schema_version"] == SCHEMA_VERSION and base["status"] == "failed"
    RunRecord.of(base)  # readable as a record
