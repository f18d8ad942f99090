"""Profiling a run: which steps and ranks record, what each engine is told, and where the files go.

One window for every tool, ``profiling.steps`` = [first, last] (1-based optimizer steps,
inclusive; empty = the first step after warm-up), on ``profiling.ranks`` (empty = every rank):

- ``nsys``: the Slurm launcher runs each profiled rank's task under ``nsys profile -c
  cudaProfilerApi --capture-range-end=stop`` (``nsys_srun_words``; report
  ``<run_dir>/nsys/rank<N>.nsys-rep``) and the engine opens the capture range with the CUDA
  profiler API around the window (Bridge: ``use_nsys_profiler``, training/profiling.py:155-181).
- ``torch``: torch.profiler with Python call stacks on the window; one Chrome trace per profiled
  rank, ``<run_dir>/torch_profile/rank-<N>.json.gz`` where Bridge writes it
  (``<tensorboard_dir>/../torch_profile``, training/profiling.py:135-138), which
  moe_vlm/report/module_table.py turns into the per-module table.
- ``memory``: the CUDA allocator's history from before the model is built, a snapshot when the
  window's last step ends and one on out-of-memory, named as Bridge names them
  (training/utils/train_utils.py:194-240, 833-842). Recording every allocation with its stack
  slows every step of a profiled rank, and a step takes as long as its slowest rank; Bridge never
  turns it off (train_utils.py:206-217). So both engines turn it off once the snapshot is written
  (``stop_memory_history``), and every step up to the snapshot is left out of the steady window;
  an out-of-memory snapshot after that has no history.

The steps a profiler slows are left out of the steady window (``"exclude": "profiler"`` in
steps.jsonl), so a profiled run's throughput is still measured on clean steps.
"""

from __future__ import annotations

import contextlib
import os
import pickle
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moe_vlm.base import noise
from moe_vlm.base.errors import EngineUnavailable
from moe_vlm.config.schema import Engine, Profiler

if TYPE_CHECKING:
    import torch

    from moe_vlm.config.spec import RunSpec

TORCH_PROFILE_DIR = "torch_profile"
TENSORBOARD_DIR = "tensorboard"  # Bridge's tensorboard_dir; its torch_profile/ sits beside it
NSYS_DIR = "nsys"
# Set by the nsys wrapper (nsys_srun_words) in a profiled rank's environment: its report's path.
# A profiled rank without it runs outside nsys, where the CUDA profiler API records nothing.
NSYS_REPORT_ENV = "MOE_VLM_NSYS_REPORT"
MEMORY_SNAPSHOT = "memory_snapshot.pickle"  # Bridge inserts _<rank> (window) or _oom_rank-<rank> (OOM)
EXCLUDE_REASON = "profiler"
# The CUDA allocator events the history keeps (Bridge's trace_alloc_max_entries, train_utils.py:214).
MEMORY_HISTORY_ENTRIES = 100_000
# What nsys records: CUDA API + kernels, NVTX ranges (Megatron's, and torch's emit_nvtx), cuDNN and
# cuBLAS; no CPU sampling (it would dwarf the window's report).
NSYS_OPTIONS = (
    "--capture-range=cudaProfilerApi",
    "--capture-range-end=stop",
    "--trace=cuda,nvtx,cudnn,cublas",
    "--sample=none",
    "--cpuctxsw=none",
    "--force-overwrite=true",
)


# --- the window ------------------------------------------------------------------------------


def window(spec: RunSpec) -> tuple[int, int]:
    """[first, last] profiled optimizer steps (1-based, inclusive). Malformed values are rule O001's
    to report; here they still give a window, so planning never crashes on them."""
    steps = spec.profiling.steps
    if not steps:
        first = spec.warmup_steps + 1
        return first, first
    return steps[0], steps[-1] if len(steps) > 1 else steps[0]


def ranks(spec: RunSpec) -> list[int]:
    """The profiled global ranks, as an explicit list (Bridge's memory guard reads an empty list as
    none, its profilers as all: training/utils/train_utils.py:208 vs training/profiling.py:43)."""
    return list(spec.profiling.ranks) or list(range(spec.layout.world_size))


def active(spec: RunSpec) -> bool:
    return spec.profiling.tool is not Profiler.none


def excluded_steps(spec: RunSpec) -> list[int]:
    """The steps the profiler slows: the torch profiler's warm-up step and window (on Megatron also
    the step after it, at whose start Bridge saves the trace), nsys's window (emit_nvtx), and for
    the memory profile every step up to the one whose end dumps the snapshot (the allocator's
    history records from before the model is built until then: stop_memory_history)."""
    tool = spec.profiling.tool
    first, last = window(spec)
    if tool is Profiler.torch:
        tail = 1 if spec.engine is Engine.megatron else 0
        return list(range(max(first - 1, 1), last + tail + 1))
    if tool is Profiler.nsys:
        return list(range(first, last + 1))
    if tool is Profiler.memory:
        return list(range(1, last + 1))
    return []


