"""profiling=none|nsys|torch|memory: the window, the srun wrapper, the torch engine's profiler, and a
real PyTorch trace turned into the per-module table."""

from __future__ import annotations

import gzip
import importlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from moe_vlm.base.errors import EngineUnavailable
from moe_vlm.base.files import RUN_JSON, STEPS_JSONL
from moe_vlm.launch import slurm
from moe_vlm.record import profiling
from moe_vlm.record.records import read_steps
from moe_vlm.report import module_table
from moe_vlm.report.module_table import (
    ATTENTION,
    DATA_PARALLEL,
    DECODER,
    DISPATCH,
    EXPERT_GEMM,
    PATTERNS,
    PROJECTOR,
    ROUTER,
    VISION,
)
from tests.conftest import REPO, make_spec

GB200 = ("cluster=gb200", "model=qwen3_vl_30b_a3b", "nodes=2")


# --- the window ------------------------------------------------------------------------------


def test_the_default_window_is_the_first_step_after_warm_up() -> None:
    spec = make_spec("profiling=torch")  # warmup_steps=2, train_iters=8
    assert profiling.window(spec) == (3, 3)
    # The torch profiler's own warm-up step (2) and its window are slowed.
    assert profiling.excluded_steps(spec) == [2, 3]
    assert profiling.exclude_reason(spec, 3) == "profiler" and profiling.exclude_reason(spec, 4) is None
    assert profiling.excluded_steps(make_spec("profiling=none")) == []


def test_the_memory_profile_slows_every_step_up_to_its_snapshot() -> None:
    # The allocator's history records from before the model is built until the snapshot is written
    # (then both engines stop it: profiling.stop_memory_history).
    spec = make_spec(*GB200, "profiling=memory", "profiling.steps=[4,5]", "train_iters=8")
    assert profiling.excluded_steps(spec) == [1, 2, 3, 4, 5]
    assert profiling.exclude_reason(spec, 5) == "profiler" and profiling.exclude_reason(spec, 6) is None


@pytest.mark.parametrize(
    ("tool", "bridge"),
    # Bridge counts completed steps (see profiling.bridge_window); all three record steps 4-5.
    [("nsys", (3, 5)), ("memory", (3, 5)), ("torch", (4, 6))],
)
def test_bridge_gets_the_window_in_its_own_counting(tool: str, bridge: tuple[int, int]) -> None:
    spec = make_spec(*GB200, "engine=megatron", "dry_run=true", f"profiling={tool}", "profiling.steps=[4,5]")
    assert profiling.bridge_window(spec) == bridge


def test_every_rank_is_listed_when_ranks_is_empty() -> None:
    spec = make_spec(*GB200, "profiling=torch", "profiling.ranks=[]")
    assert profiling.ranks(spec) == list(range(8))


# --- nsys: the srun line -----------------------------------------------------------------------


def test_dry_run_shows_nsys_in_the_srun_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "train.py",
            "-m",
            "hydra/launcher=slurm_gb200",
            "cluster=gb200",
            "model=qwen3_vl_30b_a3b",
            "profiling=nsys",
            "dry_run=true",
            f"hydra.sweep.dir={tmp_path / 'sweep'}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    srun = lines[lines.index("-- srun command --") + 1]
    assert srun.startswith("srun ") and "exec nsys profile --capture-range=cudaProfilerApi" in srun
    assert "--capture-range-end=stop" in srun and "moe_vlm_nsys 0 " in srun  # rank 0 only (the default)
    assert "export moe_vlm_point" in done.stdout  # the tasks find the point's directory
    # A plan submits nothing and writes only each point's plan.json (moe_vlm/run/plan_record.py)
    # and point.json (planned, not submitted: what `moe-vlm status` lists).
    written = [
        p.relative_to(tmp_path / "sweep").parts for p in (tmp_path / "sweep").rglob("*") if p.is_file()
    ]
    assert sorted(w[-1] for w in written) == ["plan.json", "point.json"], written


