"""Ranks a run starts on this machine (the torch engine's local ranks, the probe's ranks): how
they start, and that they die with the process that started them (a killed launcher must not
leave ranks running, writing or holding a port)."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def start_method() -> str:
    """fork where no GPU can be used: ranks start in milliseconds with torch and transformers
    already imported, instead of re-importing them (tens of seconds per rank on a busy 2-core
    laptop). Forking is unsafe once CUDA is initialised, so with NVIDIA devices present the ranks
    are spawned."""
    has_gpu_devices = any(Path("/dev").glob("nvidia[0-9]*"))
    return "spawn" if has_gpu_devices else "fork"


def cores_here() -> int:
    """The cores this process may use: its CPU affinity, capped by Slurm's allocation on the node
    (an allocation without CPU binding still shows every core: two one-CPU jobs on one node would
    each start a thread per core and stall each other)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    allocated = os.environ.get("SLURM_CPUS_ON_NODE", "")
    if allocated.isdigit() and int(allocated) > 0:
        cores = min(cores, int(allocated))
    return max(cores, 1)


def run_local_ranks(rank_fn: Callable[..., None], args: tuple[Any, ...], ranks: int) -> None:
    """`rank_fn(local_rank, *args)` in `ranks` processes here, until all return; a rank that
    raises or dies raises torch.multiprocessing's ProcessRaisedException / ProcessExitedException."""
    import torch.multiprocessing as mp  # only the callers that start ranks pay for torch

    mp.start_processes(rank_fn, args=args, nprocs=ranks, join=True, start_method=start_method())


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when its parent dies (Linux); if the parent is
    already gone (re-parented to init), exit now."""
    if not sys.platform.startswith("linux"):
        return
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() == 1:
        os._exit(1)
