"""One Megatron run on this node's GPUs: ranks, pre-flight checks, Bridge's `pretrain`, run.json."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from moe_vlm.base.errors import EngineUnavailable
from moe_vlm.base.files import STEPS_JSONL, write_json_atomic
from moe_vlm.base.provenance import REPO_ROOT
from moe_vlm.config.compose import quote_override_value
from moe_vlm.config.spec import RunSpec
from moe_vlm.data.bridge_processor import write_processor
from moe_vlm.engines.megatron import trackers
from moe_vlm.engines.megatron.config import BuiltConfig, build_config, check_overrides, place_in_run_dir
from moe_vlm.engines.megatron.effective import EFFECTIVE_JSON, Effective, effective_config
from moe_vlm.engines.megatron.recording import StepRecorder, counting_forward_step
from moe_vlm.engines.megatron.stack import stack_problem, versions
from moe_vlm.engines.run_summary import summary_lines
from moe_vlm.knobs.bridge_fields import BRIDGE_PROCESSOR_DIR
from moe_vlm.knobs.telemetry_fields import RUN_DIR, in_run_dir
from moe_vlm.perf.metrics import summarize
from moe_vlm.predict.model import record_section
from moe_vlm.record import profiling
from moe_vlm.record.explog import TRACKER_SECTION
from moe_vlm.record.records import RunRecord, read_steps
from moe_vlm.runtime.dist_env import DistEnv, free_port
from moe_vlm.runtime.failures import launch_info


def point_overrides() -> list[str]:
    """This run's own overrides as Hydra composed it: in a multirun, the point's, not the sweep's."""
    from hydra.core.hydra_config import HydraConfig

    return [str(override) for override in HydraConfig.get().overrides.task]


def torchrun_command(overrides: Sequence[str], run_dir: Path, nproc_per_node: int) -> list[str]:
    """The command that starts one process per GPU for this run: train.py with its own overrides.

    Not ``sys.argv``: under submitit's local executor that is submitit's own script (whose argument
    parser rejects Hydra overrides), and under Hydra's basic launcher it still holds ``-m`` and
    every swept value, so each rank would rerun the whole sweep. The ranks write into this run's
    directory and leave its ``.hydra/`` record, written once by this process, as it is.
    """
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc_per_node}",
        str(REPO_ROOT / "train.py"),
        *overrides,
        f"hydra.run.dir={quote_override_value(str(run_dir))}",
        "hydra.output_subdir=null",
    ]


def _relaunch_with_torchrun(spec: RunSpec, run_dir: Path) -> None:
    """Single node, not yet one process per GPU: start them with torchrun (same overrides)."""
    command = torchrun_command(point_overrides(), run_dir, spec.layout.ranks_per_node)
    print("moe_vlm: starting one process per GPU: " + shlex.join(command), file=sys.stderr)
    done = subprocess.run(command, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"torchrun exited with status {done.returncode}; see the rank logs above")


def _distributed_env(spec: RunSpec) -> bool:
    """Export torch.distributed's env:// variables for this rank; False when not one rank of many."""
    env = DistEnv.from_environ()
    if env is None:
        if spec.layout.world_size > 1:
            return False
        env = DistEnv(0, 1, 0, 1, "127.0.0.1", free_port(), "single")
    if env.world_size != spec.layout.world_size:
        raise EngineUnavailable(
            f"launched with {env.world_size} rank(s) but the layout needs nodes x nproc = "
            f"{spec.layout.world_size}; fix nodes/nproc or the launcher's task count."
        )
    os.environ.update(
        RANK=str(env.rank),
        WORLD_SIZE=str(env.world_size),
        LOCAL_RANK=str(env.local_rank),
        LOCAL_WORLD_SIZE=str(env.local_world_size),
        MASTER_ADDR=env.master_addr,
        MASTER_PORT=str(env.master_port),
    )
    return True


def _check_processor(cfg: Any, run_dir: Path) -> None:
    """Fail before the job starts when the data pipeline's Qwen processor is not on this machine.

    It loads offline (moe_vlm/__init__.py): from a local directory, or a hub id from the HF cache.
    """
    task_encoder = getattr(cfg.dataset, "task_encoder", None)
    path = getattr(cfg.dataset, "hf_processor_path", None) or getattr(task_encoder, "hf_processor_path", None)
    if not path:
        return
    path = str(path).replace(RUN_DIR, str(run_dir))
    from transformers import AutoProcessor

    try:
        AutoProcessor.from_pretrained(path)
    except Exception as exc:
        raise EngineUnavailable(
            f"engine=megatron: the data pipeline needs the processor files (tokenizer, preprocessor config) "
            f"of {path} and cannot find them on this machine, offline ({type(exc).__name__}). Fix: set "
            "model.hf_model_id=/path/to/a/local/checkpoint/dir, or fill the Hugging Face cache once where the "
            f"hub is reachable: HF_HUB_OFFLINE=0 hf download {path} --include '*.json' '*.txt' '*.jinja'"
        ) from None


