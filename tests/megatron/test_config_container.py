"""Real ConfigContainers: every option of every config group and every sweep preset point.

Each case builds the Bridge recipe the engine would pick (offline, from our model group), applies
THE table (moe_vlm/knobs/bridge_fields.py) and reads every mapped field back.
"""

from __future__ import annotations

import copy
import importlib
import itertools
from pathlib import Path
from typing import Any

import pytest
import yaml

from moe_vlm.config.spec import RunSpec
from moe_vlm.engines.megatron.config import apply_overrides, check_overrides, get_field, set_field
from moe_vlm.knobs.bridge_fields import FIELD_MAP
from moe_vlm.knobs.bridge_recipe import select_recipe
from tests.conftest import CONF, REPO, make_spec
from tests.megatron.conftest import REPORT, RecipeCache, needs_stack

GROUPS = (
    "model",
    "parallelism",
    "dispatcher",
    "recompute",
    "cuda_graph",
    "vision_freeze",
    "data",
    "cluster",
    "precision",
    "router",
    "fusion",
    "overlap",
    "offload",
    "gc",
)
BASE = ("engine=megatron", "dry_run=true", "model=qwen3_vl_30b_a3b", "cluster=gb200", "nodes=2")
# Options that need a companion value to describe a run at all.
COMPANIONS = {("data", "real"): ("data.path=/datasets/shards",)}


def group_options() -> list[tuple[str, str]]:
    return [(group, path.stem) for group in GROUPS for path in sorted((CONF / group).glob("*.yaml"))]


def sweep_points() -> list[tuple[str, tuple[str, ...]]]:
    """(preset, overrides) for every point of every sweep preset (conf/sweep and sweeps/)."""
    presets: dict[str, Path] = {}
    for directory in (CONF / "sweep", REPO / "sweeps"):
        for path in sorted(directory.glob("*.yaml")):
            presets.setdefault(path.stem, path)
    points = []
    for name, path in sorted(presets.items()):
        params = (yaml.safe_load(path.read_text()) or {}).get("hydra", {}).get("sweeper", {}).get(
            "params"
        ) or {}
        axes = [
            [f"{key}={value.strip()}" for value in str(values).split(",")] for key, values in params.items()
        ]
        points += [(name, combo) for combo in itertools.product(*axes)]
    return points


def built(recipes: RecipeCache, *overrides: str) -> tuple[RunSpec, Any]:
    spec = make_spec(*overrides)
    cfg = recipes.config(spec)
    apply_overrides(cfg, spec)
    return spec, cfg


def test_presets_and_options_found() -> None:
    # Guards the parametrisation below against silently testing nothing.
    assert len(group_options()) >= 20
    assert sweep_points() or not list((CONF / "sweep").glob("*.yaml"))


@needs_stack
@pytest.mark.parametrize(("group", "option"), group_options())
def test_every_group_option_reaches_the_config(recipes: RecipeCache, group: str, option: str) -> None:
    spec, cfg = built(recipes, *BASE, f"{group}={option}", *COMPANIONS.get((group, option), ()))
    assert check_overrides(cfg, spec) == []


@needs_stack
@pytest.mark.parametrize(
    ("preset", "point"), sweep_points(), ids=lambda v: v if isinstance(v, str) else "-".join(v)
)
def test_every_sweep_point_reaches_the_config(
    recipes: RecipeCache, preset: str, point: tuple[str, ...]
) -> None:
    spec, cfg = built(recipes, *BASE, *point)
    assert check_overrides(cfg, spec) == [], f"sweep={preset} {point}"


@needs_stack
def test_every_recipe_in_the_table_exists() -> None:
    checked = []
    for model, cluster in itertools.product(
        ("qwen3_vl_30b_a3b", "qwen3_vl_235b_a22b", "qwen35_vl_35b_a3b", "tiny_moe_vlm"),
        ("gb200", "b200", "gb300", "b300", "h100", "h200", "local"),
    ):
        recipe = select_recipe(
            make_spec("engine=megatron", "dry_run=true", f"model={model}", f"cluster={cluster}")
        )
        assert recipe is not None
        assert callable(getattr(importlib.import_module(recipe.module), recipe.function)), recipe.name
        checked.append(recipe.name)
    REPORT.append(
        f"recipes: {len(set(checked))} distinct Bridge recipe functions resolved in the installed package"
    )


