"""Job-side runtime: what a run's own processes need, below the engines that call it.

dist_env.py (who am I: rank, world, rendezvous; the Slurm job and pack variables), heartbeat.py
(running/killed), points.py (a sweep point's and run's files), failures.py (classifying and
recording a failure), node_probe.py (the node preflight's GEMM and collective timings). See
docs/layout.md.
"""