def stop_memory_history() -> None:
    """Turn the CUDA allocator's history off: ``enabled=None`` disables it, whichever call
    started it (torch/cuda/memory.py _record_memory_history). Called once the window's snapshot
    is written, so the steps after it run at full speed on the profiled ranks."""
    import torch

    torch.cuda.memory._record_memory_history(enabled=None)


def exclude_reason(spec: RunSpec, step: int) -> str | None:
    """The step record's ``exclude`` for this step (None when the profiler does not slow it)."""
    return EXCLUDE_REASON if step in excluded_steps(spec) else None


def bridge_window(spec: RunSpec) -> tuple[int, int]:
    """Bridge's (profile_step_start, profile_step_end) that record exactly [first, last].

    Bridge counts completed steps: nsys starts when `step == start` before a step runs and stops
    when `step == end` after one (training/train.py:378-384, 564, 718-724), so steps start+1..end;
    the memory snapshot is dumped when step `end` has run (train_utils.py:833); the torch profiler
    (schedule wait=start-1, warmup=1, active=end-start, stepped before each step,
    training/profiling.py:140-146) records steps start..end-1 and saves them when step `end` starts.
    """
    first, last = window(spec)
    if spec.profiling.tool is Profiler.torch:
        return first, last + 1
    return first - 1, last


# --- where the files go ----------------------------------------------------------------------


def torch_trace_path(run_dir: Path, rank: int) -> Path:
    return run_dir / TORCH_PROFILE_DIR / f"rank-{rank}.json.gz"


def snapshot_path(run_dir: Path, rank: int, oom: bool = False) -> Path:
    """Bridge's names for MEMORY_SNAPSHOT: _<rank> at the window's end, _oom_rank-<rank> on OOM."""
    base, ext = os.path.splitext(MEMORY_SNAPSHOT)
    return run_dir / (f"{base}_oom_rank-{rank}{ext}" if oom else f"{base}_{rank}{ext}")


def nsys_srun_words(spec: RunSpec, point_variable: str) -> list[str]:
    """What goes between srun's options and the task's command: a shell that runs the task under
    nsys on the profiled ranks (SLURM_PROCID) and as it is on the others. The reports go to
    ``$<point_variable>/nsys/rank<N>``: the batch script names the point's directory in that
    variable and exports it to the tasks. Empty unless profiling=nsys."""
    if spec.profiling.tool is not Profiler.nsys:
        return []
    options = " ".join(NSYS_OPTIONS)
    script = (
        'r=$1; shift; case ",$r," in ,all,|*",$SLURM_PROCID,"*) ;; *) exec "$@" ;; esac; '
        'command -v nsys >/dev/null || { echo "moe_vlm: profiling=nsys: nsys is not on PATH in the '
        "job environment (rank $SLURM_PROCID). Fix: use an image with Nsight Systems (the NeMo "
        'container has it) or put it on PATH in hydra.launcher.setup." >&2; exit 127; }; '
        f'out="${{{point_variable}:?the batch script names the point directory}}/{NSYS_DIR}"; '
        f'mkdir -p "$out" && export {NSYS_REPORT_ENV}="$out/rank$SLURM_PROCID" && '
        f'exec nsys profile {options} -o "${NSYS_REPORT_ENV}" "$@"'
    )
    profiled = ",".join(str(r) for r in spec.profiling.ranks) or "all"
    return ["bash", "-c", script, "moe_vlm_nsys", profiled]


def nsys_problem(spec: RunSpec, rank: int | None, environ: Mapping[str, str]) -> str | None:
    """Why profiling=nsys would record nothing in this process, or None.

    Only the Slurm launcher runs the profiled ranks under ``nsys profile`` (nsys_srun_words, which
    sets NSYS_REPORT_ENV); anywhere else (the Megatron engine's torchrun relaunch on one node, a
    torchrun or srun of one's own, the torch engine's own ranks) the engine's CUDA profiler API calls
    open a capture range nobody listens to, and the run would end without a report or a word.
    `rank` None: a process that starts the ranks (it is profiled through them)."""
    if spec.profiling.tool is not Profiler.nsys or NSYS_REPORT_ENV in environ:
        return None
    if rank is not None and rank not in ranks(spec):
        return None  # not profiled: runs as it is, by design
    who = "this launch" if rank is None else f"rank {rank}"
    return (
        f"profiling=nsys: {who} is not running under Nsight Systems, so nothing would be recorded; only the "
        "Slurm launcher wraps the profiled ranks in `nsys profile` (moe_vlm/record/profiling.py nsys_srun_words). "
        "Fix: submit with -m hydra/launcher=slurm_gb200 (or slurm_b200), or use profiling=torch here."
    )