def _task(words: list[str], env: dict[str, str], *command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*words, *command], env=env, capture_output=True, text=True, timeout=60)


def test_the_nsys_wrapper_profiles_the_chosen_ranks_only(tmp_path: Path) -> None:
    """The wrapper srun runs, in real bash. Nsight Systems is not installable here: a stand-in
    `nsys` on PATH records its arguments and runs the task the way nsys would."""
    spec = make_spec(*GB200, "profiling=nsys", "profiling.ranks=[0,5]")
    words = slurm.job_parameters(slurm.SlurmSettings(), spec)["srun_args"][-5:]
    assert words[:2] == ["bash", "-c"] and words[-1] == "0,5"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stand_in = bin_dir / "nsys"
    stand_in.write_text(
        '#!/bin/bash\necho "$@" > "$NSYS_ARGS"\nwhile [ "$1" != "-o" ]; do shift; done; shift 2; exec "$@"\n'
    )
    stand_in.chmod(0o755)
    point = tmp_path / "point"
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "moe_vlm_point": str(point),
        "NSYS_ARGS": str(tmp_path / "args"),
    }
    task = ("sh", "-c", f'echo "task of rank $SLURM_PROCID"; echo "${{{profiling.NSYS_REPORT_ENV}:-}}"')

    profiled = _task(words, {**env, "SLURM_PROCID": "5"}, *task)
    # The profiled task knows it runs under nsys, and where its report goes (the engine checks it).
    assert profiled.returncode == 0 and profiled.stdout == f"task of rank 5\n{point}/nsys/rank5\n"
    args = (tmp_path / "args").read_text().split()
    assert args[:3] == ["profile", "--capture-range=cudaProfilerApi", "--capture-range-end=stop"]
    assert args[args.index("-o") + 1] == f"{point}/nsys/rank5" and (point / "nsys").is_dir()

    (tmp_path / "args").unlink()
    plain = _task(words, {**env, "SLURM_PROCID": "1"}, *task)
    assert plain.stdout == "task of rank 1\n\n" and not (tmp_path / "args").exists()

    stand_in.unlink()
    missing = _task(words, {**env, "SLURM_PROCID": "0"}, *task)
    assert missing.returncode == 127 and "nsys is not on PATH" in missing.stderr


def test_nsys_outside_its_wrapper_is_refused_not_silent() -> None:
    """Issue 19 item 9: the Megatron engine's torchrun relaunch (and any launch but the Slurm
    launcher's) starts the ranks without nsys; Bridge's cudaProfilerStart then opens a capture range
    nobody records. The process that would start the ranks, and every profiled rank, refuse instead."""
    spec = make_spec(*GB200, "profiling=nsys", "profiling.ranks=[0,5]")
    for rank in (None, 0, 5):
        problem = profiling.nsys_problem(spec, rank, {})
        assert problem and "not running under Nsight Systems" in problem and "Fix:" in problem
        assert "\n" not in problem
    assert profiling.nsys_problem(spec, 1, {}) is None  # not profiled: runs bare by design
    assert profiling.nsys_problem(spec, 0, {profiling.NSYS_REPORT_ENV: "/run/nsys/rank0"}) is None
    assert profiling.nsys_problem(make_spec(*GB200, "profiling=torch"), 0, {}) is None


def test_only_points_with_nsys_get_the_wrapper() -> None:
    params = slurm.job_parameters(slurm.SlurmSettings(), make_spec(*GB200))
    assert "bash" not in params["srun_args"] and "export moe_vlm_point" not in params["setup"]


# --- the torch engine's profiler -------------------------------------------------------------


@pytest.mark.parametrize("tool", ["nsys", "memory"])
def test_cuda_only_profilers_refuse_a_cpu_rank(tool: str, tmp_path: Path) -> None:
    spec = make_spec(f"profiling={tool}")
    with pytest.raises(EngineUnavailable, match=f"profiling={tool} records CUDA activity"):
        profiling.StepProfiler(spec, tmp_path, 0, torch.device("cpu"))


