"""Does an engine READ a knob it declares Honoured? One checker per engine.

A declaration (moe_vlm/knobs/support.py) says what an engine does with a knob; these checkers
prove it from what the engine builds:

- torch: a tiny real run of the torch engine (its own ``launch`` in this process, as one rank of
  a torchrun launch: model, FSDP2, optimizer, the data group's loader, two steps) and what it
  recorded (run.json's torch_engine section, steps.jsonl, the files of the run directory) must
  differ when the knob does;
- megatron: a FIELD_MAP row must name the knob, and the real ConfigContainer the engine builds
  (the Bridge recipe + apply_overrides) must hold different values in those rows' fields.

Each checker returns a problem (str) or None, so the mutation tests (tests/unit/test_knob_reading.py,
tests/megatron/test_knob_reading.py) can neutralise the code that reads a knob and see the verdict
turn red. The knob-coverage tests call them for every honoured knob.
"""

from __future__ import annotations

import json
import os
import tempfile
import types
import typing
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, cast
from unittest import mock

from moe_vlm.config.compose import compose_spec
from moe_vlm.config.spec import RunSpec
from moe_vlm.knobs import bridge_fields
from moe_vlm.knobs.support import FIELD_MAP_GROUP_READS, SHORTCUTS
from moe_vlm.runtime.dist_env import free_port
from tests.conftest import SCHEMA_LEAVES, knob_override

# --- changing a knob ---------------------------------------------------------------------------


def base_type(kind: Any) -> Any:
    """int | None -> int; list[str] -> list."""
    if isinstance(kind, types.UnionType):
        kind = next(arg for arg in typing.get_args(kind) if arg is not type(None))
    return typing.get_origin(kind) or kind


def value_of(spec: RunSpec, knob: str) -> Any:
    """The knob's value as the spec resolved it (a shortcut: the layout's size)."""
    if knob in SHORTCUTS.values() or knob == "nodes":
        return getattr(spec.layout, knob)
    if knob == "nproc":
        return spec.layout.ranks_per_node
    group, _, name = knob.rpartition(".")
    node: Any = spec.freeze if group == "vision_freeze" else getattr(spec, group) if group else spec
    return getattr(node, name)


def set_value(knob: str) -> Any:
    """A set value of the knob's type: where null means "the recipe's" (every null-defaulted knob
    that FIELD_MAP reads as KEEP), the change is measured from a set value, not from null."""
    kind = base_type(SCHEMA_LEAVES[knob])
    if kind is bool:
        return True
    if isinstance(kind, type) and issubclass(kind, Enum):
        return next(iter(kind))
    if kind is str:
        return "set"
    return kind(1)


def changed(value: Any) -> Any:
    """Another value of the same type, past any rounding (synthetic num_images is a rounded mean)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, Enum):
        return next(member for member in type(value) if member != value)
    if isinstance(value, int | float):
        return value * 2 + 1
    if isinstance(value, list):
        return value[:-1] if value else [1]
    return f"{value}_changed"


@dataclass
class Pair:
    """Two specs that differ in one knob."""

    knob: str
    before: tuple[str, ...]
    after: tuple[str, ...]


def pair(
    knob: str, context: tuple[str, ...], to: Any = None, spec: Callable[..., RunSpec] | None = None
) -> Pair:
    """The context, and the context with the knob changed (to `to`, else to `changed` of its value;
    a knob that resolved to null starts from `set_value`)."""
    spec = spec or cached_spec
    current = value_of(spec(context), knob)
    if current is None and to is None:
        context = (*context, knob_override(knob, set_value(knob)))
        current = value_of(spec(context), knob)
    return Pair(knob, context, (*context, knob_override(knob, changed(current) if to is None else to)))


_SPECS: dict[tuple[str, ...], RunSpec] = {}


def cached_spec(overrides: tuple[str, ...]) -> RunSpec:
    if overrides not in _SPECS:
        _SPECS[overrides] = compose_spec(list(overrides))
    return _SPECS[overrides]


# --- torch -------------------------------------------------------------------------------------

# One CPU rank, two optimizer steps of one micro-batch of mock rows: cheap enough per knob.
TORCH_BASE = (
    "engine=torch",
    "nproc=1",
    "train_iters=2",
    "warmup_steps=1",
    "gbs=1",
    "seq_length=64",
    "data=mock",
)
# The data group's knobs draw small synthetic photos (the vision path real and cheap).
TORCH_DATA_BASE = (
    *TORCH_BASE[:-2],
    "seq_length=160",
    "data=synthetic",
    "data.min_long_side_px=64",
    "data.max_long_side_px=96",
    "data.min_pixels=4096",
    "data.max_pixels=9216",
    "data.min_text_tokens=16",
    "data.max_text_tokens=48",
)


class Level(Enum):
    """How much of the torch engine a knob's check builds, each level including the one before."""

    loader = 1  # the data group's batches (build_batches): their counts and token ids
    steps = 2  # + the Trainer (model, freeze, recompute, FSDP2, AdamW) and two optimizer steps
    run = 3  # the engine's own launch as one torchrun rank: its record, steps.jsonl, files


