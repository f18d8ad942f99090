"""The real ConfigContainer: the Bridge recipe for model x cluster, built offline, with THE
table (moe_vlm/knobs/bridge_fields.py) applied and read back. Runs on CPU (tests/megatron)."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import enum
import functools
import importlib
import json
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moe_vlm.base.errors import EngineUnavailable
from moe_vlm.config.spec import RunSpec
from moe_vlm.engines.hf_config import hf_model_dir, is_local_checkpoint
from moe_vlm.engines.megatron.stack import PINNED, versions
from moe_vlm.knobs.bridge_fields import (
    BRIDGE_MOCK_DATASET,
    HYBRID_EP_ENV_NAMES,
    KEEP,
    PACKED_ENERGON_DATASET,
    SEEDED_DATASET,
    BridgeOverride,
    bridge_overrides,
)
from moe_vlm.knobs.bridge_recipe import Recipe, select_recipe
from moe_vlm.knobs.telemetry_fields import RUN_DIR


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

    AutoBridge.from_hf_pretrained = classmethod(from_local_dir)
    try:
        yield requested
    finally:
        AutoBridge.from_hf_pretrained = original


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
            f"the recipe table in moe_vlm/knobs/bridge_fields.py targets {PINNED['megatron-bridge']}."
        ) from None


def build_config(spec: RunSpec, workdir: Path, recipe: Recipe | None = None) -> BuiltConfig:
    """The real ConfigContainer: the recipe (select_recipe's unless given), built offline, with
    every table row applied."""
    recipe = recipe or select_recipe(spec)
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


# The recipe's ConfigContainer per (recipe, model), built once per process by config_from_base.
_BASES: dict[str, Any] = {}


def _base_key(recipe: Recipe, spec: RunSpec) -> str:
    """What a recipe function's output depends on: the function (it takes no arguments) and the HF
    config AutoBridge reads, which hf_model_dir writes from spec.model alone; a local checkpoint's
    config.json is named by its path and the time it was written."""
    model: dict[str, Any] = dataclasses.asdict(spec.model)
    if is_local_checkpoint(spec.model):
        model["config.json written ns"] = (
            (Path(spec.model.hf_model_id).expanduser() / "config.json").stat().st_mtime_ns
        )
    return json.dumps([recipe.module, recipe.function, model], sort_keys=True, default=str)


def config_from_base(spec: RunSpec, recipe: Recipe | None = None) -> Any:
    """build_config's ConfigContainer, field for field (tests/megatron/test_config_from_base.py
    compares every field on the fuzzer's points), at a fraction of the cost: the recipe function
    (most of it converting the HF config through AutoBridge, about 0.1 s) runs once per
    (recipe, model) in this process, and each point applies THE table to a deep copy of it
    (milliseconds). For the sweep's library checks, which read the configuration and nothing on disk:
    the HF config directory the base was built from is gone when this returns."""
    recipe = recipe or select_recipe(spec)
    if recipe is None:
        raise EngineUnavailable(
            f"model={spec.model.name} (arch {spec.model.arch}) has no Megatron Bridge recipe."
        )
    key = _base_key(recipe, spec)
    if key not in _BASES:
        with tempfile.TemporaryDirectory() as scratch, offline_hf(hf_model_dir(spec.model, Path(scratch))):
            _BASES[key] = recipe_function(recipe)()
    cfg = copy.deepcopy(_BASES[key])
    apply_overrides(cfg, spec)
    return cfg


def _parent_and_name(cfg: Any, path: str) -> tuple[Any, str]:
    *parents, name = path.split(".")
    node = cfg
    for part in parents:
        node = getattr(node, part)
    return node, name


@functools.cache
def _field_names(cls: type) -> frozenset[str]:
    # Per class, not per call: a sweep's library checks set about a hundred fields per point.
    return frozenset(f.name for f in dataclasses.fields(cls))


def _has_field(node: Any, name: str) -> bool:
    if dataclasses.is_dataclass(node):
        kind: type = type(node)
        return name in _field_names(kind)
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
            f"{versions()['megatron-bridge']} (fix the row in moe_vlm/knobs/bridge_fields.py)"
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
# Rows whose value names a Bridge recipe of the config at that path, resolved with Bridge's own
# lookup (mixed_precision: training/mixed_precision.py:445-461); rows of its fields apply after it.
NAMED_ROWS = ("mixed_precision",)
_FIRST = (*CLASS_ROWS, *NAMED_ROWS)


def named_config(path: str, name: str, spec: RunSpec | None = None) -> Any:
    """Bridge's `name` recipe for `path`; with `spec`, as the table's rows of its fields leave it."""
    from megatron.bridge.training.mixed_precision import get_mixed_precision_config

    assert path in NAMED_ROWS, path
    config = get_mixed_precision_config(name)
    for row in bridge_overrides(spec) if spec else ():
        if row.field.startswith(f"{path}.") and row.value is not KEEP:
            setattr(config, row.field.removeprefix(f"{path}."), row.value)
    return config


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
    if class_name == PACKED_ENERGON_DATASET:
        # Imported here: Energon and Bridge's Qwen-VL encoder, for data=real with buffer packing only.
        from moe_vlm.engines.megatron.energon_packing import PackedEnergonDatasetConfig

        return PackedEnergonDatasetConfig(
            path=spec.data.path,
            seq_length=spec.seq_length,
            micro_batch_size=spec.mbs,
            task_encoder=builders.QwenVLEnergonTaskEncoderConfig(hf_processor_path=processor),
            packing_buffer_size=spec.data.packing_buffer,
            packed_row_length=spec.packed_row_length,
        )
    if class_name == SEEDED_DATASET:
        # Imported here: torch and Megatron Bridge's dataset classes, for this recipe class only.
        from moe_vlm.engines.megatron.data import dataset_config

        return dataset_config(spec)
    if class_name == BRIDGE_MOCK_DATASET:
        # As the recipes' *_pretrain_mock_config build it (recipes/qwen_vl/h100/qwen3_vl.py:117-127);
        # a perf recipe already holds one, so this is for a recipe that does not.
        return builders.MockVLMSFTDatasetConfig(
            seq_length=spec.seq_length,
            hf_processor_path=processor,
            prompt="Describe this image.",
            num_workers=1,
            dataloader_type="single",
            data_sharding=True,
            pin_memory=True,
            persistent_workers=False,
            pad_to_max_length=True,
        )
    if class_name == "QwenVLEnergonTaskEncoderConfig":
        return builders.QwenVLEnergonTaskEncoderConfig(hf_processor_path=processor)
    raise ValueError(f"{path}: config class {class_name!r} is not one the engine builds")


def apply_overrides(cfg: Any, spec: RunSpec) -> list[BridgeOverride]:
    """Apply every row of THE table to `cfg`, dotted path by dotted path; returns the rows set."""
    overrides = bridge_overrides(spec)
    applied: list[BridgeOverride] = []
    # Class and named rows come first, outermost first: replacing a config object resets its fields.
    ordered = sorted(overrides, key=lambda o: _FIRST.index(o.field) if o.field in _FIRST else len(_FIRST))
    for row in ordered:
        if row.value is KEEP:
            continue
        if row.field in CLASS_ROWS:
            set_field(cfg, row.field, _config_object(cfg, row.field, row.value, spec))
        elif row.field in NAMED_ROWS:
            set_field(cfg, row.field, named_config(row.field, row.value))
        elif row.field == "env_vars":
            # The recipe's HybridEP variables go, but those the row KEEPs (its tuning) stay.
            env = {
                k: v
                for k, v in cfg.env_vars.items()
                if k not in HYBRID_EP_ENV_NAMES or row.value.get(k) is KEEP
            }
            cfg.env_vars = {**env, **{k: v for k, v in row.value.items() if v is not KEEP}}
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
        elif row.field in NAMED_ROWS:
            actual, wanted = get_field(cfg, row.field), named_config(row.field, row.value, spec)
        elif row.field == "env_vars":
            kept = {k for k, v in row.value.items() if v is KEEP}
            env = {k: str(v) for k, v in cfg.env_vars.items() if k in HYBRID_EP_ENV_NAMES and k not in kept}
            actual, wanted = env, normalise({k: v for k, v in row.value.items() if k not in kept})
        elif _section_missing(cfg, row.field) and row.value in (None, False):
            continue  # an optional section the recipe left out is off
        else:
            actual, wanted = normalise(get_field(cfg, row.field)), normalise(row.value)
        if actual != wanted:
            problems.append(f"{row.field} = {actual!r}, table wants {wanted!r} (knob {row.knob})")
    return problems


def place_in_run_dir(cfg: Any, spec: RunSpec, run_dir: Path) -> list[str]:
    """Point the table's run-directory paths (TensorBoard, the profiler trace's parent, W&B, the
    memory snapshot) at this run's directory; returns the fields set. Called just before Bridge
    runs: the plan, check_overrides and the effective record keep the RUN_DIR placeholder."""
    placed = []
    for row in bridge_overrides(spec):
        if isinstance(row.value, str) and RUN_DIR in row.value:
            set_field(cfg, row.field, row.value.replace(RUN_DIR, str(run_dir)))
            placed.append(row.field)
    return placed
