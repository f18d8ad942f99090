"""The node preflight's measurements, in every task of a job before its run starts.

Each rank times square GEMMs on its own device (BF16, and the run's FP8 format on GPUs that have
one), then the ranks meet once in a process group of their own (gloo on CPUs, NCCL on GPUs; its
own port, destroyed before the engine makes the run's) and time, with a fixed number of calls so
that every member makes the same ones:

- intra-node: an all-reduce and an all-to-all among the ranks of each node (NVLink on a GPU node);
- inter-node: an all-reduce and an all-to-all among one rank per node, the same local index on
  each (the NIC path a DP group that spans nodes takes);
- expert-parallel (EP > 1): an all-to-all in each of the run's EP groups, laid out as Megatron
  Core lays them out (`ep_groups`), the dispatch's own shape, inside a node or across nodes.

Every rank gets every rank's figures (`all_gather_object`), so each reaches the same verdict
(moe_vlm/launch/preflight.py judges them). Rates are taken from the 10th percentile of the call
times: on a shared node, a time slice lost to another process is noise, while a slow GPU or link
is slow in every call.

`MOE_VLM_TEST_PREFLIGHT_FAULT` (tests only) slows a named node for real: `node1:gemm=0.05` sleeps
0.05 s after each timed GEMM call on node1, inside its timing, as a GPU throttled or shared with
another process would lose it (`intra`, `inter`: the collectives' calls, on every rank of that
node; `;` separates nodes). A CPU hog cannot stand in for it here: the test's nodes share one
machine's cores.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from moe_vlm.runtime.dist_env import PORT_BASE, PORT_SPAN, DistEnv

ENV_FAULT = "MOE_VLM_TEST_PREFLIGHT_FAULT"
GEMM_MIN_CALLS = 3
PERCENTILE = 0.1


class Collective:
    """The collectives timed (names in the figures): one closed set, as strings in the JSON."""

    all_reduce = "all_reduce"
    all_to_all = "all_to_all"


@dataclass
class RankFigures:
    """One rank's measurements: GEMM FLOP/s per dtype; per collective, the 10th-percentile call
    time and the bus bytes a call moves per rank (what NCCL's tests call bus bandwidth)."""

    rank: int
    node: str
    local_rank: int
    device: str
    gemm_flops: dict[str, float] = field(default_factory=dict)
    gemm_not_measured: dict[str, str] = field(default_factory=dict)  # dtype -> why
    # "intra:all_reduce" / "inter:all_to_all" / "ep:all_to_all" -> (seconds, bus bytes per call)
    collectives: dict[str, tuple[float, float]] = field(default_factory=dict)
    ep_group: list[int] = field(default_factory=list)  # the ranks of this rank's EP group

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def node_name() -> str:
    """The node as Slurm names it (what --exclude takes), else the host."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def fault_delay(node: str, kind: str, environ: dict[str, str] | None = None) -> float:
    """Seconds the test-only fault adds to each timed `kind` call on this node (0: none)."""
    text = (os.environ if environ is None else environ).get(ENV_FAULT, "")
    for item in text.split(";"):
        where, _, what = item.partition(":")
        if where.strip() != node:
            continue
        for part in what.split(","):
            name, _, value = part.partition("=")
            if name.strip() == kind:
                return max(float(value), 0.0)
    return 0.0


def _slowed(call: Callable[[], None], delay: float) -> Callable[[], float]:
    """The call, timed, with the test-only fault's delay inside its time."""

    def timed() -> float:
        start = time.perf_counter()
        call()
        if delay:
            time.sleep(delay)
        return time.perf_counter() - start

    return timed


def _percentile(times: list[float]) -> float:
    ordered = sorted(times)
    return ordered[min(len(ordered) - 1, int(PERCENTILE * len(ordered)))]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def gemm_rate(device: torch.device, dtype: str, size: int, seconds: float, delay: float = 0.0) -> float:
    """FLOP/s of a size x size x size GEMM in `dtype` (bf16, or fp8: torch._scaled_mm, per-tensor
    scales) on this device."""
    generator = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(size, size, generator=generator).to(device)
    b = torch.randn(size, size, generator=generator).to(device)
    if dtype == "fp8":
        scale = torch.ones((), device=device)
        a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn).t().contiguous().t()

        def call() -> None:
            torch._scaled_mm(a8, b8, scale_a=scale, scale_b=scale, out_dtype=torch.bfloat16)
            _sync(device)

    else:
        a16, b16 = a.to(torch.bfloat16), b.to(torch.bfloat16)

        def call() -> None:
            torch.matmul(a16, b16)
            _sync(device)

    call()  # warm-up: kernels chosen, memory allocated
    timed = _slowed(call, delay)
    times: list[float] = []
    started = time.perf_counter()
    while len(times) < GEMM_MIN_CALLS or time.perf_counter() - started < seconds:
        times.append(timed())
    return 2.0 * size**3 / _percentile(times)


def _groups(nodes: list[str], local_ranks: list[int]) -> tuple[dict[str, list[int]], list[int]]:
    """Ranks of each node (in rank order), and one rank per node at the local index every node has."""
    by_node: dict[str, list[int]] = {}
    for rank, node in enumerate(nodes):
        by_node.setdefault(node, []).append(rank)
    across: list[int] = []
    if len(by_node) > 1:
        index = min(local_ranks)
        across = [next((r for r in ranks if local_ranks[r] == index), ranks[0]) for ranks in by_node.values()]
    return by_node, across


