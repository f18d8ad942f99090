"""Who am I in a distributed launch? Read once from the environment of the process.

Three outside launchers can start one process per rank: torchrun (RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR, MASTER_PORT), Slurm's srun as submitit uses it (SLURM_PROCID,
SLURM_NTASKS, SLURM_LOCALID, SLURM_JOB_NODELIST) and submitit's local executor
(SUBMITIT_LOCAL_*). Every task of one job must agree on the rendezvous address without
talking to each other, so the master is the first host of the job's node list and the port
is derived from the job id. When none of these describes more than one rank, the engine
starts the ranks itself (`DistEnv.from_environ()` returns None).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass

# Rendezvous ports derived from a job id fall in [20000, 60000), the range submitit's
# TorchDistributedEnvironment draws from for the same purpose.
PORT_BASE = 20000
PORT_SPAN = 40000
# A packed point's place in its job (1-based) and the pack's size, exported before its srun step.
ENV_PACK_INDEX = "MOE_VLM_PACK_INDEX"
ENV_PACK_SIZE = "MOE_VLM_PACK_SIZE"
# How often this point was stopped by a USR2 and rerun (set in the task, see launch/requeue.py).
ENV_POINT_RESTARTS = "MOE_VLM_POINT_RESTARTS"


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int
    launcher: str  # torchrun | slurm | submitit_local | spawn

    @property
    def init_method(self) -> str:
        host = f"[{self.master_addr}]" if ":" in self.master_addr else self.master_addr
        return f"tcp://{host}:{self.master_port}"

    @classmethod
    def from_environ(
        cls,
        environ: Mapping[str, str] | None = None,
        hostnames: Callable[[str], list[str]] | None = None,
    ) -> DistEnv | None:
        """This process's place in an outside launch, or None when it is not one rank of many.

        `hostnames` expands a Slurm node list (default: `scontrol show hostnames`, falling back
        to parsing the list here when scontrol is not installed).
        """
        env = os.environ if environ is None else environ
        if all(key in env for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")):
            world = int(env["WORLD_SIZE"])
            return cls(
                rank=int(env["RANK"]),
                world_size=world,
                local_rank=int(env.get("LOCAL_RANK", env["RANK"])),
                local_world_size=int(env.get("LOCAL_WORLD_SIZE", world)),
                master_addr=env["MASTER_ADDR"],
                master_port=int(env["MASTER_PORT"]),
                launcher="torchrun",
            )
        if "SLURM_PROCID" in env and int(env.get("SLURM_NTASKS", "1")) > 1:
            nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
            if not nodelist:
                raise ValueError("SLURM_NTASKS > 1 but neither SLURM_JOB_NODELIST nor SLURM_NODELIST is set")
            expand = hostnames or slurm_hostnames
            node_index = int(env.get("SLURM_NODEID", "0"))
            return cls(
                rank=int(env["SLURM_PROCID"]),
                world_size=int(env["SLURM_NTASKS"]),
                local_rank=int(env.get("SLURM_LOCALID", "0")),
                local_world_size=tasks_on_node(env, node_index),
                master_addr=env.get("MASTER_ADDR") or node_address(expand(nodelist)[0]),
                master_port=int(env.get("MASTER_PORT") or port_for_job(env.get("SLURM_JOB_ID", "0"))),
                launcher="slurm",
            )
        if "SUBMITIT_LOCAL_GLOBALID" in env and int(env.get("SUBMITIT_LOCAL_NTASKS", "1")) > 1:
            tasks = int(env["SUBMITIT_LOCAL_NTASKS"])
            return cls(
                rank=int(env["SUBMITIT_LOCAL_GLOBALID"]),
                world_size=tasks,
                local_rank=int(env.get("SUBMITIT_LOCAL_LOCALID", env["SUBMITIT_LOCAL_GLOBALID"])),
                local_world_size=tasks,  # the local executor runs one node
                master_addr=env.get("MASTER_ADDR") or "127.0.0.1",
                master_port=int(
                    env.get("MASTER_PORT") or port_for_job(env.get("SUBMITIT_LOCAL_JOB_ID", "0"))
                ),
                launcher="submitit_local",
            )
        return None


def free_port() -> int:
    """A TCP port free on this machine now: for ranks started here alone (no launcher chose one),
    so two runs on one machine never meet on a fixed port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_for_job(job_id: str) -> int:
    """The same port in every task of a job; array tasks ('123_4') get their own."""
    digits = [int(part) for part in re.findall(r"\d+", job_id)] or [0]
    value = 0
    for part in digits:
        value = value * 1_000_003 + part
    return PORT_BASE + value % PORT_SPAN


