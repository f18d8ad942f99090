"""Every input the tool reads has one owner: this module (docs/inputs.md lists them all).

A command-line argument is checked by its argparse `type=` (one of the kinds below), so a bad
value is refused while parsing, before anything is read or written; an environment variable or a
file named by one is checked where it is first read, by the functions at the end. Each refusal is
one line naming the input, what it allows and a fix; `Parser` prints it and exits with status 2.

Outputs have one rule too (`output_file`): never over a directory, a run record or a file the
tool did not write (an existing file must pass the caller's `ours` test), and always atomically
(base/files.write_atomic), so a refused or killed command leaves nothing half-written.

tests/unit/test_inputs.py walks every argument of every `moe-vlm` subcommand, read from the
parsers themselves, with the wrong kinds of value: an argument whose `type=` is not a kind here
fails that test, so a new argument cannot escape.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, NoReturn

from moe_vlm.base.errors import EXIT_INVALID, BadInput
from moe_vlm.base.files import HEARTBEAT_JSON, POINT_JSON, RUN_JSON, STEPS_JSONL, RunPaths

# Files a run or a sweep writes and readers trust: a command never writes its own output over one.
RECORD_NAMES = frozenset(
    {*RunPaths.ATTEMPT_FILES, RUN_JSON, STEPS_JSONL, HEARTBEAT_JSON, POINT_JSON, "plan.json"}
)
# Far beyond any real value, and small enough that time.sleep, range() and a table never overflow.
MAX_SECONDS = 7 * 24 * 3600.0
MAX_COUNT = 1_000_000


class Parser(argparse.ArgumentParser):
    """argparse with the house error: one line, naming the argument, exit status 2."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {one_line(message)} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(EXIT_INVALID)


def one_line(text: str) -> str:
    return " ".join(str(text).split())


def refuse(prog: str, exc: BaseException) -> int:
    """Print a BadInput (or any message) as the one-line refusal; return the exit status."""
    print(f"{prog}: error: {one_line(str(exc))}", file=sys.stderr)
    return EXIT_INVALID


# --- kinds of command-line value (argparse `type=`); each has `kind`, read by the argument walk ---


class Kind:
    """An argparse type: parse `text` or raise ArgumentTypeError with the allowed values and a fix."""

    kind = ""
    example = ""

    def __call__(self, text: str) -> Any:
        raise NotImplementedError

    def bad(self, text: str, why: str) -> NoReturn:
        # A long path keeps its end (the name that is wrong); a huge value does not fill the screen.
        shown = text if len(text) <= 240 else text[:40] + "..." + text[-160:]
        raise argparse.ArgumentTypeError(f"{shown!r}: {why}. Fix: e.g. {self.example}")

    def __repr__(self) -> str:  # argparse names the type in some messages
        return self.kind


def _ascii_number(kind: Kind, text: str) -> str:
    # int() and float() accept any Unicode digit ('٣' is 3) and full-width forms: refuse look-alikes.
    if not text.isascii():
        kind.bad(text, "not a plain ASCII number (a look-alike character)")
    return text.strip()


class Count(Kind):
    """A whole number in [low, MAX_COUNT]."""

    kind = "count"

    def __init__(self, low: int = 1, example: str = "10") -> None:
        self.low, self.example = low, example

    def __call__(self, text: str) -> int:
        try:
            value = int(_ascii_number(self, text))
        except ValueError:
            self.bad(text, f"not a whole number; allowed: {self.low} to {MAX_COUNT}")
        if not self.low <= value <= MAX_COUNT:
            self.bad(text, f"out of range; allowed: {self.low} to {MAX_COUNT}")
        return value