def test_a_rank_outside_profiling_ranks_records_nothing(tmp_path: Path) -> None:
    spec = make_spec("profiling=torch", "profiling.ranks=[1]")
    profiler = profiling.StepProfiler(spec, tmp_path, 0, torch.device("cpu"))
    for step in range(1, 5):
        profiler.begin(step)
        profiler.end(step)
    assert not (tmp_path / profiling.TORCH_PROFILE_DIR).exists()


# --- a real run: trace -> per-module table ---------------------------------------------------


@pytest.fixture(scope="module")
def profiled_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`train.py profiling=torch train_iters=4` on 2 CPU ranks, rank 1 profiled."""
    run_dir = tmp_path_factory.mktemp("profiled")
    done = subprocess.run(
        [
            sys.executable,
            "train.py",
            "profiling=torch",
            "profiling.ranks=[1]",
            "train_iters=4",
            f"hydra.run.dir={run_dir}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return run_dir


@pytest.mark.slow
def test_profiling_torch_writes_a_trace_of_the_window_on_the_chosen_rank(profiled_run: Path) -> None:
    traces = module_table.traces(profiled_run)
    assert [t.name for t in traces] == ["rank-1.json.gz"]  # rank 0 was not asked for
    with gzip.open(traces[0], "rt") as handle:
        events = json.load(handle)["traceEvents"]
    assert {e["name"] for e in events if str(e.get("name")).startswith("ProfilerStep#")} == {"ProfilerStep#3"}
    # The steps the profiler slowed are out of the steady window, named.
    excluded = {line.step for line in read_steps(profiled_run / STEPS_JSONL) if line.exclude == "profiler"}
    assert excluded == {2, 3}
    summary = json.loads((profiled_run / RUN_JSON).read_text())["summary"]
    assert summary["steady_steps"] == [4, 4]


@pytest.mark.slow
def test_the_trace_becomes_the_per_module_table(profiled_run: Path) -> None:
    table = module_table.table_of(module_table.traces(profiled_run)[0])
    assert table.steps == 1 and table.unit == "cpu_op_self"
    for row in (VISION, PROJECTOR, DECODER, ATTENTION, ROUTER, DISPATCH, EXPERT_GEMM, DATA_PARALLEL):
        ms = table.per_step_ms(row)
        assert ms["forward"] > 0 and ms["backward"] > 0, (row, ms)
    # The decoder row is its parts.
    parts = sum(table.per_step_ms(row)["total"] for row in module_table.DECODER_PARTS)
    assert table.per_step_ms(DECODER)["total"] == pytest.approx(parts)


@pytest.mark.slow
def test_the_report_shows_the_table(profiled_run: Path, tmp_path: Path) -> None:
    from moe_vlm.cli.report import main

    assert main([str(profiled_run), "--out", str(tmp_path)]) == 0
    text = (tmp_path / "report.md").read_text()
    section = text[text.index("## Per-module time (profiling=torch)") :]
    assert "rank-1.json.gz" in section
    for label in (
        "| vision encoder |",
        "| projector (patch mergers) |",
        "|   router |",
        "|   expert GEMMs |",
    ):
        assert label in section


# --- the class names the table knows ---------------------------------------------------------


def test_the_torch_engine_model_classes_are_the_ones_the_table_names() -> None:
    hf = importlib.import_module("transformers.models.qwen3_vl_moe.modeling_qwen3_vl_moe")
    expected = {
        "vision": "Qwen3VLMoeVisionModel",
        "projector": "Qwen3VLMoeVisionPatchMerger",
        "decoder": "Qwen3VLMoeTextModel",
        "attention": "Qwen3VLMoeTextAttention",
        "router": "Qwen3VLMoeTextTopKRouter",
        "experts": "Qwen3VLMoeTextExperts",
        "model": "Qwen3VLMoeForConditionalGeneration",
    }
    for role, name in expected.items():
        assert isinstance(getattr(hf, name), type) and PATTERNS[role].search(name), (role, name)
    assert not PATTERNS["attention"].search("Qwen3VLMoeVisionAttention")  # vision attention is vision


def test_a_trace_of_megatron_named_modules_lands_in_the_right_rows(tmp_path: Path) -> None:
    """A real torch.profiler trace of small modules named like Megatron's (the real ones need
    Transformer Engine on a GPU; tests/megatron checks these names against the installed source),
    with the token moves in functions of a file named as MoELayer's, as Megatron calls them."""
    layer_file = tmp_path / "moe" / "moe_layer.py"
    layer_file.parent.mkdir()
    layer_file.write_text(
        "import torch\n\ndef dispatch(x, order):\n    return x.index_select(0, order)\n\n"
        "def combine(y, order):\n    return torch.zeros_like(y).index_add(0, order, y)\n"
    )
    spec = importlib.util.spec_from_file_location("moe_vlm_test_moe_layer", layer_file)
    assert spec is not None and spec.loader is not None
    layer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(layer)
    table = module_table.module_table(_megatron_like_trace(layer, tmp_path))
    for row in (VISION, PROJECTOR, ATTENTION, ROUTER, DISPATCH, EXPERT_GEMM):
        assert table.per_step_ms(row)["total"] > 0, row
    assert table.per_step_ms(EXPERT_GEMM)["backward"] > 0  # backward found its forward op
    assert table.per_step_ms(DISPATCH)["backward"] > 0


