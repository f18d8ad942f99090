"""The planning sweeper, as Hydra finds it: `hydra/sweeper=moe_vlm` (train.py's default).

Hydra's plugin scan executes this module in every Hydra command, `--help` included, so it imports
only Hydra: the planning itself (compose and validate every point, print a dry run's plans and
sbatch scripts, skip completed points, launch the rest; _planning.py) is imported by `sweep`.
"""

# No `from __future__ import annotations`: Hydra's plugin scan executes this module outside
# sys.modules, where dataclasses cannot resolve string annotations.
from typing import Any

from hydra.plugins.launcher import Launcher
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig


class PlanningSweeper(Sweeper):
    def __init__(
        self,
        params: dict[str, str] | None = None,
        force: bool = False,
        search: str = "grid",
        halving: Any = None,
        predict_keep: float = 1.0,
        library_checks: bool = True,
    ) -> None:
        super().__init__()
        self.params = dict(params or {})
        self.force = force
        self.search = search
        self.halving = halving
        self.predict_keep = predict_keep
        self.library_checks = library_checks
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self.launcher: Launcher | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        from hydra.core.plugins import Plugins

        self.config = config
        self.hydra_context = hydra_context
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )

    def sweep(self, arguments: list[str]) -> Any:
        # The rule catalogue, the plans and the Slurm rendering (numpy; torch for a GPU point's plan).
        from hydra_plugins.moe_vlm_sweeper._planning import Planner

        assert self.config is not None and self.hydra_context is not None and self.launcher is not None
        planner = Planner(
            params=self.params,
            force=self.force,
            search=self.search,
            halving=self.halving,
            predict_keep=self.predict_keep,
            library_checks=self.library_checks,
            config=self.config,
            hydra_context=self.hydra_context,
            launcher=self.launcher,
        )
        return planner.sweep(arguments)
