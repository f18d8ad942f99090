"""Bridge's perf recipes as knob settings: enumerate the installed library's recipe functions for
the in-scope models and read each one back into our knobs THROUGH THE TABLE (bridge_fields.FIELD_MAP).

There is no second table here. For each knob a recipe option sets, the candidates are the knob's
values (a config group's options, or the value its row's field holds in the recipe's
ConfigContainer); the one chosen is the one for which every table row of that knob holds the
recipe's own value (`check_overrides`, the engine's own read-back). What no candidate reproduces
is a difference from the library: it must be one of DELIBERATE (documented in docs/megatron.md),
or the generator fails.

Used by scripts/gen_recipes.py (writes conf/recipe/) and tests/megatron/test_recipes.py (every
in-scope function has an option, and no option has drifted from its function). Imports
megatron.bridge: only on a machine with the stack.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import importlib
import pkgutil
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from moe_vlm.config.compose import CONF_DIR, compose_config
from moe_vlm.config.schema import TrainConfig
from moe_vlm.config.spec import RunSpec, build_spec
from moe_vlm.engines.hf_config import hf_model_dir
from moe_vlm.engines.megatron.config import (
    apply_overrides,
    build_config,
    get_field,
    normalise,
    offline_hf,
    recipe_function,
)
from moe_vlm.engines.megatron.effective import ABSENT, leaves, plain, runtime_update
from moe_vlm.knobs.bridge_fields import FIELD_MAP, FieldMap
from moe_vlm.knobs.bridge_recipe import RECIPE_NAME, select_recipe
from moe_vlm.knobs.keep import KEEP

PERF_PACKAGE = "megatron.bridge.perf_recipes.qwen_vl"
# Issue 21's scope: these models, these GPUs (vr200 recipes exist too; we have no VR200 profile).
IN_SCOPE_MODELS = ("qwen3_vl_30b_a3b", "qwen3_vl_235b_a22b", "qwen35_vl_35b_a3b")
IN_SCOPE_GPUS = ("gb200", "gb300", "b200", "b300", "h100")


@dataclass(frozen=True)
class Deliberate:
    """A field where a recipe option deliberately runs something else than the function: why, and
    the one case it covers (library value, ours) -> bool, so that it can hide no other difference."""

    why: str
    applies: Callable[[Any, Any], bool] = lambda theirs, ours: True


def _both_off(theirs: Any, ours: Any) -> bool:
    return theirs is None and ours is False


# docs/megatron.md ("Reproducing a vendor recipe") lists the same, with these reasons.
DELIBERATE: dict[str, Deliberate] = {
    "checkpoint.load": Deliberate(
        "start from scratch: the recipes point it at ./nemo_experiments/default, which a benchmark on a "
        "fresh cluster does not have (checkpoint.save is None in both)"
    ),
    "validation.eval_iters": Deliberate("no evaluation inside the measured run"),
    "train.eval_iters": Deliberate("deprecated alias of validation.eval_iters (Bridge copies it over)"),
    "logger.log_throughput": Deliberate("Bridge's own TFLOP/s per step, recorded beside ours"),
    "logger.log_timers_to_tensorboard": Deliberate(
        "inert: no TensorBoard writer in either (the recipes set tensorboard_dir None, "
        "perf_recipes/_common.py:55); logger=tensorboard turns it on",
        lambda theirs, ours: ours is False,
    ),
    "dataset.hf_processor_path": Deliberate(
        "the recipes name the hub id; offline, the run builds the Qwen3-VL processor in its directory "
        "(moe_vlm/data/bridge_processor.py) and Bridge's own mock dataset loads it from there"
    ),
    "model.moe_flex_dispatcher_backend": Deliberate(
        "inert: MCore reads the flex backend only with moe_token_dispatcher_type=flex "
        "(megatron/core/transformer/transformer_config.py:1589-1610); the table writes None for the others",
        lambda theirs, ours: ours is None,
    ),
    "ddp.data_parallel_sharding_strategy": Deliberate(
        "inert: only Megatron FSDP reads it (training/config.py:1111); the table writes no_shard for 3D",
        lambda theirs, ours: ours == "no_shard",
    ),
    "comm_overlap.overlap_moe_expert_parallel_comm": Deliberate(
        "both off: CommOverlapConfig.setup starts from False and copies only values set "
        "(training/comm_overlap.py:438-439)",
        _both_off,
    ),
    "comm_overlap.delay_wgrad_compute": Deliberate("both off, as above", _both_off),
    "ddp.delay_wgrad_compute": Deliberate("both off, as above", _both_off),
    "model.use_te_rng_tracker": Deliberate(
        "the table ties the TE RNG tracker to cuda_graph, as _benchmark_common does (perf_recipes/"
        "_common.py:77-84); the recipes' post hooks change graphs after it ran and leave the tracker: "
        "Qwen3.5 on without graphs (_qwen35_vl_post), some Qwen3-VL off with graphs (_finalize_qwen3_vl). "
        "It changes only which RNG states dropout (0 here) and graph capture use; on-GPU effect unmeasured",
        lambda theirs, ours: isinstance(theirs, bool) and isinstance(ours, bool),
    ),
    "model.recompute_modules": Deliberate(
        "inert without recompute: MCore reads the list only with recompute_granularity=selective and fills "
        "None with core_attn (transformer_config.py); the table writes the recompute option's list",
        lambda theirs, ours: ours == [],
    ),
    "rng.te_rng_tracker": Deliberate(
        "as model.use_te_rng_tracker",
        lambda theirs, ours: isinstance(theirs, bool) and isinstance(ours, bool),
    ),
}


@dataclass(frozen=True)
class VendorRecipe:
    """One perf recipe function of the installed library, by name."""

    name: str  # the function without `_config`: what recipe=<name> takes
    module: str
    model: str
    gpu: str
    gpus: int
    precision: str

    @property
    def function(self) -> str:
        return f"{self.name}_config"

    def build(self) -> Callable[[], Any]:
        function: Callable[[], Any] = getattr(importlib.import_module(self.module), self.function)
        return function


def library_recipes() -> list[VendorRecipe]:
    """Every perf recipe function the installed Bridge ships for IN_SCOPE_MODELS on IN_SCOPE_GPUS."""
    package = importlib.import_module(PERF_PACKAGE)
    found: list[VendorRecipe] = []
    for gpu_pkg in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        if not gpu_pkg.ispkg or gpu_pkg.name not in IN_SCOPE_GPUS:
            continue
        gpu_module = importlib.import_module(f"{PERF_PACKAGE}.{gpu_pkg.name}")
        for family in sorted(pkgutil.iter_modules(gpu_module.__path__), key=lambda m: m.name):
            module_name = f"{PERF_PACKAGE}.{gpu_pkg.name}.{family.name}"
            module = importlib.import_module(module_name)
            for attr in sorted(vars(module)):
                if not attr.endswith("_config") or not callable(getattr(module, attr)):
                    continue
                match = RECIPE_NAME.match(attr.removesuffix("_config"))
                if match is None or match["model"] not in IN_SCOPE_MODELS or match["gpu"] != gpu_pkg.name:
                    continue
                if getattr(module, attr).__module__ != module_name:
                    continue  # imported from elsewhere, e.g. a shared helper
                found.append(
                    VendorRecipe(
                        match.string,
                        module_name,
                        match["model"],
                        match["gpu"],
                        int(match["gpus"]),
                        match["precision"],
                    )
                )
    return found


# --- reading a recipe back into knobs -----------------------------------------------------------

# The knobs a recipe option sets, in the order they are read back (the layout first: the dispatcher's
# HybridEP environment depends on EP). Config groups are searched over their options; the rest
# are scalars read from their row's field. Knobs no table row reads (nodes) come from the recipe's
# name; data is always Bridge's mock workload, the recipes' own.
GROUPS = (
    "parallelism",
    "dispatcher",
    "router",
    "recompute",
    "cuda_graph",
    "vision_freeze",
    "precision",
    "fusion",
    "overlap",
    "offload",
    "gc",
)
SCALARS = (
    "parallelism.tp",
    "parallelism.pp",
    "parallelism.vp",
    "parallelism.cp",
    "parallelism.ep",
    "parallelism.etp",
    "parallelism.sequence_parallel",
    "parallelism.first_stage_layers",
    "parallelism.last_stage_layers",
    "mbs",
    "gbs",
    "seq_length",
    "train_iters",
    "seed",
    "lr",
)
FIXED = {"engine": "megatron", "data": "bridge_mock"}
# Where a key's row is spelt differently in the table (the layout's shortcuts).
_TABLE_KNOB = {f"parallelism.{k}": k for k in ("tp", "pp", "vp", "cp", "ep", "etp")}


def _rows(knob: str) -> list[FieldMap]:
    name = _TABLE_KNOB.get(knob, knob)
    return [row for row in FIELD_MAP if row.knob == name or row.knob.startswith(f"{name}.")]


@dataclass
class Derived:
    """A recipe read back into knobs."""

    recipe: VendorRecipe
    groups: dict[str, str]  # group -> option
    values: dict[str, Any]  # dotted key -> value (scalars and group leaves no option gives)
    differences: dict[str, str] = field(default_factory=dict)  # table field -> problem (DELIBERATE only)

    def overrides(self) -> list[str]:
        """The same as command-line overrides (what compose_config takes)."""
        return [
            *(f"{g}={o}" for g, o in self.groups.items()),
            *(f"{k}={_text(v)}" for k, v in self.values.items()),
        ]


def _text(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ",".join(_text(v) for v in value) + "]"
    if value is None:
        return "null"
    return str(value).lower() if isinstance(value, bool) else str(value)


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def _with_option(conf: DictConfig, group: str, option: str) -> DictConfig:
    """`conf` with `group` set to `option` as Hydra composes it (the option's file over the schema)."""
    loaded = OmegaConf.load(CONF_DIR / group / f"{option}.yaml")
    assert isinstance(loaded, DictConfig)
    if "defaults" in loaded:
        raise ValueError(f"conf/{group}/{option}.yaml has a defaults list; compose it with Hydra instead")
    out = copy.deepcopy(conf)
    schema = OmegaConf.structured(type(OmegaConf.to_object(conf[group])))
    out[group] = OmegaConf.merge(schema, loaded)
    return out


def _spec(conf: DictConfig) -> RunSpec:
    train = OmegaConf.to_object(conf)
    assert isinstance(train, TrainConfig)
    return build_spec(train)


def _scalar_candidates(cfg: Any, rows: list[FieldMap]) -> list[Any]:

    values: list[Any] = []
    for row in rows:
        try:
            value = normalise(get_field(cfg, row.field))
        except AttributeError:
            continue
        values += [value] if value is not None else [1, 0, False]
    return list(dict.fromkeys(repr(v) for v in values if not isinstance(v, dict)).keys())


def _rows_hold(cfg: Any, conf: DictConfig, rows: list[FieldMap]) -> bool:
    """Every row of `rows` gives, for `conf`, the value its field holds in the recipe's `cfg`."""

    spec = _spec(conf)
    for row in rows:
        value = row.value(spec)
        if value is KEEP or isinstance(value, dict):
            continue
        try:
            if normalise(get_field(cfg, row.field)) != normalise(value):
                return False
        except AttributeError:
            continue
    return True


def _plain(value: Any) -> Any:
    if isinstance(value, DictConfig | ListConfig):
        return OmegaConf.to_container(value)
    return value.name if isinstance(value, enum.Enum) else value


def _set(conf: DictConfig, key: str, candidate: str) -> DictConfig | None:
    import ast

    out = copy.deepcopy(conf)
    try:
        OmegaConf.update(out, key, ast.literal_eval(candidate), merge=False)
        _spec(out)
    except Exception:
        return None
    return out


class _Judge:
    """How far the engine's config for a knob setting is from the recipe function's own, both after
    Bridge's runtime update: the number of fields that differ, deliberate ones aside."""

    def __init__(self, cfg: Any, conf: DictConfig) -> None:

        self.cfg = cfg
        self.theirs = _flat(runtime_update(cfg, _spec(conf), planned=True))

    def differences(self, conf: DictConfig) -> dict[str, tuple[Any, Any]]:

        spec = _spec(conf)
        ours_cfg = copy.deepcopy(self.cfg)
        apply_overrides(ours_cfg, spec)
        ours = _flat(runtime_update(ours_cfg, spec, planned=True))
        return {
            name: (self.theirs.get(name, ABSENT), ours.get(name, ABSENT))
            for name in dict.fromkeys([*self.theirs, *ours])
            if self.theirs.get(name, ABSENT) != ours.get(name, ABSENT)
        }

    def distance(self, conf: DictConfig) -> int:
        return sum(1 for n, (t, o) in self.differences(conf).items() if not deliberate(n, t, o))


def _best(judge: _Judge, candidates: list[tuple[Any, DictConfig]]) -> tuple[Any, DictConfig]:
    """The candidate nearest the library; ties go to the first (the current value, then in order)."""
    return min(candidates, key=lambda c: judge.distance(c[1]))


def derive(recipe: VendorRecipe, workdir: Path, cfg: Any | None = None) -> Derived:
    """`recipe` read back into knobs through the table; `cfg`: its ConfigContainer if already built."""
    import ast

    conf = compose_config(
        [f"model={recipe.model}", f"cluster={recipe.gpu}", *(f"{k}={v}" for k, v in FIXED.items())]
    )
    per_node = int(conf.cluster.gpus_per_node)
    if recipe.gpus % per_node:
        raise ValueError(f"{recipe.name}: {recipe.gpus} GPUs are not whole {recipe.gpu} nodes of {per_node}")
    conf.nodes = recipe.gpus // per_node
    if cfg is None:
        cfg = build_recipe(recipe, conf, workdir)
    judge = _Judge(cfg, conf)
    # The model, cluster and data as the recipe's name and its mock dataset say; the rest read back.
    groups: dict[str, str] = {"model": recipe.model, "cluster": recipe.gpu, "data": FIXED["data"]}
    values: dict[str, Any] = {}

    def candidates(key: str, rows: list[FieldMap]) -> list[str]:
        # The value the row's field holds before Bridge's update, then after it (MCore fills some).
        after = [repr(judge.theirs[r.field]) for r in rows if r.field in judge.theirs]
        return list(dict.fromkeys([*_scalar_candidates(cfg, rows), *after]))

    def scalar(conf: DictConfig, key: str, rows: list[FieldMap]) -> DictConfig:
        if _rows_hold(cfg, conf, rows):
            return conf  # the table already gives the recipe's values: nothing to judge
        options: list[tuple[Any, DictConfig]] = [(OmegaConf.select(conf, key), conf)]
        for text in candidates(key, rows):
            changed = _set(conf, key, text)
            if changed is not None:
                options.append((ast.literal_eval(text), changed))
        value, chosen = _best(judge, options)
        if chosen is not conf:
            values[key] = value
        return chosen

    def group(conf: DictConfig, name: str) -> DictConfig:
        rows = _rows(name)
        default = str(conf[name].get("name", ""))
        ordered = sorted(_options(name), key=lambda o: (o != default, o))
        options = [(o, _with_option(conf, name, o)) for o in ordered]
        # An option whose rows all give the recipe's values is taken as it is; else the nearest.
        holding = [(o, c) for o, c in options if _rows_hold(cfg, c, rows)]
        groups[name], conf = holding[0] if len(holding) == 1 else _best(judge, holding or options)
        # Leaves the chosen option does not give: each set to the value its row's field holds.
        for knob in dict.fromkeys(r.knob for r in rows if "." in r.knob):
            conf = scalar(conf, knob, [r for r in rows if r.knob == knob])
        return conf

    # The family first (its option file resets the layout), then the layout's knobs, which depend on
    # each other (VP needs PP): all at the library's values, then each one judged on its own.
    conf = group(conf, GROUPS[0])
    for key in SCALARS:
        valid = [(t, c) for t in candidates(key, _rows(key)) if (c := _set(conf, key, t)) is not None]
        # The candidate the key's rows turn into the recipe's own field values (the table, read back).
        text, conf = next(
            ((t, c) for t, c in valid if _rows_hold(cfg, c, _rows(key))), valid[0] if valid else (None, conf)
        )
        if text is not None:
            values[key] = ast.literal_eval(text)
    for key in SCALARS:
        conf = scalar(conf, key, _rows(key))
    for name in GROUPS[1:]:
        conf = group(conf, name)
    values = {key: _plain(OmegaConf.select(conf, key)) for key in values}
    derived = Derived(recipe, groups, {"engine": FIXED["engine"], "nodes": int(conf.nodes), **values})
    differences = judge.differences(conf)
    derived.differences = {n: f"library {t!r}, ours {o!r}" for n, (t, o) in differences.items()}
    unexplained = {n: p for n, p in derived.differences.items() if not deliberate(n, *differences[n])}
    if unexplained:
        raise ValueError(
            f"{recipe.name}: no knob setting reproduces "
            + "; ".join(f"{f}: {p}" for f, p in unexplained.items())
        )
    return derived


def deliberate(name: str, theirs: Any, ours: Any) -> str | None:
    """Why `name` (a dotted effective field) deliberately differs from the library, else None."""
    entry = DELIBERATE.get(name)
    return entry.why if entry is not None and entry.applies(theirs, ours) else None


def _flat(update: Any) -> dict[str, Any]:

    cfg = update.config
    out: dict[str, Any] = {f"env_vars.{k}": plain(v) for k, v in sorted(update.env.items())}
    for f in dataclasses.fields(cfg):
        if f.name.startswith("_") or f.name == "env_vars":
            continue
        for key, value in leaves(getattr(cfg, f.name, None)).items():
            out[f"{f.name}.{key}" if key else f.name] = value
    if update.error:
        out["<runtime update>"] = update.error
    return out


def build_recipe(recipe: VendorRecipe, conf: DictConfig, workdir: Path) -> Any:
    """The recipe function's own ConfigContainer, built offline (its hub id reads our materialised config)."""
    model = _spec(conf).model
    with warnings.catch_warnings(), offline_hf(hf_model_dir(model, workdir)):
        warnings.simplefilter("ignore")
        return recipe.build()()


def compare(spec: RunSpec, workdir: Path) -> dict[str, tuple[Any, Any]]:
    """What `recipe=<name>` plans, against the function itself: the engine's ConfigContainer for `spec`
    (build_config: the function, then THE table) and the function's own, both after Bridge's runtime
    update as one rank of the job: field -> (library, ours), for every field that differs."""

    recipe = select_recipe(spec)
    assert recipe is not None and spec.recipe.name != "none", "compare needs recipe=<name>"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours = _flat(runtime_update(build_config(spec, workdir).cfg, spec, planned=True))
        with offline_hf(hf_model_dir(spec.model, workdir)):
            theirs = _flat(runtime_update(recipe_function(recipe)(), spec, planned=True))
    return {
        name: (theirs.get(name, ABSENT), ours.get(name, ABSENT))
        for name in dict.fromkeys([*theirs, *ours])
        if theirs.get(name, ABSENT) != ours.get(name, ABSENT)
    }


def derive_all(workdir: Path) -> Iterator[Derived]:
    for recipe in library_recipes():
        yield derive(recipe, workdir)