def _megatron_like_trace(layer: Any, tmp_path: Path) -> dict[str, Any]:
    def named(name: str, forward: Any) -> type[nn.Module]:
        return type(name, (nn.Module,), {"forward": forward})

    TopKRouter = named("TopKRouter", lambda self, x: torch.softmax(self.w(x), -1).argsort(-1)[:, 0])
    TEColumnParallelGroupedLinear = named("TEColumnParallelGroupedLinear", lambda self, x: self.w(x))
    TEGroupedMLP = named("TEGroupedMLP", lambda self, x: torch.nn.functional.silu(self.fc1(x)))
    SelfAttention = named(
        "SelfAttention", lambda self, x: torch.nn.functional.scaled_dot_product_attention(x, x, x)
    )

    class MoELayer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.router, self.experts = TopKRouter(), TEGroupedMLP()
            self.router.w = nn.Linear(16, 4)
            self.experts.fc1 = TEColumnParallelGroupedLinear()
            self.experts.fc1.w = nn.Linear(16, 16)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            order = self.router(x)
            return layer.combine(self.experts(layer.dispatch(x, order.argsort())), order.argsort())

    class Qwen3VLGPTModel(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attention, self.moe = SelfAttention(), MoELayer()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.moe(self.attention(x.unsqueeze(0)).squeeze(0))

    Qwen3VLVisionPatchMerger = named("Qwen3VLVisionPatchMerger", lambda self, x: self.w(x))

    class Qwen3VLVisionModel(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.block, self.merger = nn.Linear(16, 16), Qwen3VLVisionPatchMerger()
            self.merger.w = nn.Linear(16, 16)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.merger(torch.relu(self.block(x)))

    class Qwen3VLModel(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.vision_model, self.language_model = Qwen3VLVisionModel(), Qwen3VLGPTModel()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.language_model(self.vision_model(x))

    model = Qwen3VLModel()
    x = torch.randn(32, 16)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], with_stack=True) as prof:
        for _ in range(2):
            model(x).sum().backward()
            prof.step()
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    return module_table.load_trace(path)


def test_the_module_table_cli_names_a_missing_trace(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "moe_vlm.report.module_table", str(tmp_path)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=120,
    )
    assert done.returncode == 2 and "no PyTorch trace" in done.stderr and len(done.stderr.splitlines()) == 1
