"""tests/megatron: the real Megatron Bridge / Megatron Core / Transformer Engine objects, on CPU.

When the stack does not import, every test here is skipped, and the reason is printed in red at
the end of the run (never a silent pass). Install it with `bash scripts/install_megatron.sh`
(scripts/test.sh does).
"""

from __future__ import annotations

import contextlib
import copy
import os
import socket
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from moe_vlm.config.spec import RunSpec
from moe_vlm.engines.megatron.stack import stack_problem

STACK_PROBLEM = stack_problem()
needs_stack = pytest.mark.skipif(
    STACK_PROBLEM is not None, reason=f"Megatron stack unavailable: {STACK_PROBLEM}"
)

# Lines the session summary prints (agreement counts, what was checked).
REPORT: list[str] = []


# The session summary's lines (the loud skip above, then REPORT) are printed by tests/conftest.py:
# under pytest-xdist only the root conftest runs in the controller, which gets REPORT's lines from
# the workers' test reports.


class RecipeCache:
    """Each recipe is built once per model (it converts an HF config: about a second); tests get copies."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self._built: dict[tuple[str, str], Any] = {}

    def config(self, spec: RunSpec) -> Any:
        from moe_vlm.engines.hf_config import hf_model_dir
        from moe_vlm.engines.megatron.config import offline_hf, recipe_function
        from moe_vlm.knobs.bridge_recipe import select_recipe

        recipe = select_recipe(spec)
        assert recipe is not None, f"no recipe for {spec.model.name}"
        key = (recipe.name, spec.model.name)
        if key not in self._built:
            with warnings.catch_warnings(), offline_hf(hf_model_dir(spec.model, self.workdir)):
                warnings.simplefilter("ignore")
                self._built[key] = recipe_function(recipe)()
        return copy.deepcopy(self._built[key])


@pytest.fixture(scope="session")
def recipes(tmp_path_factory: pytest.TempPathFactory) -> RecipeCache:
    return RecipeCache(tmp_path_factory.mktemp("megatron"))


def device_properties(spec: RunSpec) -> SimpleNamespace:
    """The GPU our cluster profile declares, as torch.cuda.get_device_properties describes one."""
    capability = spec.cluster.compute_capability
    return SimpleNamespace(name=spec.cluster.gpu, major=int(capability), minor=round(capability % 1 * 10))


@pytest.fixture
def engine_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Run the engine's own pre-flight for one spec as a rank of that job would.

    Bridge reads the world size from WORLD_SIZE, applies the recipe's env_vars to the process
    (os.environ.setdefault) and asks torch.cuda for the device in its flex-dispatcher check
    (validate_flex_dispatcher_backend). Each `prepare(spec)` starts from the environment the
    test session had, with the job's world size, and answers the device query with the GPU our
    cluster profile declares (there is none here): Bridge's own check code runs on it.
    """
    import torch

    saved = dict(os.environ)

    def prepare(spec: RunSpec) -> None:
        os.environ.clear()
        os.environ.update({k: v for k, v in saved.items() if not k.startswith("SLURM_")})
        os.environ["WORLD_SIZE"] = str(spec.layout.world_size)
        os.environ["RANK"] = "0"
        properties = device_properties(spec)
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *_args, **_kw: properties)

    try:
        yield prepare
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextlib.contextmanager
def model_parallel_rank() -> Iterator[None]:
    """One gloo rank with Megatron's model-parallel groups (a free local port for the rendezvous)."""
    import torch
    from megatron.core import parallel_state

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    parallel_state.initialize_model_parallel()
    try:
        yield
    finally:
        parallel_state.destroy_model_parallel()
        torch.distributed.destroy_process_group()


def runtime_updated(recipes: RecipeCache, prepare: Any, *overrides: str) -> tuple[RunSpec, Any]:
    """The engine's ConfigContainer for these overrides after Bridge's runtime update, as a rank of
    the job builds it (prepare: the engine_environment fixture)."""
    from megatron.bridge.training.config import runtime_config_update

    from moe_vlm.engines.megatron.config import apply_overrides
    from tests.conftest import make_spec

    spec = make_spec(*overrides)
    cfg = recipes.config(spec)
    apply_overrides(cfg, spec)
    prepare(spec)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        runtime_config_update(cfg)
    return spec, cfg