# Knobs read by the launch and the run loop (world size, step count, profiler, tracker): a whole
# run observes them. The data group's knobs: the loader. Every other knob: the Trainer and two steps.
RUN_KNOBS = frozenset({"nodes", "nproc", "train_iters"})
RUN_GROUPS = ("profiling", "logger")


def level(knob: str) -> Level:
    if knob in RUN_KNOBS or knob.split(".")[0] in RUN_GROUPS:
        return Level.run
    return Level.loader if knob.startswith("data.") else Level.steps


# What puts a knob in play on the torch engine.
TORCH_CONTEXT: dict[str, tuple[str, ...]] = {
    "mbs": ("gbs=2",),
    # A frozen decoder leaves only the vision path to train: it needs images.
    "vision_freeze.language": TORCH_DATA_BASE[len(TORCH_BASE) - 2 :],
    "recompute.granularity": ("recompute.method=uniform", "recompute.num_layers=1"),
    "recompute.method": ("recompute=full", "recompute.method=uniform"),
    "recompute.num_layers": ("recompute=full", "recompute.method=block", "recompute.num_layers=1"),
    "recompute.modules": ("recompute=selective",),
    "profiling.steps": ("profiling=torch",),
    "profiling.ranks": ("profiling=torch",),
    "data.path": ("data=real", "data.path=/nonexistent/shards"),
    "data.packing_buffer": ("data.packing=buffer",),
}
# Where `changed` would leave the range the run can draw from, or change nothing in a one-rank run.
TORCH_CHANGED: dict[str, Any] = {
    "mbs": 2,
    "gbs": 2,
    "nodes": 2,
    "nproc": 2,
    "train_iters": 3,
    "lr": 1e-3,
    "recompute.granularity": "full",
    "profiling.tool": "torch",
    "profiling.steps": [1],  # [] is the first step after warm-up: 2
    "profiling.ranks": [1],  # rank 0 stops recording: this run's only rank
    "logger.backend": "tensorboard",
    "data.min_images": 2,
    "data.max_images": 3,
    "data.min_long_side_px": 80,
    "data.max_long_side_px": 128,
    "data.aspect_ratios": [0.5],
    "data.min_text_tokens": 32,
    "data.max_text_tokens": 96,
    "data.min_pixels": 8192,
    "data.max_pixels": 6144,
    "data.packing_buffer": 1,  # one candidate: one sample per row, where 64 pack several
}
# Knobs the engine reads by refusing a value: the refusal names it (launch checks that nodes x
# nproc is the world it was started with; the loader opens data.path).
TORCH_READ_BY_REFUSAL = frozenset({"nodes", "nproc", "data.path"})
# Knobs only a tracker whose package is not installed reads (rule O006 rejects those trackers).
TRACKER_PACKAGES: dict[str, tuple[str, ...]] = {
    "logger.project": ("wandb", "mlflow"),
    "logger.run_name": ("wandb", "mlflow"),
    "logger.entity": ("wandb",),
    "logger.tracking_uri": ("mlflow",),
}
# What a recorded step shows of the knobs (times and memory are left out: they vary run to run).
_STEP_FIELDS = (
    "step",
    "warmup",
    "exclude",
    "micro_batches",
    "sequences",
    "padded_tokens",
    "real_tokens",
    "text_tokens",
    "image_tokens",
    "images",
    "vision_patches",
    "loss",
    "grad_norm",
    "lr",
)


