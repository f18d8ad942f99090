"""The effective configuration: Bridge's ConfigContainer as its own runtime update leaves it, as
the fields that differ from the library's defaults, grouped by section.

THE table (bridge_fields.FIELD_MAP) says what the engine sets; this says what Bridge then runs
with: the recipe's own tuning (fusions, router, overlaps, precision, environment), what
``runtime_config_update`` derives from it (megatron/bridge/training/config.py:1853-1888: the
recipe's env_vars by setdefault, mixed precision, comm-overlap setup, then ``validate()``, which
finalises the model and the other sections), all of it. The update runs on a copy, so the engine's
config is untouched, and the process environment is restored afterwards.

Planned (``dry_run=true``), it runs on CPU as one rank of the job would on the cluster: the world
size from the layout, the GPU the cluster profile declares answering Bridge's device query
(flex-dispatcher check), the recipe's env_vars not shadowed by this shell's. In a run it uses the
rank's real environment and device, so a variable the launcher set shows with its value.

`dry_run=true` prints it (moe_vlm/run/plan.py), the Megatron engine records it in run.json
(``bridge.effective``), and ``moe-vlm report --diff`` sets two runs' side by side.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import enum
import functools
import io
import logging
import math
import os
import tempfile
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from moe_vlm.config.spec import RunSpec
from moe_vlm.engines.megatron.config import CLASS_ROWS, NAMED_ROWS, build_config, get_field
from moe_vlm.knobs.bridge_fields import FIELD_MAP, RESOLVED_FIELDS
from moe_vlm.knobs.bridge_recipe import Recipe, RecipeKind, family_recipes
from moe_vlm.knobs.telemetry_fields import RUN_DIR  # this run's directory in values

# The sections the issue names first (what a performance engineer reads first), then every other
# ConfigContainer section in declaration order.
LEADING_SECTIONS = ("model", "ddp", "optimizer", "comm_overlap", "mixed_precision", "scheduler", "env_vars")
EFFECTIVE_JSON = "bridge_effective.json"  # in the run directory, written before pretrain starts
NO_DEFAULT = "<required>"  # a field the library gives no default
ABSENT = "<absent>"  # a nested key one side lacks
NOT_A_FIELD = "<not a field>"  # an attribute the recipe set that the section's class does not declare
_DEPTH = 4  # nested configs deeper than this print as their class name


@dataclass
class Effective:
    """section -> dotted field -> value (JSON-safe), for the fields that differ from the defaults."""

    sections: dict[str, dict[str, Any]]
    defaults: dict[str, dict[str, Any]] = field(default_factory=dict)  # the library's, same keys
    error: str | None = None  # Bridge's runtime update rejected the config (then: the values before it)
    # env_vars names this process already had: setdefault kept its value, not the recipe's
    env_from_process: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # what Bridge printed or logged while updating
    # Each bridge_fields.FIELD_MAP field as the run gets it, at the library default or not (the plan's
    # tuning block shows what a null "the recipe's" knob resolves to)
    table: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """Every field, JSON-safe (the plan cache, moe_vlm/engines/megatron/plan_cache.py)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, payload: dict[str, Any]) -> Effective:
        return cls(**payload)

    def to_record(self) -> dict[str, Any]:
        """run.json's ``bridge.effective``."""
        return {
            "sections": self.sections,
            "error": self.error,
            "env_from_process": self.env_from_process,
            "notes": self.notes,
        }

    def flat(self) -> dict[str, Any]:
        """section.field -> value."""
        return {
            _dotted(s, name): value for s, fields in self.sections.items() for name, value in fields.items()
        }

    def lines(self) -> list[str]:
        out = []
        if self.error:
            out.append(f"Bridge's runtime update REJECTS this config: {self.error}")
            out.append("(values below: the config before the update)")
        out += [f"Bridge: {note}" for note in self.notes]
        for section, fields in self.sections.items():
            out.append(f"{section}: {len(fields)} field(s)")
            defaults = self.defaults.get(section, {})
            for name, value in fields.items():
                default = defaults.get(name)
                library = "" if section == "env_vars" else f"   (library: {show(default)})"
                launcher = " (this process's, not the recipe's)" if name in self.env_from_process else ""
                out.append(f"  {name:<48} = {show(value)}{library}{launcher}")
        return out


def _dotted(section: str, name: str) -> str:
    return f"{section}.{name}" if name else section


def show(value: Any) -> str:
    text = repr(value) if value == "" else str(value)
    return text if len(text) <= 100 else text[:97] + "..."


# --- values -----------------------------------------------------------------------------------


