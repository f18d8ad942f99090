"""Bridge's experiment trackers, guarded as the torch engine's are (record/explog.Tracker): a
tracker that cannot open is its failure, recorded with its reason in run.json, never the run's.

Bridge opens each tracker lazily, in a GlobalState property, on the last rank
(megatron/bridge/training/state.py:177-191 TensorBoard, :193-226 W&B, :228-304 MLflow) and the
training loop asks for it at every logging step; an exception there (MLflow refusing a file store
or a scheme it lacks, wandb.init without a network, TensorBoard's directory taken by a file) ended
the run. `guard` wraps those properties: the first exception is caught, said once on stderr and
written to the run directory (TRACKER_FILE: the last rank opens the tracker, rank 0 writes
run.json and reads it), and the property returns None from then on, which Bridge reads as "no
tracker" (it checks `if writer:` / `if wandb_writer:` before logging).

An opened tracker is handed out wrapped (`Guarded`): the first exception in any of its methods
(a SummaryWriter whose directory vanished, MLflow's `log_metrics` against a store that is gone or
a server that stopped answering) is recorded the same way (`"at": "<method> (<property>)"`), the
call returns None, and from then on the property returns None and every call on a wrapper Bridge
already holds (train_utils.py:630-666 keeps the MLflow module for the whole run) does nothing.
Attributes that are not methods (`wandb.run`) come back unwrapped.
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
            opened = fget(state)
        except Exception as exc:  # any tracker error: the run must not die of it
            _fail(failed, name, f"open ({name})", exc, run_dir, backend)
            return None
        if opened is None:
            return None
        wrapped: dict[str, Guarded] = state.__dict__.setdefault("_moe_vlm_guarded_trackers", {})
        if name not in wrapped or wrapped[name].tracker is not opened:
            wrapped[name] = Guarded(opened, name, failed, run_dir, backend)
        return wrapped[name]

    return get


def _fail(failed: set[str], name: str, at: str, exc: Exception, run_dir: Path, backend: str) -> None:
    failed.add(name)
    reason = scrub_text(" ".join(f"{type(exc).__name__}: {exc}".split()))[:REASON_CHARS]
    write_json_atomic(
        run_dir / TRACKER_FILE, {"backend": backend, "status": "failed", "at": at, "reason": reason}
    )
    print(
        f"moe_vlm: warning: logger={backend} failed at {at} ({reason}); training goes on without it "
        "(run.json tracker)",
        file=sys.stderr,
        flush=True,
    )


class Guarded:
    """An opened tracker whose method calls cannot raise: the first exception is recorded and the
    tracker is dropped (its property returns None, this wrapper is falsy and its calls no-ops)."""

    def __init__(self, tracker: Any, name: str, failed: set[str], run_dir: Path, backend: str) -> None:
        self.__dict__.update(tracker=tracker, _name=name, _failed=failed, _run_dir=run_dir, _backend=backend)

    # isinstance sees the tracker's class: Megatron Core's timers write only to a SummaryWriter
    # (megatron/core/timers.py:482).
    @property  # type: ignore[misc]
    def __class__(self) -> type:
        return type(self.tracker)

    def __bool__(self) -> bool:
        return self._name not in self._failed

    def __eq__(self, other: object) -> bool:  # timers.py:484 compares the writer with the wandb module
        return self.tracker == (other.tracker if isinstance(other, Guarded) else other)

    def __hash__(self) -> int:
        return hash(self.tracker)

    def __getattr__(self, attr: str) -> Any:
        value = getattr(self.tracker, attr)
        if not callable(value):
            return value

        def call(*args: Any, **kwargs: Any) -> Any:
            if self._name in self._failed:
                return None
            try:
                return value(*args, **kwargs)
            except Exception as exc:  # any tracker error: the run must not die of it
                _fail(self._failed, self._name, f"{attr} ({self._name})", exc, self._run_dir, self._backend)
                return None

        return call


def failure(run_dir: Path) -> dict[str, Any] | None:
    """The tracker failure a rank recorded in this run directory, or None."""
    try:
        found = json.loads((run_dir / TRACKER_FILE).read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None