def describe(spec: RunSpec) -> str:
    """One line for the plan and the console."""
    if not active(spec):
        return "profiling: none"
    first, last = window(spec)
    steps = f"step {first}" if first == last else f"steps {first}-{last}"
    who = ",".join(map(str, spec.profiling.ranks)) or "every rank"
    return (
        f"profiling: {spec.profiling.tool.value} on {steps}, rank(s) {who}; "
        f"steps {step_ranges(excluded_steps(spec))} left out of the steady window"
    )


def step_ranges(steps: list[int]) -> str:
    return f"{steps[0]}-{steps[-1]}" if len(steps) > 1 else str(steps[0]) if steps else "none"


# --- the torch engine ------------------------------------------------------------------------


class StepProfiler:
    """The torch engine's profiler for one rank: ``begin(step)`` before each step, ``end(step)``
    after it, ``close()`` at the end. Create it before the model: memory history must see every
    allocation. A rank outside profiling.ranks gets an inert one."""

    def __init__(self, spec: RunSpec, run_dir: Path, rank: int, device: torch.device) -> None:
        self.spec = spec
        self.run_dir = run_dir
        self.rank = rank
        self.tool = spec.profiling.tool if rank in ranks(spec) else Profiler.none
        self.first, self.last = window(spec)
        self._torch: Any = None
        self._nvtx: Any = None
        if self.tool in (Profiler.nsys, Profiler.memory) and device.type != "cuda":
            raise EngineUnavailable(
                f"profiling={self.tool.value} records CUDA activity and rank {rank} runs on the CPU "
                "(rule T003 rejects this on cluster profiles without GPUs). Fix: run on GPUs, or "
                "profiling=torch."
            )
        problem = nsys_problem(spec, rank, os.environ) if self.tool is Profiler.nsys else None
        if problem:
            raise EngineUnavailable(problem)
        if self.tool is Profiler.memory:
            self._start_memory_history()
        elif self.tool is Profiler.torch:
            self._torch = self._torch_profiler(device)

    def begin(self, step: int) -> None:
        if self._torch is not None:
            if step == 1:
                self._torch.start()
            self._torch.step()  # step N runs under the schedule's action for N, as in Bridge's loop
        elif self.tool is Profiler.nsys and step == self.first:
            import torch

            torch.cuda.profiler.start()
            self._nvtx = torch.autograd.profiler.emit_nvtx()
            self._nvtx.__enter__()

    def end(self, step: int) -> None:
        if step != self.last:
            return
        if self._torch is not None:
            self._torch.stop()  # the window's last step is RECORD_AND_SAVE: stopping exports it
            self._torch = None
        elif self.tool is Profiler.nsys and self._nvtx is not None:
            import torch

            torch.cuda.synchronize()
            torch.cuda.profiler.stop()
            self._nvtx.__exit__(None, None, None)
            self._nvtx = None
        elif self.tool is Profiler.memory:
            self._dump(snapshot_path(self.run_dir, self.rank))
            stop_memory_history()  # the steps after the snapshot run unslowed

    def close(self) -> None:
        """Leave nothing running when a run ends early (an exception inside the window)."""
        if self._torch is not None:
            with contextlib.suppress(Exception):
                self._torch.stop()
            self._torch = None
        if self._nvtx is not None:
            import torch

            with contextlib.suppress(Exception):
                torch.cuda.profiler.stop()
                self._nvtx.__exit__(None, None, None)
            self._nvtx = None

    def _torch_profiler(self, device: torch.device) -> Any:
        import torch

        if device.type != "cuda":
            noise.quiet_kineto()  # Kineto's CPU-only stderr lines (moe_vlm/base/noise.py)
        activities = [torch.profiler.ProfilerActivity.CPU]
        if device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        path = torch_trace_path(self.run_dir, self.rank)

        def export(prof: Any) -> None:
            path.parent.mkdir(parents=True, exist_ok=True)
            prof.export_chrome_trace(str(path))

        return torch.profiler.profile(
            activities=activities,
            # Bridge's schedule for the same window (training/profiling.py:140-146).
            schedule=torch.profiler.schedule(
                wait=max(self.first - 1, 0),
                warmup=1 if self.first > 0 else 0,
                active=self.last - self.first + 1,
                repeat=1,
            ),
            on_trace_ready=export,
            # Python call stacks name every nn.Module call in the trace: the per-module table.
            with_stack=True,
        )

    def _start_memory_history(self) -> None:
        import torch

        torch.cuda.memory._record_memory_history(max_entries=MEMORY_HISTORY_ENTRIES)
        oom_path = snapshot_path(self.run_dir, self.rank, oom=True)

        def on_oom(_device: int, _alloc: int, _device_alloc: int, _device_free: int) -> None:
            self._dump(oom_path)

        # Private, as in Bridge (train_utils.py:232): the only hook into the allocator's OOM path.
        torch._C._cuda_attach_out_of_memory_observer(on_oom)  # type: ignore[attr-defined]

    @staticmethod
    def _dump(path: Path) -> None:
        import torch

        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as handle:
            pickle.dump(torch.cuda.memory._snapshot(), handle)
