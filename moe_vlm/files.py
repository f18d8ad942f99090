"""The project's one atomic writer (and, below it, RunPaths: the name of every file of a run).

Everything a run or a sweep writes whole (run.json, point.json, the requeue marker, a scrubbed
log) goes through `write_atomic`: a killed writer leaves the old file or the new one, never half.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


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


def write_json_atomic(path: Path, payload: dict[str, Any]) -> None:
    write_atomic(path, json.dumps(payload, indent=2, sort_keys=True, default=str) + "\n")