def _time_collective(
    op: str, group: Any, size: int, nbytes: int, device: torch.device, iters: int, delay: float
) -> tuple[float, float]:
    """(10th-percentile seconds per call, bus bytes per call per rank) of one collective."""
    elements = max(size, nbytes // 4 // size * size)
    send = torch.ones(elements, dtype=torch.float32, device=device)
    out = torch.empty_like(send)
    if op == Collective.all_reduce:
        bus = 2.0 * (size - 1) / size * elements * 4

        def call() -> None:
            dist.all_reduce(send, group=group)
            _sync(device)

    else:
        bus = (size - 1) / size * elements * 4

        def call() -> None:
            dist.all_to_all_single(out, send, group=group)
            _sync(device)

    dist.barrier(group=group)
    call()
    timed = _slowed(call, delay)
    times = []
    for _ in range(iters):
        dist.barrier(group=group)
        times.append(timed())
    return _percentile(times), bus


def ep_groups(world_size: int, ep: int, etp: int) -> list[list[int]]:
    """The run's expert-parallel groups: Megatron Core's expert rank order `tp-cp-ep-dp-pp`
    (cp=1 for experts, tp=ETP; parallel_state.py `expert_decoder_rank_generator.get_ranks('ep')`):
    EP ranks are ETP apart, in blocks of ETP x EP. Empty when EP is 1."""
    if ep <= 1 or world_size % (ep * etp):
        return []
    groups = []
    for block in range(0, world_size, ep * etp):
        for offset in range(etp):
            groups.append([block + offset + etp * k for k in range(ep)])
    return groups


def probe_port(env: DistEnv) -> int:
    """The preflight's own rendezvous port, next to the run's (which the engine binds after it)."""
    return PORT_BASE + (env.master_port - PORT_BASE + 1) % PORT_SPAN


def measure(
    env: DistEnv | None,
    device: torch.device,
    dtypes: list[str],
    not_measured: dict[str, str],
    gemm_size: int,
    seconds: float,
    message_bytes: int,
    iters: int,
    expert_groups: list[list[int]] | None = None,
) -> list[RankFigures]:
    """This rank's figures and, in a job of several ranks, every other rank's (in rank order),
    inside `group`."""
    node = node_name()
    rank = env.rank if env else 0
    mine = RankFigures(rank, node, env.local_rank if env else 0, str(device))
    mine.gemm_not_measured = dict(not_measured)
    for dtype in dtypes:
        mine.gemm_flops[dtype] = gemm_rate(device, dtype, gemm_size, seconds, fault_delay(node, "gemm"))
    if env is None or env.world_size < 2:
        return [mine]
    placed: list[Any] = [None] * env.world_size
    dist.all_gather_object(placed, (node, env.local_rank))
    nodes, local_ranks = [p[0] for p in placed], [p[1] for p in placed]
    by_node, across = _groups(nodes, local_ranks)
    # Every rank creates every group, in the same order (torch.distributed's rule).
    intra = {name: dist.new_group(ranks) for name, ranks in by_node.items() if len(ranks) > 1}
    inter = dist.new_group(across) if across else None
    experts = [dist.new_group(ranks) for ranks in expert_groups or []]
    mine_ep = next((i for i, ranks in enumerate(expert_groups or []) if rank in ranks), None)
    for op in (Collective.all_reduce, Collective.all_to_all):
        if node in intra:
            mine.collectives[f"intra:{op}"] = _time_collective(
                op, intra[node], len(by_node[node]), message_bytes, device, iters, fault_delay(node, "intra")
            )
        if inter is not None and rank in across:
            mine.collectives[f"inter:{op}"] = _time_collective(
                op, inter, len(across), message_bytes, device, iters, fault_delay(node, "inter")
            )
    if mine_ep is not None and expert_groups:
        mine.ep_group = list(expert_groups[mine_ep])
        size = len(mine.ep_group)
        mine.collectives[f"ep:{Collective.all_to_all}"] = _time_collective(
            Collective.all_to_all, experts[mine_ep], size, message_bytes, device, iters, 0.0
        )
    gathered: list[Any] = [None] * env.world_size
    dist.all_gather_object(gathered, mine)
    return [g for g in gathered if isinstance(g, RankFigures)]


@contextmanager
def group(env: DistEnv | None, device: torch.device) -> Iterator[None]:
    """The preflight's own process group for the job's ranks (none for a job of one rank): its own
    port, destroyed on the way out, before the engine makes the run's."""
    if env is None or env.world_size < 2:
        yield
        return
    host = f"[{env.master_addr}]" if ":" in env.master_addr else env.master_addr
    dist.init_process_group(
        "nccl" if device.type == "cuda" else "gloo",
        init_method=f"tcp://{host}:{probe_port(env)}",
        rank=env.rank,
        world_size=env.world_size,
        timeout=timedelta(minutes=2),
        device_id=device if device.type == "cuda" else None,
    )
    try:
        yield
    finally:
        dist.destroy_process_group()


def barrier(env: DistEnv | None) -> None:
    if env is not None and env.world_size > 1:
        dist.barrier()