class Number(Kind):
    """A finite number in [low, high] (low excluded when `open_low`, high excluded when `open_high`)."""

    kind = "number"

    def __init__(
        self, low: float, high: float, example: str, open_low: bool = False, open_high: bool = False
    ) -> None:
        self.low, self.high, self.example = low, high, example
        self.open_low, self.open_high = open_low, open_high

    def __call__(self, text: str) -> float:
        allowed = f"{'above' if self.open_low else 'from'} {self.low:g} {'and below' if self.open_high else 'to'} {self.high:g}"
        try:
            value = float(_ascii_number(self, text))
        except ValueError:
            self.bad(text, f"not a number; allowed: {allowed}")
        low_ok = value > self.low if self.open_low else value >= self.low
        high_ok = value < self.high if self.open_high else value <= self.high
        if not (math.isfinite(value) and low_ok and high_ok):
            self.bad(text, f"out of range; allowed: {allowed}")
        return value


class StepRange(Kind):
    """FIRST-LAST: a window of optimizer steps, 1 <= FIRST <= LAST <= MAX_COUNT."""

    kind = "steps"

    def __init__(self, example: str = "5-20") -> None:
        self.example = example

    def __call__(self, text: str) -> tuple[int, int]:
        first, dash, last = text.partition("-")
        if not dash or not first.isascii() or not last.isascii() or not first.isdigit() or not last.isdigit():
            self.bad(text, "not FIRST-LAST (two whole step numbers)")
        low, high = int(first), int(last)
        if not 1 <= low <= high <= MAX_COUNT:
            self.bad(text, f"out of range; allowed: 1 <= FIRST <= LAST <= {MAX_COUNT}")
        return low, high


def _probe(kind: Kind, text: str) -> Path:
    """The path `text` names, refused when empty or when the system cannot even look at it."""
    if not text.strip():
        kind.bad(text, "empty path")
    if "\x00" in text:
        kind.bad(text, "contains a NUL character")
    path = Path(text).expanduser()
    try:
        path.exists()
    except OSError as exc:  # a name too long, a loop of links: the system refuses to look
        kind.bad(text, f"cannot be looked up ({exc.strerror or exc})")
    return path


class ReadDir(Kind):
    """An existing directory."""

    kind = "directory"

    def __init__(self, example: str) -> None:
        self.example = example

    def __call__(self, text: str) -> Path:
        path = _probe(self, text)
        if not path.exists():
            self.bad(text, "no such directory")
        if not path.is_dir():
            self.bad(text, "a file, not a directory")
        if not os.access(path, os.R_OK | os.X_OK):
            self.bad(text, "not readable")
        return path


class ReadPath(Kind):
    """An existing file or directory, or a glob (checked when expanded: it must match something)."""

    kind = "file or directory"

    def __init__(self, example: str, globs: bool = False) -> None:
        self.example, self.globs = example, globs

    def __call__(self, text: str) -> str:
        path = _probe(self, text)
        if self.globs and any(c in text for c in "*?["):
            return text
        if not path.exists():
            self.bad(text, "no such file or directory")
        if not os.access(path, os.R_OK):
            self.bad(text, "not readable")
        return text


class ReadJson(Kind):
    """An existing, readable JSON file holding an object."""

    kind = "JSON file"

    def __init__(self, example: str) -> None:
        self.example = example

    def __call__(self, text: str) -> Path:
        path = _probe(self, text)
        try:
            read_json(path, text)
        except BadInput as exc:
            self.bad(text, str(exc).split(": ", 1)[-1].split(". Fix:")[0])
        return path


class WriteFile(Kind):
    """A file the command will write: not a directory, not a run record, not under a file."""

    kind = "output file"

    def __init__(self, example: str) -> None:
        self.example = example

    def __call__(self, text: str) -> Path:
        path = _probe(self, text)
        try:
            check_output_path(path)
        except BadInput as exc:
            self.bad(text, str(exc).split(": ", 1)[-1].split(". Fix:")[0])
        return path


