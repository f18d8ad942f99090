"""Structured configs of the planning sweeper and the submitit launchers, in Hydra's ConfigStore.

`conf/hydra/launcher/{slurm,slurm_gb200,slurm_b200,local}.yaml` start from `moe_vlm_submitit`.
"""

# No `from __future__ import annotations`: Hydra's plugin scan executes this module outside
# sys.modules, where dataclasses cannot resolve string annotations.
from dataclasses import dataclass, field

from hydra.core.config_store import ConfigStore

from moe_vlm.launch.settings import SlurmSettings


@dataclass
class HalvingConf:
    """hydra.sweeper.halving.*, read by search=halving (moe_vlm/launch/halving.py)."""

    eta: int = 3  # keep the top 1/eta of each rung
    first_steps: int = 10  # steady steps of the first rung, after each point's warm-up (>= 10)
    rungs: int = 3  # the last rung runs each survivor's full train_iters
    tie_factor: float = 2.0  # ties with the cut go on too, up to tie_factor x the top 1/eta
    poll_s: float = 15.0  # seconds between looks at a running rung's jobs


@dataclass
class PlanningSweeperConf:
    _target_: str = "hydra_plugins.moe_vlm_sweeper.sweeper.PlanningSweeper"
    # Sweep axes from a preset (conf/sweep/*.yaml); command-line sweeps of the same key win.
    params: dict[str, str] | None = None
    # Rerun points already completed in the sweep directory (default: skip them = resume).
    force: bool = False
    # grid: every point to its train_iters; halving: successive halving (docs/slurm.md).
    search: str = "grid"
    halving: HalvingConf = field(default_factory=HalvingConf)
    # Keep only this fraction of the valid points, the best by predicted effective tokens/s/GPU
    # (moe_vlm/predict; docs/step-time-prediction.md). 1.0 = every point.
    predict_keep: float = 1.0
    # The library's own checks (LIB-*) on every point on this machine, when the Megatron stack
    # imports here; false leaves them to the canary (a first sweep of many distinct points pays
    # about 0.3 s a point, after one import of the stack).
    library_checks: bool = True


@dataclass
class SubmititLauncherConf(SlurmSettings):
    _target_: str = "hydra_plugins.moe_vlm_sweeper.launcher.SubmititLauncher"


ConfigStore.instance().store(
    group="hydra/sweeper", name="moe_vlm", node=PlanningSweeperConf, provider="moe_vlm"
)
ConfigStore.instance().store(
    group="hydra/launcher", name="moe_vlm_submitit", node=SubmititLauncherConf, provider="moe_vlm"
)
