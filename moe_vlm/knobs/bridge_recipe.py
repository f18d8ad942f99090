"""Which Bridge recipe function a run's ConfigContainer starts from (select_recipe): the perf
recipe recipe=<name> names, the model's perf recipe for its GPU, or a stand-in on another GPU.
The knob -> field table that then overrides it is knobs/bridge_fields.py."""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from moe_vlm.config.arch import PROFILES
from moe_vlm.config.schema import ClusterConfig
from moe_vlm.config.spec import RunSpec


class RecipeKind(StrEnum):
    perf = "perf"  # this cluster's own perf recipe for the model
    stand_in = "stand-in"  # another GPU's perf recipe of the model (this cluster has none)
    template = "template"  # a perf recipe of the architecture's template model (the model has none)
    named = "vendor"  # the perf recipe function recipe=<name> names, whatever the cluster


@dataclass(frozen=True)
class Recipe:
    module: str
    function: str
    kind: RecipeKind
    family: str  # one per model, whatever the cluster: cross-GPU runs differ in hardware, not recipe
    model: str  # whose recipe: the run's model, or its architecture's template model
    gpu: str  # whose perf recipe it is: the cluster's own, or the stand-in's
    note: str = ""

    @property
    def name(self) -> str:
        return f"{self.module}.{self.function}"


# megatron-bridge 0.6.2 ships the flat perf recipes in the package (perf_recipes/qwen_vl/<gpu>/
# <family>.py), GPUs x bf16 per model below; the family and the template model of each
# architecture are in its profile (moe_vlm/config/arch.py). B300 has only Qwen3.5-VL recipes
# (perf_recipes/qwen_vl/b300/ has no qwen3_vl.py); H200 has none.
_PERF_GPUS = {
    "qwen3_vl_30b_a3b": {"gb200": 8, "b200": 8, "h100": 16, "gb300": 8},
    "qwen3_vl_235b_a22b": {"gb200": 64, "b200": 64, "h100": 256, "gb300": 64},
    "qwen35_vl_35b_a3b": {"gb200": 8, "b200": 8, "h100": 16, "gb300": 8, "b300": 8},
}
# A cluster without a perf recipe runs another GPU's perf recipe of the same model, never the
# general recipe, which differs from every perf recipe in fusions, router, gradient-reduce
# precision, NaN checks, tokenizer, LR schedule and TP overlap (a cross-GPU comparison would mix
# recipe with hardware). The stand-in is of the same GPU generation (compute capability major):
# H200 -> H100; B300 -> B200 (8-GPU NVLink nodes, like B300). Others (cluster=local): H100's.
_STAND_INS = {9: ("h100",), 10: ("b200", "gb200", "gb300")}
_DEFAULT_STAND_INS = ("h100", "b200")


def _perf_recipe(model: str, cluster: ClusterConfig) -> tuple[str, int]:
    """The perf recipe GPU for `model` on `cluster` (its own, else a stand-in) and its GPU count."""
    own = _PERF_GPUS[model]
    if cluster.name in own:
        return cluster.name, own[cluster.name]
    preferred = _STAND_INS.get(int(cluster.compute_capability), ()) + _DEFAULT_STAND_INS
    gpu = next(g for g in preferred if g in own)
    return gpu, own[gpu]


# A perf recipe function's name without `_config` (what recipe=<name> takes), e.g.
# qwen3_vl_30b_a3b_pretrain_8gpu_gb200_bf16: model, GPU count, GPU, precision.
RECIPE_NAME = re.compile(
    r"^(?P<model>[a-z0-9_]+?)_pretrain_(?P<gpus>\d+)gpu_(?P<gpu>[a-z0-9]+)_(?P<precision>bf16|fp8cs|fp8mx|nvfp4)$"
)


def _named_recipe(spec: RunSpec) -> Recipe | None:
    """recipe=<name>: that function itself (its precision, its tuning), whatever knobs override it."""
    match = RECIPE_NAME.match(spec.recipe.name)
    if match is None or not spec.recipe.module:
        return None
    model, gpu = match["model"], match["gpu"]
    family = spec.recipe.module.rpartition(".")[2]
    changed = [
        what
        for what, ours in (("model", spec.model.name), ("cluster", spec.cluster.name))
        if ours != {"model": model, "cluster": gpu}[what]
    ]
    note = f"recipe={spec.recipe.name}: the vendor's function itself, tuned for {match['gpus']}x{gpu.upper()}"
    if changed:
        note += f" (this run changes its {' and '.join(changed)})"
    return Recipe(
        spec.recipe.module,
        f"{spec.recipe.name}_config",
        RecipeKind.named,
        f"{model} perf (perf_recipes/qwen_vl/<gpu>/{family}.py, {match['precision']})",
        model,
        gpu,
        note,
    )


def select_recipe(spec: RunSpec, gpu: str | None = None) -> Recipe | None:
    """The Bridge perf recipe our overrides start from: recipe=<name>'s function when given, else the
    model's family on every cluster.

    `gpu`: that GPU's perf recipe of the family instead (family_recipes compares them)."""
    model, cluster = spec.model.name, spec.cluster
    arch = PROFILES.get(spec.model.arch)
    if arch is None:
        return None
    if gpu is None and spec.recipe.name != "none":
        return _named_recipe(spec)
    base = model if model in _PERF_GPUS else arch.bridge_template_model
    chosen = gpu is None
    gpu, gpus = _perf_recipe(base, cluster) if gpu is None else (gpu, _PERF_GPUS[base][gpu])
    tuned = f"tuned for {gpus}x{gpu.upper()}"
    if base != model:
        kind = RecipeKind.template
        note = f"{tuned}; {model} has no Bridge recipe: {base}'s is the template, the architecture is ours"
    elif gpu != cluster.name:
        kind = RecipeKind.stand_in
        why = f"{cluster.name} has no {model} perf recipe" if chosen else f"asked for {gpu.upper()}'s"
        note = f"{tuned}; {why}: {gpu.upper()}'s stands in"
    else:
        kind, note = RecipeKind.perf, tuned
    return Recipe(
        arch.perf_recipe_module(gpu),
        f"{base}_pretrain_{gpus}gpu_{gpu}_bf16_config",
        kind,
        f"{base} perf (perf_recipes/qwen_vl/<gpu>/{arch.bridge_recipe_family}.py, bf16)",
        base,
        gpu,
        note,
    )


def family_recipes(spec: RunSpec) -> list[Recipe]:
    """Every perf recipe of this run's family, the one it runs first."""
    own = select_recipe(spec)
    if own is None:
        return []
    others = [select_recipe(spec, gpu) for gpu in _PERF_GPUS.get(own.model, {}) if gpu != own.gpu]
    return [own, *(r for r in others if r is not None)]
