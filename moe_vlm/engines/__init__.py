"""Engines: the torch engine (embedded default) and the Megatron engine (GPU clusters)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from moe_vlm.spec import RunSpec


class EngineUnavailable(RuntimeError):
    """The engine cannot run here (missing library or hardware); the message says why."""


def launch(spec: RunSpec, config: dict[str, Any], run_dir: Path) -> None:
    if spec.engine == "torch":
        from moe_vlm.engines import torch_engine

        torch_engine.launch(spec, config, run_dir)
        return
    raise EngineUnavailable(
        "engine=megatron: the Megatron Bridge engine is not available in this build yet; "
        "plan the run with dry_run=true, or use engine=torch."
    )
