"""The knob -> Bridge field table, checked without the library (the real objects are checked in tests/megatron)."""

from __future__ import annotations

from moe_vlm.knobs.bridge_fields import FIELD_MAP, KEEP, bridge_overrides
from moe_vlm.knobs.bridge_recipe import select_recipe
from tests.conftest import make_spec

MEG = ["cluster=gb200", "model=qwen3_vl_30b_a3b", "nodes=2"]


def fields(*overrides: str) -> dict[str, object]:
    return {o.field: o.value for o in bridge_overrides(make_spec(*overrides))}


def test_each_field_is_set_once() -> None:
    names = [m.field for m in FIELD_MAP]
    assert len(names) == len(set(names))


def test_freeze_fields_are_always_explicit() -> None:
    # The MoE provider freezes language and vision by default: we must never inherit that.
    for option in ("none", "vision", "vision_projector"):
        values = fields(*MEG, f"vision_freeze={option}")
        for name in (
            "model.freeze_language_model",
            "model.freeze_vision_model",
            "model.freeze_vision_projection",
        ):
            assert isinstance(values[name], bool)
    assert fields(*MEG, "vision_freeze=vision")["model.freeze_vision_model"] is True
    assert fields(*MEG, "vision_freeze=vision")["model.freeze_vision_projection"] is False


def test_hybridep_topology_comes_from_the_cluster() -> None:
    env = fields(*MEG, "dispatcher=hybridep")["env_vars"]
    assert env == {
        "NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN": "8",
        "NVLINK_DOMAIN_SIZE": "72",
        "USE_MNNVL": "1",
        "NUM_OF_TOKENS_PER_CHUNK_COMBINE_API": KEEP,  # tuning: the recipe's unless the knob sets it
    }
    values = fields(*MEG, "dispatcher=hybridep")
    assert values["model.moe_token_dispatcher_type"] == "flex"
    assert values["model.moe_flex_dispatcher_backend"] == "hybridep"
    assert values["model.moe_shared_expert_overlap"] is False
    b200_env = fields("cluster=b200", "model=qwen3_vl_30b_a3b", "dispatcher=hybridep")["env_vars"]
    assert b200_env == {
        "NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN": "8",
        "NVLINK_DOMAIN_SIZE": "8",
        "USE_MNNVL": "0",
        "NUM_OF_TOKENS_PER_CHUNK_COMBINE_API": KEEP,
    }


def test_layout_recompute_and_graph_fields() -> None:
    values = fields(
        "cluster=b200", "model=qwen3_vl_30b_a3b", "nodes=8", "parallelism=3d", "pp=4", "vp=2",
        "recompute=selective", "cuda_graph=te_moe",
    )  # fmt: skip
    assert values["model.pipeline_model_parallel_size"] == 4
    assert values["model.virtual_pipeline_model_parallel_size"] == 2
    assert values["ddp.use_megatron_fsdp"] is False
    assert values["model.recompute_granularity"] == "selective"
    assert values["model.recompute_modules"] == ["core_attn"]
    assert values["model.cuda_graph_impl"] == "transformer_engine"
    assert values["model.cuda_graph_modules"] == ["moe_router", "moe_preprocess"]
    assert values["model.use_te_rng_tracker"] is True
    full = fields(*MEG, "cuda_graph=full_iteration", "recompute=full")
    assert (full["model.cuda_graph_impl"], full["model.cuda_graph_modules"]) == ("full_iteration", [])
    assert full["rerun_state_machine.check_for_nan_in_loss"] is False
    assert (full["model.recompute_method"], full["model.recompute_num_layers"]) == ("uniform", 1)


def test_fsdp_fields() -> None:
    values = fields(*MEG)
    assert values["ddp.use_megatron_fsdp"] is True
    assert values["checkpoint.ckpt_format"] == "fsdp_dtensor"
    assert values["ddp.data_parallel_sharding_strategy"] == "optim_grads_params"


def test_recipe_selection() -> None:
    perf = select_recipe(make_spec(*MEG))
    assert perf is not None and perf.kind == "perf" and "gb200" in perf.function
    # No H200 perf recipe: the H100 one of the same family stands in (never the general recipe).
    stand_in = select_recipe(make_spec("cluster=h200", "model=qwen3_vl_30b_a3b"))
    assert stand_in is not None and stand_in.kind == "stand-in" and stand_in.gpu == "h100"
    assert stand_in.family == perf.family and "perf_recipes" in stand_in.module
