"""Child processes a run starts on this machine (ranks, probe ranks) die with the process that
started them: a killed launcher must not leave ranks running, writing or holding a port."""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when its parent dies (Linux); if the parent is
    already gone (re-parented to init), exit now."""
    if not sys.platform.startswith("linux"):
        return
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() == 1:
        os._exit(1)