class WriteDir(Kind):
    """A directory the command writes into (created if missing): not a file, not under a file."""

    kind = "output directory"

    def __init__(self, example: str) -> None:
        self.example = example

    def __call__(self, text: str) -> Path:
        path = _probe(self, text)
        if path.exists() and not path.is_dir():
            self.bad(text, "a file, not a directory")
        blocked = _file_above(path)
        if blocked is not None:
            self.bad(text, f"{blocked} is a file, so no directory can be made under it")
        return path


class Choice(Kind):
    """One of a fixed list of names."""

    kind = "choice"

    def __init__(self, options: Iterable[str]) -> None:
        self.options = tuple(options)
        self.example = self.options[0] if self.options else ""

    def __call__(self, text: str) -> str:
        if text not in self.options:
            self.bad(text, f"not one of {', '.join(self.options)}")
        return text


class Text(Kind):
    """Free text (an override, a name): not empty, one line, printable."""

    kind = "text"

    def __init__(self, example: str) -> None:
        self.example = example

    def __call__(self, text: str) -> str:
        if not text.strip():
            self.bad(text, "empty")
        if any(ord(c) < 32 or ord(c) == 127 for c in text):
            self.bad(text, "contains a control character (one value is one line)")
        return text


# --- files and outputs -----------------------------------------------------------------------


def _file_above(path: Path) -> Path | None:
    for parent in path.absolute().parents:
        if parent.exists():
            return None if parent.is_dir() else parent
    return None


def check_output_path(path: Path) -> None:
    """Refuse a path no output may take: a directory, a run record's name, a path under a file."""
    if path.is_dir():
        raise BadInput(f"{path}: a directory, not a file. Fix: name a file inside it, e.g. {path}/out.json")
    if path.name in RECORD_NAMES:
        raise BadInput(
            f"{path}: a run record's name ({path.name}); records are never overwritten. "
            "Fix: name another file, e.g. baseline.json"
        )
    blocked = _file_above(path)
    if blocked is not None:
        raise BadInput(
            f"{path}: {blocked} is a file, so nothing can be written under it. Fix: name another path"
        )


def output_file(name: str, path: Path, ours: Callable[[Path], bool]) -> Path:
    """`path` as an output of input `name`: refused (BadInput) when check_output_path refuses it,
    or when a file is already there that `ours` does not recognise as one this tool wrote."""
    try:
        check_output_path(path)
    except BadInput as exc:
        raise BadInput(f"{name} {exc}") from None
    if path.exists() and not ours(path):
        raise BadInput(
            f"{name} {path}: an existing file this tool did not write; it is never overwritten. "
            "Fix: name a new file, or move that one away"
        )
    return path


def read_json(path: Path, name: str) -> dict[str, Any]:
    """A JSON object from `path`, or BadInput naming `name`: missing, a directory, unreadable, corrupt."""
    if not path.exists():
        raise BadInput(f"{name}: no such file. Fix: pass an existing JSON file")
    if path.is_dir():
        raise BadInput(f"{name}: a directory, not a file. Fix: pass a JSON file")
    try:
        payload = json.loads(path.read_text())
    except OSError as exc:
        raise BadInput(f"{name}: cannot be read ({exc.strerror}). Fix: check its permissions") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadInput(f"{name}: not valid JSON ({one_line(str(exc))}). Fix: repair or remove it") from None
    if not isinstance(payload, dict):
        raise BadInput(f"{name}: not a JSON object. Fix: repair or remove it")
    return payload


def json_has(*keys: str) -> Callable[[Path], bool]:
    """An `ours` test for output_file: a JSON object holding these keys (what this tool writes)."""

    def ours(path: Path) -> bool:
        try:
            return set(keys) <= set(read_json(path, str(path)))
        except BadInput:
            return False

    return ours


def starts_with(prefix: bytes) -> Callable[[Path], bool]:
    """An `ours` test for output_file: a file that begins as this tool's own (a title, a header)."""

    def ours(path: Path) -> bool:
        try:
            with path.open("rb") as handle:
                return handle.read(len(prefix)) == prefix
        except OSError:
            return False

    return ours