def _name(obj: Any) -> str:
    module = getattr(obj, "__module__", None) or ""
    qualname = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None) or type(obj).__name__
    return f"{module}.{qualname}" if module and module != "builtins" else str(qualname)


def plain(value: Any, run_dir: str | None = None) -> Any:
    """A JSON-safe value that names the same thing in every process: enums by name, callables by
    qualified name (not their address), dtypes as torch spells them, this run's directory as RUN_DIR."""
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, str):
        return value.replace(run_dir, RUN_DIR) if run_dir else value
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, Path):
        return plain(str(value), run_dir)
    if isinstance(value, list | tuple | set | frozenset):
        items = sorted(value, key=str) if isinstance(value, set | frozenset) else value
        return [plain(item, run_dir) for item in items]
    if isinstance(value, dict):
        return {str(k): plain(v, run_dir) for k, v in value.items()}
    if isinstance(value, functools.partial):
        args = [plain(a, run_dir) for a in value.args]
        kwargs = [f"{k}={plain(v, run_dir)}" for k, v in value.keywords.items()]
        return f"partial({', '.join([_name(value.func), *map(str, args), *kwargs])})"
    if callable(value):
        return _name(value)
    if type(value).__module__ == "torch" and type(value).__name__ == "dtype":
        return str(value)
    return f"<{_name(type(value))}>"


def _hf_config(value: Any) -> bool:
    return hasattr(value, "to_diff_dict") and hasattr(value, "model_type")


def leaves(value: Any, run_dir: str | None = None, depth: int = 0) -> dict[str, Any]:
    """A nested config as dotted leaves ("" for a value that is a leaf itself).

    Config objects (dataclasses, transformers configs) open up, so a diff names the one nested field
    that changed; a transformers config shows only what differs from its class's defaults.
    """
    if depth < _DEPTH and _hf_config(value):  # transformers 5 configs are dataclasses too
        return {k: plain(v, run_dir) for k, v in sorted(value.to_diff_dict().items())}
    if depth < _DEPTH and dataclasses.is_dataclass(value) and not isinstance(value, type):
        out: dict[str, Any] = {}
        for f in dataclasses.fields(value):
            if not f.name.startswith("_"):
                for key, leaf in leaves(getattr(value, f.name, None), run_dir, depth + 1).items():
                    out[f"{f.name}.{key}" if key else f.name] = leaf
        return out
    return {"": plain(value, run_dir)}