@contextmanager
def _one_torchrun_rank() -> Iterator[None]:
    """This process as rank 0 of a one-rank torchrun launch (DistEnv.from_environ reads it)."""
    env = {
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
    }
    kept = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SUBMITIT_"))}
    with mock.patch.dict(os.environ, {**kept, **env}, clear=True):
        yield


@contextmanager
def _one_rank_group() -> Iterator[None]:
    import torch
    import torch.distributed as dist

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
        torch.set_num_threads(threads)


def observe_loader(spec: RunSpec) -> dict[str, Any]:
    """The first two micro-batches of the torch engine's loader: their counts and token ids."""
    from dataclasses import asdict

    from moe_vlm.data import build_batches

    batches = build_batches(spec, 0, 1)
    return {
        "batches": [
            {
                **asdict(batch.stats),
                "input_ids": batch.input_ids.tolist(),
                "shape": list(batch.input_ids.shape),
            }
            for batch in (next(batches), next(batches))
        ]
    }


def observe_steps(spec: RunSpec) -> dict[str, Any]:
    """The Trainer as the engine builds it (its record section, the optimizer's settings, a
    checksum of the initial parameters) and its first two steps, on one gloo rank."""
    import torch
    from torch.distributed.tensor import DTensor

    from moe_vlm.engines.torch_engine import Trainer

    with _one_rank_group():
        trainer = Trainer(spec, torch.device("cpu"), 0, 1, timing=False)
        optimizer = {k: v for k, v in trainer.optimizer.param_groups[0].items() if k != "params"}
        # fully_shard made every parameter a DTensor; on one rank its local shard is all of it
        shards = [cast(DTensor, p.detach()).to_local() for p in trainer.model.parameters()]
        checksum = float(sum(float(shard.double().sum()) for shard in shards))
        steps = [trainer.step(step) for step in (1, 2)]
        return {
            "engine": trainer.describe(),
            "optimizer": {k: v for k, v in optimizer.items() if isinstance(v, int | float | bool | tuple)},
            "checksum": checksum,
            "steps": [{name: getattr(line, name, None) for name in _STEP_FIELDS} for line in steps],
        }


def observe_run(spec: RunSpec) -> dict[str, Any]:
    """What a tiny real run of the engine's own launch recorded: run.json's torch_engine section,
    the deterministic fields of every steps.jsonl line, the run directory's files; or its refusal."""
    from moe_vlm.base.files import RUN_JSON, STEPS_JSONL
    from moe_vlm.engines import torch_engine
    from moe_vlm.record.records import read_steps

    with tempfile.TemporaryDirectory() as tmp, _one_torchrun_rank():
        run_dir = Path(tmp)
        try:
            torch_engine.launch(spec, {}, run_dir)
        except Exception as exc:  # the refusal is the observation (TORCH_READ_BY_REFUSAL)
            return {"refused": f"{type(exc).__name__}: {exc}"}
        record = json.loads((run_dir / RUN_JSON).read_text())
        lines = read_steps(run_dir / STEPS_JSONL)
        files = sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*") if p.is_file())
        return {
            "engine": record.get("torch_engine"),
            "steps": [{name: getattr(line, name, None) for name in _STEP_FIELDS} for line in lines],
            "files": files,
        }


OBSERVE: dict[Level, Callable[[RunSpec], dict[str, Any]]] = {
    Level.loader: observe_loader,
    Level.steps: observe_steps,
    Level.run: observe_run,
}


def observe(spec: RunSpec, at: Level) -> dict[str, Any]:
    try:
        return OBSERVE[at](spec)
    except Exception as exc:  # a refusal is an observation too (TORCH_READ_BY_REFUSAL)
        return {"refused": f"{type(exc).__name__}: {exc}"}


