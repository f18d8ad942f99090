"""Per-step records from inside Bridge's training loop: Bridge callbacks, a counting data
iterator and CUDA-event component timing. GPU-only at run time; unit-tested on CPU with fakes
of the context Bridge passes."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moe_vlm.record import STEPS_JSONL, StepWriter
from moe_vlm.schema import CudaGraphImpl
from moe_vlm.spec import RunSpec

GIB = 1024**3


@dataclass
class StepStats:
    """What one rank fed the model during one optimizer step (summed over micro-batches)."""

    micro_batches: int = 0
    sequences: int = 0
    padded: int = 0
    real: int = 0
    image: int = 0
    loss: int = 0
    images: int = 0
    vision_patches: int = 0
    sum_seq_len_squared: int = 0
    sum_patches_squared: int = 0

    def add_batch(self, batch: dict[str, Any], pad_token_id: int, image_token_id: int) -> None:
        tokens = batch.get("input_ids")
        if tokens is None:
            tokens = batch.get("tokens")
        if tokens is None:
            return
        self.micro_batches += 1
        self.sequences += int(tokens.shape[0])
        self.padded += int(tokens.numel())
        # Bridge's collate pads with the tokenizer's pad id; an attention mask, when the batch
        # carries one, is the better witness.
        attention = batch.get("attention_mask")
        if attention is not None and tuple(attention.shape) == tuple(tokens.shape):
            real_mask = attention.bool()
        else:
            real_mask = tokens != pad_token_id
        real_per_sequence = real_mask.sum(dim=-1)
        self.real += int(real_per_sequence.sum())
        self.sum_seq_len_squared += int((real_per_sequence.long() ** 2).sum())
        self.image += int((tokens == image_token_id).sum())
        loss_mask = batch.get("loss_mask")
        if loss_mask is not None:
            self.loss += int(loss_mask.sum())
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
        batch = next(self.inner)
        if isinstance(batch, dict):
            self.stats.add_batch(batch, self.pad_token_id, self.image_token_id)
        return batch


class ComponentTimer:
    """Vision encoder / projector / decoder time from CUDA events on the model's submodules.

    Forward: events around each call of the module's forward. Backward, per forward call (so any
    pipeline schedule works): from the first gradient reaching that call's outputs to the last
    gradient reaching its inputs, or, where the inputs need no gradient, the output of its first
    layer. The projector (patch merger) runs inside the vision model, so encoder = vision model
    - projector; deepstack mergers count as encoder. A frozen stack whose inputs need no
    gradient has no backward, and records none.
    """

    def __init__(self) -> None:
        self.spans: dict[str, list[tuple[Any, Any]]] = {}
        self._forward_start: dict[str, Any] = {}
        self._current_call: dict[str, int] = {}
        self._backward: dict[tuple[str, int], dict[str, Any]] = {}
        self._calls = 0
        self.attached = False

    def attach(self, model_chunks: list[Any]) -> None:
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
                    layers = getattr(getattr(language, "decoder", None), "layers", None)
                    self._watch("decoder", language, layers[0] if layers else None)
                self.attached = True

    @staticmethod
    def _event() -> Any:
        import torch

        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    @staticmethod
    def _needing_grad(value: Any) -> list[Any]:
        import torch

        if isinstance(value, torch.Tensor):
            return [value] if value.requires_grad else []
        if isinstance(value, list | tuple):
            return [t for item in value for t in ComponentTimer._needing_grad(item)]
        if isinstance(value, dict):
            return [t for item in value.values() for t in ComponentTimer._needing_grad(item)]
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

    def _watch(self, name: str, module: Any, first_layer: Any) -> None:
        def pre_forward(_module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            self._calls += 1
            self._current_call[name] = self._calls
            self._forward_start[name] = self._event()
            for tensor in self._needing_grad(args) + self._needing_grad(kwargs):
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

    def step_seconds(self) -> dict[str, float] | None:
        """Seconds per component for the step just finished (call after a device synchronise)."""
        for (name, _call), state in self._backward.items():
            if "start" in state and "end" in state:
                self.spans.setdefault(name, []).append((state["start"], state["end"]))
        self._backward.clear()
        if not self.attached:
            return None
        total = {name: sum(start.elapsed_time(end) for start, end in spans) / 1000.0
                 for name, spans in self.spans.items()}  # fmt: skip
        self.spans.clear()
        vision, projector = total.get("vision", 0.0), total.get("projector", 0.0)
        return {
            "vision_encoder": max(vision - projector, 0.0),
            "projector": projector,
            "decoder": total.get("decoder", 0.0),
        }


@dataclass
class StepRecorder:
    """Bridge callbacks that write one steps.jsonl line per optimizer step per data-parallel rank."""

    spec: RunSpec
    run_dir: Path
    stats: StepStats = field(default_factory=StepStats)
    timer: ComponentTimer = field(default_factory=ComponentTimer)
    writer: StepWriter | None = None
    _started_s: float = 0.0
    _pending: dict[str, Any] | None = None
    _flops_before: float = 0.0

    # Bridge's Callback protocol: CallbackManager.add() registers methods by these names.
    def on_train_start(self, context: Any) -> None:
        import torch

        if self.spec.cuda_graph.impl is not CudaGraphImpl.full_iteration:
            # Hooks inside a captured full-iteration graph would record nothing useful.
            self.timer.attach(context.model)
        if torch.distributed.get_rank() == 0:
            self.writer = StepWriter(self.run_dir / STEPS_JSONL)
        self._flops_before = float(context.state.train_state.floating_point_operations_so_far)

    def on_train_step_start(self, context: Any) -> None:
        import torch

        self._flush(context)  # Bridge adds the previous step's FLOPs after on_train_step_end.
        self.stats = StepStats()
        torch.cuda.synchronize()
        self._started_s = time.perf_counter()

    def on_train_step_end(self, context: Any) -> None:
        import torch

        torch.cuda.synchronize()
        step_time_s = time.perf_counter() - self._started_s
        loss = None
        if context.loss_dict:
            value = next(iter(context.loss_dict.values()))
            loss = float(value.float().mean()) if hasattr(value, "float") else float(value)
        try:
            lr = float(context.optimizer.param_groups[0]["lr"])
        except (AttributeError, IndexError, KeyError, TypeError):
            lr = None
        self._pending = {
            # Bridge increments train_state.step after this callback: 1-based step = step + 1.
            "step": int(context.state.train_state.step) + 1,
            "time_unix_s": time.time(),
            "step_time_s": step_time_s,
            "loss": loss,
            "grad_norm": float(context.grad_norm) if context.grad_norm is not None else None,
            "lr": lr,
            "skipped": bool(context.skipped_iter),
            "stats": dataclasses.asdict(self.stats),
            "components_s": self.timer.step_seconds(),
            "peak_memory_gib": torch.cuda.max_memory_allocated() / GIB,
        }

    def on_train_end(self, context: Any) -> None:
        self._flush(context)
        if self.writer is not None:
            self.writer.close()

    def _flush(self, context: Any) -> None:
        """Gather the finished step from every rank and write its lines (rank 0)."""
        if self._pending is None:
            return
        import torch
        from megatron.core import parallel_state as mpu

        flops_now = float(context.state.train_state.floating_point_operations_so_far)
        step_flops, self._flops_before = flops_now - self._flops_before, flops_now
        local = {
            **self._pending,
            "dp_rank": mpu.get_data_parallel_rank(),
            "feeds_data": mpu.get_tensor_model_parallel_rank() == 0
            and mpu.get_context_parallel_rank() == 0
            and mpu.is_pipeline_first_stage(ignore_virtual=True),
        }
        self._pending = None
        is_writer = torch.distributed.get_rank() == 0
        gathered: list[Any] | None = [None] * torch.distributed.get_world_size() if is_writer else None
        torch.distributed.gather_object(local, gathered, dst=0)
        if self.writer is None or gathered is None:
            return  # not rank 0
        world = len(gathered)
        step_time_max = max(record["step_time_s"] for record in gathered)
        memory_by_dp: dict[int, float] = {}
        for record in gathered:
            memory_by_dp[record["dp_rank"]] = max(
                memory_by_dp.get(record["dp_rank"], 0.0), record["peak_memory_gib"]
            )
        for record in sorted((r for r in gathered if r["feeds_data"]), key=lambda r: r["dp_rank"]):
            self.writer.write(
                self._line(record, memory_by_dp[record["dp_rank"]], step_flops, step_time_max, world)
            )

    def _line(
        self,
        record: dict[str, Any],
        peak_memory_gib: float,
        step_flops: float,
        step_time_max: float,
        world: int,
    ) -> dict[str, Any]:
        stats = record["stats"]
        bridge_tflops = step_flops / step_time_max / world / 1e12 if step_time_max > 0 else None
        return {
            "step": record["step"],
            "rank": record["dp_rank"],
            "warmup": record["step"] <= self.spec.warmup_steps,
            "time_unix_s": record["time_unix_s"],
            "step_time_s": record["step_time_s"],
            "loss": record["loss"],
            "grad_norm": record["grad_norm"],
            "lr": record["lr"],
            "micro_batches": stats["micro_batches"],
            "tokens": {
                "padded": stats["padded"],
                "real": stats["real"],
                "text": stats["real"] - stats["image"],
                "image": stats["image"],
                "loss": stats["loss"],
            },
            "sequences": stats["sequences"],
            "images": stats["images"],
            "vision_patches": stats["vision_patches"],
            "sum_seq_len_squared": stats["sum_seq_len_squared"],
            "sum_patches_squared": stats["sum_patches_squared"],
            "peak_memory_gib": peak_memory_gib,  # max over this DP rank's model-parallel peers
            "memory_kind": "cuda_max_allocated",
            "components_s": record["components_s"],  # first pipeline stage when PP > 1
            # Bridge's own figure for the same step: its FLOP count (padded tokens, frozen modules
            # counted x3) over the slowest rank's step time, per GPU.
            "bridge_tflops_per_gpu": bridge_tflops,
            "bridge_step_flops": step_flops,
            **({"exclude": "skipped_iter"} if record["skipped"] else {}),
        }


def counting_forward_step(recorder: StepRecorder) -> Any:
    """Bridge's Qwen3-VL forward step, fed through an iterator that counts each micro-batch."""
    from megatron.bridge.models.qwen_vl.qwen3_vl_step import forward_step

    model_cfg = recorder.spec.model

    def qwen3_vl_forward_step(
        state: Any, data_iterator: Any, model: Any, return_schedule_plan: bool = False
    ) -> Any:
        if data_iterator is not None:
            data_iterator = CountingIterator(
                data_iterator, recorder.stats, model_cfg.pad_token_id, model_cfg.image_token_id
            )
        return forward_step(state, data_iterator, model, return_schedule_plan=return_schedule_plan)

    return qwen3_vl_forward_step
