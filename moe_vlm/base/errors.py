"""The user-error exception and the exit statuses every entry point shares.

train.py, the sweeper, `moe-vlm report | status | advise` and the launcher all report bad
input the same way: one line naming the key, the allowed values and a fix, exit status 2.
"""

from __future__ import annotations

EXIT_FAILED = 1  # the work ran and failed (or, for report --baseline, regressed)
EXIT_INVALID = 2  # bad input: nothing was run


class BadInput(Exception):
    """A user error, reported as a single line with exit status EXIT_INVALID."""


class EngineUnavailable(RuntimeError):
    """The engine cannot run here (missing library or hardware); the message says why."""


class RunFailed(RuntimeError):
    """Training started and failed; the run's run.json already records why (status failed)."""
