"""engine=megatron: Megatron Bridge + Megatron Core + Transformer Engine on GPU clusters.

One run, as Megatron experts would set it up by hand:

1. start from the Bridge recipe for model x cluster (``bridge_fields.select_recipe``): the GPU's
   perf recipe where one exists, the general Qwen3-VL / Qwen3.5-VL recipe otherwise;
2. build it offline: the recipe's ``AutoBridge.from_hf_pretrained("<hub id>")`` reads the
   config.json materialised from our `model` group (or the user's local checkpoint directory);
3. apply every row of THE mapping table (``apply_overrides``), the same rows ``dry_run=true``
   prints, and read them back (``check_overrides``);
4. run Bridge's ``pretrain`` with the Qwen3-VL forward step, one process per GPU (torchrun, or
   Slurm tasks from the launcher), recording ``steps.jsonl`` / ``run.json`` per moe_vlm.record.

The library is imported lazily: planning (dry_run) and the rest of the project never need it.
Running needs GPUs; everything before ``pretrain`` also works on a CPU (tests/megatron).
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import importlib
import importlib.metadata
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moe_vlm.engines import EngineUnavailable
from moe_vlm.engines.bridge_fields import (
    HYBRID_EP_ENV_NAMES,
    KEEP,
    BridgeOverride,
    Recipe,
    bridge_overrides,
    select_recipe,
)
from moe_vlm.engines.hf_config import hf_model_dir
from moe_vlm.record import RUN_JSON, STEPS_JSONL, StepWriter, base_record, read_steps, write_json_atomic
from moe_vlm.schema import CudaGraphImpl
from moe_vlm.spec import RunSpec

PINNED = {"megatron-core": "0.19.2", "megatron-bridge": "0.6.2"}
INSTALL_HINT = (
    "install the pinned stack with `bash scripts/install_megatron.sh` (CPU machines) or run inside "
    "NVIDIA's NeMo container (see README, 'Cluster install')"
)
GIB = 1024**3


# --- the library --------------------------------------------------------------------------


def stack_problem() -> str | None:
    """Why the Megatron stack cannot be used here (None when it can)."""
    try:
        import megatron.bridge
        import megatron.core  # noqa: F401
        import transformer_engine.pytorch  # noqa: F401
    except Exception as exc:  # ImportError, or TE's FileNotFoundError for a missing torch extension
        return f"the Megatron stack does not import ({type(exc).__name__}: {exc}); {INSTALL_HINT}"
    for package, wanted in PINNED.items():
        installed = importlib.metadata.version(package)
        if installed != wanted:
            return (
                f"{package} {installed} is installed, the engine is checked against {wanted}; {INSTALL_HINT}"
            )
    return None


def versions() -> dict[str, str | None]:
    names = ("megatron-core", "megatron-bridge", "transformer-engine", "transformer-engine-torch")
    found: dict[str, str | None] = {}
    for name in names:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


@contextlib.contextmanager
def offline_hf(hf_dir: Path) -> Iterator[list[str]]:
    """While open, ``AutoBridge.from_hf_pretrained(<hub id>)`` reads `hf_dir` instead of the hub.

    Recipes hard-code the hub id; clusters often cannot reach the hub. Yields the ids the recipe
    asked for, so the record can say which config stood in for which id.
    """
    from megatron.bridge import AutoBridge

    original = AutoBridge.__dict__["from_hf_pretrained"]
    requested: list[str] = []

    def from_local_dir(cls: type, path: Any, *args: Any, **kwargs: Any) -> Any:
        requested.append(str(path))
        return original.__func__(cls, str(hf_dir), *args, **kwargs)

    offline_before = os.environ.get("HF_HUB_OFFLINE")
    os.environ["HF_HUB_OFFLINE"] = "1"
    AutoBridge.from_hf_pretrained = classmethod(from_local_dir)
    try:
        yield requested
    finally:
        AutoBridge.from_hf_pretrained = original
        if offline_before is None:
            os.environ.pop("HF_HUB_OFFLINE", None)
        else:
            os.environ["HF_HUB_OFFLINE"] = offline_before


# --- config: recipe + THE table -------------------------------------------------------------


@dataclass
class BuiltConfig:
    cfg: Any  # megatron.bridge.training.config.ConfigContainer
    recipe: Recipe
    hf_dir: Path
    hub_ids_requested: list[str]
    applied: list[BridgeOverride]


def recipe_function(recipe: Recipe) -> Any:
    module = importlib.import_module(recipe.module)
    try:
        return getattr(module, recipe.function)
    except AttributeError:
        raise EngineUnavailable(
            f"{recipe.name} does not exist in megatron-bridge {versions()['megatron-bridge']}; "
            f"the recipe table in moe_vlm/engines/bridge_fields.py targets {PINNED['megatron-bridge']}."
        ) from None


def build_config(spec: RunSpec, workdir: Path) -> BuiltConfig:
    """The real ConfigContainer: the recipe, built offline, with every table row applied."""
    recipe = select_recipe(spec)
    if recipe is None:
        raise EngineUnavailable(
            f"model={spec.model.name} (arch {spec.model.arch}) has no Megatron Bridge recipe."
        )
    hf_dir = hf_model_dir(spec.model, workdir)
    build = recipe_function(recipe)
    with offline_hf(hf_dir) as requested:
        cfg = build()
    applied = apply_overrides(cfg, spec)
    return BuiltConfig(cfg, recipe, hf_dir, requested, applied)


def _parent_and_name(cfg: Any, path: str) -> tuple[Any, str]:
    *parents, name = path.split(".")
    node = cfg
    for part in parents:
        node = getattr(node, part)
    return node, name


def _has_field(node: Any, name: str) -> bool:
    if dataclasses.is_dataclass(node):
        return name in {f.name for f in dataclasses.fields(node)}
    return hasattr(node, name)


def _optional_section(path: str) -> Any:
    """An empty config for an optional ConfigContainer section the recipe left as None."""
    if path == "comm_overlap":
        from megatron.bridge.training.comm_overlap import CommOverlapConfig

        return CommOverlapConfig(tp_comm_overlap=False)
    raise AttributeError(f"{path} is None in the recipe and the engine has no empty config for it")


def _section_missing(cfg: Any, path: str) -> bool:
    section = path.partition(".")[0]
    return "." in path and hasattr(cfg, section) and getattr(cfg, section) is None


def set_field(cfg: Any, path: str, value: Any) -> None:
    """Set a dotted ConfigContainer field. A name the installed Bridge lacks is an error: Python
    would otherwise add it as a new attribute that nothing reads.

    Optional sections the recipe left as None (comm_overlap in the general recipes) mean "off":
    switching something off there is already done; switching it on creates the section.
    """
    if _section_missing(cfg, path):
        if value in (None, False):
            return
        setattr(cfg, path.partition(".")[0], _optional_section(path.partition(".")[0]))
    node, name = _parent_and_name(cfg, path)
    if not _has_field(node, name):
        raise AttributeError(
            f"{path}: {type(node).__name__} has no field {name!r} in megatron-bridge "
            f"{versions()['megatron-bridge']} (fix the row in moe_vlm/engines/bridge_fields.py)"
        )
    setattr(node, name, value)


def get_field(cfg: Any, path: str) -> Any:
    """A dotted field's value; a field inside an optional section that is None reads as None."""
    if _section_missing(cfg, path):
        return None
    node, name = _parent_and_name(cfg, path)
    return getattr(node, name)