@dataclass
class TorchChecker:
    """Observations cached per level and override list; a fresh checker sees the code as it is now."""

    _seen: dict[tuple[Level, tuple[str, ...]], dict[str, Any]] = field(default_factory=dict)

    def observation(self, at: Level, overrides: tuple[str, ...]) -> dict[str, Any]:
        if (at, overrides) not in self._seen:
            self._seen[at, overrides] = observe(compose_spec(list(overrides)), at)
        return self._seen[at, overrides]

    def pair(self, knob: str, accepted: tuple[Any, ...] | None = None) -> Pair:
        base = TORCH_DATA_BASE if level(knob) is Level.loader else TORCH_BASE
        context = (*base, *TORCH_CONTEXT.get(knob, ()))
        if accepted is not None:  # a knob honoured for some values: move between two of them
            first, second = [v for v in accepted if v is not None][:2]
            if base_type(SCHEMA_LEAVES[knob]) is list:  # a list knob accepts items
                first, second = [first], [second]
            return Pair(knob, (*context, knob_override(knob, first)), (*context, knob_override(knob, second)))
        return pair(knob, context, TORCH_CHANGED.get(knob))

    def problem(self, knob: str, accepted: tuple[Any, ...] | None = None) -> str | None:
        """None when what the torch engine builds changes with the knob; else what is wrong."""
        probe, at = self.pair(knob, accepted), level(knob)
        before, after = self.observation(at, probe.before), self.observation(at, probe.after)
        refused = [o["refused"] for o in (before, after) if "refused" in o]
        if knob in TORCH_READ_BY_REFUSAL:
            if not refused or before == after:
                return f"{knob}: expected the torch engine to refuse a value it reads; got {refused or 'two runs'}"
            return None
        if refused:
            return f"{knob}: the torch engine refused `{' '.join(probe.after)}`: {refused[0]}"
        if before == after:
            return (
                f"{knob} is declared Honoured on the torch engine, but its {at.name} records the same for "
                f"`{' '.join(probe.before)}` and with `{probe.after[-1]}`: no torch code reads it "
                "(engines/torch_engine.py, torch_model.py, data/)"
            )
        return None


def torch_unobservable(knob: str) -> str | None:
    """Why the checker cannot observe the knob here, else None: its tracker's package is missing,
    or the tracker is MLflow, whose store the run's records do not hold (the dev extra installs
    mlflow-skinny; tests/unit/test_mlflow_run.py reads the experiment, the run name and the store
    back from MLflow itself)."""
    import importlib.util

    packages = TRACKER_PACKAGES.get(knob, ())
    if "mlflow" in packages and importlib.util.find_spec("mlflow") is not None:
        return f"{knob} is read by MLflow into its store: tests/unit/test_mlflow_run.py reads it back"
    if not packages or any(importlib.util.find_spec(name) for name in packages):
        return None
    return f"{knob} is read only by {' or '.join(packages)}, not installed here"


# --- megatron ----------------------------------------------------------------------------------

# Each engine as a spec reaches it (dry_run: the Megatron engine is planned on this CPU machine).
MEGATRON_BASE = ("engine=megatron", "dry_run=true")
BRIDGE_HYBRIDEP = ("cluster=b200", "model=qwen3_vl_30b_a3b", "dispatcher=hybridep")
_REAL = ("data=real", "data.path=/nonexistent")
# What makes the Bridge rows that name a knob read it.
BRIDGE_CONTEXT: dict[str, tuple[str, ...]] = {
    "recompute.modules": ("recompute=selective",),
    "cuda_graph.scope": ("cuda_graph=te_moe",),
    # Qwen3-VL-MoE's provider turns sequence parallelism on whenever TP > 1; Qwen3.5's does not.
    "parallelism.sequence_parallel": ("model=qwen35_vl_35b_a3b", "tp=2"),
    # HybridEP's topology on a cluster whose NVLink domain is one node (MNNVL off unless asked).
    **{leaf: BRIDGE_HYBRIDEP for leaf in FIELD_MAP_GROUP_READS["dispatcher"][2:]},
    **{f"data.{name}": _REAL for name in ("min_pixels", "max_pixels")},
    "data.path": ("data=real",),
    "data.packing_buffer": ("data.packing=buffer",),
    **{f"model.vision_{name}": _REAL for name in ("patch_size", "spatial_merge_size", "temporal_patch_size")},
    "model.hf_model_id": _REAL,
    **{
        f"cuda_graph.{name}": ("cuda_graph.vision=true",)
        for name in ("vision_scope", "vision_max_seq_length")
    },
    # The window and ranks reach Bridge while a profiler runs; a tracker's fields while it is on.
    **{f"profiling.{name}": ("profiling=torch",) for name in ("steps", "ranks")},
    **{f"logger.{name}": ("logger=wandb",) for name in ("project", "run_name", "entity")},
    "logger.tracking_uri": ("logger=mlflow",),
}