@needs_stack
def test_every_table_field_exists(recipes: RecipeCache) -> None:
    """Each row names a real field: of the recipe's config, or of the real-data or Bridge-mock
    config it builds."""
    _, cfg = built(recipes, *BASE)
    _, real_cfg = built(recipes, *BASE, "data=real", "data.path=/datasets/shards")
    _, mock_cfg = built(recipes, *BASE, "data=bridge_mock")
    _, packed_cfg = built(recipes, *BASE, "data=real", "data.path=/datasets/shards", "data.packing=buffer")
    for row in FIELD_MAP:
        if row.field == "env_vars":
            continue
        target = (
            mock_cfg
            if row.field == "dataset.hf_processor_path"
            else packed_cfg
            if row.field == "dataset.packing_buffer_size"
            else real_cfg
            if row.field.startswith("dataset.task_encoder")
            or row.field
            in (
                "dataset.path",
                "dataset.micro_batch_size",
                "dataset.enable_in_batch_packing",
                "dataset.defer_in_batch_packing_to_step",
                "dataset.pad_to_max_length",
            )
            else cfg
        )
        set_field(target, row.field, get_field(target, row.field))  # raises for a field the library lacks
    REPORT.append(f"table: all {len(FIELD_MAP)} rows name fields that exist in megatron-bridge 0.6.2")


@needs_stack
def test_unknown_field_is_an_error_not_a_new_attribute(recipes: RecipeCache) -> None:
    _, cfg = built(recipes, *BASE)
    with pytest.raises(AttributeError, match="no field 'megatron_fsdp_version'"):
        set_field(cfg, "ddp.megatron_fsdp_version", 2)


@needs_stack
def test_freeze_fields_beat_the_provider_defaults(recipes: RecipeCache) -> None:
    # The MoE provider and the recipes freeze language and vision: vision_freeze=none must undo it.
    _, cfg = built(recipes, *BASE, "vision_freeze=none")
    assert (cfg.model.freeze_language_model, cfg.model.freeze_vision_model) == (False, False)
    _, cfg = built(recipes, *BASE, "vision_freeze=vision_projector")
    assert (cfg.model.freeze_vision_model, cfg.model.freeze_vision_projection) == (True, True)
    assert cfg.model.freeze_language_model is False


@needs_stack
def test_hybridep_topology_replaces_the_recipe_s(recipes: RecipeCache) -> None:
    _, cfg = built(recipes, "engine=megatron", "dry_run=true", "model=qwen3_vl_30b_a3b", "cluster=b200",
                   "dispatcher=hybridep")  # fmt: skip
    assert cfg.env_vars["NVLINK_DOMAIN_SIZE"] == "8" and cfg.env_vars["USE_MNNVL"] == "0"
    assert "NUM_OF_TOKENS_PER_CHUNK_COMBINE_API" not in cfg.env_vars  # B200's recipe has no HybridEP tuning
    _, cfg = built(recipes, *BASE, "dispatcher=alltoall")
    assert not {"NVLINK_DOMAIN_SIZE", "USE_MNNVL"} & set(cfg.env_vars)
    assert cfg.model.moe_token_dispatcher_type == "alltoall" and cfg.model.moe_flex_dispatcher_backend is None


# --- GB300 and B300 (conf/cluster/gb300.yaml, b300.yaml) ----------------------------------------


@needs_stack
@pytest.mark.parametrize(
    ("overrides", "recipe"),
    [
        (("model=qwen3_vl_235b_a22b", "cluster=gb300", "nodes=16"), "qwen3_vl_235b_a22b_pretrain_64gpu_gb300_bf16_config"),
        (("model=qwen3_vl_30b_a3b", "cluster=gb300", "nodes=2"), "qwen3_vl_30b_a3b_pretrain_8gpu_gb300_bf16_config"),
        (("model=qwen35_vl_35b_a3b", "cluster=gb300", "nodes=2"), "qwen35_vl_35b_a3b_pretrain_8gpu_gb300_bf16_config"),
        (("model=qwen35_vl_35b_a3b", "cluster=b300", "nodes=1"), "qwen35_vl_35b_a3b_pretrain_8gpu_b300_bf16_config"),
    ],
)  # fmt: skip
def test_new_clusters_run_their_own_perf_recipe_and_its_topology(
    recipes: RecipeCache, overrides: tuple[str, ...], recipe: str
) -> None:
    """Bridge's GB300/B300 recipe is picked, and its own HybridEP topology is what our cluster derives."""
    from moe_vlm.config.spec import hybridep_topology

    spec = make_spec("engine=megatron", "dry_run=true", "dispatcher=hybridep", *overrides)
    chosen = select_recipe(spec)
    assert chosen is not None and chosen.function == recipe and chosen.kind == "perf"
    raw = recipes.config(spec)  # the recipe as Bridge builds it, before our table
    assert raw.model.moe_flex_dispatcher_backend == "hybridep"
    assert raw.model.expert_model_parallel_size == spec.layout.ep
    derived = hybridep_topology(spec)
    assert {name: int(raw.env_vars[name]) for name in derived} == derived
    cfg = copy.deepcopy(raw)
    apply_overrides(cfg, spec)
    assert check_overrides(cfg, spec) == []


