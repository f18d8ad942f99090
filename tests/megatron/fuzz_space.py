"""The combination fuzzer's space, derived from the schema and the config groups.

A point is a GPU cluster, a model, a node count, one option of every config group (conf/<group>/,
listed from disk: a new option enters by itself) and a few leaves set to other values. A leaf's
values come from its type where the type says them (an Enum's members, a bool, a bool | None);
the other leaves (sizes, lists of names, counts) have their values in DOMAINS, or a reason in
EXCLUDED. tests/megatron/test_fuzz_combinations.py fails when a schema leaf is in neither, so a
new knob is in the fuzzer's space the day it is added (docs/adding-a-knob.md).

Points are assembled from one Hydra composition per cluster x model and one per group option
(the group's dataclass as Hydra builds it), not composed whole (a quarter second each);
test_fuzz_combinations checks on a sample that the assembly equals Hydra's compose of the same
overrides (`Point.overrides`).
"""

from __future__ import annotations

import copy
import itertools
import random
import types
import typing
from dataclasses import dataclass
from enum import Enum
from functools import cache
from typing import Any

from moe_vlm.config.compose import CONF_DIR, compose_point
from moe_vlm.config.schema import SYNTHETIC_DRAW_FIELDS, Packing, TrainConfig
from moe_vlm.rules.catalogue import CUDA_GRAPH_SCOPES, SELECTIVE_RECOMPUTE_MODULES
from moe_vlm.rules.overlap import VISION_GRAPH_SCOPES
from tests.conftest import SCHEMA_LEAVES, knob_override

CLUSTERS = ("gb200", "gb300", "b200", "b300", "h100", "h200")
MODELS = ("qwen3_vl_30b_a3b", "qwen3_vl_235b_a22b", "qwen35_vl_35b_a3b")
# GPUs per job, per model: around what its perf recipes use (8 for the A3B models, 64 for 235B),
# so that a fair share of points fits in memory and reaches the library checks.
WORLDS = {
    "qwen3_vl_30b_a3b": (4, 8, 16, 32),
    "qwen35_vl_35b_a3b": (4, 8, 16, 32),
    "qwen3_vl_235b_a22b": (64, 128),
}
# Config groups that are axes (above) or not knobs of a run.
# recipe= and card=: a vendor recipe or a published card row sets the other groups' choices
# (tests/megatron/test_recipes.py and tests/unit/test_sweep_presets.py check every one of them);
# the fuzzer varies those groups themselves.
AXIS_GROUPS = ("cluster", "model", "sweep", "hydra", "recipe", "card")
# Group options whose points need a companion override to be meaningful.
COMPANIONS = {("data", "real"): {"data.path": "/datasets/shards"}}

