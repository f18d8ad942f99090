"""Structured configs of the planning sweeper and the submitit launchers, in Hydra's ConfigStore.

`conf/hydra/launcher/{slurm,slurm_gb200,slurm_b200,local}.yaml` start from `moe_vlm_submitit`.
"""

# No `from __future__ import annotations`: Hydra's plugin scan executes this module outside
# sys.modules, where dataclasses cannot resolve string annotations.
from dataclasses import dataclass

from hydra.core.config_store import ConfigStore

from moe_vlm.launch.slurm import SlurmSettings


@dataclass
class PlanningSweeperConf:
    _target_: str = "hydra_plugins.moe_vlm_sweeper.sweeper.PlanningSweeper"
    # Sweep axes from a preset (conf/sweep/*.yaml); command-line sweeps of the same key win.
    params: dict[str, str] | None = None
    # Rerun points already completed in the sweep directory (default: skip them = resume).
    force: bool = False


@dataclass
class SubmititLauncherConf(SlurmSettings):
    _target_: str = "hydra_plugins.moe_vlm_sweeper.launcher.SubmititLauncher"


ConfigStore.instance().store(
    group="hydra/sweeper", name="moe_vlm", node=PlanningSweeperConf, provider="moe_vlm"
)
ConfigStore.instance().store(
    group="hydra/launcher", name="moe_vlm_submitit", node=SubmititLauncherConf, provider="moe_vlm"
)