# --- environment variables -------------------------------------------------------------------


def env_path(variable: str, kind: str, environ: Mapping[str, str] | None = None) -> Path | None:
    """The path an environment variable names (None when unset or empty), refused with BadInput when
    it cannot be that `kind`: "file" (must exist, a file: the variable names the file to read),
    "file-or-new" (a file or nothing yet: a cache the tool creates), or "dir-or-new"."""
    env = os.environ if environ is None else environ
    raw = env.get(variable, "")
    if not raw or raw == NO_FILE:
        return None
    fix = f"Fix: point {variable} at a {'directory' if kind == 'dir-or-new' else 'file'} or unset it"
    if kind == "file":
        fix += f" ({variable}={NO_FILE}: none on purpose)"
    if "\x00" in raw or not raw.strip():
        raise BadInput(f"{variable}={raw!r}: not a path. {fix}")
    path = Path(raw).expanduser()
    try:
        exists = path.exists()
    except OSError as exc:
        raise BadInput(f"{variable}={raw}: cannot be looked up ({exc.strerror}). {fix}") from None
    if kind == "file" and not exists:
        raise BadInput(f"{variable}={raw}: no such file. {fix}")
    if kind in ("file", "file-or-new") and path.is_dir():
        raise BadInput(f"{variable}={raw}: a directory, not a file. {fix}")
    if kind == "dir-or-new" and exists and not path.is_dir():
        raise BadInput(f"{variable}={raw}: a file, not a directory. {fix}")
    blocked = _file_above(path)
    if blocked is not None:
        raise BadInput(f"{variable}={raw}: {blocked} is a file. {fix}")
    return path


# A variable naming a file may say there is none on purpose (a CI box without a site file).
NO_FILE = "none"
CALIBRATION_ENV = "MOE_VLM_CALIBRATION"
SITE_FILE_ENV = "MOE_VLM_SITE_FILE"
CACHE_DIR_ENV = "MOE_VLM_CACHE_DIR"
# Every environment variable naming a path the tool reads, and the kind env_path checks it as.
# (MOE_VLM_<SITE KEY> values are checked by the site reader as site values; Slurm's and
# torchrun's variables by runtime/dist_env.py, which refuses a malformed one by name.)
ENV_PATHS = {SITE_FILE_ENV: "file", CALIBRATION_ENV: "file-or-new", CACHE_DIR_ENV: "dir-or-new"}


def calibration_file(environ: Mapping[str, str] | None = None) -> Path:
    """$MOE_VLM_CALIBRATION, else the user's cache: calibrations are per user and machine set."""
    env = os.environ if environ is None else environ
    explicit = env_path(CALIBRATION_ENV, ENV_PATHS[CALIBRATION_ENV], env)
    if explicit is not None:
        return explicit
    cache = Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "moe_vlm" / "step_time_calibration.json"


def check_calibration_file(path: Path) -> None:
    """An existing calibration file must be one: a corrupt one is refused, never read as empty
    (the plan would call every prediction uncalibrated and `calibrate` would overwrite it)."""
    if not path.exists():
        return
    name = f"calibration file {path} (${CALIBRATION_ENV} or the default)"
    try:
        payload = read_json(path, name)
    except BadInput as exc:
        raise BadInput(f"{exc}; or point ${CALIBRATION_ENV} at a new file") from None
    if not isinstance(payload.get("calibrations"), list):
        raise BadInput(
            f"{name}: no 'calibrations' list, not a file `moe-vlm calibrate` wrote. "
            f"Fix: move it away, or point ${CALIBRATION_ENV} at a new file"
        )


def check_environment(environ: Mapping[str, str] | None = None) -> None:
    """Every path the environment names, checked before a command reads or writes anything."""
    env = os.environ if environ is None else environ
    for variable, kind in ENV_PATHS.items():
        env_path(variable, kind, env)
    check_calibration_file(calibration_file(env))