# Values of the leaves whose type does not enumerate them.
DOMAINS: dict[str, tuple[Any, ...]] = {
    "mbs": (1, 2, 4),
    "weight_decay": (0.0, 0.033, 0.1),  # Bridge's scheduler asserts start <= end, both >= 0
    "gbs": (None, 128, 256, 512, 1024),
    "seq_length": (None, 2048, 4096, 8192),
    "train_iters": (8, 12),
    "warmup_steps": (2, 3),
    "tp": (None, 1, 2, 4, 8),
    "pp": (None, 1, 2, 4),
    "vp": (None, 1, 2, 3),
    "cp": (None, 1, 2),
    "ep": (None, 0, 1, 4, 8, 16, 32),
    "etp": (None, 1, 2),
    "parallelism.tp": (1, 2, 4),
    "parallelism.pp": (1, 2, 4),
    "parallelism.vp": (1, 2),
    "parallelism.cp": (1, 2),
    "parallelism.ep": (0, 4, 8, 16),
    "parallelism.etp": (1, 2),
    "parallelism.first_stage_layers": (0, 10, 11),
    "parallelism.last_stage_layers": (0, 10, 13),
    "parallelism.fsdp_version": (1, 2),
    "parallelism.dp_outer": (0, 1, 2),
    "dispatcher.num_sms": (0, 16, 32),
    "dispatcher.hybridep_ranks_per_nvlink_domain": (0, 4, 8),
    "dispatcher.hybridep_nvlink_domain_size": (0, 8, 72),
    "dispatcher.hybridep_tokens_per_chunk_combine": (0, 128),
    "recompute.num_layers": (0, 1, 2, 4),
    # Each name the rules know, alone, and the pairs the recipes use.
    "recompute.modules": ([], *([m] for m in SELECTIVE_RECOMPUTE_MODULES), ["layernorm", "moe_act"]),
    "cuda_graph.scope": ([], *([s] for s in CUDA_GRAPH_SCOPES), ["moe_router", "moe_preprocess"]),
    "cuda_graph.warmup_steps": (1, 3),
    "cuda_graph.vision_scope": ([], *([s] for s in VISION_GRAPH_SCOPES)),
    "cuda_graph.vision_max_seq_length": (0, 4096, 8192),
    "router.aux_loss_coeff": (None, 0.0, 1e-3),
    "router.capacity_factor": (None, 1.0, 1.5),
    "overlap.bucket_size": (None, 40_000_000),
    "offload.activation_layers": (0, 4, 8),
    "offload.optimizer_fraction": (0.0, 0.5, 1.0),
    "gc.interval": (None, 0, 5, 100),
    "profiling.steps": ([], [4], [5, 6]),
    "profiling.ranks": ([0], [0, 1]),
    "data.num_workers": (None, 0, 2),
    "data.packing_buffer": (0, 1, 64),  # 0: A020 refuses it
}
# Leaves the fuzzer does not vary, and why.
EXCLUDED: dict[str, str] = {
    "engine": "fixed: engine=megatron (the library checks judge the Megatron engine)",
    "dry_run": "fixed: planned, never run",
    "nodes": "an axis: drawn from WORLDS / gpus_per_node",
    "nproc": "null: one rank per GPU (L011 rejects anything else on a GPU cluster)",
    "seed": "a seed: no check reads its value",
    "lr": "a learning rate: no config check reads its value",
    "data.path": "set with data=real (COMPANIONS); a real path is a file system check, not a library one",
    "logger.project": "a label for the tracker",
    "logger.run_name": "a label for the tracker",
    "logger.entity": "a label for the tracker",
    "logger.tracking_uri": "a tracker address",
    "router.assumed_load": "a planning input of the predictor: no engine or library check reads it",
    "recipe.module": "set by recipe=<name> (tests/megatron/test_recipes.py checks every recipe option)",
    "recipe.knobs": "set by recipe=<name> (tests/megatron/test_recipes.py checks every recipe option)",
    **{
        f"card.{name}": "set by card=<row> (tests/unit/test_sweep_presets.py checks every card option)"
        for name in (
            "row",
            "source",
            "published_tflops_per_gpu",
            "published_mfu",
            "validated_on",
            "as_written",
            "reasons",
            "assumed",
        )
    },
    **{
        f"data.{name}": "a draw parameter of the project's own seeded samples (MoeVlmDatasetConfig): no library check"
        for name in (*SYNTHETIC_DRAW_FIELDS, "min_pixels", "max_pixels")
    },
}
AXIS_PREFIXES = ("model.", "cluster.")  # a fixed description of the model and the machine: axes
LABEL_SUFFIX = ".name"  # a group option's label (its fields carry the settings)


LEAVES = SCHEMA_LEAVES


def values_of(knob: str) -> tuple[Any, ...] | None:
    """The values the fuzzer draws for `knob`: DOMAINS, else from its type; None: not in the space."""
    if knob in DOMAINS:
        return DOMAINS[knob]
    kind = LEAVES[knob]
    args = typing.get_args(kind) if isinstance(kind, types.UnionType) else (kind,)
    optional = type(None) in args
    base = next((a for a in args if a is not type(None)), None)
    found: tuple[Any, ...] | None = None
    if isinstance(base, type) and issubclass(base, Enum):
        found = tuple(base)
    elif base is bool:
        found = (True, False)
    if found is None:
        return None
    return (None, *found) if optional else found


def _fixed(knob: str) -> bool:
    return knob in EXCLUDED or knob.startswith(AXIS_PREFIXES) or knob.endswith(LABEL_SUFFIX)


def space() -> dict[str, tuple[Any, ...]]:
    """Every leaf the fuzzer varies, with its values."""
    return {knob: found for knob in LEAVES if not _fixed(knob) and (found := values_of(knob)) is not None}


def unplaced() -> list[str]:
    """Schema leaves neither in the space nor excluded with a reason (the test's failure list)."""
    return [knob for knob in LEAVES if not _fixed(knob) and values_of(knob) is None]


@cache
def group_options() -> dict[str, tuple[str, ...]]:
    """conf/<group>/<option>.yaml for every config group that is a knob of a run."""
    return {
        d.name: tuple(sorted(p.stem for p in d.glob("*.yaml")))
        for d in sorted(CONF_DIR.iterdir())
        if d.is_dir() and d.name not in AXIS_GROUPS and any(d.glob("*.yaml"))
    }


_override = knob_override


