"""Engines: the torch engine (embedded default) and the Megatron engine (GPU clusters)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from moe_vlm.base.errors import EngineUnavailable
from moe_vlm.config.schema import Engine
from moe_vlm.config.spec import RunSpec


def launch(spec: RunSpec, config: dict[str, Any], run_dir: Path) -> None:
    if spec.engine == Engine.torch:
        # Imported here: torch, transformers and the data path load only for the torch engine.
        from moe_vlm.engines import torch_engine

        torch_engine.launch(spec, config, run_dir)
        return
    if spec.engine == Engine.megatron:
        # Imports the Megatron stack lazily; raises EngineUnavailable with the reason when it
        # (or a GPU) is missing.
        from moe_vlm.engines.megatron.launch import launch as launch_megatron

        launch_megatron(spec, config, run_dir)
        return
    raise EngineUnavailable(f"engine={spec.engine}: no such engine; allowed: torch, megatron.")
