"""`hydra/launcher=slurm*`'s settings, apart from the launcher's Slurm code: the launcher plugin's
structured config (hydra_plugins/moe_vlm_sweeper/config.py) derives from them, and Hydra's plugin
scan imports that config in every Hydra command, so this module imports nothing of ours."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


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
    # The canary also times the first point's GEMMs and collectives on its node (seconds) and,
    # where no published-row defaults apply, stores that as a first step-time calibration.
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
