"""Many runs on Slurm: what a sweep submits, and what happens around each job.

slurm      launcher settings -> sbatch parameters -> rendered script, batched polling
site       per-cluster site settings (account, partition, container)
pack       several points in one Slurm job, one srun step after another
canary     the short job a Slurm sweep submits first: the stack imports, the config builds
requeue    surviving preemption and time limits inside a Slurm task
preflight  every node of a job checked before its run; a failing node excluded from the sweep's jobs
status     `moe-vlm status`: per-point state of a sweep
halving    successive halving over a sweep's points, rung by rung
entry      where a bare `python train.py ...` runs: in place, or submitted as a one-point sweep
"""
