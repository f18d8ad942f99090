"""How many DataLoader worker processes build each training rank's batches (data.num_workers).

With none, the Qwen image processor and the collate run on the training thread inside each step,
and the step time measures them. data.num_workers=null (the default) resolves per engine:

- engine=torch: 0, the engine builds batches in its training loop (rule E010) and records the
  wait per step (steps.jsonl data_wait_s);
- engine=megatron: from the CPUs of one rank. Under Slurm that is SLURM_CPUS_PER_TASK (the
  launchers run one task per GPU); elsewhere this process's CPU affinity over the ranks per node.
  One core stays with the training thread; each worker keeps PREFETCH_PER_WORKER micro-batches
  ready (torch's DataLoader default: Bridge's loader passes no prefetch_factor,
  megatron/bridge/data/samplers.py:114-122).

An explicit data.num_workers wins on the Megatron engine. Resolved where it runs: on each rank at
run time, and for the plan on the machine that plans.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from moe_vlm.config.schema import Engine
from moe_vlm.config.spec import RunSpec

# torch.utils.data.DataLoader's prefetch_factor default when num_workers > 0.
PREFETCH_PER_WORKER = 2
# A rank consumes a few micro-batches per second; past this, more workers add host memory (each one
# prefetches) and start-up time, not batches the GPU could use.
MAX_AUTO_WORKERS = 8


@dataclass(frozen=True)
class Workers:
    count: int
    source: str  # where the count comes from, in words

    @property
    def prefetched(self) -> int:
        """Micro-batches the loader keeps ready ahead of the training loop."""
        return self.count * PREFETCH_PER_WORKER

    def describe(self) -> str:
        if self.count == 0:
            return f"0: batches built on the training thread, inside the step ({self.source})"
        return f"{self.count} per rank, {self.prefetched} micro-batches prefetched ({self.source})"


def cpus_per_rank(ranks_per_node: int, environ: Mapping[str, str] | None = None) -> tuple[int, str]:
    env = os.environ if environ is None else environ
    slurm = env.get("SLURM_CPUS_PER_TASK", "")
    if slurm.isdigit() and int(slurm) > 0:
        return int(slurm), f"SLURM_CPUS_PER_TASK={slurm}"
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    ranks = max(ranks_per_node, 1)
    return max(cpus // ranks, 1), f"{cpus} CPUs here / {ranks} ranks per node"


def data_workers(spec: RunSpec, environ: Mapping[str, str] | None = None) -> Workers:
    """The worker count this rank's data loader uses, and where it comes from."""
    if spec.data.num_workers is not None:
        return Workers(spec.data.num_workers, "data.num_workers")
    if spec.engine is Engine.torch:
        return Workers(0, "torch engine; steps.jsonl data_wait_s records the wait")
    cpus, source = cpus_per_rank(spec.layout.ranks_per_node, environ)
    count = min(max(cpus - 1, 1), MAX_AUTO_WORKERS)
    return Workers(count, f"auto: {source}, one core left to the training thread, at most {MAX_AUTO_WORKERS}")
