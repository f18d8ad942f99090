"""`hydra/launcher=slurm*`'s settings, apart from the launcher's Slurm code: the launcher plugin's
structured config (hydra_plugins/moe_vlm_sweeper/config.py) derives from them, and Hydra's plugin
scan imports that config in every Hydra command, so this module imports nothing of ours."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class PreflightSettings:
    """`hydra.launcher.preflight.*`: the node preflight every task of a Slurm job runs before the
    run starts (moe_vlm/launch/preflight.py). Expected rates come from the cluster preset's
    hardware description (moe_vlm/launch/preflight.py `expected_rates`); a figure set here
    replaces the preset's (cluster=local has none: without one, a node is held only to the job's
    best node). A node below `fraction` x expected fails."""

    enabled: bool = True  # false skips it (the skip switch)
    gemm_tflops: float | None = None  # expected dense BF16 GEMM TFLOP/s per GPU (or CPU rank)
    intra_gbps: float | None = None  # expected intra-node bus bandwidth, GB/s per GPU
    inter_gbps: float | None = None  # expected inter-node bus bandwidth, GB/s per GPU
    gemm_fraction: float = 0.5  # a GPU below this fraction of the expected GEMM rate fails
    collective_fraction: float = 0.25  # a collective below this fraction of the expected bandwidth fails
    # A node below this fraction of the job's best node fails too (the self-relative check, the
    # only one on cluster=local without figures above).
    relative_fraction: float = 0.5
    seconds: float = 0.3  # timing per GEMM
    collective_iters: int = 5  # timed calls per collective (after one untimed)
    message_mib: float | None = None  # per-rank message; null = 64 MiB on GPUs, 4 MiB on CPU
    gemm_size: int | None = None  # square GEMM side; null = 8192 on GPUs, 512 on CPU
    # A rerun of the sweep keeps every node that failed it out of the sweep's jobs (--exclude).
    exclude_failed: bool = True


@dataclass
class SlurmSettings:
    """Everything `hydra/launcher=slurm*` sets. Resources that depend on the experiment (nodes,
    tasks and GPUs per node) are not here: they come from each point's RunSpec."""

    submitit_folder: str = "${hydra.sweep.dir}/.submitit/%j"
    executor: str = "slurm"  # slurm | local (submitit's local executor: processes on this machine)
    # Return once the jobs are queued (Slurm). False waits for every job, as the local executor does.
    submit_and_exit: bool = True
    # The cluster config this preset is written for (null = any). A mismatch is an error.
    expects_cluster: str | None = None
    name: str = "moe_vlm"  # Slurm job name
    timeout_min: int = 30  # time limit per job
    cpus_per_task: int | None = None
    mem_gb: int | None = None  # per node; 0 = all of the node's memory; null = Slurm's default
    exclusive: bool = False  # whole nodes
    # GB200: keep a job inside one NVLink domain. "auto" = the largest node count that divides
    # the job and fits one domain (all nodes when the job fits); a number = that; null = off.
    segment: str | None = None
    signal_delay_s: int = 120  # USR2 this long before the time limit (NCCL catches USR1)
    max_requeues: int = 2  # requeues after a USR2 (time limit or preemption) before recording a failure
    # Up to this many points with the same resources run one after another as srun steps of one
    # job (one queue wait instead of N); its time limit is the sum of theirs. 1 = a job per point.
    points_per_job: int = 1
    # Points with the same resources that are not packed go in one job array: one sbatch call.
    array: bool = True
    # One short one-node job per (cluster, container image) before the points, which depend on it
    # (afterok): it imports the stack in the job environment and builds the first point's config.
    canary: bool = True
    canary_timeout_min: int = 15  # room for a first container image pull; the check itself is ~1 min
    # The canary also measures the step model's rates on its node (seconds: GEMMs, attention, a
    # copy, eager ops, the data loader, the link) and, where no published rates apply, stores them.
    canary_probe: bool = True
    # Site values: null/empty here = from MOE_VLM_* env or ~/.config/moe_vlm/site.yaml (see launch/site.py).
    account: str | None = None
    partition: str | None = None
    qos: str | None = None
    reservation: str | None = None
    constraint: str | None = None
    container_image: str | None = None  # pyxis --container-image
    container_mounts: list[str] = field(default_factory=list)  # pyxis --container-mounts, SRC:DST[:FLAGS]
    container_workdir: str | None = None
    container_env: list[str] = field(default_factory=list)  # env var names pyxis passes into the container
    python: str | None = None  # interpreter the tasks run; null = the one submitting
    setup: list[str] = field(default_factory=list)  # shell lines before srun (module load, exports)
    srun_args: list[str] = field(default_factory=list)  # extra srun arguments
    additional_parameters: dict[str, Any] = field(default_factory=dict)  # extra #SBATCH --key=value
    preflight: PreflightSettings = field(default_factory=PreflightSettings)