# Rows whose value names the config class to hold at that path (not a plain value).
CLASS_ROWS = ("dataset", "dataset.task_encoder")


def _config_object(cfg: Any, path: str, class_name: str, spec: RunSpec) -> Any:
    """A `class_name` config for `path`, reusing the recipe's when it is already that class."""
    current = get_field(cfg, path)
    if type(current).__name__ == class_name:
        return current
    from megatron.bridge.data import builders

    processor = spec.model.hf_model_id
    if class_name == "EnergonDatasetConfig":
        return builders.EnergonDatasetConfig(
            path=spec.data.path,
            seq_length=spec.seq_length,
            micro_batch_size=spec.mbs,
            task_encoder=builders.QwenVLEnergonTaskEncoderConfig(hf_processor_path=processor),
        )
    if class_name == "MockVLMSFTDatasetConfig":
        return builders.MockVLMSFTDatasetConfig(seq_length=spec.seq_length, hf_processor_path=processor)
    if class_name == "QwenVLEnergonTaskEncoderConfig":
        return builders.QwenVLEnergonTaskEncoderConfig(hf_processor_path=processor)
    raise ValueError(f"{path}: config class {class_name!r} is not one the engine builds")


def apply_overrides(cfg: Any, spec: RunSpec) -> list[BridgeOverride]:
    """Apply every row of THE table to `cfg`, dotted path by dotted path; returns the rows set."""
    overrides = bridge_overrides(spec)
    applied: list[BridgeOverride] = []
    # Class rows come first, outermost first: replacing a config object resets its fields.
    ordered = sorted(
        overrides, key=lambda o: CLASS_ROWS.index(o.field) if o.field in CLASS_ROWS else len(CLASS_ROWS)
    )
    for row in ordered:
        if row.value is KEEP:
            continue
        if row.field in CLASS_ROWS:
            set_field(cfg, row.field, _config_object(cfg, row.field, row.value, spec))
        elif row.field == "env_vars":
            env = {k: v for k, v in cfg.env_vars.items() if k not in HYBRID_EP_ENV_NAMES}
            cfg.env_vars = {**env, **row.value}
        else:
            set_field(cfg, row.field, row.value)
        applied.append(row)
    return applied


def normalise(value: Any) -> Any:
    """Compare values the way the engine means them: enums by name, tuples as lists."""
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, list | tuple):
        return [normalise(item) for item in value]
    if isinstance(value, dict):
        return {str(k): str(v) for k, v in value.items()}
    return value


