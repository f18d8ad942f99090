"""The embedded torch engine: transformers Qwen3-VL-MoE + torch FSDP2, one process per rank.

    launch(spec, config, run_dir)
      -> one rank of an outside launch (torchrun / Slurm / submitit env)  -> run_rank
      -> otherwise spawn spec.layout.ranks_per_node local ranks           -> run_rank each
    run_rank: process group (gloo on CPU, NCCL on GPU) -> Trainer -> steps.jsonl -> run.json

Rank 0 gathers every rank's step record and appends it to steps.jsonl (flushed per step),
prints one progress line per step, and writes run.json once at the end (atomically).
"""

from __future__ import annotations

import os
import resource
import signal
import socket
import sys
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from moe_vlm.base.errors import EngineUnavailable, RunFailed
from moe_vlm.base.files import RUN_JSON, STEPS_JSONL, write_json_atomic
from moe_vlm.base.processes import cores_here, die_with_parent, run_local_ranks
from moe_vlm.config.schema import DataKind, ShardingStrategy
from moe_vlm.config.spec import RunSpec
from moe_vlm.data import Batch, BatchStats, DataStats, build_batches
from moe_vlm.engines.router_hooks import RouterCounter
from moe_vlm.engines.run_summary import summary_lines
from moe_vlm.engines.timing import COMPONENTS, ComponentTimer, clock_for
from moe_vlm.engines.torch_model import apply_freeze, apply_recompute, build_model, forward_inputs
from moe_vlm.perf.memory.estimate import GIB
from moe_vlm.perf.metrics import summarize
from moe_vlm.predict.model import record_section
from moe_vlm.record import profiling
from moe_vlm.record.explog import TRACKER_SECTION, Tracker, step_metrics, summary_metrics
from moe_vlm.record.profiling import StepProfiler
from moe_vlm.record.records import RunRecord, RunStatus, StepRecord, StepWriter, read_steps
from moe_vlm.record.router_load import ROUTER_SECTION
from moe_vlm.runtime.dist_env import DistEnv, free_port
from moe_vlm.runtime.failures import classify, launch_info, tail_lines, write_failure

# Tests only: seconds slept inside every training step, a slowdown a gate must catch
# (tests/integration/test_decision.py; `moe-vlm report --baseline`).
ENV_TEST_STEP_SLEEP_S = "MOE_VLM_TEST_STEP_SLEEP_S"

# --- launching -----------------------------------------------------------------------------


def launch(spec: RunSpec, config: dict[str, Any], run_dir: Path) -> None:
    env = DistEnv.from_environ()
    if env is not None:
        if env.world_size != spec.layout.world_size:
            raise EngineUnavailable(
                f"{env.launcher} started {env.world_size} ranks but nodes x nproc = {spec.layout.nodes} x "
                f"{spec.layout.ranks_per_node} = {spec.layout.world_size}. "
                "Fix: set nodes/nproc to match the launch."
            )
        run_rank(spec, config, run_dir, env)
        return
    if spec.layout.nodes > 1:
        raise EngineUnavailable(
            f"nodes={spec.layout.nodes}: the torch engine starts ranks on this machine only. "
            "Fix: nodes=1, or launch one process per rank with Slurm (hydra/launcher=slurm) or torchrun."
        )
    _spawn_local(spec, config, run_dir)


def _spawn_local(spec: RunSpec, config: dict[str, Any], run_dir: Path) -> None:
    ranks = spec.layout.ranks_per_node
    port = free_port()
    try:
        run_local_ranks(_spawned_rank, (spec, config, run_dir, ranks, port), ranks)
    except (mp.ProcessRaisedException, mp.ProcessExitedException) as exc:
        # A rank that raised has recorded the failure already; one that died (killed, OOM-killer,
        # segfault) could not, so the launcher does, keeping any more specific record.
        text = str(exc)
        exit_code = signal_number = None
        if isinstance(exc, mp.ProcessExitedException):
            exit_code = exc.exit_code
            signal_number = signal.Signals[exc.signal_name].value if exc.signal_name else None
        base = _record(spec, config, run_dir, "failed")
        diagnosis = classify(text, exit_code=exit_code, signal_number=signal_number)
        tail = tail_lines(text)
        record = write_failure(run_dir, diagnosis, tail, base, launch=launch_info())
        raise RunFailed(f"{record['failure']['class']}: {record['failure']['message']}") from None