def _default_of(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        try:
            return f.default_factory()
        except Exception:  # a factory that needs the runtime (a process group): no usable default
            return NO_DEFAULT
    return NO_DEFAULT


def section_diff(
    obj: Any, default_obj: Any = None, run_dir: str | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(values, library defaults) of the dotted fields of `obj` that differ from its class's defaults.

    `default_obj`: the section's value when the container's default is not an object (None), e.g. a
    recipe's comm_overlap against ConfigContainer's comm_overlap=None.
    """
    values: dict[str, Any] = {}
    defaults: dict[str, Any] = {}
    if obj is None:
        return values, defaults
    if not dataclasses.is_dataclass(obj):
        return (
            ({"": plain(obj, run_dir)}, {"": plain(default_obj, run_dir)}) if obj != default_obj else ({}, {})
        )
    declared = {f.name for f in dataclasses.fields(obj)}
    for f in dataclasses.fields(obj):
        if f.name.startswith("_"):
            continue
        now = leaves(getattr(obj, f.name, None), run_dir)
        default = _default_of(f)
        then = {"": NO_DEFAULT} if default is NO_DEFAULT else leaves(default, run_dir)
        if "" in now:  # a plain value now: compare it whole
            value, library = now[""], then.get("", then)
            if value != library:
                values[f.name], defaults[f.name] = value, library
            continue
        for key in dict.fromkeys([*now, *then]):
            if not key:
                continue  # the library's plain value (None) is compared field by field below
            # A config object where the library has a plain value (None): each of its fields differs.
            value, library = now.get(key, ABSENT), then.get("", then.get(key, ABSENT))
            if value != library:
                values[f"{f.name}.{key}"], defaults[f"{f.name}.{key}"] = value, library
    # Attributes a recipe set that the class does not declare (nothing in the library reads them).
    for name, value in sorted(vars(obj).items()):
        if name not in declared and not name.startswith("_"):
            values[name], defaults[name] = plain(value, run_dir), NOT_A_FIELD
    return values, defaults


def diff_against_defaults(cfg: Any, env: Mapping[str, str], run_dir: str | None = None) -> Effective:
    """Every section of a ConfigContainer, as the fields that differ from the library's defaults."""
    container_fields = {f.name: f for f in dataclasses.fields(cfg) if not f.name.startswith("_")}
    order = [*LEADING_SECTIONS, *(name for name in container_fields if name not in LEADING_SECTIONS)]
    sections: dict[str, dict[str, Any]] = {}
    defaults: dict[str, dict[str, Any]] = {}
    for name in order:
        if name == "env_vars":
            values = {key: plain(env.get(key, value), run_dir) for key, value in sorted(cfg.env_vars.items())}
            sections[name], defaults[name] = values, {}
            continue
        obj = getattr(cfg, name, None)
        if obj is None:
            default = _default_of(container_fields[name])
            if default is not None and default is not NO_DEFAULT:
                sections[name], defaults[name] = {"": None}, {"": f"<{_name(type(default))}>"}  # switched off
            continue
        values, library = section_diff(obj, run_dir=run_dir)
        if values:
            sections[name], defaults[name] = values, library
    return Effective(sections, defaults)


# --- Bridge's runtime update, on a copy -------------------------------------------------------


@contextlib.contextmanager
def rank_environment(spec: RunSpec, env_names: set[str], planned: bool) -> Iterator[None]:
    """The process environment Bridge's runtime update reads, restored afterwards.

    Planned: one rank of this job on the cluster (WORLD_SIZE, RANK; the cluster's GPU answers
    torch.cuda.get_device_properties), with the recipe's env_vars unset here so theirs apply.
    """
    import torch

    saved = dict(os.environ)
    query, capability_query = torch.cuda.get_device_properties, torch.cuda.get_device_capability
    try:
        if planned:
            for name in env_names:
                os.environ.pop(name, None)
            os.environ.update(WORLD_SIZE=str(spec.layout.world_size), RANK="0", LOCAL_RANK="0")
            capability = spec.cluster.compute_capability
            device = SimpleNamespace(
                name=spec.cluster.gpu, major=int(capability), minor=round(capability % 1 * 10)
            )
            torch.cuda.get_device_properties = lambda *_args, **_kwargs: device  # type: ignore[assignment]
            torch.cuda.get_device_capability = lambda *_args, **_kwargs: (device.major, device.minor)
        yield
    finally:
        torch.cuda.get_device_properties = query
        torch.cuda.get_device_capability = capability_query
        # Only what changed is put back: clearing and refilling the whole environment costs a
        # putenv per variable, twice per point of a sweep's library checks.
        for name in [name for name in os.environ if name not in saved]:
            del os.environ[name]
        for name, value in saved.items():
            if os.environ.get(name) != value:
                os.environ[name] = value


class _Notes(logging.Handler):
    def __init__(self, notes: list[str]) -> None:
        super().__init__(logging.INFO)
        self.notes = notes

    def emit(self, record: logging.LogRecord) -> None:
        self.notes.append(record.getMessage())


@contextlib.contextmanager
def _captured() -> Iterator[list[str]]:
    """What Bridge prints (print_rank_0) and logs while updating, as notes instead of output:
    why a value changed ("Disabling tensor parallel communication overlap due to TP size < 2")."""
    notes: list[str] = []
    handler = _Notes(notes)
    root = logging.getLogger()
    stdout = io.StringIO()
    handlers, root.handlers = root.handlers, [handler]
    try:
        with contextlib.redirect_stdout(stdout), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # deprecation notes; the values say what happened
            yield notes
    finally:
        root.handlers = handlers
        notes.extend(line.strip() for line in stdout.getvalue().splitlines() if line.strip())


@dataclass
class Update:
    """Bridge's runtime update run on a copy of a config."""

    config: Any  # the updated copy; on a refusal, a copy of the config before the update
    exception: Exception | None  # what the library raised (None: accepted)
    notes: list[str]
    env: dict[str, str]  # the recipe's env_vars as the process then had them

    @property
    def error(self) -> str | None:
        return None if self.exception is None else f"{type(self.exception).__name__}: {self.exception}"


def runtime_update(cfg: Any, spec: RunSpec, *, planned: bool, in_place: bool = False) -> Update:
    """``runtime_config_update`` on a copy of `cfg`, as one rank of the job (planned: here, see
    `rank_environment`); a refusal is returned, not raised (moe_vlm/engines/megatron/library_checks.py
    reads it too). in_place: on `cfg` itself, for a caller that owns it and reads only the
    exception of a refused update (the config is then left part-updated): one deep copy less."""
    from megatron.bridge.training.config import runtime_config_update

    updated = cfg if in_place else copy.deepcopy(cfg)
    recipe_env = {name: str(value) for name, value in cfg.env_vars.items()}
    error = None
    with rank_environment(spec, set(recipe_env), planned), _captured() as notes:
        try:
            runtime_config_update(updated)
        except Exception as exc:  # the library's own check: reported, not raised, in a plan
            error = exc
            if not in_place:
                updated = copy.deepcopy(cfg)
        env = {name: os.environ.get(name, value) for name, value in recipe_env.items()}
    return Update(updated, error, notes, env)


def effective_config(cfg: Any, spec: RunSpec, run_dir: Path | None = None, *, planned: bool) -> Effective:
    """Bridge's runtime update applied to a copy of `cfg` (the engine's, after THE table), diffed
    against the library's defaults. A config the update rejects yields the error and the values
    before the update, so the plan can print both."""
    names = set(cfg.env_vars)
    own = {name: os.environ[name] for name in names if name in os.environ} if not planned else {}
    update = runtime_update(cfg, spec, planned=planned)
    result = diff_against_defaults(update.config, update.env, str(run_dir) if run_dir else None)
    result.error = update.error
    result.notes = update.notes
    result.env_from_process = {name: value for name, value in own.items() if value != str(cfg.env_vars[name])}
    result.table = table_values(update.config, str(run_dir) if run_dir else None)
    return with_vision(result, update.config.model, str(run_dir) if run_dir else None)


# --- the vision model's own TransformerConfig ---------------------------------------------------

# Not a ConfigContainer section: the TransformerConfig Qwen3VLModel builds for its vision tower
# inside provide() (megatron/bridge/models/qwen_vl/modelling_qwen3_vl/model.py:313-317, from
# get_vision_model_config, modelling_qwen3_vl/transformer_config.py:63-158). It copies the
# decoder's recompute, TP size and CUDA-graph settings, takes its graph impl from
# vision_cuda_graph_impl, and sets neither fp8 nor fp4, so the ViT and mergers run BF16 under an
# FP8/FP4 decoder (moe_vlm.perf.peaks.BF16_MODULES holds them to the BF16 peak for that reason).
VISION_SECTION = "vision_model"
# Shown whatever their value: the ViT's precision, CUDA graphs and recompute.
VISION_FIELDS = (
    "fp8", "fp8_recipe", "fp4", "fp4_recipe", "bf16", "params_dtype",
    "cuda_graph_impl", "cuda_graph_modules", "cuda_graph_scope", "enable_cuda_graph",
    "external_cuda_graph", "cuda_graph_warmup_steps", "max_vision_cuda_graph_seq_length",
    "recompute_granularity", "recompute_method", "recompute_num_layers", "recompute_modules",
    "tensor_model_parallel_size", "sequence_parallel", "num_layers", "hidden_size",
)  # fmt: skip
# `precision`: what the ViT's GEMMs run in, derived (no single field says it): the vision config's
# own fp8/fp4, else the whole model's 16-bit format, to which Megatron's Float16Module casts every
# parameter, the vision tower's included (megatron/core/transformer/module.py:448-464).
DERIVED = "<derived>"


def vision_config(model: Any) -> Any | None:
    """The vision TransformerConfig provide() builds from this model provider, as model.py:313-317
    builds it (None for a model without a vision tower)."""
    hf_vision = getattr(model, "vision_config", None)
    if hf_vision is None:
        return None
    from megatron.bridge.models.qwen_vl.modelling_qwen3_vl.transformer_config import get_vision_model_config

    config = get_vision_model_config(hf_vision, megatron_config=model)
    config.pipeline_model_parallel_size = 1
    config.first_pipeline_num_layers = None
    return config


def vision_precision(vision: Any, model: Any) -> str:
    if getattr(vision, "fp8", None):
        return "fp8"
    if getattr(vision, "fp4", None):
        return "fp4"
    return "bf16" if getattr(model, "bf16", False) else "fp16" if getattr(model, "fp16", False) else "fp32"


def vision_section(model: Any, run_dir: str | None = None) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """(values, library defaults) of the vision TransformerConfig: VISION_FIELDS always, then every
    other field that differs from Qwen3VLTransformerConfig's defaults."""
    vision = vision_config(model)
    if vision is None:
        return None
    values, defaults = section_diff(vision, run_dir=run_dir)
    by_name = {f.name: f for f in dataclasses.fields(vision)}
    shown: dict[str, Any] = {"precision": vision_precision(vision, model)}
    shown_defaults: dict[str, Any] = {"precision": DERIVED}
    for name in VISION_FIELDS:
        if name in by_name:
            shown[name] = plain(getattr(vision, name), run_dir)
            shown_defaults[name] = plain(_default_of(by_name[name]), run_dir)
    rest = {k: v for k, v in values.items() if k.split(".")[0] not in shown}
    return shown | rest, shown_defaults | {k: defaults[k] for k in rest}


def with_vision(result: Effective, model: Any, run_dir: str | None = None) -> Effective:
    """`result` with the vision section last (Bridge's update ran on `model`)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # deprecation notes, as in _captured
            section = vision_section(model, run_dir)
    except Exception as exc:  # the library's own check on the vision config: reported, not raised
        result.notes.append(f"vision TransformerConfig not built: {type(exc).__name__}: {exc}")
        return result
    if section is not None:
        result.sections[VISION_SECTION], result.defaults[VISION_SECTION] = section
    return result


def table_values(cfg: Any, run_dir: str | None = None) -> dict[str, Any]:
    """Every plain FIELD_MAP field of `cfg` (class, named-recipe and env rows aside) and the fields the
    runtime update carries them on to (RESOLVED_FIELDS), JSON-safe."""
    skip = {*CLASS_ROWS, *NAMED_ROWS, "env_vars"}
    fields = [row.field for row in FIELD_MAP if row.field not in skip]
    out: dict[str, Any] = {}
    for name in [*fields, *(f for resolved in RESOLVED_FIELDS.values() for f in resolved)]:
        with contextlib.suppress(AttributeError):  # a field of the other dataset/provider class
            out[name] = plain(get_field(cfg, name), run_dir)
    return out


# --- side by side -----------------------------------------------------------------------------


def differing(columns: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Dotted names whose values are not the same in every flat effective config (absent counts)."""
    keys = list(dict.fromkeys(k for flat in columns.values() for k in flat))
    return [k for k in keys if len({repr(flat.get(k, ABSENT)) for flat in columns.values()}) > 1]


def side_by_side(columns: Mapping[str, Mapping[str, Any]], width: int = 28) -> list[str]:
    """One line per differing field: its name, then its value in each column ("-": absent)."""
    names = differing(columns)
    if not names:
        return ["(no differences)"]
    name_width = max(len(n) for n in names)

    def cell(value: Any) -> str:
        text = show(value)
        return text if len(text) <= width else text[: width - 3] + "..."

    lines = [f"{'field':<{name_width}}  " + "  ".join(f"{label:<{width}}" for label in columns).rstrip()]
    for name in names:
        cells = [cell(flat.get(name, "-")) for flat in columns.values()]
        lines.append(f"{name:<{name_width}}  " + "  ".join(f"{c:<{width}}" for c in cells).rstrip())
    return lines


# --- the plan ---------------------------------------------------------------------------------


@dataclass
class Planned:
    """This point's effective configuration on its recipe, and on every perf recipe of its family."""

    recipe: Recipe
    effective: Effective
    family: dict[str, Effective]  # GPU -> this point on that GPU's perf recipe (its own first)

    def to_json(self) -> dict[str, Any]:
        """JSON-safe, in order (the plan cache)."""
        return {
            "recipe": {**dataclasses.asdict(self.recipe), "kind": self.recipe.kind.value},
            "effective": self.effective.to_json(),
            "family": {gpu: e.to_json() for gpu, e in self.family.items()},
        }

    @classmethod
    def from_json(cls, payload: dict[str, Any]) -> Planned:
        recipe = payload["recipe"]
        return cls(
            Recipe(**{**recipe, "kind": RecipeKind(recipe["kind"])}),
            Effective.from_json(payload["effective"]),
            {gpu: Effective.from_json(e) for gpu, e in payload["family"].items()},
        )

    def family_lines(self) -> list[str]:
        """What remains different across the family: the recipes' own tuning, for these knobs."""
        columns = {
            f"{gpu}{' (this run)' if gpu == self.recipe.gpu else ''}": e.flat()
            for gpu, e in self.family.items()
        }
        names = differing(columns)
        head = (
            f"{len(names)} field(s) differ between the family's perf recipes for this point's knobs "
            "(the tuning each recipe keeps; the table sets the rest alike):"
            if names
            else "none: every perf recipe of the family gives this point the same effective configuration"
        )
        return [head, *(side_by_side(columns) if names else [])]


def plan_effective(spec: RunSpec) -> Planned:
    """Build this point's ConfigContainer on each perf recipe of its family, offline in a scratch
    directory, and run Bridge's runtime update on each as a rank on the cluster would (seconds)."""
    recipes = family_recipes(spec)
    family: dict[str, Effective] = {}
    with tempfile.TemporaryDirectory() as scratch:
        for recipe in recipes:
            built = build_config(spec, Path(scratch), recipe)
            family[recipe.gpu] = effective_config(built.cfg, spec, Path(scratch), planned=True)
    own = recipes[0]
    return Planned(own, family[own.gpu], family)
