"""One run of train.py, composed once: the pre-flight's composition is the one Hydra runs.

`@hydra.main` composes the config twice for a single run (hydra/_internal/utils.py:_run_hydra:
`Hydra.get_mode` composes in MULTIRUN mode only to read `hydra.mode`, then `_run_app` appends
`hydra.mode=RUN` and `Hydra.run` composes again), and the pre-flight (config/preflight.py)
composed it once before that, to word a bad override in one line before Hydra writes anything.
Each composition of conf/train.yaml is a quarter of a second on a 2-core machine, most of a CPU
dry run beyond what an empty Hydra app costs (docs/configuration.md, Start-up).

For a plain single run (no -m, no --cfg/--help/--info/..., no --config-* flag, no sweep
override, no `hydra.mode`), train.py builds Hydra as `_run_hydra` does (the same search path, task
name and `Hydra` object, hydra/_internal/hydra.py:Hydra.create_main_hydra2) but with a config
loader that keeps one composition: the pre-flight checks it, and `Hydra.run` gets it instead of
composing again. Its mode is what `get_mode` would find: a config that sets `hydra.mode` itself
is left to `@hydra.main` (`usable` is False). Anything else goes through `@hydra.main` unchanged.
tests/unit/test_one_run.py checks the kept composition equals Hydra's own and that the run's
.hydra/ files are those `@hydra.main` writes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra._internal.hydra import Hydra
from hydra._internal.utils import (
    create_automatic_config_search_path,
    detect_calling_file_or_module_from_task_function,
    detect_task_name,
    get_args_parser,
    run_and_report,
)
from hydra.core.config_loader import ConfigLoader
from hydra.core.config_search_path import ConfigSearchPath
from hydra.core.global_hydra import GlobalHydra
from hydra.core.object_type import ObjectType
from hydra.core.utils import validate_config_path
from hydra.plugins.config_source import ConfigSource
from hydra.types import RunMode, TaskFunction
from omegaconf import DictConfig

from moe_vlm.config.compose import override_key, parse_override

# What `_run_app` appends to a single run's overrides when the config leaves hydra.mode unset
# (hydra/_internal/utils.py:_run_app); `Hydra.run` composes with it.
RUN_MODE = "hydra.mode=RUN"


class KeepingLoader(ConfigLoader):
    """Hydra's config loader, handing `Hydra.run` the one composition already made for this run.

    Kept once, handed out once: any other request (a second composition, a sweep's) is Hydra's own.
    """

    def __init__(self, search_path: ConfigSearchPath) -> None:
        self.inner = ConfigLoaderImpl(config_search_path=search_path)
        self._kept: dict[tuple[Any, ...], DictConfig] = {}

    @staticmethod
    def _key(
        config_name: str | None, overrides: list[str], run_mode: RunMode, from_shell: bool, validate: bool
    ) -> tuple[Any, ...]:
        return (config_name, tuple(overrides), run_mode, from_shell, validate)

    def keep(self, config_name: str, overrides: list[str]) -> DictConfig:
        """Compose `overrides` for a single run; when the config leaves hydra.mode unset, keep the
        result as the composition of `overrides + [hydra.mode=RUN]` that Hydra.run will ask for.

        Setting the node and recording the override is what Hydra's composition does with that one
        hydra override (config_loader_impl.py: `_apply_overrides_to_config`, then
        `cfg.hydra.overrides.hydra.append`); nothing else reads hydra.mode while composing.
        """
        cfg = self.inner.load_configuration(config_name, list(overrides), RunMode.RUN)
        if cfg.hydra.mode is None:
            cfg.hydra.mode = RunMode.RUN
            cfg.hydra.overrides.hydra.append(RUN_MODE)
            self._kept[self._key(config_name, [*overrides, RUN_MODE], RunMode.RUN, True, True)] = cfg
        return cfg

    @property
    def holds(self) -> bool:
        return bool(self._kept)

    def load_configuration(
        self,
        config_name: str | None,
        overrides: list[str],
        run_mode: RunMode,
        from_shell: bool = True,
        validate_sweep_overrides: bool = True,
    ) -> DictConfig:
        kept = self._kept.pop(
            self._key(config_name, overrides, run_mode, from_shell, validate_sweep_overrides), None
        )
        if kept is not None:
            return kept
        return self.inner.load_configuration(
            config_name=config_name,
            overrides=overrides,
            run_mode=run_mode,
            from_shell=from_shell,
            validate_sweep_overrides=validate_sweep_overrides,
        )

    def load_sweep_config(self, master_config: DictConfig, sweep_overrides: list[str]) -> DictConfig:
        return self.inner.load_sweep_config(master_config, sweep_overrides)

    def get_search_path(self) -> ConfigSearchPath:
        return self.inner.get_search_path()

    def get_sources(self) -> list[ConfigSource]:
        return self.inner.get_sources()

    def list_groups(self, parent_name: str) -> list[str]:
        return self.inner.list_groups(parent_name)

    def get_group_options(
        self,
        group_name: str,
        results_filter: ObjectType | None = ObjectType.CONFIG,
        config_name: str | None = None,
        overrides: list[str] | None = None,
    ) -> list[str]:
        return self.inner.get_group_options(group_name, results_filter, config_name, overrides)

    def compute_defaults_list(self, config_name: str | None, overrides: list[str], run_mode: RunMode) -> Any:
        return self.inner.compute_defaults_list(config_name, overrides, run_mode)


# Flags after which `_run_hydra` does something other than run one job, or reads configs from
# elsewhere: those commands go through @hydra.main as they always did.
_OTHER_COMMANDS = (
    "help",
    "hydra_help",
    "cfg",
    "resolve",
    "package",
    "multirun",
    "shell_completion",
    "config_path",
    "config_name",
    "config_dir",
    "experimental_rerun",
    "info",
)


@dataclass
class OneRun:
    """A single run of `task` with conf/<config_name>.yaml, composed once (see the module's doc)."""

    task: TaskFunction
    config_path: str
    config_name: str
    overrides: list[str]
    loader: KeepingLoader = field(init=False)
    task_name: str = field(init=False)

    def __post_init__(self) -> None:
        # As hydra/_internal/utils.py:_run_hydra finds them for @hydra.main(config_path=...).
        calling_file, calling_module = detect_calling_file_or_module_from_task_function(self.task)
        self.task_name = detect_task_name(calling_file, calling_module)
        validate_config_path(self.config_path)
        self.loader = KeepingLoader(
            create_automatic_config_search_path(calling_file, calling_module, self.config_path)
        )

    @classmethod
    def of(cls, task: TaskFunction, config_path: str, config_name: str, argv: list[str]) -> OneRun | None:
        """The run `argv` asks for, when it is a plain single run; None for any other command."""
        args, unknown = get_args_parser().parse_known_args(argv)
        if unknown or any(getattr(args, flag) for flag in _OTHER_COMMANDS):
            return None
        overrides: list[str] = list(args.overrides or [])
        try:
            if any(
                override_key(o) == "hydra.mode" or parse_override(o).is_sweep_override() for o in overrides
            ):
                return None
        except Exception:
            return None  # the pre-flight words a grammar error; @hydra.main never sees it
        return cls(task, config_path, config_name, overrides)

    def _hydra(self) -> Hydra:
        # Hydra's constructor names the job (JobRuntime) that a composition records as hydra.job.name.
        return Hydra(task_name=self.task_name, config_loader=self.loader)

    def compose(self) -> DictConfig:
        """The run's composition, kept for Hydra's run; raises what Hydra's composition raises."""
        self._hydra()
        return self.loader.keep(self.config_name, self.overrides)

    @property
    def usable(self) -> bool:
        """Whether `run` can use the kept composition (the config left hydra.mode unset, and no
        composition has taken it)."""
        return self.loader.holds

    def run(self, fallback: Callable[[], Any]) -> None:
        """Hydra's run of the kept composition, as `_run_hydra` runs a single job; `fallback`
        (the @hydra.main function) when there is none to use."""
        if not self.usable:
            fallback()
            return
        GlobalHydra.instance().clear()  # the planners' compose helper may have left its own
        hydra = self._hydra()
        GlobalHydra.instance().initialize(hydra)
        try:
            run_and_report(
                lambda: hydra.run(
                    config_name=self.config_name,
                    task_function=self.task,
                    overrides=[*self.overrides, RUN_MODE],
                )
            )
        finally:
            GlobalHydra.instance().clear()
