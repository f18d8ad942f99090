"""Every input has an owner (issue 33): every argument of every `moe-vlm` subcommand, read from its
own argparse parser (a new argument cannot escape), is given each wrong kind of value its kind
can meet; each must be refused with exit status 2 and exactly one line on stderr naming the
argument, with no traceback and nothing written anywhere under the working directory.

Not walked, with the reason: an unreadable file or directory (chmod 000) cannot be made here,
because the tests run as root and root reads it anyway; `moe-vlm advise` takes key=value words, not
argparse arguments: its `sweep=` is walked by hand below.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from moe_vlm.base import inputs
from moe_vlm.cli import main as cli
from moe_vlm.cli.commands import SUBCOMMANDS

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests" / "fixtures" / "cpu_sweep"
# Subcommands that take key=value words instead of argparse arguments (walked by hand below).
KEY_VALUE = {"advise"}
LONG = "x" * 5000  # longer than any file name the system allows
CYRILLIC_O = "\u043e"  # looks like 'o'


def _parsers() -> Iterator[tuple[str, argparse.ArgumentParser]]:
    for name, (module, _) in SUBCOMMANDS.items():
        if name in KEY_VALUE:
            continue
        yield name, importlib.import_module(module).parser()


def _arguments() -> list[tuple[str, argparse.Action]]:
    return [
        (name, action)
        for name, parser in _parsers()
        for action in parser._actions
        if not isinstance(action, argparse._HelpAction) and action.nargs != 0
    ]


def _wrong_values(kind: inputs.Kind, work: Path) -> list[tuple[str, str]]:
    """(what, value) pairs that are wrong for this kind of argument."""
    record = next(FIXTURE.glob("*/run.json")).relative_to(FIXTURE)
    common = [("empty", ""), ("huge", LONG)]
    if isinstance(kind, inputs.ReadDir):
        return [
            *common,
            ("missing", "nowhere"),
            ("file for dir", "a_file"),
            ("look-alike", f"sweep{CYRILLIC_O}"),
        ]
    if isinstance(kind, inputs.ReadPath):
        return [*common, ("missing", "nowhere"), ("look-alike", "sw\u0435\u0435p")]
    if isinstance(kind, inputs.ReadJson):
        return [
            *common,
            ("missing", "nowhere.json"),
            ("dir for file", "sweep"),
            ("corrupt", "corrupt.json"),
            ("not an object", "list.json"),
        ]
    if isinstance(kind, inputs.WriteFile):
        return [
            *common,
            ("dir for file", "sweep"),
            ("a run record", f"sweep/{record}"),
            ("under a file", "a_file/out.json"),
        ]
    if isinstance(kind, inputs.WriteDir):
        return [*common, ("file for dir", "a_file"), ("under a file", "a_file/out")]
    if isinstance(kind, inputs.Count):
        return [
            *common,
            ("negative", "-1"),
            ("zero", "0"),
            ("huge number", "1" + "0" * 30),
            ("words", "ten"),
            ("look-alike digit", "\u0663"),
            ("full-width digit", "\uff15"),
        ]
    if isinstance(kind, inputs.Number):
        return [
            *common,
            ("negative", "-1"),
            ("huge number", "1e308"),
            ("nan", "nan"),
            ("inf", "inf"),
            ("words", "x"),
            ("look-alike minus", "\u22125"),
        ]
    if isinstance(kind, inputs.Choice):
        return [
            *common,
            ("unknown", "bogus"),
            ("look-alike", kind.options[0].replace("o", CYRILLIC_O, 1) + "\u200b"),
        ]
    if isinstance(kind, inputs.Text):
        return [("empty", ""), ("control character", "a\nb")]
    if isinstance(kind, inputs.StepRange):
        return [
            *common,
            ("one number", "5"),
            ("reversed", "9-3"),
            ("zero", "0-3"),
            ("negative", "-1-3"),
            ("look-alike digit", "\u0663-9"),
            ("huge number", "1-1" + "0" * 30),
        ]
    raise AssertionError(f"no wrong values for {kind!r}: add them here")


def _snapshot(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        for p in sorted(root.rglob("*"))
    }


@pytest.fixture
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    shutil.copytree(FIXTURE, tmp_path / "sweep")
    (tmp_path / "a_file").write_text("not a directory\n")
    (tmp_path / "corrupt.json").write_text("{not json")
    (tmp_path / "list.json").write_text("[1, 2]")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MOE_VLM_SITE_FILE", "none")
    monkeypatch.setenv(inputs.CALIBRATION_ENV, str(tmp_path / "calibration.json"))
    return tmp_path


def _run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str, str]:
    try:
        code = cli.main(argv)
    except SystemExit as done:
        code = int(done.code or 0)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _valid(name: str, action: argparse.Action) -> list[str]:
    """A value that parses for a required positional (the walk varies one argument at a time)."""
    return ["sweep"] if action.required and not action.option_strings else []


def test_every_argument_has_an_owner() -> None:
    unowned = [
        f"moe-vlm {name} {action.option_strings or action.dest}"
        for name, action in _arguments()
        if not isinstance(action.type, inputs.Kind)
    ]
    assert not unowned, f"arguments without a kind from moe_vlm/base/inputs.py: {unowned}"
    assert set(SUBCOMMANDS) - KEY_VALUE == {name for name, _ in _parsers()}


CASES = [
    pytest.param(name, action.dest, what, value, id=f"{name}-{action.dest}-{what}")
    for name, action in _arguments()
    for what, value in _wrong_values(action.type, Path("."))  # type: ignore[arg-type]
]


@pytest.mark.parametrize(("name", "dest", "what", "value"), CASES)
def test_every_wrong_value_is_one_line_exit_2_and_writes_nothing(
    work: Path, capsys: pytest.CaptureFixture[str], name: str, dest: str, what: str, value: str
) -> None:
    parser = dict(_parsers())[name]
    target = next(a for a in parser._actions if a.dest == dest)
    argv: list[str] = []
    for action in parser._actions:
        if action is target:
            argv += [action.option_strings[0], value] if action.option_strings else [value]
        elif action.required and not action.option_strings:
            argv += _valid(name, action)
    before = _snapshot(work)
    code, out, err = _run(capsys, [name, *argv])
    assert code == 2, (what, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    shown = target.option_strings[0] if target.option_strings else (target.metavar or target.dest)
    assert lines[0].startswith(f"moe-vlm {name}: error: ") and str(shown) in lines[0], lines[0]
    assert _snapshot(work) == before


# --- the cases the issue reported, each through the real command -------------------------------


def test_an_output_onto_a_run_record_or_a_foreign_file_is_refused_and_kept(
    work: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    record = next((work / "sweep").glob("*/run.json"))
    mine = work / "notes.json"
    mine.write_text('{"mine": true}\n')
    before = _snapshot(work)
    for argv in (
        ["calibrate", "sweep", "--out", str(record)],
        ["report", "sweep", "--out", "rep", "--save-baseline", str(record)],
        ["calibrate", "sweep", "--out", str(mine)],
        ["report", "sweep", "--out", "rep", "--save-baseline", str(mine)],
        ["calibrate", "sweep", "--out", "sweep"],
    ):
        code, _, err = _run(capsys, argv)
        assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, (argv, err)
        assert _snapshot(work) == before, argv


def test_a_corrupt_calibration_file_is_refused_not_ignored_nor_overwritten(
    work: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    calibration = work / "calibration.json"
    calibration.write_text('{"calibrations": [')
    before = _snapshot(work)
    for argv in (["calibrate", "sweep"], ["status", "sweep"]):
        code, _, err = _run(capsys, argv)
        assert code == 2 and "calibration file" in err and len(err.strip().splitlines()) == 1, (argv, err)
    assert _snapshot(work) == before


def test_a_calibration_file_it_wrote_is_updated(work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # the quiet side: the rule refuses foreign files only
    assert _run(capsys, ["calibrate", "sweep"])[0] == 0
    assert _run(capsys, ["calibrate", "sweep"])[0] == 0
    assert json.loads((work / "calibration.json").read_text())["calibrations"]


def test_a_missing_site_file_named_in_the_environment_is_refused(
    work: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MOE_VLM_SITE_FILE", str(work / "sitee.yaml"))
    code, _, err = _run(capsys, ["status", "sweep"])
    assert code == 2 and "MOE_VLM_SITE_FILE" in err and "no such file" in err
    monkeypatch.setenv("MOE_VLM_SITE_FILE", "none")  # none on purpose
    assert _run(capsys, ["status", "sweep"])[0] == 0


@pytest.mark.parametrize(
    ("variable", "value"), [("MOE_VLM_CALIBRATION", "sweep"), ("MOE_VLM_CACHE_DIR", "a_file")]
)
def test_a_path_of_the_wrong_kind_in_the_environment_is_refused(
    work: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, str(work / value))
    before = _snapshot(work)
    code, _, err = _run(capsys, ["status", "sweep"])
    assert code == 2 and err.startswith(f"moe-vlm status: error: {variable}=") and len(err.splitlines()) == 1
    assert _snapshot(work) == before


@pytest.mark.parametrize("value", ["", "a_file", "nowhere", LONG])
def test_advise_sweep_of_the_wrong_kind_is_one_line_exit_2(
    work: Path, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    before = _snapshot(work)
    code, _, err = _run(capsys, ["advise", f"sweep={value}"])
    assert code == 2 and len(err.strip().splitlines()) == 1 and "sweep=" in err and "Traceback" not in err
    assert _snapshot(work) == before


def test_a_report_never_overwrites_a_file_of_its_names_it_did_not_write(
    work: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = work / "rep"
    out.mkdir()
    (out / "report.md").write_text("# my notes, not a report\n")
    before = _snapshot(work)
    code, _, err = _run(capsys, ["report", "sweep", "--out", "rep"])
    assert code == 2 and "report.md" in err and len(err.strip().splitlines()) == 1, err
    assert _snapshot(work) == before
    (out / "report.md").unlink()  # the quiet side: its own earlier report is replaced
    assert _run(capsys, ["report", "sweep", "--out", "rep"])[0] == 0
    assert _run(capsys, ["report", "sweep", "--out", "rep"])[0] == 0