@dataclass(frozen=True)
class Point:
    cluster: str
    model: str
    nodes: int
    groups: tuple[tuple[str, str], ...]  # (group, option)
    leaves: tuple[tuple[str, Any], ...]  # (knob, value), applied after the groups

    @property
    def overrides(self) -> list[str]:
        """The command line that composes this point (what a user would type)."""
        return [
            "engine=megatron",
            "dry_run=true",
            f"cluster={self.cluster}",
            f"model={self.model}",
            f"nodes={self.nodes}",
            *(f"{group}={option}" for group, option in self.groups),
            *(_override(knob, value) for knob, value in self.leaves),
        ]

    def describe(self) -> str:
        return " ".join(self.overrides[2:])


def draw(rng: random.Random, gpus_per_node: dict[str, int]) -> Point:
    """One random point: 0 to 5 groups on another option than their default (any option, uniformly),
    then 0 to 5 leaves drawn from the space. Near the defaults, so that enough points plan VALID to
    reach the library checks; 2,000 of them still cover every pair of options many times over."""
    cluster, model = rng.choice(CLUSTERS), rng.choice(MODELS)
    nodes = max(1, rng.choice(WORLDS[model]) // gpus_per_node[cluster])
    options = group_options()
    changed = sorted(rng.sample(sorted(options), rng.randint(0, 5)))
    groups = tuple((group, rng.choice(options[group])) for group in changed)
    leaves: dict[str, Any] = {}
    for group, option in groups:
        leaves.update(COMPANIONS.get((group, option), {}))
    drawable = space()
    for knob in rng.sample(sorted(drawable), rng.randint(0, 5)):
        value = rng.choice(drawable[knob])
        leaves[knob] = copy.copy(value)
    return Point(cluster, model, nodes, groups, tuple(leaves.items()))


# --- assembly ---------------------------------------------------------------------------------


_BASE_OVERRIDES = ("engine=megatron", "dry_run=true")


@cache
def _base(cluster: str, model: str) -> TrainConfig:
    return compose_point([*_BASE_OVERRIDES, f"cluster={cluster}", f"model={model}"]).train


@cache
def _group(group: str, option: str) -> Any:
    """The group's dataclass as Hydra builds it for `group=option`."""
    return getattr(compose_point([*_BASE_OVERRIDES, f"{group}={option}"]).train, group)


def gpus_per_node() -> dict[str, int]:
    return {cluster: _base(cluster, MODELS[0]).cluster.gpus_per_node for cluster in CLUSTERS}


def _set(train: TrainConfig, knob: str, value: Any) -> None:
    *parents, name = knob.split(".")
    node: Any = train
    for part in parents:
        node = getattr(node, part)
    setattr(node, name, copy.copy(value))


def assemble(point: Point) -> TrainConfig:
    """The TrainConfig Hydra's compose of `point.overrides` gives, from cached compositions."""
    train = copy.deepcopy(_base(point.cluster, point.model))
    train.nodes = point.nodes
    for group, option in point.groups:
        setattr(train, group, copy.deepcopy(_group(group, option)))
    for knob, value in point.leaves:
        _set(train, knob, value)
    return train


# --- the shape axes -----------------------------------------------------------------------------

# What the shape check (moe_vlm/rules/shapes.py) reads, drawn together: the random points above
# change at most five things, so packing x FP8 x CP x SP x an odd sequence length rarely meet there.
# data=real needs files (the shape check says S000 without them); the three others build batches.
SHAPE_AXES: dict[str, tuple[Any, ...]] = {
    "cluster": ("gb200", "b200", "h100"),
    "data": ("mock", "synthetic", "bridge_mock"),
    "data.packing": tuple(Packing),
    "precision": ("bf16", "fp8cs", "fp8mx", "nvfp4"),
    "tp": (1, 2, 4),
    "cp": (1, 2),
    "parallelism.sequence_parallel": (True, False),
    "mbs": (1, 2, 3, 4),
    # 4100: a multiple of 4 only; 4104: of 8, not 16 or 32; 4112: of 16, not 32
    "seq_length": (2048, 4096, 4100, 4104, 4112),
}
SHAPE_SMALL = (("data.max_long_side_px", 480), ("data.max_text_tokens", 96))  # a batch in a second


def draw_shape_point(rng: random.Random, per_node: dict[str, int]) -> Point:
    """One point on the shape axes: the 30B-A3B model on 8 GPUs, 3D parallelism, the all-to-all
    dispatcher (allgather refuses packing, A010), every shape axis drawn."""
    pick = {axis: rng.choice(values) for axis, values in SHAPE_AXES.items()}
    cluster = pick.pop("cluster")
    groups = (
        ("data", pick.pop("data")),
        ("dispatcher", "alltoall"),
        ("parallelism", "3d"),
        ("precision", pick.pop("precision")),
    )
    leaves = (*pick.items(), *SHAPE_SMALL)
    return Point(cluster, MODELS[0], max(1, 8 // per_node[cluster]), groups, leaves)


# --- the third pass's axes (issue 49) -----------------------------------------------------------

# What slipped through the random points and the shape axes: TP userbuffers (the recipe's, on, off)
# with every precision, sequence lengths that are multiples of 128 and of only 64, 32, 16, 8 or 4,
# every model family (Qwen3.5's Gated DeltaNet layers included) against every parallelism knob, and
# every packing mode. THIRD_PRODUCT's axes are enumerated whole (each combination THIRD_REPEATS
# times); the others are drawn for each.
THIRD_PRODUCT: dict[str, tuple[Any, ...]] = {
    "precision": ("bf16", "fp8cs", "fp8mx", "nvfp4"),
    "overlap.tp_comm": (None, True, False),
    # 4096 a multiple of 128; 4160 of 64 only; 4128 of 32; 4112 of 16; 4104 of 8; 4100 of 4
    "seq_length": (4096, 4160, 4128, 4112, 4104, 4100),
}
# A value listed twice is drawn twice as often: TP overlap needs TP >= 2 with sequence parallelism,
# and the 235B model on H100s rarely fits (M001).
THIRD_DRAWN: dict[str, tuple[Any, ...]] = {
    "cluster": ("gb200", "gb200", "b200", "h100"),
    "model": (MODELS[0], MODELS[0], MODELS[1], MODELS[2], MODELS[2]),
    "parallelism": ("fsdp", "3d", "3d"),
    "tp": (1, 2, 2, 4),
    "cp": (1, 1, 2),
    "pp": (1, 2),
    "ep": (None, 1, 4, 8),
    "etp": (None, 1, 2),
    "parallelism.sequence_parallel": (True, True, False),
    "data.packing": tuple(Packing),
    "mbs": (1, 2, 3),
}
THIRD_AXES = {**THIRD_PRODUCT, **THIRD_DRAWN}
THIRD_REPEATS = 4
# Bridge-free mock samples fill whole rows (a packed batch in milliseconds); small images for the rest.
THIRD_DATA = (("data.max_long_side_px", 480), ("data.max_text_tokens", 96))


def third_point(rng: random.Random, per_node: dict[str, int], fixed: dict[str, Any]) -> Point:
    """One point: `fixed` (THIRD_PRODUCT's values), THIRD_DRAWN drawn, mock data, the all-to-all
    dispatcher (allgather refuses packing, A010), the model's usual GPU count."""
    pick = {**{axis: rng.choice(values) for axis, values in THIRD_DRAWN.items()}, **fixed}
    cluster, model = pick.pop("cluster"), pick.pop("model")
    groups = (
        ("data", "mock"),
        ("dispatcher", "alltoall"),
        ("parallelism", pick.pop("parallelism")),
        ("precision", pick.pop("precision")),
    )
    leaves = (*((k, v) for k, v in pick.items() if v is not None), *THIRD_DATA)
    gpus = max(WORLDS[model][:2])  # 8 GPUs for the A3B models, 128 for 235B
    return Point(cluster, model, max(1, gpus // per_node[cluster]), groups, leaves)


def third_points(rng: random.Random, per_node: dict[str, int]) -> list[Point]:
    """Every combination of THIRD_PRODUCT, THIRD_REPEATS times, the other axes drawn for each."""
    combos = itertools.product(*THIRD_PRODUCT.values())
    return [
        third_point(rng, per_node, dict(zip(THIRD_PRODUCT, combo, strict=True)))
        for combo in combos
        for _ in range(THIRD_REPEATS)
    ]


def draw_sweep(rng: random.Random, per_node: dict[str, int], points: int = 3) -> list[Point]:
    """A sweep whose points differ in shape: one drawn point, then the same with other sequence lengths
    and micro-batch sizes (what `-m seq_length=4096,4100 mbs=1,2` expands to)."""
    fixed = {axis: rng.choice(values) for axis, values in THIRD_PRODUCT.items()}
    first = third_point(rng, per_node, fixed)
    kept = tuple((k, v) for k, v in first.leaves if k not in ("seq_length", "mbs"))
    sweep = [first]
    for _ in range(points - 1):
        shape = (
            ("seq_length", rng.choice(THIRD_PRODUCT["seq_length"])),
            ("mbs", rng.choice(THIRD_DRAWN["mbs"])),
        )
        sweep.append(Point(first.cluster, first.model, first.nodes, first.groups, (*kept, *shape)))
    return sweep
