"""Bridge's experiment trackers, guarded as the torch engine's are (record/explog.Tracker): a
tracker that cannot open is its failure, recorded with its reason in run.json, never the run's.

Bridge opens each tracker lazily, in a GlobalState property, on the last rank
(megatron/bridge/training/state.py:177-191 TensorBoard, :193-226 W&B, :228-304 MLflow) and the
training loop asks for it at every logging step; an exception there (MLflow refusing a file store
or a scheme it lacks, wandb.init without a network, TensorBoard's directory taken by a file) ended
the run. `guard` wraps those properties: the first exception is caught, said once on stderr and
written to the run directory (TRACKER_FILE: the last rank opens the tracker, rank 0 writes
run.json and reads it), and the property returns None from then on, which Bridge reads as "no
tracker" (it checks `if writer:` / `if wandb_writer:` before logging). Failures inside a later
log call of an opened tracker are not guarded here.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from moe_vlm.base.files import write_json_atomic
from moe_vlm.base.safety import scrub_text
from moe_vlm.record.explog import REASON_CHARS

# GlobalState's tracker properties (state.py line numbers above).
PROPERTIES = ("tensorboard_logger", "wandb_logger", "mlflow_logger")
TRACKER_FILE = "tracker_failure.json"
_ORIGINAL: dict[str, property] = {}


def guard(state_cls: type, run_dir: Path, backend: str) -> None:
    """Wrap `state_cls`'s tracker properties for this run (idempotent: rewraps the originals)."""
    for name in PROPERTIES:
        original = _ORIGINAL.setdefault(name, getattr(state_cls, name))
        assert original.fget is not None
        setattr(state_cls, name, property(_guarded(name, original.fget, run_dir, backend)))


def _guarded(name: str, fget: Callable[[Any], Any], run_dir: Path, backend: str) -> Callable[[Any], Any]:
    def get(state: Any) -> Any:
        failed: set[str] = state.__dict__.setdefault("_moe_vlm_failed_trackers", set())
        if name in failed:  # a tracker that failed once would fail again at every step
            return None
        try:
            return fget(state)
        except Exception as exc:  # any tracker error: the run must not die of it
            failed.add(name)
            reason = scrub_text(" ".join(f"{type(exc).__name__}: {exc}".split()))[:REASON_CHARS]
            write_json_atomic(
                run_dir / TRACKER_FILE,
                {"backend": backend, "status": "failed", "at": f"open ({name})", "reason": reason},
            )
            print(
                f"moe_vlm: warning: logger={backend} failed at open ({reason}); training goes on "
                "without it (run.json tracker)",
                file=sys.stderr,
                flush=True,
            )
            return None

    return get


def failure(run_dir: Path) -> dict[str, Any] | None:
    """The tracker failure a rank recorded in this run directory, or None."""
    try:
        found = json.loads((run_dir / TRACKER_FILE).read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None
