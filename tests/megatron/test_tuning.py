"""The fusion, router, overlap, HSDP, offload, GC and vision-graph knobs on the real ConfigContainer.

Each case builds the engine's config (the perf recipe + THE table), runs Bridge's own
``runtime_config_update`` on it as a rank of the job would (comm-overlap and mixed-precision setup,
then ``validate()``, which finalises Megatron Core's TransformerConfig), and reads the field the run
gets. Where our rules say the library rejects or silently replaces a setting, the library is made
to do so here, on CPU.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest

from moe_vlm.config.spec import RunSpec
from moe_vlm.engines.megatron.config import apply_overrides, check_overrides
from moe_vlm.rules import validate
from tests.conftest import make_spec
from tests.megatron.conftest import REPORT, RecipeCache, needs_stack, runtime_updated

MEG = ("engine=megatron", "dry_run=true", "model=qwen3_vl_30b_a3b")
GB200 = (*MEG, "cluster=gb200", "nodes=2")
B200 = (*MEG, "cluster=b200", "nodes=1")
THREE_D = (*B200, "parallelism=3d")


def updated(recipes: RecipeCache, prepare: Any, *overrides: str) -> tuple[RunSpec, Any]:
    """The engine's config for these overrides after Bridge's runtime update (the table still holds)."""
    spec, cfg = runtime_updated(recipes, prepare, *overrides)
    assert check_overrides(cfg, spec) == [], "the runtime update rewrote a table value"
    return spec, cfg


def field(cfg: Any, path: str) -> Any:
    node = cfg
    for part in path.split("."):
        node = getattr(node, part)
    return node


CASES: list[tuple[tuple[str, ...], dict[str, Any]]] = [
    # Null keeps the perf recipe's values (_qwen35/_finalize_qwen3_vl, qwen3_vl_provider.py:256-261).
    (
        GB200,
        {
            "model.moe_permute_fusion": True,
            "model.moe_router_fusion": True,
            "model.cross_entropy_loss_fusion": True,
            "model.cross_entropy_fusion_impl": "te",
            "model.bias_activation_fusion": True,
            "model.moe_router_dtype": "fp32",
            "model.moe_aux_loss_coeff": 0.001,
            "model.moe_expert_capacity_factor": None,
            "ddp.grad_reduce_in_fp32": False,
            "train.manual_gc": True,
            "train.manual_gc_interval": 100,
            "model.vision_cuda_graph_impl": "none",
        },
    ),
    (
        (*GB200, "fusion=none"),
        {
            "model.moe_permute_fusion": False,
            "model.moe_router_fusion": False,
            "model.cross_entropy_loss_fusion": False,
            "model.bias_activation_fusion": False,
        },
    ),
    (
        (*GB200, "fusion=all"),
        {"model.cross_entropy_loss_fusion": True, "model.cross_entropy_fusion_impl": "native"},
    ),
    (
        # An fp64 router runs only unfused (rule X009: TE's fused router refuses float64).
        (*GB200, "router.dtype=fp64", "router.aux_loss_coeff=0.01", "fusion.moe_router_fusion=false"),
        {
            "model.moe_router_dtype": "fp64",
            "model.moe_aux_loss_coeff": 0.01,
            "model.moe_router_fusion": False,
        },
    ),
    ((*GB200, "router.dtype=bf16"), {"model.moe_router_dtype": None}),
    (
        (*GB200, "router=drop_and_pad"),
        {"model.moe_expert_capacity_factor": 1.0, "model.moe_pad_expert_input_to_capacity": True},
    ),
    # The perf recipes' DP overlap is off; CommOverlapConfig.setup writes ours into ddp and optimizer.
    # (DP > 1 still gets Bridge's bucket size; Megatron DDP drops it without overlap, rule O002.)
    (
        THREE_D,
        {"ddp.overlap_grad_reduce": False, "ddp.overlap_param_gather": False, "ddp.bucket_size": 134217728},
    ),
    (
        (*THREE_D, "overlap=dp", "overlap.bucket_size=50000000"),
        {
            "ddp.overlap_grad_reduce": True,
            "ddp.overlap_param_gather": True,
            "optimizer.overlap_param_gather": True,
            "ddp.bucket_size": 50_000_000,
        },
    ),
    ((*THREE_D, "overlap.grad_reduce_in_fp32=true"), {"ddp.grad_reduce_in_fp32": True}),
    # TP userbuffer overlap: the recipe asks for it; Bridge keeps it only with TP >= 2 and SP.
    (THREE_D, {"model.tp_comm_overlap": False}),
    ((*THREE_D, "tp=2"), {"model.tp_comm_overlap": True, "model.sequence_parallel": True}),
    ((*THREE_D, "tp=2", "overlap=none"), {"model.tp_comm_overlap": False}),
    (
        (*GB200, "ep=4", "parallelism.dp_outer=2", "parallelism.dp_outer_sharding=optim"),
        {"ddp.num_distributed_optimizer_instances": 2, "ddp.outer_dp_sharding_strategy": "optim"},
    ),
    (
        (*THREE_D, "offload=optimizer"),
        {"optimizer.optimizer_cpu_offload": True, "optimizer.optimizer_offload_fraction": 1.0},
    ),
    ((*B200, "offload=activations"), {"model.cpu_offloading": True, "model.cpu_offloading_num_layers": 8}),
    ((*GB200, "gc=auto"), {"train.manual_gc": False}),
    ((*GB200, "gc=manual", "gc.interval=5"), {"train.manual_gc": True, "train.manual_gc_interval": 5}),
    # Vision-encoder graphs are rejected (rule O016); their fields: test_vision_graphs_reach_the_vision_encoder_config.
]


@needs_stack
@pytest.mark.parametrize(
    ("overrides", "expected"), CASES, ids=lambda v: " ".join(v[3:]) if isinstance(v, tuple) else ""
)
def test_each_knob_reaches_the_field_the_run_gets(
    recipes: RecipeCache, engine_environment: Any, overrides: tuple[str, ...], expected: dict[str, Any]
) -> None:
    spec, cfg = updated(recipes, engine_environment, *overrides)
    assert not [f.line() for f in validate(spec) if f.is_error]
    assert {name: field(cfg, name) for name in expected} == expected


@needs_stack
def test_vision_graphs_reach_the_vision_encoder_config(recipes: RecipeCache, engine_environment: Any) -> None:
    """Bridge builds the ViT's TransformerConfig from the provider's vision fields
    (models/qwen_vl/modelling_qwen3_vl/transformer_config.py:134-153)."""
    from megatron.bridge.models.qwen_vl.modelling_qwen3_vl.transformer_config import get_vision_model_config

    _, cfg = updated(
        recipes,
        engine_environment,
        *THREE_D,
        "cuda_graph.vision=true",
        "cuda_graph.vision_scope=[attn]",
        "cuda_graph.vision_max_seq_length=7776",
    )
    vision = get_vision_model_config(cfg.model.vision_config, cfg.model)
    assert vision.cuda_graph_impl == "transformer_engine"
    assert [getattr(m, "name", m) for m in vision.cuda_graph_modules] == ["attn"]
    assert vision.max_vision_cuda_graph_seq_length == 7776


@needs_stack
def test_qwen35_provider_has_no_vision_graph_fields(recipes: RecipeCache) -> None:
    """Rule O012's first reason: the Qwen3.5 provider declares none of the three fields."""
    spec = make_spec("engine=megatron", "dry_run=true", "model=qwen35_vl_35b_a3b", "cluster=b200",
                     "parallelism=3d", "cuda_graph.vision=true")  # fmt: skip
    assert "O012" in {f.code for f in validate(spec)}
    with pytest.raises(AttributeError, match="no field 'vision_cuda_graph_impl'"):
        apply_overrides(recipes.config(spec), spec)


