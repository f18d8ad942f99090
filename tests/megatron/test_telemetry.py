"""profiling= and logger= against the installed Megatron Bridge, on CPU.

- Every option of both groups builds the real ConfigContainer, holds the table's values, and its
  run-directory paths land in the run directory; Bridge's own finalize checks accept it (MLflow's
  imports mlflow: the stack check names it first).
- Bridge's own profiler code, driven in its training loop's order (training/train.py:378-384, 564,
  718-724), records exactly profiling.steps: the PyTorch trace in <run_dir>/torch_profile, nsys's
  capture range opened and closed around the same steps.
- The module classes and dispatcher functions the per-module table names exist in the installed
  Megatron Core and Bridge under those names.
"""

from __future__ import annotations

import gzip
import importlib
import inspect
import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from moe_vlm.config.spec import RunSpec
from moe_vlm.knobs.telemetry_fields import RUN_DIR
from moe_vlm.record import profiling
from moe_vlm.report.module_table import DISPATCH_FUNCTIONS, PATTERNS
from tests.conftest import CONF, make_spec
from tests.megatron.conftest import REPORT, RecipeCache, needs_stack

BASE = ("engine=megatron", "dry_run=true", "model=qwen3_vl_30b_a3b", "cluster=gb200", "nodes=2")
OPTIONS = [
    (group, path.stem) for group in ("profiling", "logger") for path in sorted((CONF / group).glob("*.yaml"))
]


def built(recipes: RecipeCache, *overrides: str) -> tuple[RunSpec, Any]:
    from moe_vlm.engines.megatron.config import apply_overrides

    spec = make_spec(*BASE, *overrides)
    cfg = recipes.config(spec)
    apply_overrides(cfg, spec)
    return spec, cfg


def test_both_groups_have_their_four_options() -> None:
    assert sorted(OPTIONS) == sorted(
        [("profiling", t) for t in ("none", "nsys", "torch", "memory")]
        + [("logger", b) for b in ("none", "tensorboard", "wandb", "mlflow")]
    )


@needs_stack
@pytest.mark.parametrize(("group", "option"), OPTIONS)
def test_every_option_reaches_the_config_and_the_run_dir(
    recipes: RecipeCache, tmp_path: Path, group: str, option: str
) -> None:
    from moe_vlm.engines.megatron.config import check_overrides, get_field, place_in_run_dir

    spec, cfg = built(recipes, f"{group}={option}")
    assert check_overrides(cfg, spec) == []
    placed = place_in_run_dir(cfg, spec, tmp_path)
    for path in placed:
        value = get_field(cfg, path)
        assert RUN_DIR not in value and value.startswith(str(tmp_path)), (path, value)
    cfg.profiling.finalize()  # Bridge's own check: one profiler, a window that starts and ends
    if option == "mlflow" and importlib.util.find_spec("mlflow") is None:
        # Bridge's finalize imports mlflow when an MLflow field is set (training/config.py:699-708):
        # the engine's stack check (engines/megatron/stack.py MLFLOW) names it before that.
        with pytest.raises(ModuleNotFoundError, match="mlflow"):
            cfg.logger.finalize()
    else:
        cfg.logger.finalize()
    REPORT.append(f"{group}={option}: fields held, {len(placed)} path(s) placed in the run dir")


@pytest.fixture
def one_rank() -> Iterator[None]:
    initialised = torch.distributed.is_initialized()
    if not initialised:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        torch.distributed.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1
        )
    yield
    if not initialised:
        torch.distributed.destroy_process_group()


def _bridge_loop(cfg: Any, train_iters: int, prof: Any = None) -> None:
    """Bridge's training loop around the profiler, in its order (training/train.py): step() before
    each step with the completed-step count, stop() after the count is incremented."""
    from megatron.bridge.training.profiling import handle_profiling_step, handle_profiling_stop

    step, nvtx = 0, None
    weight = torch.randn(64, 64)
    while step < train_iters:
        nvtx = handle_profiling_step(cfg.profiling, step, 0, prof) or nvtx
        with torch.profiler.record_function(f"moe_vlm_step_{step + 1}"):
            (weight @ weight).sum()
        step += 1
        handle_profiling_stop(cfg.profiling, step, 0, prof, nvtx)


@needs_stack
@pytest.mark.parametrize("steps", [[3], [3, 4], [1, 2]])
def test_bridges_pytorch_profiler_records_exactly_the_window(
    recipes: RecipeCache, tmp_path: Path, one_rank: None, steps: list[int]
) -> None:
    from megatron.bridge.training.profiling import initialize_pytorch_profiler

    from moe_vlm.engines.megatron.config import place_in_run_dir

    window = ",".join(map(str, steps))
    spec, cfg = built(
        recipes, "profiling=torch", f"profiling.steps=[{window}]", "warmup_steps=0", "train_iters=6"
    )
    place_in_run_dir(cfg, spec, tmp_path)
    prof = initialize_pytorch_profiler(cfg.profiling, cfg.logger.tensorboard_dir)
    prof.start()
    _bridge_loop(cfg, spec.train_iters, prof)
    trace = profiling.torch_trace_path(tmp_path, 0)  # where the report looks
    assert trace.is_file(), f"Bridge wrote no trace at {trace}"
    with gzip.open(trace, "rt") as handle:
        names = {e.get("name") for e in json.load(handle)["traceEvents"]}
    recorded = sorted(int(n.rsplit("_", 1)[1]) for n in names if str(n).startswith("moe_vlm_step_"))
    first, last = profiling.window(spec)
    assert recorded == list(range(first, last + 1))
    REPORT.append(f"Bridge's PyTorch profiler, profiling.steps={steps}: recorded steps {recorded}")