def launch(spec: RunSpec, config: dict[str, Any], run_dir: Path) -> None:
    """Run `spec` on this node's GPUs (one call per rank under torchrun or Slurm)."""
    # Every module these options import, on every rank, before distributed init and the GPU check.
    problem = stack_problem(spec)
    if problem:
        raise EngineUnavailable(f"engine=megatron: {problem}")
    # profiling=nsys outside the Slurm launcher (the torchrun relaunch below included) would record
    # nothing: refused before any rank starts. A rank's number is in RANK (torchrun) or SLURM_PROCID.
    rank = os.environ.get("RANK", os.environ.get("SLURM_PROCID"))
    problem = profiling.nsys_problem(spec, None if rank is None else int(rank), os.environ)
    if problem:
        raise EngineUnavailable(problem)
    import torch

    if not torch.cuda.is_available():
        raise EngineUnavailable(
            "engine=megatron needs GPUs and this machine has none visible; plan with dry_run=true, "
            "or use engine=torch."
        )
    if not _distributed_env(spec):
        if spec.layout.nodes > 1:
            raise EngineUnavailable(
                f"engine=megatron: {spec.layout.world_size} ranks over {spec.layout.nodes} nodes need a "
                "launcher: use hydra/launcher=slurm_gb200 (or slurm_b200) with -m, or torchrun on each node."
            )
        _relaunch_with_torchrun(spec, run_dir)
        return

    from megatron.bridge.training.pretrain import pretrain
    from megatron.bridge.training.state import GlobalState

    trackers.guard(GlobalState, run_dir, spec.logger.backend.value)  # a tracker never costs the run

    built = build_config(spec, run_dir)
    if in_run_dir(BRIDGE_PROCESSOR_DIR) == getattr(built.cfg.dataset, "hf_processor_path", None):
        # data=bridge_mock without a local checkpoint: Bridge's mock loads this offline processor.
        write_processor(spec.model, run_dir / BRIDGE_PROCESSOR_DIR)
    _check_processor(built.cfg, run_dir)
    problems = check_overrides(built.cfg, spec)
    if problems:
        raise EngineUnavailable("the Bridge config does not hold the table's values: " + "; ".join(problems))
    effective = None
    if int(os.environ["RANK"]) == 0:
        # What Bridge runs with, written before it runs, so a run that fails is explained too.
        effective = effective_config(built.cfg, spec, run_dir, planned=False)
        write_json_atomic(run_dir / EFFECTIVE_JSON, effective.to_record())
    recorder = StepRecorder(spec, run_dir)
    place_in_run_dir(built.cfg, spec, run_dir)  # TensorBoard, profiler and W&B files go in the run dir
    pretrain(built.cfg, forward_step_func=counting_forward_step(recorder), callbacks=[recorder])

    if effective is not None:
        _write_run_json(spec, config, run_dir, built, effective)


def _write_run_json(
    spec: RunSpec, config: dict[str, Any], run_dir: Path, built: BuiltConfig, effective: Effective
) -> None:
    steps = read_steps(run_dir / STEPS_JSONL)
    # One Bridge FLOP count per step; its time is the slowest rank's, as Bridge's own log divides.
    steady: dict[int, tuple[float, float]] = {}
    for line in steps:
        if line.warmup or line.exclude or line.bridge_step_flops is None:
            continue
        flops, slowest = steady.get(line.step, (line.bridge_step_flops, 0.0))
        steady[line.step] = (flops, max(slowest, line.step_time_s))
    steady_time_s = sum(time_s for _flops, time_s in steady.values())
    bridge = {
        "recipe": built.recipe.name,
        "recipe_kind": built.recipe.kind,
        "recipe_family": built.recipe.family,
        "recipe_gpu": built.recipe.gpu,
        # Bridge's config after its runtime update: the fields that differ from the library defaults.
        "effective": effective.to_record(),
        "hf_config_dir": str(built.hf_dir),
        "hub_ids_requested": built.hub_ids_requested,
        "versions": versions(),
        "fields": {row.field: row.value for row in built.applied},
        # Bridge's own TFLOP/s/GPU (padded tokens; frozen modules counted as trained), beside ours.
        "tflops_per_gpu": (
            sum(flops for flops, _time_s in steady.values()) / steady_time_s / spec.layout.world_size / 1e12
            if steady_time_s > 0
            else None
        ),
    }
    summary = summarize(steps, spec)
    prediction = record_section(spec, summary)  # predicted vs measured
    # The job's place (restarts, Slurm ids) goes in with the completion, as with a failure: a reader
    # that sees "completed" sees it too, before the launcher adds the task's host and times.
    tracked = trackers.failure(run_dir)
    sections = {TRACKER_SECTION: tracked} if tracked is not None else {}
    completed = RunRecord.completed(spec, config, summary, bridge=bridge, prediction=prediction, **sections)
    record = completed.with_launch(launch_info()).write(run_dir)
    print("\n".join(summary_lines(spec, record, run_dir)), flush=True)
