"""moe_vlm's Hydra plugins: the planning sweeper (default for train.py) and the submitit launchers.

Hydra discovers them through the `hydra_plugins` namespace package: every Hydra command in this
environment executes each module here whose name does not start with `_`. Those modules import
only Hydra, OmegaConf and light modules of ours (tests/unit/test_plugin_imports.py); what a sweep,
a launch or `--help` needs is imported when it runs (the `_`-named modules hold the heavy parts).
"""

from typing import Any

from omegaconf import OmegaConf


def _help(part: str) -> str:
    from moe_vlm.cli.train_help import render  # reads conf/ and the schema: only `--help` asks

    return render(part)


def _sweep_name(overrides: Any) -> str:
    from moe_vlm.runtime.points import sweep_name  # the run records' module: only a sweep asks

    return sweep_name(list(overrides or []))


# Registered here, before Hydra composes anything; each resolver imports its module when resolved.
OmegaConf.register_new_resolver("moe_vlm_help", _help, replace=True)
OmegaConf.register_new_resolver("moe_vlm_sweep_name", _sweep_name, replace=True)