@needs_stack
@pytest.mark.parametrize("steps", [[3], [2, 4]])
def test_bridges_nsys_range_opens_and_closes_around_the_window(
    recipes: RecipeCache, monkeypatch: pytest.MonkeyPatch, steps: list[int]
) -> None:
    """cudaProfilerStart/Stop need a GPU: Bridge's two calls into them record when its loop makes
    them; everything that decides when is Bridge's."""
    from megatron.bridge.training import profiling as bridge_profiling

    window = ",".join(map(str, steps))
    spec, cfg = built(recipes, "profiling=nsys", f"profiling.steps=[{window}]", "warmup_steps=1")
    calls: list[str] = []

    def start(_cfg: Any) -> str:
        calls.append("start")
        return "ctx"

    monkeypatch.setattr(bridge_profiling, "start_nsys_profiler", start)
    monkeypatch.setattr(bridge_profiling, "stop_nsys_profiler", lambda _ctx: calls.append("stop"))
    from megatron.bridge.training.profiling import handle_profiling_step, handle_profiling_stop

    step, opened, closed = 0, None, None
    while step < spec.train_iters:
        if handle_profiling_step(cfg.profiling, step, 0, None) is not None:
            opened = step + 1  # the step about to run is the first inside the range
        step += 1
        before = len(calls)
        handle_profiling_stop(cfg.profiling, step, 0, None, "ctx")
        if len(calls) > before:
            closed = step  # the last step inside the range
    assert calls == ["start", "stop"] and (opened, closed) == profiling.window(spec)


@needs_stack
def test_the_tables_megatron_names_exist_in_the_installed_library() -> None:
    def cls(path: str) -> type[Any]:  # Megatron is untyped: its methods are looked up by name
        module, _, name = path.rpartition(".")
        found = getattr(importlib.import_module(module), name)
        assert isinstance(found, type), path
        return found

    roles = {
        "model": "megatron.bridge.models.qwen_vl.modelling_qwen3_vl.model.Qwen3VLModel",
        "vision": "megatron.bridge.models.qwen_vl.modelling_qwen3_vl.vision_model.Qwen3VLVisionModel",
        "projector": "megatron.bridge.models.qwen_vl.modelling_qwen3_vl.utils.Qwen3VLVisionPatchMerger",
        "decoder": "megatron.bridge.models.qwen_vl.modelling_qwen3_vl.text_model.Qwen3VLGPTModel",
        "attention": "megatron.bridge.models.qwen_vl.modelling_qwen3_vl.attention.Qwen3VLSelfAttention",
        "router": "megatron.core.transformer.moe.router.TopKRouter",
        "experts": "megatron.core.transformer.moe.experts.TEGroupedMLP",
        "gemm_module": "megatron.core.extensions.transformer_engine.TEColumnParallelGroupedLinear",
    }
    for role, path in roles.items():
        assert PATTERNS[role].search(cls(path).__name__), (role, path)
    assert PATTERNS["experts"].search(cls("megatron.core.transformer.moe.experts.SequentialMLP").__name__)
    assert PATTERNS["gemm_module"].search(
        cls("megatron.core.extensions.transformer_engine.TERowParallelGroupedLinear").__name__
    )
    assert PATTERNS["attention"].search(cls("megatron.core.ssm.gated_delta_net.gdn.GatedDeltaNet").__name__)
    # Token moves are functions (dispatchers are no modules): as the trace names a Python call.
    moe_layer = cls("megatron.core.transformer.moe.moe_layer.MoELayer")
    dispatcher = cls("megatron.core.transformer.moe.token_dispatcher.MoEAlltoAllTokenDispatcher")
    for method in (moe_layer.dispatch, moe_layer.combine, moe_layer.preprocess, dispatcher.token_dispatch):
        function = inspect.unwrap(method)  # the trace names the decorated function's own frame too
        path = inspect.getsourcefile(function) or ""
        relative = path[path.index("megatron/") :]
        line = inspect.getsourcelines(function)[1]
        assert DISPATCH_FUNCTIONS.search(f"{relative}({line}): {function.__name__}"), relative
    assert not DISPATCH_FUNCTIONS.search(
        f"megatron/core/transformer/moe/moe_layer.py(1): {moe_layer.forward.__name__}"
    )
