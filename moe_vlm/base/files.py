"""The project's one atomic writer (and, below it, RunPaths: the name of every file of a run).

Everything a run or a sweep writes whole (run.json, point.json, the requeue marker, a scrubbed
log) goes through `write_atomic`: a killed writer leaves the old file or the new one, never half.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar


def write_atomic(path: Path, data: bytes | str) -> None:
    """Replace `path` with `data` in one step: readers see the old file or the new one, never half.

    The project's one atomic writer. The temp file's name is unique (mkstemp), so any number of
    processes may write the same path at once (every rank of a job materialises the same HF
    config): each renames its own complete file over the target and the last one wins. A fixed
    temp name would let one rank rename another's file away and crash on its own rename.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    blob = data.encode() if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(blob)
            handle.flush()
            os.fsync(handle.fileno())
        # mkstemp creates 0600 files; run records are read by teammates on shared clusters.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def link_atomic(link: Path, target: str) -> None:
    """Point the symlink `link` at `target` (relative to the link's directory) in one step: a reader
    follows the old target or the new one. Sweeps started at once each rename their own link."""
    fd, tmp = tempfile.mkstemp(prefix=f".{link.name}.", suffix=".tmp", dir=link.parent)
    os.close(fd)
    try:
        Path(tmp).unlink()
        Path(tmp).symlink_to(target, target_is_directory=True)
        os.replace(tmp, link)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def file_in_the_way(directory: Path) -> Path | None:
    """The first of `directory` and its parents that exists and is not a directory (a file that
    `mkdir(parents=True)` would fail on), or None when the directory exists or can be made."""
    for candidate in (directory, *directory.parents):
        if candidate.is_dir():
            return None
        if candidate.exists():
            return candidate
    return None


def write_json_atomic(path: Path, payload: dict[str, Any]) -> None:
    write_atomic(path, json.dumps(payload, indent=2, sort_keys=True, default=str) + "\n")


# --- the files of a run directory (a sweep point's directory: its run writes there) -----------
#
# Every name a run, the launcher, the sweeper and the readers use: nothing else spells them
# (tests/unit/test_files.py). RunPaths joins them to one directory, as submitit's JobPaths
# names a job's files.

RUN_JSON = "run.json"
STEPS_JSONL = "steps.jsonl"
HEARTBEAT_JSON = "heartbeat.json"
POINT_JSON = "point.json"
# Written by rank 0 on a USR2 it will requeue for; the job script moves it to PREVIOUS on restart.
REQUEUE_MARKER = "requeue.json"
PREVIOUS_REQUEUE_MARKER = "requeue.previous.json"
# The node preflight's verdict for this attempt (moe_vlm/launch/preflight.py).
PREFLIGHT_JSON = "preflight.json"
ATTEMPTS = "attempts"
CANARIES = "canaries"
CANARY_JSON = "canary.json"


@dataclass(frozen=True)
class RunPaths:
    """Every file of one run directory."""

    folder: Path

    # Files of one attempt; moved aside together so a rerun starts clean and nothing is lost.
    ATTEMPT_FILES: ClassVar[tuple[str, ...]] = (
        RUN_JSON,
        STEPS_JSONL,
        HEARTBEAT_JSON,
        REQUEUE_MARKER,
        PREVIOUS_REQUEUE_MARKER,
        PREFLIGHT_JSON,
    )

    @property
    def run_json(self) -> Path:
        return self.folder / RUN_JSON

    @property
    def steps(self) -> Path:
        return self.folder / STEPS_JSONL

    @property
    def heartbeat(self) -> Path:
        return self.folder / HEARTBEAT_JSON

    @property
    def point_json(self) -> Path:
        return self.folder / POINT_JSON

    @property
    def requeue_marker(self) -> Path:
        return self.folder / REQUEUE_MARKER

    @property
    def previous_requeue_marker(self) -> Path:
        return self.folder / PREVIOUS_REQUEUE_MARKER

    @property
    def preflight(self) -> Path:
        return self.folder / PREFLIGHT_JSON

    @property
    def attempts(self) -> Path:
        """attempts/<n>/: the files of earlier attempts (runtime/points.archive_attempt)."""
        return self.folder / ATTEMPTS

    def attempt_files(self) -> list[Path]:
        """The files of the current attempt that exist."""
        return [self.folder / name for name in self.ATTEMPT_FILES if (self.folder / name).exists()]
