"""A sweep's library checks in a second process, working while the sweep plans.

Checking a sweep's Megatron points first imports the Megatron stack (about 23 s of CPU on a 2-core
machine, docs/slurm.md) and then costs about 10 ms per distinct point. In the sweep's own process
all of it followed the planning of the last point. Here a spawned process takes each point as soon
as it is planned, so on a machine with a core to spare (a login node has dozens) the import
overlaps the planning, and the sweep waits only for what is left when its last point is planned.

The work and the findings are those of `moe_vlm.run.plan.library_findings` (the same call, the same
plan cache, the same one-line progress notes); what the library prints in the worker is captured
and counted, as in the sweep's process. A point whose checks the plan cache holds is answered here
without the worker, and the worker starts only for a point the cache lacks, so a sweep of points
judged before imports nothing and starts nothing. If the worker dies, the points it had not
answered are checked here, in order, as before.
"""

from __future__ import annotations

import multiprocessing
import queue
from dataclasses import dataclass, field
from multiprocessing.context import SpawnProcess
from typing import Any

from moe_vlm.base import noise
from moe_vlm.config.schema import Engine
from moe_vlm.config.spec import RunSpec
from moe_vlm.engines.megatron.plan_cache import Keying, key_like, keying
from moe_vlm.rules import Finding
from moe_vlm.run.plan import library_findings, stored_library_findings

# How often a wait for an answer looks whether the worker is still alive.
POLL_S = 1.0


@dataclass(frozen=True)
class Checked:
    """One point's library findings and how many lines the library printed while checking it."""

    findings: list[Finding]
    library_lines: int = 0


def check_here(spec: RunSpec) -> Checked:
    """The library checks of one point in this process, the library's output captured."""
    with noise.captured() as lines:
        found = library_findings(spec)
    return Checked(found, len(lines))


def _serve(requests: Any, answers: Any, sweeps: Keying) -> None:
    """The worker: check each (key, spec) it is sent, in order, until the sweep terminates it
    (LibraryWorker.close); its plan cache keys are the sweep's (the environment the sweep's process
    started with, the install it read)."""
    key_like(sweeps)
    while True:
        key, spec = requests.get()
        answers.put((key, check_here(spec)))


@dataclass
class LibraryWorker:
    """Hands a sweep's points to a worker process as they are planned; `checked` answers in order."""

    started: bool = False
    _process: SpawnProcess | None = None
    _requests: Any = None
    _answers: Any = None
    _sent: set[str] = field(default_factory=set)
    _answered: dict[str, Checked] = field(default_factory=dict)
    _dead: bool = False

    def submit(self, key: str, spec: RunSpec) -> None:
        """Start checking this point in the worker (started now if it is the first), unless it is
        not a Megatron point, the plan cache already holds its checks, or it was sent before."""
        if spec.engine != Engine.megatron or key in self._sent or self._dead:
            return
        stored = stored_library_findings(spec)
        if stored is not None:
            self._answered[key] = Checked(stored)
            return
        if self._process is None:
            # spawn: a fresh interpreter, as a dry run has; forking a process that holds Hydra's
            # state and maybe threads is not safe.
            context = multiprocessing.get_context("spawn")
            self._requests, self._answers = context.Queue(), context.Queue()
            self._process = context.Process(
                target=_serve,
                args=(self._requests, self._answers, keying()),
                name="moe_vlm-library-checks",
                daemon=True,
            )
            self._process.start()
            self.started = True
        self._sent.add(key)
        self._requests.put((key, spec))

    def checked(self, key: str, spec: RunSpec) -> Checked:
        """This point's findings: the cache's, the worker's (waited for), or checked here when it
        was never sent or the worker died."""
        if key in self._answered:
            return self._answered.pop(key)
        if key not in self._sent or self._dead:
            return check_here(spec)
        while key not in self._answered:
            try:
                answer_key, answer = self._answers.get(timeout=POLL_S)
            except queue.Empty:
                if self._process is not None and not self._process.is_alive():
                    self._dead = True
                    return check_here(spec)
                continue
            self._answered[answer_key] = answer
        return self._answered.pop(key)

    def close(self) -> None:
        """Stop the worker now (a point it is checking is abandoned: nothing waits for it)."""
        if self._process is None:
            return
        if self._process.is_alive():
            self._process.terminate()
        self._process.join(timeout=10)
        for channel in (self._requests, self._answers):
            channel.close()
            channel.cancel_join_thread()  # items still queued are not flushed to a dead reader
        self._process = None