@needs_stack
@pytest.mark.parametrize(
    ("cluster", "gpu", "deepep_allowed"),
    [
        ("gb300", None, False),
        ("b300", None, True),
        ("b300", "NVIDIA B300 SXM6 AC", True),  # the name the device reports; Bridge matches the prefix
        ("gb200", None, False),
        ("b200", None, True),
    ],
)
def test_bridge_judges_deepep_on_the_declared_device(
    recipes: RecipeCache,
    monkeypatch: pytest.MonkeyPatch,
    cluster: str,
    gpu: str | None,
    deepep_allowed: bool,
) -> None:
    """Bridge's own flex-dispatcher check on our cluster's device agrees with rules D001 and D002."""
    import torch
    from megatron.bridge.training.flex_dispatcher_backend import validate_flex_dispatcher_backend

    from moe_vlm.rules import validate
    from tests.megatron.conftest import device_properties

    for dispatcher, allowed in (("deepep", deepep_allowed), ("hybridep", True)):
        extra = (f"cluster.gpu={gpu}",) if gpu else ()
        spec, cfg = built(recipes, *BASE, f"cluster={cluster}", f"dispatcher={dispatcher}", *extra)
        monkeypatch.setattr(
            torch.cuda, "get_device_properties", lambda *_a, _s=spec, **_k: device_properties(_s)
        )
        assert (cfg.model.moe_token_dispatcher_type, cfg.model.moe_flex_dispatcher_backend) == (
            "flex",
            dispatcher,
        )
        ours = {f.code for f in validate(spec)} & {"D001", "D002"}
        if allowed:
            validate_flex_dispatcher_backend(cfg.model)
            assert not ours
        else:
            with pytest.raises(ValueError, match="DeepEP is supported for"):
                validate_flex_dispatcher_backend(cfg.model)
            assert ours == {"D001"}


@needs_stack
@pytest.mark.parametrize(
    "overrides",
    [
        ("model=qwen3_vl_30b_a3b", "cluster=gb300", "nodes=2"),
        ("model=qwen3_vl_30b_a3b", "cluster=b300", "nodes=1"),  # B200's recipe stands in
        ("model=qwen35_vl_35b_a3b", "cluster=b300", "nodes=1"),
        ("model=qwen3_vl_30b_a3b", "cluster=h100", "nodes=2"),
    ],
)
def test_playbook_says_which_variables_the_recipe_sets(
    recipes: RecipeCache, overrides: tuple[str, ...]
) -> None:
    """`moe-vlm advise` prints each variable as set by the recipe, or the user's: the recipe agrees."""
    from moe_vlm.cli.advise.playbook import PLAYBOOKS

    spec = make_spec("engine=megatron", "dry_run=true", *overrides)
    chosen = select_recipe(spec)
    assert chosen is not None
    env = recipes.config(spec).env_vars
    for var in PLAYBOOKS[spec.cluster.name].env:
        claimed = var.set_by is None or chosen.gpu in var.set_by
        assert (var.name in env) is claimed, (chosen.function, var.name)
        if claimed:
            assert str(env[var.name]) == var.value, (chosen.function, var.name, env[var.name])


# --- precision (conf/precision): what Bridge's runtime update leaves in the model and DDP configs ---


@needs_stack
@pytest.mark.parametrize("family", ["fsdp", "3d"])
@pytest.mark.parametrize(
    ("precision", "fp8", "fp8_recipe", "fp4"),
    [
        ("bf16", None, "tensorwise", None),  # fp8_recipe is inert while fp8 is None (MCore's default)
        ("fp8cs", "hybrid", "tensorwise", None),
        ("fp8mx", "e4m3", "mxfp8", None),
        ("nvfp4", None, "tensorwise", "e2m1"),
    ],
)
def test_precision_survives_bridges_runtime_update(
    recipes: RecipeCache,
    engine_environment: Any,
    family: str,
    precision: str,
    fp8: str | None,
    fp8_recipe: str,
    fp4: str | None,
) -> None:
    """mixed_precision.setup copies the recipe into the model, optimizer and DDP configs
    (megatron/bridge/training/config.py:1873-1877); validate() then finalises them."""
    from megatron.bridge.training.config import runtime_config_update

    spec, cfg = built(recipes, *BASE, f"parallelism={family}", f"precision={precision}")
    engine_environment(spec)
    runtime_config_update(cfg)
    model, ddp = cfg.model, cfg.ddp
    assert (model.fp8, model.fp8_recipe, model.fp4, model.bf16) == (fp8, fp8_recipe, fp4, True)
    # Quantized primary weights, gathered quantized: what the memory estimate's quantized_weights counts.
    assert (model.fp8_param, ddp.fp8_param_gather) == (fp8 is not None,) * 2
    assert (model.fp4_param, ddp.fp4_param_gather) == (fp4 is not None,) * 2
    assert model.first_last_layers_bf16 is False and ddp.grad_reduce_in_fp32 is False  # as the perf recipes
    # MXFP8 reuses the gradient buffer for the weight all-gather on 3D; Megatron FSDP turns it off
    # (config.py:1090-1094), 3D asserts it on (config.py:1348-1359).
    assert ddp.reuse_grad_buf_for_mxfp8_param_ag is (precision == "fp8mx" and family == "3d")