def tasks_on_node(env: Mapping[str, str], node_index: int) -> int:
    """Tasks on this node from SLURM_TASKS_PER_NODE ('2(x3),1' = 2, 2, 2, 1)."""
    if env.get("SLURM_NTASKS_PER_NODE"):
        return int(env["SLURM_NTASKS_PER_NODE"])
    spec = env.get("SLURM_TASKS_PER_NODE")
    if not spec:
        return int(env.get("SLURM_NTASKS", "1"))
    counts: list[int] = []
    for item in spec.split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", item.strip())
        if not match:
            raise ValueError(f"cannot parse SLURM_TASKS_PER_NODE={spec!r}")
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts[min(node_index, len(counts) - 1)]


def slurm_hostnames(nodelist: str) -> list[str]:
    """Hosts of a Slurm node list, by `scontrol show hostnames` where Slurm is installed."""
    scontrol = shutil.which("scontrol")
    if scontrol:
        try:
            done = subprocess.run(
                [scontrol, "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30
            )
        except (OSError, subprocess.TimeoutExpired):
            done = None
        if done is not None and done.returncode == 0 and done.stdout.split():
            return done.stdout.split()
    return expand_hostlist(nodelist)


def node_address(node: str) -> str:
    """Where the ranks meet on a job's first node: its name where that resolves (every cluster's
    node names do), else the address Slurm itself reaches it at (`scontrol show node`: NodeAddr),
    as on a test Slurm whose node names are no host names (scripts/slurm_local.sh)."""
    try:
        socket.getaddrinfo(node, None)
        return node
    except (OSError, UnicodeError):
        pass
    scontrol = shutil.which("scontrol")
    if scontrol:
        try:
            done = subprocess.run(
                [scontrol, "--oneliner", "show", "node", node], capture_output=True, text=True, timeout=30
            )
        except (OSError, subprocess.TimeoutExpired):
            done = None
        found = re.search(r"\bNodeAddr=(\S+)", done.stdout) if done is not None else None
        if found:
            return found.group(1)
    return node


def expand_hostlist(nodelist: str) -> list[str]:
    """Slurm hostlist syntax: 'gpu[001-003,007],login1' -> gpu001 gpu002 gpu003 gpu007 login1."""
    hosts: list[str] = []
    for item in re.findall(r"[^,\[]+(?:\[[^\]]*\][^,\[]*)*", nodelist):
        expansions = [""]
        for literal, ranges in re.findall(r"([^\[]*)(?:\[([^\]]*)\])?", item):
            values = _expand_ranges(ranges) if ranges else [""]
            expansions = [prefix + literal + value for prefix in expansions for value in values]
        hosts.extend(expansions)
    return hosts


def _expand_ranges(ranges: str) -> list[str]:
    values: list[str] = []
    for part in ranges.split(","):
        low, _, high = part.partition("-")
        if not high:
            values.append(low)
            continue
        width = len(low)
        values.extend(str(n).zfill(width) for n in range(int(low), int(high) + 1))
    return values


def global_rank() -> int:
    return int(os.environ.get("SLURM_PROCID", os.environ.get("RANK", "0")) or 0)


def job_id_from_env() -> str | None:
    """This job's id as its point.json holds it: ARRAY_TASK for an array task (SLURM_JOB_ID is
    then a number of its own), else SLURM_JOB_ID."""
    env = os.environ
    if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):
        return f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    return env.get("SLURM_JOB_ID")