def check_overrides(cfg: Any, spec: RunSpec) -> list[str]:
    """Every row whose field does not hold the value the table intends (empty when all do)."""
    problems = []
    for row in bridge_overrides(spec):
        if row.value is KEEP:
            continue
        if row.field in CLASS_ROWS:
            actual: Any = type(get_field(cfg, row.field)).__name__
            wanted: Any = row.value
        elif row.field == "env_vars":
            env = {k: str(v) for k, v in cfg.env_vars.items() if k in HYBRID_EP_ENV_NAMES}
            actual, wanted = env, normalise(row.value)
        elif _section_missing(cfg, row.field) and row.value in (None, False):
            continue  # an optional section the recipe left out is off
        else:
            actual, wanted = normalise(get_field(cfg, row.field)), normalise(row.value)
        if actual != wanted:
            problems.append(f"{row.field} = {actual!r}, table wants {wanted!r} (knob {row.knob})")
    return problems


# --- running: per-step records -------------------------------------------------------------


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


# --- launch ---------------------------------------------------------------------------------


def _relaunch_with_torchrun(spec: RunSpec, run_dir: Path) -> None:
    """Single node, not yet one process per GPU: start them with torchrun (same overrides)."""
    overrides = [arg for arg in sys.argv[1:] if not arg.startswith("hydra.run.dir=")]
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={spec.layout.ranks_per_node}",
        sys.argv[0],
        *overrides,
        f"hydra.run.dir={run_dir}",
    ]
    print("moe_vlm: starting one process per GPU: " + " ".join(command), file=sys.stderr)
    done = subprocess.run(command, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"torchrun exited with status {done.returncode}; see the rank logs above")


def _distributed_env(spec: RunSpec) -> bool:
    """Export torch.distributed's env:// variables for this rank; False when not one rank of many."""
    from moe_vlm.launch.dist_env import DistEnv

    env = DistEnv.from_environ()
    if env is None:
        if spec.layout.world_size > 1:
            return False
        env = DistEnv(0, 1, 0, 1, "127.0.0.1", 29500, "single")
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


def _check_processor(cfg: Any) -> None:
    """Fail before the job starts when the data pipeline's Qwen processor is not on this machine."""
    task_encoder = getattr(cfg.dataset, "task_encoder", None)
    path = getattr(cfg.dataset, "hf_processor_path", None) or getattr(task_encoder, "hf_processor_path", None)
    if not path:
        return
    from transformers import AutoProcessor

    try:
        AutoProcessor.from_pretrained(path)
    except Exception as exc:
        raise EngineUnavailable(
            f"engine=megatron: the data pipeline needs the processor files (tokenizer, preprocessor config) "
            f"of {path} and cannot load them offline ({type(exc).__name__}). Fix: set "
            "model.hf_model_id=/path/to/a/local/checkpoint/dir, or fill the Hugging Face cache once where "
            f"the hub is reachable: huggingface-cli download {path} --include '*.json' '*.txt'"
        ) from None


def launch(spec: RunSpec, config: dict[str, Any], run_dir: Path) -> None:
    """Run `spec` on this node's GPUs (one call per rank under torchrun or Slurm)."""
    problem = stack_problem()
    if problem:
        raise EngineUnavailable(f"engine=megatron: {problem}")
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

    os.environ["HF_HUB_OFFLINE"] = "1"
    from megatron.bridge.training.pretrain import pretrain

    built = build_config(spec, run_dir)
    _check_processor(built.cfg)
    problems = check_overrides(built.cfg, spec)
    if problems:
        raise EngineUnavailable("the Bridge config does not hold the table's values: " + "; ".join(problems))
    recorder = StepRecorder(spec, run_dir)
    pretrain(built.cfg, forward_step_func=counting_forward_step(recorder), callbacks=[recorder])

    if int(os.environ["RANK"]) == 0:
        _write_run_json(spec, config, run_dir, built)


def _write_run_json(spec: RunSpec, config: dict[str, Any], run_dir: Path, built: BuiltConfig) -> None:
    from moe_vlm.metrics import summarize

    steps = read_steps(run_dir / STEPS_JSONL)
    record = base_record(spec, config, status="completed")
    record["summary"] = summarize(steps, spec)
    # One Bridge FLOP count per step; its time is the slowest rank's, as Bridge's own log divides.
    steady: dict[int, tuple[float, float]] = {}
    for line in steps:
        if line.get("warmup") or line.get("exclude") or line.get("bridge_step_flops") is None:
            continue
        flops, slowest = steady.get(line["step"], (line["bridge_step_flops"], 0.0))
        steady[line["step"]] = (flops, max(slowest, line["step_time_s"]))
    steady_time_s = sum(time_s for _flops, time_s in steady.values())
    record["bridge"] = {
        "recipe": built.recipe.name,
        "recipe_kind": built.recipe.kind,
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
    write_json_atomic(run_dir / RUN_JSON, record)
