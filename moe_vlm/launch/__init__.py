"""Launching runs: where ranks come from and what happens around them.

dist_env   this process's place in a distributed launch (torchrun, Slurm, submitit local)
slurm      launcher settings -> sbatch parameters -> rendered script, batched polling
site       per-cluster site settings (account, partition, container)
safety     what may reach a shell, and what must never be written down
points     the sweep directory, one subdirectory per point
failures   why a run failed: classes, log tails, run.json failure records
requeue    surviving preemption and time limits inside a Slurm task
pack       several points in one Slurm job, one srun step after another
canary     the short job a Slurm sweep submits first: the stack imports, the config builds
entry      where a bare `python train.py ...` runs: in place, or submitted as a one-point sweep
"""