def _spawned_rank(
    local_rank: int, spec: RunSpec, config: dict[str, Any], run_dir: Path, ranks: int, port: int
) -> None:
    die_with_parent()  # a rank must not outlive a killed run and keep writing its record
    env = DistEnv(
        rank=local_rank,
        world_size=ranks,
        local_rank=local_rank,
        local_world_size=ranks,
        master_addr="127.0.0.1",
        master_port=port,
        launcher="spawn",
    )
    try:
        run_rank(spec, config, run_dir, env)
    except RunFailed:
        sys.exit(1)  # recorded; the launcher reports it without a second traceback


# --- one rank ------------------------------------------------------------------------------


def pick_device(env: DistEnv) -> torch.device:
    """The local GPU of this rank when there are GPUs, else the CPU."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    count = torch.cuda.device_count()
    if count == 1 and env.local_world_size > 1:  # the launcher gave each task its own GPU
        return torch.device("cuda", 0)
    if env.local_rank >= count:
        raise EngineUnavailable(
            f"local rank {env.local_rank} has no GPU ({count} visible). Fix: nproc={count}, "
            "or CUDA_VISIBLE_DEVICES= to train on the CPU."
        )
    return torch.device("cuda", env.local_rank)


def run_rank(spec: RunSpec, config: dict[str, Any], run_dir: Path, env: DistEnv) -> None:
    device = pick_device(env)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:
        # Ranks share the cores; oversubscribed intra-op threads only slow every rank down.
        torch.set_num_threads(max(1, cores_here() // env.local_world_size))
    dist.init_process_group(
        "nccl" if device.type == "cuda" else "gloo",
        init_method=env.init_method,
        rank=env.rank,
        world_size=env.world_size,
        timeout=timedelta(minutes=10),
        device_id=device if device.type == "cuda" else None,
    )
    is_main = env.rank == 0
    writer = StepWriter(run_dir / STEPS_JSONL) if is_main else None
    trainer: Trainer | None = None
    profiler: StepProfiler | None = None
    tracker: Tracker | None = None
    held: tuple[StepRecord, float] | None = None  # the finished step whose period is still open
    try:
        # Before the model: the allocator history (profiling=memory) must see every allocation.
        profiler = StepProfiler(spec, run_dir, env.rank, device)
        trainer = Trainer(spec, device, env.rank, env.world_size)
        console = Console(spec, trainer) if is_main else None
        if is_main:
            tracker = Tracker(spec, config, run_dir)  # its failures are recorded, never fatal
            if profiling.active(spec):
                print(f"moe_vlm {profiling.describe(spec)}", flush=True)

        def publish(line: StepRecord) -> None:
            gathered: list[StepRecord] | None = [line] * env.world_size if is_main else None
            dist.gather_object(line, gathered, dst=0)
            if writer is not None and console is not None and gathered is not None:
                for rank_record in gathered:
                    writer.write(rank_record)
                console.step(gathered)
                if tracker is not None:
                    tracker.log(line.step, step_metrics(gathered))

        # A step's line waits for the next step's start, where its period ends: the profiler's
        # export and snapshot dump, the gather, steps.jsonl, the console and the tracker all run
        # between two steps, outside step_time_s and inside step_period_s.
        for step in range(1, spec.train_iters + 1):
            profiler.begin(step)
            line = trainer.step(step)
            line.exclude = line.exclude or profiling.exclude_reason(spec, step)
            if held is not None:
                previous, previous_start = held
                previous.step_period_s = trainer.started_s - previous_start
                held = None
                publish(previous)
            held = (line, trainer.started_s)
            profiler.end(step)  # outside the step's timing: the trace export and the snapshot dump
        if held is not None:
            last, held = held[0], None
            publish(last)  # the last step: no next start, no period
        data_stats = trainer.gather_data_stats()
        router_load = trainer.router.gather(spec)  # a collective: every rank
        if writer is not None:
            writer.close()
            steps = read_steps(run_dir / STEPS_JSONL)
            record = _record(spec, config, run_dir, "completed", trainer, steps, data_stats, tracker)
            record[ROUTER_SECTION] = router_load.to_json()
            write_json_atomic(run_dir / RUN_JSON, record)
            if console is not None:
                console.finish(record, run_dir)
            if tracker is not None:
                before = tracker.section()
                tracker.log(spec.train_iters, summary_metrics(record["summary"]))
                tracker.close("completed")
                if tracker.section() != before:  # it failed on the summary or at close: say so too
                    write_json_atomic(run_dir / RUN_JSON, {**record, TRACKER_SECTION: tracker.section()})
    except Exception as exc:
        if writer is not None:
            if held is not None:  # a finished step is never lost: this rank's line, without its period
                writer.write(held[0])
            writer.close()
            text = "".join(traceback.format_exception(exc))
            print(text, file=sys.stderr, flush=True)
            base = _record(
                spec, config, run_dir, "failed", trainer, read_steps(run_dir / STEPS_JSONL), tracker=tracker
            )
            tail = tail_lines(text)
            record = write_failure(run_dir, classify(text), tail, base, launch=launch_info())
            raise RunFailed(f"{record['failure']['class']}: {record['failure']['message']}") from exc
        raise
    finally:
        if profiler is not None:
            profiler.close()
        if tracker is not None:
            tracker.close("failed")
        if trainer is not None:
            trainer.timer.remove()
            trainer.router.remove()
        if dist.is_initialized():
            dist.destroy_process_group()


def _record(
    spec: RunSpec,
    config: dict[str, Any],
    run_dir: Path,
    status: str,
    trainer: Trainer | None = None,
    steps: list[StepRecord] | None = None,
    data_stats: dict[str, Any] | None = None,
    tracker: Tracker | None = None,
) -> dict[str, Any]:
    """run.json: completed, or the base a failure record is classified onto (runtime.failures)."""
    steps = steps if steps is not None else read_steps(run_dir / STEPS_JSONL)
    sections = {"torch_engine": trainer.describe()} if trainer is not None else {}
    tracked = tracker.section() if tracker is not None else None
    if tracked is not None:
        sections[TRACKER_SECTION] = tracked
    if status == RunStatus.completed:
        summary = summarize(steps, spec)
        sections["prediction"] = record_section(spec, summary)  # predicted vs measured
        # The job's place (restarts, Slurm ids) goes in with the completion, as with a failure: a
        # reader that sees "completed" sees it too, before the launcher adds the task's host and times.
        completed = RunRecord.completed(spec, config, summary, data_stats, **sections)
        return completed.with_launch(launch_info()).to_json()
    return RunRecord.failed(spec, config, summarize(steps, spec) if steps else None, **sections).to_json()


# --- the training loop ---------------------------------------------------------------------


@dataclass
class Sharding:
    mesh: DeviceMesh
    reshard_after_forward: bool
    name: str


def sharding_for(spec: RunSpec, device: torch.device, world_size: int) -> Sharding:
    """FSDP2 over the data-parallel ranks, as parallelism.sharding_strategy says."""
    strategy = spec.parallelism.sharding_strategy
    if strategy is ShardingStrategy.no_shard:
        # HSDP with a shard group of one rank: parameters replicated, gradients all-reduced (DDP).
        mesh = init_device_mesh(device.type, (world_size, 1), mesh_dim_names=("replicate", "shard"))
        return Sharding(mesh, reshard_after_forward=False, name="replicate (FSDP2 HSDP, shard size 1)")
    mesh = init_device_mesh(device.type, (world_size,), mesh_dim_names=("shard",))
    if strategy is ShardingStrategy.optim_grads:
        return Sharding(mesh, reshard_after_forward=False, name="FSDP2 full shard, no reshard after forward")
    if strategy is ShardingStrategy.optim_grads_params:
        return Sharding(mesh, reshard_after_forward=True, name="FSDP2 full shard")
    raise EngineUnavailable(
        f"parallelism.sharding_strategy={strategy.value} has no torch FSDP2 equivalent (rule E006)"
    )


def peak_memory_gib(device: torch.device) -> tuple[float, str]:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / GIB, "cuda_max_allocated"
    # ru_maxrss is KiB on Linux.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB, "process_peak_rss"


class Trainer:
    """Model, optimizer and data of one rank; `step()` runs one optimizer step."""

    def __init__(
        self,
        spec: RunSpec,
        device: torch.device,
        rank: int,
        world_size: int,
        batches: Iterator[Batch] | None = None,
        timing: bool = True,
    ) -> None:
        self.spec = spec
        self.device = device
        self.rank = rank
        self.world_size = world_size
        self.model = build_model(spec.model, spec.recompute, device, spec.seed)
        self.parameter_counts = apply_freeze(self.model, spec.freeze)
        self.recomputed = apply_recompute(self.model, spec.recompute)
        self.timer = ComponentTimer(self.model, clock_for(device), enabled=timing)
        self.router = RouterCounter(self.model.model.language_model.layers, device)
        self.sharding = sharding_for(spec, device, world_size)
        self.precision = "bf16 params, fp32 reduce" if device.type == "cuda" else "fp32"
        policy = (
            MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
            if device.type == "cuda"
            else MixedPrecisionPolicy()
        )
        mesh, reshard = self.sharding.mesh, self.sharding.reshard_after_forward
        for layer in self.model.model.language_model.layers:
            fully_shard(layer, mesh=mesh, reshard_after_forward=reshard, mp_policy=policy)
        for block in self.model.model.visual.blocks:
            fully_shard(block, mesh=mesh, reshard_after_forward=reshard, mp_policy=policy)
        fully_shard(self.model, mesh=mesh, reshard_after_forward=reshard, mp_policy=policy)
        # After sharding: the optimizer must hold the sharded parameters, and only trainable ones.
        self.trainable = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.trainable, lr=spec.lr, weight_decay=spec.weight_decay)
        self.batches = batches if batches is not None else build_batches(spec, rank, world_size)
        self.data_stats = DataStats()
        self.micro_batches_run = 0
        self.started_s = 0.0  # perf_counter at the last step's start (after the device drained)
        self.test_sleep_s = float(os.environ.get(ENV_TEST_STEP_SLEEP_S) or 0.0)

    def describe(self) -> dict[str, Any]:
        return {
            "device": str(self.device),
            "backend": dist.get_backend() if dist.is_initialized() else None,
            "precision": self.precision,
            "sharding": self.sharding.name,
            "parameters": self.parameter_counts,
            "trainable_parameters": sum(p.numel() for p in self.trainable),
            "recomputed": self.recomputed,
            "attention": getattr(self.model.config.text_config, "_attn_implementation", None),
        }

    def _synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def step(self, step: int) -> StepRecord:
        spec = self.spec
        accumulation = spec.accumulation_steps
        self._synchronize()
        started = self.started_s = time.perf_counter()
        losses: list[torch.Tensor] = []
        consumed: list[Batch] = []
        data_wait_s = 0.0
        # The router's load over the window the summary keeps (metrics.steady_window).
        measured = step > spec.warmup_steps and profiling.exclude_reason(spec, step) is None
        self.router.window_steps += measured
        for _ in range(accumulation):
            fetch_started = time.perf_counter()
            batch = next(self.batches)
            data_wait_s += time.perf_counter() - fetch_started
            self.data_stats.add(batch)
            consumed.append(batch)
            inputs = {
                name: value.to(self.device, non_blocking=True) if isinstance(value, torch.Tensor) else value
                for name, value in forward_inputs(self.model, batch).items()
            }
            self.router.counting = measured
            loss = self.model(**inputs).loss
            self.router.counting = False  # backward's recompute runs the router again
            self.timer.begin_backward()
            (loss / accumulation).backward()
            self.timer.end_backward()
            losses.append(loss.detach())
            self.micro_batches_run += 1
        optimizer_started = time.perf_counter()
        grad_norm = self._grad_norm()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self._synchronize()
        if self.test_sleep_s:
            time.sleep(self.test_sleep_s)
        finished = time.perf_counter()
        step_time_s = finished - started
        times = self.timer.collect()
        stats = BatchStats()
        for batch in consumed:
            stats += batch.stats
        peak_gib, memory_kind = peak_memory_gib(self.device)
        return StepRecord.measured(
            stats,
            step=step,
            rank=self.rank,
            host=socket.gethostname(),  # the straggler view names the node (moe_vlm/perf/stragglers.py)
            warmup=step <= spec.warmup_steps,
            time_unix_s=time.time(),
            step_time_s=step_time_s,
            loss=float(torch.stack(losses).mean()),
            grad_norm=grad_norm,
            lr=self.optimizer.param_groups[0]["lr"],
            micro_batches=len(consumed),
            # Host-side waits inside step_time_s: building batches (data pipeline) and the
            # grad-norm + optimizer tail (its collectives included).
            data_wait_s=data_wait_s,
            optimizer_s=finished - optimizer_started,
            peak_memory_gib=peak_gib,
            memory_kind=memory_kind,
            components_s=times.total_s if self.timer.enabled else None,
            components_forward_s=times.forward_s if self.timer.enabled else None,
            components_backward_s=times.backward_s if self.timer.enabled else None,
        )

    def _grad_norm(self) -> float:
        grads = [p.grad for p in self.trainable if p.grad is not None]
        if not grads:
            return 0.0
        norm = torch.nn.utils.get_total_norm(grads)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()  # sum over shards: the global norm, same on every rank
        return float(norm)

    def gather_data_stats(self) -> dict[str, Any] | None:
        gathered: list[DataStats | None] = [None] * self.world_size if self.rank == 0 else []
        dist.gather_object(self.data_stats, gathered if self.rank == 0 else None, dst=0)
        if self.rank != 0:
            return None
        merged = DataStats()
        for stats in gathered:
            if stats is not None:
                merged.merge(stats)
        return merged.to_dict()


# --- console -------------------------------------------------------------------------------


class Console:
    """Rank 0's progress: a header, one line per step, a summary table at the end."""

    def __init__(self, spec: RunSpec, trainer: Trainer) -> None:
        self.spec = spec
        lay = spec.layout
        label = (
            "data=mock (image-free: NOT a VLM performance proxy)"
            if spec.data.kind is DataKind.mock
            else f"data={spec.data.kind.value}"
        )
        print(
            f"moe_vlm torch engine: {spec.model.name} | {lay.world_size} rank(s) on {trainer.device.type} "
            f"({trainer.describe()['backend']}, {trainer.precision}) | {trainer.sharding.name} | "
            f"mbs {spec.mbs} x dp {lay.dp} x accumulation {spec.accumulation_steps} = gbs {spec.gbs} | "
            f"seq {spec.seq_length} | recompute={spec.recompute.name} "
            f"vision_freeze={spec.freeze.name} | {label}",
            flush=True,
        )

    def step(self, records: list[StepRecord]) -> None:
        first = records[0]
        step_time = max(r.step_time_s for r in records)
        real_tokens = sum(r.real_tokens for r in records)
        loss = sum(r.loss or 0.0 for r in records) / len(records)
        components = first.components_s or {}
        parts = " ".join(f"{name.split('_')[0]} {components.get(name, 0.0):.3f}" for name in COMPONENTS)
        print(
            f"step {first.step:>4}/{self.spec.train_iters}  loss {loss:.4f}  "
            f"grad_norm {first.grad_norm or 0.0:.3f}  "
            f"step {step_time:.3f} s  {real_tokens / step_time / len(records):,.0f} real tok/s/rank  "
            f"peak {max(r.peak_memory_gib or 0.0 for r in records):.2f} GiB ({first.memory_kind})  "
            f"rank0 s: {parts}{'  (warm-up)' if first.warmup else ''}",
            flush=True,
        )

    def finish(self, record: dict[str, Any], run_dir: Path) -> None:
        print("\n".join(summary_lines(self.spec, record, run_dir)), flush=True)
