"""Collectives timed between ranks started on this node (the probe's link rates).

Starts ranks on this node (one per GPU with NCCL; CPU processes over gloo where there is no GPU),
times each case for about a second and reports its rate in the step model's convention: bytes each
rank moves over the links, size x (n - 1) / n, per second. The probe (moe_vlm/predict/probe.py)
times all-gathers at two sizes and solves for the link's latency and bandwidth. One node measures
the links inside it only; what crosses nodes is not probed.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass
from enum import StrEnum
from pathlib import Path

import torch
import torch.distributed as dist

from moe_vlm.base.processes import die_with_parent, run_local_ranks
from moe_vlm.config.spec import RunSpec


class Collective(StrEnum):
    all_to_all = "all_to_all"
    all_gather = "all_gather"


@dataclass(frozen=True)
class CollectiveCase:
    """One collective to time: its group size and the bytes each rank holds (all-to-all: sends;
    all-gather: the gathered output)."""

    op: Collective
    ranks: int
    message_bytes: int


@dataclass(frozen=True)
class CollectiveRate:
    op: Collective
    ranks: int
    message_bytes: int
    seconds_per_call: float
    backend: str

    @property
    def bytes_per_s(self) -> float:
        """Bytes one rank moves over its links per second: message x (n - 1) / n per call."""
        moved = self.message_bytes * (self.ranks - 1) / self.ranks
        return moved / self.seconds_per_call

    def line(self) -> str:
        return (
            f"{self.op} over {self.ranks} ranks ({self.backend}), {self.message_bytes / 2**20:.3g} MiB "
            f"per rank: {self.seconds_per_call * 1e3:.3g} ms, {self.bytes_per_s / 1e9:.3g} GB/s per rank"
        )


def _time_case(case: CollectiveCase, rank: int, device: torch.device, seconds: float) -> float:
    """Seconds per call on this rank (the group is ranks 0..n-1; the others only take part)."""
    group = dist.new_group(list(range(case.ranks)))
    if not isinstance(group, dist.ProcessGroup):  # this rank is outside the group
        return 0.0
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    elements = max(case.message_bytes // dtype.itemsize, case.ranks)
    elements -= elements % case.ranks
    full = torch.ones(elements, dtype=dtype, device=device)
    out = torch.empty_like(full)
    shard = full[: elements // case.ranks]

    # all_gather_single is all_gather_into_tensor renamed (torch 2.14); the GPU image's 2.11 has the old name.
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

    def call() -> None:
        if case.op is Collective.all_to_all:
            dist.all_to_all_single(out, full, group=group)
        else:
            gather(out, shard, group=group)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    call()
    sync()
    dist.barrier(group=group)
    calls, start = 0, time.perf_counter()
    # Every rank must make the same number of calls: rank 0 decides when to stop, by broadcast.
    flag = torch.zeros(1, dtype=torch.int32, device=device)
    while True:
        call()
        calls += 1
        sync()
        if rank == 0:
            flag.fill_(int(time.perf_counter() - start >= seconds))
        dist.broadcast(flag, src=0, group=group)
        if int(flag.item()):
            break
    return (time.perf_counter() - start) / calls


def _rank(
    local_rank: int, ranks: int, init_file: str, todo: list[CollectiveCase], seconds: float, out: str
) -> None:
    die_with_parent()  # a killed probe (the canary's time limit, Ctrl-C) takes its ranks along
    # A forked child inherits the parent's OpenMP pool without its threads: one intra-op thread
    # keeps it from waiting on them forever (the ranks time collectives, not arithmetic).
    torch.set_num_threads(1)
    gpu = torch.cuda.is_available()
    device = torch.device("cuda", local_rank) if gpu else torch.device("cpu")
    if gpu:
        torch.cuda.set_device(device)
    backend = "nccl" if gpu else "gloo"
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=local_rank, world_size=ranks)
    try:
        found = []
        for case in todo:
            per_call = _time_case(case, local_rank, device, seconds)
            found.append(asdict(CollectiveRate(case.op, case.ranks, case.message_bytes, per_call, backend)))
        if local_rank == 0:
            Path(out).write_text(json.dumps(found))
    finally:
        dist.destroy_process_group()


def measure(todo: list[CollectiveCase], seconds: float = 1.0) -> list[CollectiveRate]:
    """Start max(group) ranks here and time every case; [] when there is nothing to time."""
    if not todo:
        return []
    ranks = max(case.ranks for case in todo)
    with tempfile.TemporaryDirectory(prefix="moe_vlm_probe_") as scratch:
        init_file, out = os.path.join(scratch, "init"), os.path.join(scratch, "rates.json")
        run_local_ranks(_rank, (ranks, init_file, todo, seconds, out), ranks)
        raw = json.loads(Path(out).read_text())
    return [
        CollectiveRate(
            Collective(r["op"]),
            int(r["ranks"]),
            int(r["message_bytes"]),
            float(r["seconds_per_call"]),
            r["backend"],
        )
        for r in raw
    ]


def ranks_on_node(spec: RunSpec) -> int:
    """How many ranks the probe can start here: the GPUs CUDA sees, else the point's ranks per
    node (CPU processes), never more than the CPUs can run one each."""
    if torch.cuda.is_available():
        return torch.cuda.device_count()
    return min(spec.layout.ranks_per_node, os.cpu_count() or 1)
