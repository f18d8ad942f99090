"""Where a run's code came from: package versions, git state, host, and a sweep point's identity."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import socket
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]


def _version(package: str) -> str | None:
    # Here, not at the top: only a record's writer asks, and importlib.metadata's import was a
    # tenth of a CPU dry run's own start-up (issue 33).
    import importlib.metadata

    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def git_state(root: Path = REPO_ROOT) -> dict[str, Any]:
    import subprocess  # only a record's writer asks

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": bool(status) if status is not None else None}


def environment() -> dict[str, Any]:
    packages = ("torch", "transformers", "hydra-core", "submitit", "megatron-core", "megatron-bridge")
    return {
        "python": platform.python_version(),
        **{name.replace("-", "_"): _version(name) for name in packages},
        "git": git_state(),
        "host": socket.gethostname(),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
    }


def point_id(config: dict[str, Any], code_version: str | None) -> str:
    """Identity of a sweep point: the resolved config plus the code that runs it."""
    blob = json.dumps({"config": config, "code": code_version}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