def rows(knob: str) -> list[bridge_fields.FieldMap]:
    """The FIELD_MAP rows that read `knob`: named for it, its shortcut, or its group."""
    names = {knob, SHORTCUTS.get(knob, knob)}
    names |= {group for group, leaves in FIELD_MAP_GROUP_READS.items() if knob in leaves}
    return [row for row in bridge_fields.FIELD_MAP if row.knob in names]


def megatron_pair(knob: str) -> Pair:
    return pair(knob, (*MEGATRON_BASE, *BRIDGE_CONTEXT.get(knob, ())))


def read_back(cfg: Any, path: str) -> Any:
    """A field of a built ConfigContainer as a comparable value (a config object by its repr); a
    field the section's config class lacks (Energon's fields on the seeded dataset) reads as absent."""
    from moe_vlm.engines.megatron.config import get_field, normalise

    try:
        value = get_field(cfg, path)
    except AttributeError:
        return "(absent)"
    return (
        normalise(value)
        if isinstance(value, Enum | list | tuple | dict | str | int | float | bool | None)
        else repr(value)
    )


# Knobs the Megatron engine reads outside the ConfigContainer (support.MEGATRON, not FIELD_MAP):
# nodes x nproc is the world the engine's launch checks it was started with.
def _megatron_world(spec: RunSpec) -> Any:
    from moe_vlm.engines.megatron.launch import _distributed_env

    with _one_torchrun_rank():
        try:
            return _distributed_env(spec)
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"


MEGATRON_OUTSIDE_TABLE: dict[str, Callable[[RunSpec], Any] | None] = {
    "nodes": _megatron_world,
    "nproc": _megatron_world,
    # Read by the step writer of a running job (engines/megatron/recording.py): needs GPUs.
    "warmup_steps": None,
}
MEGATRON_OUTSIDE_BASE = ("engine=megatron", "dry_run=true", "nproc=1")


def megatron_outside_problem(knob: str) -> str | None:
    observe = MEGATRON_OUTSIDE_TABLE[knob]
    assert observe is not None, f"{knob}: not observable on this machine"
    probe = pair(knob, MEGATRON_OUTSIDE_BASE, TORCH_CHANGED.get(knob))
    before, after = observe(cached_spec(probe.before)), observe(cached_spec(probe.after))
    return None if before != after else f"{knob}: the Megatron engine's launch does the same for both values"


def megatron_problem(knob: str, build: Callable[[RunSpec], Any]) -> str | None:
    """None when a FIELD_MAP row names the knob and the ConfigContainer `build` returns for a spec
    (the recipe with the table applied) holds other values in those rows' fields when it changes."""
    found = rows(knob)
    if not found:
        return (
            f"{knob} is declared Honoured on the Megatron engine, but no bridge_fields.FIELD_MAP row "
            "names it: add the row (docs/adding-a-knob.md, step 5)"
        )
    probe = megatron_pair(knob)
    before, after = build(cached_spec(probe.before)), build(cached_spec(probe.after))
    fields = sorted({row.field for row in found})
    if all(read_back(before, f) == read_back(after, f) for f in fields):
        return (
            f"{knob}: the built ConfigContainer holds the same {fields} for `{probe.before[-1]}` and "
            f"`{probe.after[-1]}`: its FIELD_MAP rows do not carry it"
        )
    return None