# What Megatron Core / Bridge raise on CPU for the settings our engine rules reject (the library's
# message, matched), each next to the same setting the rule accepts.
REJECTED = [
    ("X001", (*B200, "router.pad_to_capacity=true"), "moe_expert_capacity_factor must be set"),
    ("X003", (*B200, "dispatcher=deepep", "router=drop_and_pad"), "does not support moe_pad_expert_input_to_capacity"),
    (
        "X004",
        (*THREE_D, "cuda_graph=te_moe", "router.capacity_factor=1.0"),
        "moe_preprocess cuda graph is not supported",
    ),
    ("O008", (*B200, "offload=activations", "recompute=selective"), "CPU offloading does not work"),
    ("O008", (*B200, "offload=activations", "parallelism=3d", "pp=2"), "no support for Pipeline parallelism"),
    ("O008", (*THREE_D, "offload=activations", "cuda_graph=te_moe"), "CUDA graphs not supported with CPU offloading"),
]  # fmt: skip


@needs_stack
@pytest.mark.parametrize(
    ("code", "overrides", "message"), REJECTED, ids=[f"{c}-{i}" for i, (c, *_) in enumerate(REJECTED)]
)
def test_the_library_rejects_what_the_rules_reject(
    recipes: RecipeCache, engine_environment: Any, code: str, overrides: tuple[str, ...], message: str
) -> None:
    assert code in {f.code for f in validate(make_spec(*overrides)) if f.is_error}
    with pytest.raises((ValueError, AssertionError), match=message):
        updated(recipes, engine_environment, *overrides)
    REPORT.append(f"tuning: {code} confirmed by the library on CPU ({message!r})")


@needs_stack
def test_tp_overlap_without_tp_is_dropped_silently(recipes: RecipeCache, engine_environment: Any) -> None:
    """Rule O004: Bridge accepts tp_comm_overlap with TP 1 and turns it off with a log line
    (training/comm_overlap.py:442-451): the run would measure no TP overlap."""
    overrides = (*THREE_D, "overlap.tp_comm=true")
    assert "O004" in {f.code for f in validate(make_spec(*overrides))}
    _, cfg = updated(recipes, engine_environment, *overrides)
    assert cfg.comm_overlap.tp_comm_overlap is True and cfg.model.tp_comm_overlap is False


@needs_stack
def test_bucket_size_counts_parameters_and_reaches_ddp(recipes: RecipeCache, engine_environment: Any) -> None:
    """Without the knob, CommOverlapConfig gives DP > 1 its 128 x 1024^2-parameter buckets
    (training/comm_overlap.py:576-577); with it, ours."""
    _, cfg = updated(recipes, engine_environment, *THREE_D, "overlap=dp")
    assert cfg.ddp.bucket_size == 128 * 1024 * 1024


@needs_stack
def test_a_negative_capacity_factor_becomes_dropless(recipes: RecipeCache, engine_environment: Any) -> None:
    """Rule X002: Megatron Core turns a negative factor into None, dropless (transformer_config.py:1660-1662)."""
    from megatron.bridge.training.config import runtime_config_update

    spec = make_spec(*B200, "router.capacity_factor=-1")
    assert "X002" in {f.code for f in validate(spec) if f.is_error}
    cfg = recipes.config(spec)
    apply_overrides(cfg, spec)
    engine_environment(spec)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        runtime_config_update(cfg)
    assert cfg.model.moe_expert_capacity_factor is None
