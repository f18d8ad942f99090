"""Per-step records from inside Bridge's training loop: Bridge callbacks, a counting data
iterator, CUDA-event step and component timing, per-step memory. GPU-only at run time;
unit-tested on CPU (tests/megatron/test_recording.py) with Bridge's own callback classes, gloo
ranks under Megatron's parallel_state, a perf_counter clock and a stand-in for torch.cuda's
memory counters."""

from __future__ import annotations

import dataclasses
import importlib
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from moe_vlm.base.files import STEPS_JSONL
from moe_vlm.config.schema import CudaGraphImpl, Profiler
from moe_vlm.config.spec import RunSpec
from moe_vlm.data.batch import BatchStats
from moe_vlm.knobs.bridge_fields import forward_step_path
from moe_vlm.perf.memory.estimate import GIB
from moe_vlm.perf.metrics import MemoryKind
from moe_vlm.record import profiling
from moe_vlm.record.records import StepRecord, StepWriter

if TYPE_CHECKING:
    from collections.abc import Callable

    from moe_vlm.engines.timing import Clock


@dataclass
class StepStats(BatchStats):
    """What one rank fed the model during one optimizer step, summed over micro-batches: the torch
    engine's BatchStats counts, as far as Bridge's batch shows them (skipped_samples: draws our
    seeded data replaced, engines/megatron/data.py; vision markers and truncation are not in the
    batch and stay 0)."""

    micro_batches: int = 0
    # Host seconds the training loop spent in next(data_iterator): the loader's queue was empty,
    # or (no workers) the batch was built right there. The GPU may still have been running queued
    # work meanwhile, so this bounds the input-bound time from above.
    data_wait_s: float = 0.0

    def add_batch(self, batch: dict[str, Any], pad_token_id: int, image_token_id: int) -> None:
        tokens = batch.get("input_ids")
        if tokens is None:
            tokens = batch.get("tokens")
        if tokens is None:
            return
        self.micro_batches += 1
        self.sequences += int(tokens.shape[0])
        self.padded_tokens += int(tokens.numel())
        cu_seqlens = batch.get("cu_seqlens_q")
        if cu_seqlens is not None:
            # data.packing=in_batch: one THD row; cu_seqlens_q holds the samples' unpadded bounds
            # and cu_seqlens_q_padded (CP/SP alignment) the physical ones (data/packing/in_batch.py:
            # 196-205), so what the alignment added stays padding.
            lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
            self._add_counts(batch, int(lengths.sum()), int((lengths**2).sum()), tokens, image_token_id)
            self.samples += int(lengths.numel())
            return
        # Bridge's collate pads with the tokenizer's pad id; an attention mask, when the batch
        # carries one, is the better witness.
        attention = batch.get("attention_mask")
        if attention is not None and tuple(attention.shape) == tuple(tokens.shape):
            real_mask = attention.bool()
        else:
            real_mask = tokens != pad_token_id
        real_per_sequence = real_mask.sum(dim=-1)
        self.samples += int(tokens.shape[0])
        self._add_counts(
            batch,
            int(real_per_sequence.sum()),
            int((real_per_sequence.long() ** 2).sum()),
            tokens,
            image_token_id,
        )

    def _add_counts(
        self, batch: dict[str, Any], real: int, sum_squares: int, tokens: Any, image_token_id: int
    ) -> None:
        image = int((tokens == image_token_id).sum())
        self.real_tokens += real
        self.sum_seq_len_squared += sum_squares
        self.image_tokens += image
        self.text_tokens += real - image  # vision markers included, as the torch engine counts them
        loss_mask = batch.get("loss_mask")
        if loss_mask is not None:
            self.loss_tokens += int(loss_mask.sum())
        skipped = batch.get("skipped_samples")
        if skipped is not None:
            self.skipped_samples += int(skipped)
        visual = batch.get("visual_inputs")
        grid = getattr(visual, "image_grid_thw", None) if visual is not None else None
        if grid is not None and grid.numel():
            # [images, 3] or Qwen's batched [B, N, 3] with all-zero rows for missing images.
            patches = grid.long().prod(dim=-1)
            self.images += int((patches > 0).sum())
            self.vision_patches += int(patches.sum())
            self.sum_patches_squared += int((patches**2).sum())


