"""Records never crash a command: `moe-vlm report`, `status`, `advise sweep=` and `report --diff`
over seeded mutations of a real CPU sweep's run.json and steps.jsonl (tests/fixtures/cpu_sweep).

Each mutation breaks one point's records the way disks, editors and killed writers do:
truncation, binary bytes, a value of the wrong type, an array where an object belongs, NaN and
infinity, numbers too large for a float or too long to convert, missing and extra keys, nesting
deep enough to exhaust a recursive reader; some first turn the record into a `running` one whose
process is gone, so status and report settle it from its steps. The commands run in process
(their `main`) with the real readers, writers and plots; a few cases run the console script.
Every command must return 0 (some run was read) or 2 (none was), never raise, and name each
record it leaves out in one line, exactly those RunRecord.read refuses.
"""

from __future__ import annotations

import contextlib
import io
import json
import random
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from moe_vlm.base.files import POINT_JSON, RUN_JSON, STEPS_JSONL
from moe_vlm.cli import report as report_cli
from moe_vlm.cli.advise import main as advise_main
from moe_vlm.launch import status
from moe_vlm.record.records import RecordError, RunRecord, read_steps
from moe_vlm.runtime import points
from tests.conftest import REPO

FIXTURE = REPO / "tests" / "fixtures" / "cpu_sweep"
POINTS = sorted(p.name for p in FIXTURE.iterdir() if p.is_dir())
SEED = 18
MUTATIONS = 1000
REPORT_BATCH = 125  # mutated points per in-process report: one table mixes their bad values
# Values a mutation puts where another belongs (JSON ones: json.dumps writes NaN and Infinity).
VALUES: list[Any] = [
    None, True, False, 0, -1, 7, 1.5, -2.5e-9, 10**30, 1e308, -1e308, float("nan"), float("inf"),
    float("-inf"), "", "x", "NaN", "completed", "running", [], {}, [1, "a"], {"a": {"b": []}},
    [[[[]]]], {"status": "completed"},
]  # fmt: skip
# Text a mutation puts in place of a JSON value: what json.dumps cannot write.
RAW_VALUES = ["1" + "0" * 5000, "1e999", "-1e999", "[" * 40 + "]" * 40, "[" * 5000 + "]" * 5000, '"\\ud800"']


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a value inside `value` (dict keys, list indices), the root included."""
    out = [prefix]
    if len(prefix) > 8:  # a record nested deep by an earlier mutation
        return out
    if isinstance(value, dict):
        for key, item in value.items():
            out += _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value[:4]):
            out += _paths(item, (*prefix, index))
    return out


def _set(root: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    parent = root
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = value
    return root


def mutate_json(value: Any, rng: random.Random) -> tuple[str, str]:
    """One structural mutation of a parsed record, written back as text; (text, what was done)."""
    paths = _paths(value)
    # Prefer the values readers use: summary, status, config knobs, spec.
    path = rng.choice(
        [p for p in paths if p and p[0] in ("summary", "status", "spec", "config", "failure")] or paths
    )
    op = rng.choice(["delete", "replace", "replace", "raw", "extra", "wrap", "root"])
    where = ".".join(map(str, path)) or "(root)"
    if op == "delete" and path:
        parent = value
        for key in path[:-1]:
            parent = parent[key]
        del parent[path[-1]]
        return json.dumps(value), f"delete {where}"
    if op == "extra":
        target = value
        for key in path:
            target = target[key]
        if isinstance(target, dict):
            target[f"unknown_{rng.randint(0, 99)}"] = rng.choice(VALUES)
            return json.dumps(value), f"extra key in {where}"
    if op == "wrap":
        return json.dumps([value]), "the record inside an array"
    if op == "root":
        replacement = rng.choice(VALUES)
        return json.dumps(replacement), f"the record replaced by {replacement!r}"
    if op == "raw":
        marker = "__MUTATION__"
        raw = rng.choice(RAW_VALUES)
        return json.dumps(_set(value, path, marker)).replace(f'"{marker}"', raw), f"{where} = {raw[:20]}..."
    replacement = rng.choice(VALUES)
    return json.dumps(_set(value, path, replacement)), f"{where} = {replacement!r}"


def mutate_text(text: str, rng: random.Random) -> tuple[bytes, str]:
    """One byte-level mutation; (bytes, what was done)."""
    data = text.encode()
    op = rng.choice(["truncate", "bytes", "binary", "empty", "number", "nest"])
    if op == "truncate":
        at = rng.randrange(len(data) or 1)
        return data[:at], f"truncated at byte {at}"
    if op == "bytes":
        at = rng.randrange(len(data) or 1)
        return data[:at] + rng.randbytes(rng.randint(1, 16)) + data[at + 1 :], f"random bytes at {at}"
    if op == "binary":
        return rng.randbytes(rng.randint(1, 400)), "binary bytes"
    if op == "empty":
        return b"", "empty"
    if op == "number":
        raw = rng.choice(["1" + "0" * 5000, "1e999", "NaN", "-Infinity", "1e400"])
        digits = [i for i in range(1, len(text)) if text[i].isdigit() and text[i - 1] in " :["]
        if digits:
            at = rng.choice(digits)
            end = at
            while end < len(text) and (text[end].isdigit() or text[end] in ".e-+"):
                end += 1
            return (text[:at] + raw + text[end:]).encode(), f"a number at {at} = {raw[:12]}"
    depth = rng.choice([33, 1000, 200_000])
    return ("[" * depth + text + "]" * depth).encode(), f"nested {depth} deep"


def running(raw: dict[str, Any]) -> dict[str, Any]:
    """The record as a run killed before its final write leaves it: `running`, its process gone."""
    return {
        **raw,
        "status": "running",
        "process": {"host": "a-node-long-gone", "pid": 123, "started_unix_s": 1_700_000_000.0},
    }


def mutate_point(point: Path, rng: random.Random) -> list[str]:
    """One to three mutations of the point's run.json and steps.jsonl, sometimes one of its
    point.json; what was done."""
    done = []
    run_file, steps_file = point / RUN_JSON, point / STEPS_JSONL
    if rng.random() < 0.3:
        run_file.write_text(json.dumps(running(json.loads(run_file.read_text()))))
        done.append("running, process gone")
    for _ in range(rng.randint(1, 3)):
        if rng.random() < 0.65:
            text = run_file.read_text(errors="replace")
            try:
                value = json.loads(text)
            except (ValueError, RecursionError):
                value = None
            if value is not None and rng.random() < 0.7:
                new, what = mutate_json(value, rng)
                run_file.write_text(new)
            else:
                blob, what = mutate_text(text, rng)
                run_file.write_bytes(blob)
            done.append(f"run.json: {what}")
        else:
            lines = steps_file.read_text(errors="replace").splitlines()
            index = rng.randrange(len(lines)) if lines else 0
            if lines and rng.random() < 0.7:
                try:
                    new, what = mutate_json(json.loads(lines[index]), rng)
                except (ValueError, RecursionError):
                    new, what = "", "emptied"
                lines[index] = new
                steps_file.write_text("\n".join(lines) + "\n")
            else:
                blob, what = mutate_text("\n".join(lines), rng)
                steps_file.write_bytes(blob)
            done.append(f"steps.jsonl line {index}: {what}")
    if rng.random() < 0.15:  # the sweeper's point.json, which status reads too
        point_file = point / POINT_JSON
        if rng.random() < 0.7:
            new, what = mutate_json(json.loads(point_file.read_text()), rng)
            point_file.write_text(new)
        else:
            blob, what = mutate_text(point_file.read_text(), rng)
            point_file.write_bytes(blob)
        done.append(f"point.json: {what}")
    return done


def call(
    main: Callable[[list[str]], int], argv: list[str], what: str, out: io.StringIO | None = None
) -> tuple[int, str]:
    """main(argv) in process: its exit status and stderr (its stdout into `out`); any exception fails
    the test, naming the mutation."""
    out, err = out or io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(argv)
    except BaseException as exc:  # SystemExit too: a command returns its status
        pytest.fail(f"{main.__module__}.main{argv} raised {exc!r} on: {what}")
    assert code in (0, 2), f"{main.__module__}.main{argv} returned {code} on: {what}\n{err.getvalue()}"
    return code, err.getvalue()


def refused(run_file: Path) -> RecordError | None:
    try:
        RunRecord.read(run_file)
    except RecordError as exc:
        return exc
    return None


def test_no_mutation_of_a_real_sweeps_records_crashes_a_command(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    batch = tmp_path / "batch"
    batch_refused: list[Path] = []
    mutated = 0
    for number in range(MUTATIONS):
        sweep = tmp_path / f"m{number}"
        shutil.copytree(FIXTURE, sweep)
        target = sweep / POINTS[number % len(POINTS)]
        what = f"mutation {number} (seed {SEED}) of {target.name}: " + "; ".join(mutate_point(target, rng))
        bad = refused(target / RUN_JSON)
        try:
            points.read_point_checked(target)
            point_bad = None
        except RecordError as exc:
            point_bad = exc

        shown = io.StringIO()
        code, err = call(status.main, [str(sweep)], what, shown)
        assert code == 0, f"status found no point on: {what}\n{err}"  # the other point is intact
        first = point_bad or bad  # status reads point.json first
        if first is not None:  # listed and counted, never left out as if the sweep were smaller
            table = shown.getvalue()
            assert f": {len(POINTS)} point(s), 1 with a record that cannot be read" in table, what
            assert f"{status.UNREADABLE} " in table and f"{first.path.name}: {first.why}" in table, what
        code, err = call(advise_main, [f"sweep={sweep}"], what)
        assert code == 0, f"advise read no run on: {what}\n{err}"
        other = sweep / next(p for p in POINTS if p != target.name)
        code, err = call(report_cli.main, ["--diff", str(target), str(other)], what)
        assert code == (2 if bad is not None else 0), f"--diff on: {what}\n{err}"
        assert len(err.splitlines()) <= 2, f"--diff wrote more than a line per problem on: {what}\n{err}"

        # The mutated run.json as status left it (it may have settled a killed run), into the batch.
        shutil.copytree(target, batch / str(number))
        if refused(batch / str(number) / RUN_JSON) is not None:
            batch_refused.append(batch / str(number) / RUN_JSON)
        mutated += bad is not None
        shutil.rmtree(sweep)
        if (number + 1) % REPORT_BATCH == 0:
            shutil.copytree(FIXTURE / POINTS[0], batch / "intact")
            code, err = call(
                report_cli.main, [str(batch), "--out", str(tmp_path / "out")], f"batch up to {number}"
            )
            assert code == 0, err
            skipped = sorted(line for line in err.splitlines() if line.startswith("moe-vlm report: skipped "))
            assert skipped == sorted(f"moe-vlm report: skipped {e}" for e in map(refused, batch_refused) if e)
            assert len(err.splitlines()) == len(skipped), err  # nothing else on stderr
            shutil.rmtree(batch)
            batch_refused = []
    # The mutations reach both outcomes: many records refused, many still read.
    assert 0.2 * MUTATIONS < mutated < 0.9 * MUTATIONS, mutated


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b"[]", "a run record is a JSON object, not an array"),
        (bytes(range(256)) * 2, "not text (binary bytes)"),
        (b'{"status": 5, "summary": "x"}', "status is int 5, not a string"),
        (b'{"status": "completed", "summary": "x"}', "summary is str 'x', not an object"),
        (b'{"status": "completed", "config"', "not JSON (Expecting ':' delimiter at line 1 column 33)"),
    ],
)
def test_report_skips_an_unusable_record_with_one_line(tmp_path: Path, content: bytes, why: str) -> None:
    moe_vlm = str(REPO / ".venv" / "bin" / "moe-vlm")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / RUN_JSON).write_bytes(content)
    alone = subprocess.run(
        [moe_vlm, "report", str(tmp_path / "bad")], capture_output=True, text=True, timeout=300
    )
    assert alone.returncode == 2, alone.stderr
    lines = alone.stderr.splitlines()
    assert lines[0] == f"moe-vlm report: skipped {tmp_path / 'bad' / RUN_JSON}: {why}"
    assert len(lines) == 2 and lines[1].startswith("moe-vlm report: error: none of the 1 run.json")
    shutil.copytree(FIXTURE / POINTS[0], tmp_path / "good")
    both = subprocess.run([moe_vlm, "report", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert both.returncode == 0, both.stderr
    assert both.stderr.splitlines() == [lines[0]]
    assert "1 runs: 1 completed." in both.stdout


def test_status_on_a_directory_that_is_not_a_sweep_is_one_line_exit_2(tmp_path: Path) -> None:
    moe_vlm = str(REPO / ".venv" / "bin" / "moe-vlm")
    shutil.copytree(FIXTURE / POINTS[0], tmp_path / "run")
    for directory, hint in (
        (tmp_path / "run", "for this one run: moe-vlm report"),
        (tmp_path / "run" / ".hydra", ""),
    ):
        done = subprocess.run(
            [moe_vlm, "status", str(directory)], capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 2 and done.stdout == ""
        assert done.stderr.count("\n") == 1 and f"{directory}: not a sweep directory" in done.stderr
        assert hint in done.stderr
    # A sweep whose every record is unusable: each listed (state unreadable, the file and why), then
    # one line and exit 2.
    sweep = tmp_path / "sweep"
    shutil.copytree(FIXTURE, sweep)
    for point in POINTS:
        (sweep / point / RUN_JSON).write_text("[]")
    done = subprocess.run([moe_vlm, "status", str(sweep)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith(f"{status.UNREADABLE} ")]
    assert len(rows) == len(POINTS) and all(f"{RUN_JSON}: " in row for row in rows), done.stdout


def test_read_steps_keeps_the_steps_and_skips_what_is_no_step(tmp_path: Path) -> None:
    lines = (FIXTURE / POINTS[0] / STEPS_JSONL).read_text().splitlines()
    first, second = json.loads(lines[0]), json.loads(lines[1])
    diverged = {**second, "loss": float("nan"), "grad_norm": float("inf")}  # measured: kept
    bad = [
        {**first, "step_time_s": "1.5"},
        {**first, "step_time_s": float("nan")},
        {**first, "sequences": None},
        {**first, "tokens": {"real": 1.5}},
        {**first, "components_s": [1, 2]},
        {**first, "rank": 10**40},
        [first],
        {k: v for k, v in first.items() if k != "step"},
    ]
    text = "\n".join([json.dumps(first), *map(json.dumps, bad), "\x00\xff binary", json.dumps(diverged)])
    (tmp_path / STEPS_JSONL).write_text(text + '\n{"step": 3, "step_ti')  # and a torn last line
    steps = read_steps(tmp_path / STEPS_JSONL)
    assert [(s.step, s.rank) for s in steps] == [
        (first["step"], first["rank"]),
        (second["step"], second["rank"]),
    ]
    assert steps[1].grad_norm == float("inf") and steps[1].loss != steps[1].loss  # NaN kept
