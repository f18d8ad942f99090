"""The run record: steps.jsonl while running, run.json once at the end.

run.json is written with temp file + fsync + rename, so a killed run never leaves a
half-written record; steps.jsonl is appended and flushed line by line, so a killed run
leaves every completed step readable.

One steps.jsonl line per optimizer step per rank (rank 0 gathers and writes them all):

    step                 1-based optimizer step
    rank                 data-parallel rank
    host                 hostname of the process that measured it (records before it was added: absent)
    warmup               step <= warmup_steps (excluded from the steady window)
    time_unix_s          wall clock at the end of the step
    step_time_s          wall time of the whole optimizer step (all micro-batches), synchronised
    loss                 mean loss over this rank's micro-batches
    grad_norm            global gradient norm (same on every rank)
    lr                   learning rate used
    micro_batches        accumulation steps run
    tokens               {"padded", "real", "text", "image", "loss"}: this rank, summed over micro-batches
    sequences, images, vision_patches, sum_seq_len_squared, sum_patches_squared
                         this rank, summed over micro-batches (see data.batch.BatchStats)
    peak_memory_gib      peak so far on this rank
    memory_kind          "cuda_max_allocated" (GPU) or "process_peak_rss" (CPU)
    components_s         {"vision_encoder", "projector", "decoder"}: forward + backward seconds
    data_wait_s          host seconds of step_time_s the training loop spent waiting for batches
                         (torch engine: building them in its loop; Megatron: inside next(data_iterator))
    exclude              optional reason this step is outside the steady window
                         ("profiler", "checkpoint", "cuda_graph_capture"), beside warm-up

Optional, where the engine measures them (the torch engine does):

    components_forward_s, components_backward_s
                         the two halves of components_s (None when timing hooks are off)
    optimizer_s          seconds of step_time_s in grad norm + optimizer step (collectives included)
    skipped_samples      samples the data pipeline dropped while building this step's batches
                         (Megatron: seeded draws it replaced; real data skips happen inside Energon)
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import platform
import socket
import subprocess
import tempfile
from pathlib import Path
from typing import Any, TextIO

from moe_vlm.launch.safety import scrub
from moe_vlm.spec import RunSpec

RUN_JSON = "run.json"
STEPS_JSONL = "steps.jsonl"
SCHEMA_VERSION = 1
REPO_ROOT = Path(__file__).resolve().parent.parent


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


class StepWriter:
    """Appends one JSON object per line and flushes it, so readers see every finished step."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._handle: TextIO = path.open("a", buffering=1)

    def write(self, record: dict[str, Any]) -> None:
        self._handle.write(json.dumps(record, sort_keys=True, default=str) + "\n")
        self._handle.flush()

    def close(self) -> None:
        self._handle.close()

    def __enter__(self) -> StepWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_steps(path: Path) -> list[dict[str, Any]]:
    """Every complete line; a torn last line from a killed writer is skipped."""
    steps: list[dict[str, Any]] = []
    if not path.exists():
        return steps
    for line in path.read_text().splitlines():
        try:
            steps.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return steps


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def git_state(root: Path = REPO_ROOT) -> dict[str, Any]:
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


def base_record(spec: RunSpec, config: dict[str, Any], status: str) -> dict[str, Any]:
    env = environment()
    layout = spec.layout
    # Secrets from the environment (a path through ${oc.env:...}) must not reach any record.
    return scrub(
        {
            "schema_version": SCHEMA_VERSION,
            "status": status,
            "point_id": point_id(config, env["git"]["commit"]),
            "config": config,
            "spec": spec.to_dict(),
            "layout": {
                "world_size": layout.world_size,
                "nodes": layout.nodes,
                "dp": layout.dp,
                "tp": layout.tp,
                "pp": layout.pp,
                "vp": layout.vp,
                "cp": layout.cp,
                "ep": layout.ep,
                "etp": layout.etp,
            },
            "engine": spec.engine,
            # Forced-balance routing is labelled beside the data kind: neither is a real-routing VLM run.
            "data": {"kind": spec.data.kind.value, "routing": spec.router.name},
            "env": env,
        }
    )