class CountingIterator:
    """Passes batches through unchanged, counting what each one holds (host tensors: no sync)."""

    def __init__(self, inner: Any, stats: StepStats, pad_token_id: int, image_token_id: int) -> None:
        self.inner = inner
        self.stats = stats
        self.pad_token_id = pad_token_id
        self.image_token_id = image_token_id

    def __iter__(self) -> CountingIterator:
        return self

    def __next__(self) -> Any:
        started = time.perf_counter()
        batch = next(self.inner)
        self.stats.data_wait_s += time.perf_counter() - started
        if isinstance(batch, dict):
            self.stats.add_batch(batch, self.pad_token_id, self.image_token_id)
        return batch


class BridgeComponentTimer:
    """Vision encoder / projector / decoder seconds per step, from CUDA events on Qwen3VLModel's
    submodules (the torch engine has its own, moe_vlm.engines.timing.ComponentTimer).

    What each figure covers, summed over the step's forward calls and their backward passes:
      vision_encoder  the vision model (patch embedding, ViT blocks, deepstack mergers) minus the
                      projector;
      projector       the patch merger, which runs inside the vision model;
      decoder         the language model call: decoder layers, final norm, output layer and loss
                      (the token embedding runs in Qwen3VLModel before it, and is not counted).
    Forward: events around each call of the module. Backward, per forward call (so any pipeline
    schedule works): from the first gradient reaching that call's outputs to the last gradient
    reaching its inputs: for the decoder its decoder_input, or on a later pipeline stage the
    decoder's input_tensor; for the vision model, whose pixels need no gradient, the output of
    patch_embed; for the projector, the output of its first child. A frozen stack whose inputs
    need no gradient has no backward, and records none.

    Module hooks go only on modules that Megatron never hands to CUDA-graph capture: Transformer
    Engine's make_graphed_callables refuses a module with hooks
    (transformer_engine/pytorch/graph.py:386-400), and Megatron Core passes it each graphable
    TransformerLayer of language_model.decoder (megatron/core/transformer/cuda_graphs.py:2166-2178,
    2732-2734) and, with vision graphs, of vision_model.decoder (cuda_graphs.py:3102-3108). Those
    layers are GraphableMegatronModules; the containers watched here are not. The backward
    markers are tensor hooks, which no graph capture sees.

    The events are only recorded during the step; `end_step` hands them over unread, and
    `seconds_of` reads them at the recorder's next gather, once the device has passed them.
    """

    def __init__(self) -> None:
        self.spans: dict[str, list[tuple[Any, Any]]] = {}
        self._forward_start: dict[str, Any] = {}
        self._current_call: dict[str, int] = {}
        self._backward: dict[tuple[str, int], dict[str, Any]] = {}
        self._calls = 0
        self._clock: Clock | None = None
        self.attached = False

    def attach(self, model_chunks: list[Any], clock: Clock) -> None:
        self._clock = clock
        for chunk in model_chunks:
            for module in chunk.modules():
                if type(module).__name__ != "Qwen3VLModel":
                    continue
                vision = getattr(module, "vision_model", None)
                if vision is not None:
                    self._watch("vision", vision, getattr(vision, "patch_embed", None))
                    merger = getattr(vision, "merger", None)
                    if merger is not None:
                        self._watch("projector", merger, next(iter(merger.children()), None))
                language = getattr(module, "language_model", None)
                if language is not None:
                    decoder = getattr(language, "decoder", None)
                    self._watch("decoder", language, None, pipeline_input=decoder)
                self.attached = True

    def _event(self) -> Any:
        assert self._clock is not None, "hooks run only after attach()"
        return self._clock.mark()

    @staticmethod
    def _needing_grad(value: Any) -> list[Any]:
        import torch

        if isinstance(value, torch.Tensor):
            return [value] if value.requires_grad else []
        if isinstance(value, list | tuple):
            return [t for item in value for t in BridgeComponentTimer._needing_grad(item)]
        if isinstance(value, dict):
            return [t for item in value.values() for t in BridgeComponentTimer._needing_grad(item)]
        return []

    def _on_backward_start(self, key: tuple[str, int]) -> Any:
        def hook(_grad: Any) -> None:
            state = self._backward.setdefault(key, {})
            if "start" not in state:
                state["start"] = self._event()

        return hook

    def _on_backward_end(self, key: tuple[str, int]) -> Any:
        def hook(_grad: Any) -> None:
            self._backward.setdefault(key, {})["end"] = self._event()

        return hook

    def _watch(self, name: str, module: Any, first_layer: Any, pipeline_input: Any = None) -> None:
        """Time `module`. Its backward ends at the last gradient reaching its inputs, or, where no
        input needs one, at `first_layer`'s output (a hooked module: never a graphable one), or at
        `pipeline_input.input_tensor`, what a later pipeline stage receives instead of inputs."""

        def pre_forward(_module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            self._calls += 1
            self._current_call[name] = self._calls
            self._forward_start[name] = self._event()
            inputs = self._needing_grad(args) + self._needing_grad(kwargs)
            if not inputs and pipeline_input is not None:
                inputs = self._needing_grad(getattr(pipeline_input, "input_tensor", None))
            for tensor in inputs:
                tensor.register_hook(self._on_backward_end((name, self._calls)))

        def post_forward(_module: Any, _args: Any, _kwargs: Any, output: Any) -> None:
            self.spans.setdefault(name, []).append((self._forward_start.pop(name), self._event()))
            for tensor in self._needing_grad(output):
                tensor.register_hook(self._on_backward_start((name, self._current_call[name])))

        def first_layer_output(_module: Any, _args: Any, output: Any) -> None:
            for tensor in self._needing_grad(output)[:1]:
                tensor.register_hook(self._on_backward_end((name, self._current_call[name])))

        module.register_forward_pre_hook(pre_forward, with_kwargs=True)
        module.register_forward_hook(post_forward, with_kwargs=True)
        if first_layer is not None:
            first_layer.register_forward_hook(first_layer_output)

    def end_step(self) -> dict[str, list[tuple[Any, Any]]] | None:
        """The step's (start, end) marks per watched module, unread; None when nothing is watched."""
        for (name, _call), state in self._backward.items():
            if "start" in state and "end" in state:
                self.spans.setdefault(name, []).append((state["start"], state["end"]))
        self._backward.clear()
        spans, self.spans = self.spans, {}
        return spans if self.attached else None

    @staticmethod
    def seconds_of(spans: dict[str, list[tuple[Any, Any]]], clock: Clock) -> dict[str, float]:
        total = {name: sum(completed_seconds(clock, start, end) for start, end in pairs)
                 for name, pairs in spans.items()}  # fmt: skip
        vision, projector = total.get("vision", 0.0), total.get("projector", 0.0)
        return {
            "vision_encoder": max(vision - projector, 0.0),
            "projector": projector,
            "decoder": total.get("decoder", 0.0),
        }


def completed_seconds(clock: Clock, start: Any, end: Any) -> float:
    """Seconds between two marks, read once the device has passed both. Event.synchronize waits
    only for the work queued before that event, and returns at once when it is done (which it is
    by the next gather, bar the last step's tail); a perf_counter mark has nothing to wait for."""
    for mark in (start, end):
        wait = getattr(mark, "synchronize", None)
        if wait is not None:
            wait()
    return clock.seconds(start, end)


@dataclass(frozen=True)
class MemorySample:
    """One rank's memory at the end of a step, GiB."""

    peak_allocated_gib: float  # max_memory_allocated since the step's reset_peak_memory_stats
    reserved_gib: float  # the caching allocator's reserved segments, at the step's end
    device_used_gib: float  # cudaMemGetInfo total - free, at the same moment (what nvidia-smi shows)


class MemorySource(Protocol):
    """Where the recorder's memory figures come from: CudaMemory on a GPU run."""

    def reset_peak(self) -> None: ...

    def sample(self) -> MemorySample: ...


class CudaMemory:
    """The step's memory figures from torch.cuda. The allocator counters are host-side (no wait
    for queued kernels); cudaMemGetInfo is one driver query per step, whose cost on a GPU has not
    been measured yet (scripts/bench_step_timer.py measures the host side only).

    device_used - reserved is what lives outside the caching allocator: the CUDA context, NCCL
    buffers, DeepEP/HybridEP buffers and TE userbuffers (cudaMalloc'd directly), so those show
    next to the allocator's peak. The GPU is one rank's, so other processes rarely add to it."""

    def reset_peak(self) -> None:
        import torch

        torch.cuda.reset_peak_memory_stats()

    def sample(self) -> MemorySample:
        import torch

        free, total = torch.cuda.mem_get_info()
        return MemorySample(
            peak_allocated_gib=torch.cuda.max_memory_allocated() / GIB,
            reserved_gib=torch.cuda.memory_reserved() / GIB,
            device_used_gib=(total - free) / GIB,
        )


@dataclass(frozen=True)
class Placement:
    """Where this rank sits in Megatron's layout; fixed for the run, so asked once."""

    dp_rank: int
    feeds_data: bool  # TP0, CP0, first pipeline stage: its batches are the DP rank's batches
    last_stage: bool  # holds Bridge's loss_dict (train.py:980-1018); empty elsewhere
    host: str


@dataclass
class PendingStep:
    """A finished step, kept with its device marks unread until the next gather."""

    step: int
    time_unix_s: float
    start: Any
    end: Any
    loss: Any  # Bridge's reduced loss tensor, read at the gather (reading it now would sync)
    grad_norm: float | None
    lr: float | None
    skipped: bool
    stats: StepStats
    spans: dict[str, list[tuple[Any, Any]]] | None
    memory: MemorySample
    flops: float | None = None  # Bridge adds the step's FLOPs after on_train_step_end (train.py:608)
    next_start: Any = None  # the mark at the next step's start, where this step's period ends


# Records travel to rank 0 once per this many steps (and at on_train_end). gather_object is a
# world-wide rendezvous: each rank waits for the slowest one, and on NCCL the pickled records go
# through the device, which synchronises it. Doing it every step would cap how far the host runs
# ahead of the device at every step boundary; every 10th keeps it off 9 in 10, while a run that
# Bridge ends with sys.exit, without on_train_end (signal or exit_duration_in_mins: train.py:795-805),
# loses at most this many steps' lines.
GATHER_EVERY_STEPS = 10


@dataclass
class StepRecorder:
    """Bridge callbacks that write one steps.jsonl line per optimizer step per data-parallel rank.

    Nothing here waits for the device: the step is bracketed by clock marks (CUDA events on the
    current stream), its memory read from the allocator's counters, its loss kept as the tensor
    Bridge reduced. Every `gather_every` steps and at the end, each rank reads the marks of its
    finished steps and rank 0 gathers them and writes their lines, in step order."""

    spec: RunSpec
    run_dir: Path
    stats: StepStats = field(default_factory=StepStats)
    timer: BridgeComponentTimer = field(default_factory=BridgeComponentTimer)
    # Where time and memory come from; on_train_start picks torch.cuda's when left None.
    clock: Clock | None = None
    memory: MemorySource | None = None
    gather_every: int = GATHER_EVERY_STEPS
    writer: StepWriter | None = None
    # Turns the CUDA allocator's history off (profiling=memory); on_train_start picks
    # profiling.stop_memory_history when left None.
    history_off: Callable[[], None] | None = None
    _history_until: int | None = None  # the step whose end dumps the snapshot, on a profiled rank
    _placement: Placement | None = None
    _pending: list[PendingStep] = field(default_factory=list)
    _started: Any = None
    _flops_before: float = 0.0

    # Bridge's Callback protocol: CallbackManager.add() registers methods by these names.
    def on_train_start(self, context: Any) -> None:
        import torch
        from megatron.core import parallel_state as mpu

        if self.clock is None:
            from moe_vlm.engines.timing import clock_for

            self.clock = clock_for(torch.device("cuda", torch.cuda.current_device()))
        if self.memory is None:
            self.memory = CudaMemory()
        if self.spec.cuda_graph.impl is not CudaGraphImpl.full_iteration:
            # Hooks inside a captured full-iteration graph would record nothing useful.
            self.timer.attach(context.model, self.clock)
        self._placement = Placement(
            dp_rank=mpu.get_data_parallel_rank(),
            feeds_data=mpu.get_tensor_model_parallel_rank() == 0
            and mpu.get_context_parallel_rank() == 0
            and mpu.is_pipeline_first_stage(ignore_virtual=True),
            last_stage=mpu.is_pipeline_last_stage(ignore_virtual=True),
            host=socket.gethostname(),
        )
        if torch.distributed.get_rank() == 0:
            self.writer = StepWriter(self.run_dir / STEPS_JSONL)
        # Bridge starts the allocator's history on the profiled ranks before the model is built and
        # never stops it (training/utils/train_utils.py:206-217): stopped here after the snapshot.
        profiled = torch.distributed.get_rank() in profiling.ranks(self.spec)
        if self.spec.profiling.tool is Profiler.memory and profiled:
            self._history_until = profiling.window(self.spec)[1]
            self.history_off = self.history_off or profiling.stop_memory_history
        self._flops_before = float(context.state.train_state.floating_point_operations_so_far)

    def on_train_step_start(self, context: Any) -> None:
        assert self.clock is not None and self.memory is not None, "on_train_start comes first"
        # The previous step's period ends here: after everything Bridge runs between its
        # on_train_step_end and this callback (training_log, manual GC, checkpoints:
        # train.py:497-729), before this recorder's own gather, which is measuring, not training.
        if self._pending and self._pending[-1].next_start is None:
            self._pending[-1].next_start = self.clock.mark()
        self._take_flops(context)
        if len(self._pending) >= self.gather_every:
            self._gather()
        # Bridge dumped the snapshot in training_log once step `_history_until` ended
        # (train_utils.py:833-842, iteration == profile_step_end): the history's work is done.
        step = int(context.state.train_state.step) + 1
        if self._history_until is not None and step > self._history_until and self.history_off:
            self.history_off()
            self._history_until = None
        self.stats = StepStats()
        self.memory.reset_peak()
        self._started = self.clock.mark()

    def on_train_step_end(self, context: Any) -> None:
        assert self.clock is not None and self.memory is not None, "on_train_start comes first"
        end = self.clock.mark()
        loss = None
        if context.loss_dict:
            value = next(iter(context.loss_dict.values()))
            loss = value.detach() if hasattr(value, "detach") else value
        try:
            lr = float(context.optimizer.param_groups[0]["lr"])
        except (AttributeError, IndexError, KeyError, TypeError):
            lr = None
        self._pending.append(
            PendingStep(
                # Bridge increments train_state.step after this callback: 1-based step = step + 1.
                step=int(context.state.train_state.step) + 1,
                time_unix_s=time.time(),
                start=self._started,
                end=end,
                loss=loss,
                grad_norm=float(context.grad_norm) if context.grad_norm is not None else None,
                lr=lr,
                skipped=bool(context.skipped_iter),
                stats=self.stats,
                spans=self.timer.end_step(),
                memory=self.memory.sample(),
            )
        )

    def on_train_end(self, context: Any) -> None:
        self._take_flops(context)
        if self._pending:
            self._gather()
        if self.writer is not None:
            self.writer.close()

    def _take_flops(self, context: Any) -> None:
        """Give the last finished step the FLOPs Bridge added after its on_train_step_end."""
        flops_now = float(context.state.train_state.floating_point_operations_so_far)
        if self._pending and self._pending[-1].flops is None:
            self._pending[-1].flops = flops_now - self._flops_before
        self._flops_before = flops_now

    def _local(self, pending: PendingStep) -> dict[str, Any]:
        """A finished step as plain numbers (reads its marks and its loss: they are complete by now)."""
        assert self.clock is not None and self._placement is not None
        loss = pending.loss
        if loss is not None:
            loss = float(loss.float().mean()) if hasattr(loss, "float") else float(loss)
        return {
            "step": pending.step,
            "time_unix_s": pending.time_unix_s,
            "step_time_s": completed_seconds(self.clock, pending.start, pending.end),
            "step_period_s": None
            if pending.next_start is None
            else completed_seconds(self.clock, pending.start, pending.next_start),
            "loss": loss,
            "grad_norm": pending.grad_norm,
            "lr": pending.lr,
            "skipped": pending.skipped,
            "stats": pending.stats,
            "components_s": None
            if pending.spans is None
            else BridgeComponentTimer.seconds_of(pending.spans, self.clock),
            "memory": dataclasses.asdict(pending.memory),
            "flops": pending.flops,
            **dataclasses.asdict(self._placement),
        }

    def _gather(self) -> None:
        """Every rank's finished steps to rank 0, which writes their lines in step order."""
        import torch

        local = [self._local(pending) for pending in self._pending]
        self._pending = []
        is_writer = torch.distributed.get_rank() == 0
        gathered: list[Any] | None = [None] * torch.distributed.get_world_size() if is_writer else None
        torch.distributed.gather_object(local, gathered, dst=0)
        if self.writer is None or gathered is None:
            return  # not rank 0
        world = len(gathered)
        by_step: dict[int, list[dict[str, Any]]] = {}
        for rank_records in gathered:
            for record in rank_records:
                by_step.setdefault(record["step"], []).append(record)
        # Bridge's count for the step as rank 0 saw it (gathered[0] is rank 0's own).
        flops_by_step = {record["step"]: record["flops"] for record in gathered[0]}
        for step, records in sorted(by_step.items()):
            for line in self._lines(records, flops_by_step.get(step), world):
                self.writer.write(line)

    def _lines(self, records: list[dict[str, Any]], step_flops: float | None, world: int) -> list[StepRecord]:
        """One step's lines, one per data-parallel rank, from every rank's record of that step."""
        step_time_max = max(record["step_time_s"] for record in records)
        memory_by_dp: dict[int, dict[str, float]] = {}
        loss_by_dp: dict[int, float] = {}
        for record in records:
            peers = memory_by_dp.setdefault(record["dp_rank"], {})
            for key, gib in record["memory"].items():
                peers[key] = max(peers.get(key, 0.0), gib)
            if record["last_stage"] and record["loss"] is not None:
                loss_by_dp.setdefault(record["dp_rank"], record["loss"])
        feeding = sorted((r for r in records if r["feeds_data"]), key=lambda r: r["dp_rank"])
        return [
            self._line(
                record,
                memory_by_dp[record["dp_rank"]],
                loss_by_dp.get(record["dp_rank"]),
                step_flops,
                step_time_max,
                world,
            )
            for record in feeding
        ]

    def _line(
        self,
        record: dict[str, Any],
        memory: dict[str, float],
        loss: float | None,
        step_flops: float | None,
        step_time_max: float,
        world: int,
    ) -> StepRecord:
        bridge_tflops = (
            step_flops / step_time_max / world / 1e12
            if step_flops is not None and step_time_max > 0
            else None
        )
        # A skipped iteration, or a step the profiler slows (moe_vlm/record/profiling.py).
        exclude = "skipped_iter" if record["skipped"] else profiling.exclude_reason(self.spec, record["step"])
        return StepRecord.measured(
            record["stats"],  # the counts and micro_batches, data_wait_s
            step=record["step"],
            rank=record["dp_rank"],
            host=record["host"],  # the straggler view names the node (moe_vlm/perf/stragglers.py)
            warmup=record["step"] <= self.spec.warmup_steps,
            time_unix_s=record["time_unix_s"],
            step_time_s=record["step_time_s"],
            step_period_s=record["step_period_s"],  # None on the run's last step
            # From this DP rank's last pipeline stage: with PP > 1 the line's own (first-stage)
            # rank has no loss_dict.
            loss=loss,
            grad_norm=record["grad_norm"],
            lr=record["lr"],
            # Each the max over this DP rank's model-parallel peers (its worst GPU).
            peak_memory_gib=memory["peak_allocated_gib"],  # this step's, reset at its start
            memory_kind=MemoryKind.cuda_max_allocated.value,
            reserved_gib=memory["reserved_gib"],
            device_used_gib=memory["device_used_gib"],
            components_s=record["components_s"],  # first pipeline stage when PP > 1
            # Bridge's own figure for the same step: its FLOP count (padded tokens, frozen modules
            # counted x3) over the slowest rank's step time, per GPU.
            bridge_tflops_per_gpu=bridge_tflops,
            bridge_step_flops=step_flops,
            exclude=exclude,
        )


def counted(data_iterator: Any, recorder: StepRecorder) -> Any:
    """The iterator one forward step reads, with each micro-batch counted once, at its source.

    With virtual pipeline stages (vp > 1) Bridge hands every model chunk its own view of one
    shared cache over the step's data iterator (training/train.py:896-901 ->
    data/iterator_utils.py:56-90: SharedCache.iterator, CacheView.cache), and each chunk's
    forward step reads the same micro-batch from it (qwen3_vl_step.py:60). Counting each view
    would count every micro-batch vp times, so the cache's source iterator is wrapped instead,
    once: only a read that reaches the source is a new micro-batch (and a wait for data).
    tests/megatron/test_recording.py drives Bridge's own make_data_iterator_list through this."""
    model_cfg = recorder.spec.model

    def counting(inner: Any) -> CountingIterator:
        return CountingIterator(inner, recorder.stats, model_cfg.pad_token_id, model_cfg.image_token_id)

    cache = getattr(data_iterator, "cache", None)
    if cache is not None and hasattr(cache, "iterator"):  # a CacheView of make_data_iterator_list
        if not isinstance(cache.iterator, CountingIterator) and cache.iterator is not None:
            cache.iterator = counting(cache.iterator)
        return data_iterator
    return counting(data_iterator)


def counting_forward_step(recorder: StepRecorder) -> Any:
    """Bridge's forward step for this run (bridge_fields.forward_step_path: Qwen3-VL's, or vlm_step
    with data.packing=in_batch), fed through an iterator that counts each micro-batch."""
    module, function = forward_step_path(recorder.spec).split(":")
    forward_step = getattr(importlib.import_module(module), function)

    def qwen3_vl_forward_step(
        state: Any, data_iterator: Any, model: Any, return_schedule_plan: bool = False
    ) -> Any:
        if data_iterator is not None:
            data_iterator = counted(data_iterator, recorder)
        return forward_step(state, data_iterator, model, return_schedule_plan=return_schedule_plan)

    return qwen3_vl_forward_step
