"""DistEnv: this process's rank, world and rendezvous from real launcher environments."""

from __future__ import annotations

import shutil

import pytest

from moe_vlm.runtime.dist_env import DistEnv, expand_hostlist, port_for_job, slurm_hostnames, tasks_on_node

# What `torchrun --nnodes 1 --nproc-per-node 4` exports to its third worker.
TORCHRUN = {
    "RANK": "2",
    "WORLD_SIZE": "4",
    "LOCAL_RANK": "2",
    "LOCAL_WORLD_SIZE": "4",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "29500",
    "GROUP_RANK": "0",
    "TORCHELASTIC_RUN_ID": "none",
}

# What srun exports to task 5 of `sbatch -N2 --ntasks-per-node=4` (job 48213).
SLURM = {
    "SLURM_JOB_ID": "48213",
    "SLURM_PROCID": "5",
    "SLURM_NTASKS": "8",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1",
    "SLURM_JOB_NODELIST": "gb200-[017-018]",
    "SLURM_TASKS_PER_NODE": "4(x2)",
}

# What submitit's LocalExecutor exports to its task 1 of 2.
SUBMITIT_LOCAL = {
    "SUBMITIT_LOCAL_JOB_ID": "31337",
    "SUBMITIT_LOCAL_NTASKS": "2",
    "SUBMITIT_LOCAL_GLOBALID": "1",
    "SUBMITIT_LOCAL_LOCALID": "1",
    "SUBMITIT_LOCAL_NODEID": "0",
    "SUBMITIT_LOCAL_JOB_NUM_NODES": "1",
}


def test_torchrun() -> None:
    env = DistEnv.from_environ(TORCHRUN)
    assert env == DistEnv(
        rank=2,
        world_size=4,
        local_rank=2,
        local_world_size=4,
        master_addr="127.0.0.1",
        master_port=29500,
        launcher="torchrun",
    )
    assert env.init_method == "tcp://127.0.0.1:29500"


def test_slurm_task_agrees_with_every_other_task() -> None:
    env = DistEnv.from_environ(SLURM, hostnames=expand_hostlist)
    assert env is not None
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size) == (5, 8, 1, 4)
    assert env.master_addr == "gb200-017"
    assert env.launcher == "slurm"
    # Another task of the same job derives the same rendezvous without talking to this one.
    other = DistEnv.from_environ({**SLURM, "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0"})
    assert other is not None
    assert (other.master_addr, other.master_port) == (env.master_addr, env.master_port)
    # A different job gets a different port.
    assert DistEnv.from_environ({**SLURM, "SLURM_JOB_ID": "48214"}).master_port != env.master_port  # type: ignore[union-attr]


def test_slurm_explicit_master_wins() -> None:
    env = DistEnv.from_environ({**SLURM, "MASTER_ADDR": "10.0.0.7", "MASTER_PORT": "41000"})
    assert env is not None
    assert (env.master_addr, env.master_port) == ("10.0.0.7", 41000)


def test_single_slurm_task_is_not_a_distributed_launch() -> None:
    # One task per node (e.g. an interactive allocation): the engine spawns its own ranks.
    assert DistEnv.from_environ({**SLURM, "SLURM_NTASKS": "1", "SLURM_PROCID": "0"}) is None


def test_submitit_local() -> None:
    env = DistEnv.from_environ(SUBMITIT_LOCAL)
    assert env is not None
    assert (env.rank, env.world_size, env.local_rank, env.master_addr) == (1, 2, 1, "127.0.0.1")
    assert env.master_port == port_for_job("31337")
    assert env.launcher == "submitit_local"


def test_plain_process_is_not_distributed() -> None:
    assert DistEnv.from_environ({"PATH": "/usr/bin", "HOME": "/root"}) is None


def test_torchrun_wins_over_slurm() -> None:
    # torchrun inside a Slurm allocation: torchrun's per-worker variables describe the rank.
    env = DistEnv.from_environ({**SLURM, **TORCHRUN})
    assert env is not None and env.launcher == "torchrun"


@pytest.mark.parametrize(
    ("nodelist", "hosts"),
    [
        ("node1", ["node1"]),
        ("gpu[001-003,007]", ["gpu001", "gpu002", "gpu003", "gpu007"]),
        ("a[1-2],b3,c[09-10]", ["a1", "a2", "b3", "c09", "c10"]),
        ("rack[1-2]-n[3-4]", ["rack1-n3", "rack1-n4", "rack2-n3", "rack2-n4"]),
    ],
)
def test_expand_hostlist(nodelist: str, hosts: list[str]) -> None:
    assert expand_hostlist(nodelist) == hosts


@pytest.mark.skipif(shutil.which("scontrol") is None, reason="Slurm's scontrol is not installed")
def test_scontrol_agrees_with_the_parser() -> None:
    assert slurm_hostnames("gpu[001-003,007],login1") == expand_hostlist("gpu[001-003,007],login1")


def test_tasks_on_node() -> None:
    assert tasks_on_node({"SLURM_TASKS_PER_NODE": "2(x3),1"}, 2) == 2
    assert tasks_on_node({"SLURM_TASKS_PER_NODE": "2(x3),1"}, 3) == 1
    assert tasks_on_node({"SLURM_NTASKS_PER_NODE": "8", "SLURM_TASKS_PER_NODE": "8(x4)"}, 0) == 8
    assert tasks_on_node({"SLURM_NTASKS": "3"}, 0) == 3


def test_port_for_job_is_in_range_and_separates_array_tasks() -> None:
    ports = {port_for_job(job) for job in ("1", "48213", "48213_0", "48213_1", "999999999")}
    assert len(ports) == 5
    assert all(20000 <= port < 60000 for port in ports)
