"""Declared shapes of JSON records, checked once where a record is read (RunRecord.read, read_steps).

A record on disk can be anything: a truncated file, an array, binary bytes, a NaN, a number with
4,000 digits, an object nested 10,000 deep, or a record whose `summary` holds a string where a
number belongs. Readers (report, status, advise, report --diff) format and add the values they
read, so each would crash on its own kind of bad value. Instead the reader checks the record
against a declared shape and either hands out a record every reader can use, or says in one line
which value is wrong. Shapes declare only what readers use; other keys pass as they are.

A shape is one of:
- `NUMBER`: a finite float at most MAX_MAGNITUDE in size, or an int at most MAX_INTEGER (never a
  bool); `REAL` the same or NaN or infinity;
- `INT`: an int (not a bool), at most MAX_INTEGER in size;
- `STR`, `BOOL`, `DICT` (any object), `LIST` (any array), `SCALAR` (str, bool or a NUMBER);
- a dict {key: shape}: an object whose listed keys, where present, have their shapes
  (`Required(shape)`: the key must be present and not null);
- `ListOf(shape)`, `MapOf(shape)`: an array, an object (any keys), whose items have the shape.

`None` (JSON null) passes everywhere: a reader treats a missing value and null alike.

Here too: the shape of run.json (RUN_SHAPE, SUMMARY_SHAPE; the knobs' kinds sit beside KNOBS in
moe_vlm/record/records.py) and of point.json (POINT_SHAPE), `load_json` for a record file and `RecordError`, the one-line reason a
command prints for a record it skips.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Larger magnitudes are not measurements; they overflow a float (OverflowError) when formatted.
MAX_MAGNITUDE = 1e300
# Larger integers are no count either; a table column cannot hold them (Parquet's is 64-bit), and
# a float holds every integer up to here exactly.
MAX_INTEGER = 2**53
# Records are a few levels deep; deeper ones exhaust the recursion of whoever walks them.
MAX_DEPTH = 32


class Kind:
    """A leaf shape, named for the message."""

    def __init__(self, name: str, types: tuple[type, ...], finite: bool = True) -> None:
        self.name = name
        self.types = types
        self.finite = finite

    def __repr__(self) -> str:
        return self.name


NUMBER = Kind("a finite number", (int, float))
# NaN and infinity allowed: a diverged loss or gradient norm is still what the step measured.
REAL = Kind("a number", (int, float), finite=False)
INT = Kind("an integer", (int,))
STR = Kind("a string", (str,))
BOOL = Kind("true or false", (bool,))
DICT = Kind("an object", (dict,))
LIST = Kind("an array", (list,))
SCALAR = Kind("a string, number or boolean", (str, bool, int, float))


@dataclass(frozen=True)
class Required:
    item: Any


@dataclass(frozen=True)
class ListOf:
    item: Any


@dataclass(frozen=True)
class MapOf:
    item: Any


def _number_problem(value: Any, finite: bool) -> str | None:
    if isinstance(value, float) and not math.isfinite(value):
        return f"{value}" if finite else None
    if abs(value) > (MAX_INTEGER if isinstance(value, int) else MAX_MAGNITUDE):
        return "a number beyond any measurement"
    return None


def _describe(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:40]}{'...' if len(text) > 40 else ''}"


def problem(value: Any, shape: Any, where: str) -> str | None:
    """The first way `value` (at `where`, a dotted path) breaks `shape`, in words; None when it fits."""
    if value is None:
        return f"{where} is missing" if type(shape) is Required else None
    kind = type(shape)
    if kind is Required:
        return problem(value, shape.item, where)
    if kind is Kind:
        # The common case first, by exact type (json.loads makes no subclasses): steps.jsonl
        # lines are read by the hundred thousand.
        t = type(value)
        if t is float:
            if float in shape.types and -MAX_MAGNITUDE <= value <= MAX_MAGNITUDE:
                return None
        elif t is int:
            if int in shape.types and -MAX_INTEGER <= value <= MAX_INTEGER:
                return None
        elif t in shape.types:
            return None
        # Anything else: a subclass (a StrEnum), NaN, a number out of range, or a wrong type.
        if not isinstance(value, shape.types) or (isinstance(value, bool) and bool not in shape.types):
            return f"{where} is {_describe(value)}, not {shape.name}"
        if isinstance(value, int | float) and not isinstance(value, bool):
            bad = _number_problem(value, shape.finite)
            return f"{where} is {bad}, not {shape.name}" if bad else None
        return None
    # Containers: the path of an item is spelled out only when it is wrong (no string per item).
    if kind is dict:
        if not isinstance(value, dict):
            return f"{where} is {_describe(value)}, not an object"
        for key, inner in shape.items():
            item = value.get(key)
            if (item is not None or type(inner) is Required) and problem(item, inner, where):
                return problem(item, inner, f"{where}.{key}")
        return None
    if kind is ListOf:
        if not isinstance(value, list):
            return f"{where} is {_describe(value)}, not an array"
        for index, item in enumerate(value):
            if problem(item, shape.item, where):
                return problem(item, shape.item, f"{where}[{index}]")
        return None
    if kind is MapOf:
        if not isinstance(value, dict):
            return f"{where} is {_describe(value)}, not an object"
        for key, item in value.items():
            if problem(item, shape.item, where):
                return problem(item, shape.item, f"{where}.{key}")
        return None
    raise TypeError(f"not a shape: {shape!r}")


_CONTAINERS = (dict, list)  # what json.loads nests: exact types
# A JSON escape of a UTF-16 surrogate: the only way a record decoded from UTF-8 holds text that
# cannot be printed or written back (a lone surrogate); a pair is one character, and fine.
SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def not_unicode(value: Any) -> bool:
    """Whether a string anywhere in `value` (keys too) holds a lone surrogate, which no terminal,
    CSV or Parquet writer can encode."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode()
            except UnicodeEncodeError:
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def too_deep(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether arrays and objects nest deeper than `limit` (walked level by level, no recursion)."""
    level = [value] if type(value) in _CONTAINERS else []
    for _ in range(limit):
        below: list[Any] = []
        for item in level:
            children = item.values() if type(item) is dict else item
            below += [child for child in children if type(child) in _CONTAINERS]
        if not below:
            return False
        level = below
    return bool(level)


# --- what the readers of run.json use, checked by RunRecord.from_json ---------------------------
#
# report, status, advise and report --diff format and add these values; a record where one of them
# has another type is not used (RecordError says which). metrics.summarize writes `summary`.
_SECONDS = MapOf(NUMBER)
_PEAK = {"name": STR, "flops": NUMBER}
SUMMARY_SHAPE: dict[str, Any] = {
    **dict.fromkeys(
        (
            "effective_tokens_per_s_per_gpu", "nominal_tokens_per_s_per_gpu", "padded_tokens_per_s_per_gpu",
            "loss_tokens_per_s_per_gpu", "image_tokens_per_s_per_gpu", "tflops_per_gpu",
            "bridge_tflops_per_gpu", "hardware_tflops_per_gpu", "mfu", "mfu_precision", "peak_memory_gib",
            "component_coverage", "padding_fraction",
        ),
        NUMBER,
    ),
    **dict.fromkeys(("mfu_note", "mfu_precision_note", "memory_kind"), STR),
    "world_size": INT,
    "steady_steps": ListOf(INT),
    "steady_window": {"steps": INT, "text": STR},
    "peak": _PEAK,
    "precision_peak": {**_PEAK, "kind": STR},
    "errors": ListOf(STR),
    "step_time_s": _SECONDS,
    "tokens_per_step": _SECONDS,
    "flops_per_step": {**dict.fromkeys(("model", "bridge", "hardware", "recompute"), NUMBER),
                       "model_by_module": _SECONDS},
    "components": _SECONDS,
    "flops_basis": {
        **dict.fromkeys(("bridge_flops", "model_flops", "useful_fraction", "real_fraction", "positions_per_sample",
                         "real_tokens_per_sample", "patches_per_sample"), NUMBER),
        "terms": ListOf({"name": STR, "flops": NUMBER, "why": STR}),
    },
    "component_time_s_per_rank_step": _SECONDS,
    "data_wait": {"mean_s": NUMBER, "max_s": NUMBER, "fraction_of_step_time": NUMBER, "rank_steps": INT},
    "device_memory": MapOf(SCALAR),
    "per_rank": ListOf(
        {"rank": Required(INT), "host": STR, "steps": INT, "median_s": Required(_SECONDS), "median_load": _SECONDS}
    ),
}  # fmt: skip
RUN_SHAPE: dict[str, Any] = {
    "status": Required(STR),
    "schema_version": INT,
    "point_id": STR,
    "engine": STR,
    **dict.fromkeys(("config", "data", "env", "layout"), DICT),
    "spec": {"warmup_steps": INT},
    "summary": SUMMARY_SHAPE,
    "findings": ListOf({"code": SCALAR, "level": STR, "message": STR}),
    "failure": {"class": STR, "message": STR, "evidence": STR, "log_tail": ListOf(STR)},
    "launch": {"restarts": INT},
    # A running record's process (moe_vlm/runtime/heartbeat.py); Bridge's effective config (report --diff).
    "process": {"pid": INT, "host": STR, "started_unix_s": NUMBER, "pid_start_ticks": INT},
    "bridge": {"effective": {"sections": MapOf(DICT)}},
}

# point.json (the sweeper's, moe_vlm/runtime/points.py): what `moe-vlm status` reads of it.
_SUBMISSION = {
    "executor": STR,
    "job_id": SCALAR,
    "canary": {"job_id": Required(SCALAR), "dir": Required(STR)},
    "pack": {"index": Required(INT), "size": Required(INT)},
}
POINT_SHAPE: dict[str, Any] = {
    "point_id": STR,
    "job_id": SCALAR,
    "overrides": ListOf(SCALAR),
    "launcher_overrides": ListOf(SCALAR),
    "config": DICT,
    "submitit_folder": STR,
    "submissions": ListOf(_SUBMISSION),
    "refused": ListOf(DICT),  # {code, message} of each error finding (the sweeper's, or the canary's)
}


class RecordError(ValueError):
    """A record file its readers cannot use: the file, and why in a few words."""

    def __init__(self, path: Path, why: str) -> None:
        super().__init__(f"{path}: {why}")
        self.path = path
        self.why = why

    def skipped(self, prog: str) -> str:
        """The one line a command prints for a record it leaves out."""
        return f"{prog}: skipped {self.path}: {self.why}"


def load_json(path: Path) -> Any:
    """A JSON record file as its value; RecordError when it is missing, unreadable, not UTF-8 text,
    not JSON (a truncated file), or nested deeper than shape.MAX_DEPTH."""
    try:
        text = path.read_bytes().decode()
    except FileNotFoundError:
        raise RecordError(path, "no such file") from None
    except OSError as exc:
        raise RecordError(path, f"unreadable ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise RecordError(path, "not text (binary bytes)") from None
    if not text.strip():
        raise RecordError(path, "empty file")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RecordError(path, f"not JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    except (ValueError, RecursionError) as exc:  # an integer too long to convert; nesting
        raise RecordError(path, f"not JSON a reader can hold ({str(exc).split(';')[0]})") from None
    if too_deep(value):
        raise RecordError(path, f"nested deeper than {MAX_DEPTH} levels")
    if SURROGATE_ESCAPE.search(text) and not_unicode(value):
        raise RecordError(path, "text that is not Unicode (a lone surrogate escape)")
    return value
