"""Where a bare `python train.py ...` runs: in place, or submitted as a one-point sweep.

`python train.py parallelism=fsdp dispatcher=hybridep` is how users start. What it means
depends on where it is typed:

- on a laptop (no site `cluster`/`launcher`): it runs here, on cluster=local, as before;
- on a cluster login node whose site file (moe_vlm/launch/site.py) names `cluster: gb200` and
  `launcher: slurm_gb200`: it plans the run for gb200 and submits it as a one-point sweep
  (`-m hydra/launcher=slurm_gb200 cluster=gb200 ...`, canary included), then prints the
  `moe-vlm status` command;
- inside an allocation (a Slurm job, SLURM_JOB_ID set, with GPUs visible): it runs in place on
  the site's cluster; a nested job would wait behind the allocation it runs in.

`cluster=` and `hydra/launcher=` on the command line win over the site file; a command naming
another cluster than the site's runs as it says, without the site's launcher. GPUs are visible
when CUDA_VISIBLE_DEVICES names some, or (unset) when /dev/nvidia<N> exists;
`MOE_VLM_GPUS_VISIBLE=1` (or `0`) states it instead, for allocations whose GPUs are not yet
visible to this shell and for tests on machines without GPUs.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from hydra._internal.utils import get_args_parser

from moe_vlm.base.errors import BadInput
from moe_vlm.config.compose import CONF_DIR, override_key
from moe_vlm.launch import site

ENV_GPUS_VISIBLE = "MOE_VLM_GPUS_VISIBLE"
NO_GPUS = ("", "-1", "NoDevFiles")  # CUDA_VISIBLE_DEVICES values that hide every GPU


@dataclass(frozen=True)
class Entry:
    argv: list[str]  # the command line Hydra runs
    note: str | None  # one line saying what the site file changed, when it changed something


def gpus_visible(environ: Mapping[str, str]) -> bool:
    forced = environ.get(ENV_GPUS_VISIBLE)
    if forced is not None:
        if forced not in ("0", "1"):
            raise BadInput(
                f"{ENV_GPUS_VISIBLE}={forced!r}: expected 1 or 0. Fix: unset it to detect the GPUs."
            )
        return forced == "1"
    devices = environ.get("CUDA_VISIBLE_DEVICES")
    if devices is not None:
        return devices.strip() not in NO_GPUS
    return any(Path("/dev").glob("nvidia[0-9]*"))


def in_allocation(environ: Mapping[str, str]) -> bool:
    """Inside a Slurm job with GPUs: run here. An `salloc` shell on the login node has a job id
    but no GPUs, so a run started there is submitted like one from the login node."""
    return bool(environ.get("SLURM_JOB_ID")) and gpus_visible(environ)


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def _checked(key: str, value: str, group: str) -> str:
    allowed = _options(group)
    if value not in allowed:
        raise BadInput(
            f"{key}: {value!r} in the site file {site.site_file()} (or MOE_VLM_{key.upper()}): no such "
            f"option. Allowed: {', '.join(allowed)}. Fix: correct it there, or pass {group}=... on the "
            "command line."
        )
    return value


def _chosen(overrides: list[str]) -> dict[str, str]:
    """Config groups and keys the command line sets, by name (`cluster`, `hydra/launcher`)."""
    return {override_key(o): o.partition("=")[2] for o in overrides if "=" in o}


def command_line(argv: list[str], environ: Mapping[str, str] | None = None) -> Entry:
    """The command line to run for `argv`, with the site's cluster and launcher applied."""
    env = os.environ if environ is None else environ
    args, _ = get_args_parser().parse_known_args(argv)
    if args.help or args.hydra_help or args.shell_completion or args.info:
        return Entry(list(argv), None)
    defaults = site.entry_defaults()
    chosen = _chosen(list(args.overrides or []))
    out = list(argv)
    site_cluster = defaults.get("cluster")
    if site_cluster is not None:
        _checked("cluster", site_cluster, "cluster")
        if "cluster" not in chosen:
            out.append(f"cluster={site_cluster}")
    launcher = defaults.get("launcher")
    other_cluster = site_cluster is not None and chosen.get("cluster", site_cluster) != site_cluster
    if launcher is None or other_cluster or args.cfg or in_allocation(env):
        return Entry(out, None)
    launcher = chosen.get("hydra/launcher") or _checked("launcher", launcher, "hydra/launcher")
    if "hydra/launcher" not in chosen:
        out.append(f"hydra/launcher={launcher}")
    multirun = args.multirun or chosen.get("hydra.mode") == "MULTIRUN"
    if multirun:
        return Entry(out, None)
    return Entry(
        ["-m", *out],
        f"moe_vlm: not inside a GPU allocation: submitting this run as a one-point sweep through "
        f"hydra/launcher={launcher} (site file {site.site_file()}; inside an allocation it runs in place)",
    )
