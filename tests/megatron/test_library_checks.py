"""Each library-backed check (moe_vlm/engines/megatron/library_checks.py) fires where the library
refuses, and stays quiet on the neighbouring configuration it accepts; the plan runs them."""

from __future__ import annotations

import pytest

from moe_vlm.engines.megatron.config import apply_overrides
from moe_vlm.run.plan import library_findings
from tests.conftest import make_spec
from tests.megatron.conftest import RecipeCache, needs_stack

GB200 = ("engine=megatron", "dry_run=true", "cluster=gb200", "model=qwen3_vl_30b_a3b", "nodes=2")
TP_OVERLAP = (*GB200, "parallelism=3d", "tp=2", "ep=4", "overlap.tp_comm=true")

# check -> (firing overrides, quiet overrides, text of the library's refusal)
CASES = {
    "LIB-ROUTER": ((*GB200, "router.dtype=fp64"), (*GB200, "router.dtype=fp32"), "float64 router type"),
    "LIB-TE-UB": (
        (*TP_OVERLAP, "precision=nvfp4"),
        (*TP_OVERLAP, "precision=fp8mx"),
        "Unsupported quantizer for Userbuffers",
    ),
    # On 3D, where Megatron FSDP does not turn gradient-reduce overlap back on (rule O015 says it first)
    "LIB-ARGS": (
        (*GB200, "parallelism=3d", "ep=8", "overlap.param_gather=true", "overlap.grad_reduce=false"),
        (*GB200, "parallelism=3d", "ep=8", "overlap=dp"),
        "Must use --overlap-param-gather with --overlap-grad-reduce",
    ),
    # Bridge's CUDA-graph validation (rule G002 says the same before the library runs)
    "LIB-BRIDGE": (
        (*GB200, "parallelism=3d", "ep=8", "cuda_graph.impl=local", "cuda_graph.scope=[moe_router]"),
        (*GB200, "parallelism=3d", "ep=8", "cuda_graph=te_moe"),
        "",
    ),
}


def _checks(recipes: RecipeCache, overrides: tuple[str, ...]) -> dict[str, str]:
    from moe_vlm.engines.megatron.library_checks import check_config

    spec = make_spec(*overrides)
    cfg = recipes.config(spec)
    apply_overrides(cfg, spec)
    return {f.check.value: f.line() for f in check_config(cfg, spec)}


@needs_stack
@pytest.mark.parametrize("check", sorted(CASES))
def test_check_fires_and_stays_quiet(recipes: RecipeCache, check: str) -> None:
    firing, quiet, text = CASES[check]
    fired = _checks(recipes, firing)
    assert check in fired and text in fired[check], fired
    assert _checks(recipes, quiet) == {}


@needs_stack
def test_vision_config_is_checked_on_its_final_values(recipes: RecipeCache) -> None:
    """The provider's ViT config, rebuilt through TransformerConfig's own checks."""
    from moe_vlm.engines.megatron.library_checks import vision_config

    spec = make_spec(*GB200, "recompute=full")
    cfg = recipes.config(spec)
    apply_overrides(cfg, spec)
    vit = vision_config(cfg.model)
    assert vit.recompute_granularity == "full" and vit.num_moe_experts is None
    assert "LIB-VISION" not in _checks(recipes, (*GB200, "recompute=full"))


@needs_stack
def test_the_plan_reports_a_library_refusal() -> None:
    found = library_findings(make_spec(*GB200, "router.dtype=fp64"))
    assert [(f.code, f.is_error) for f in found] == [("LIB-ROUTER", True)]
    assert library_findings(make_spec("cluster=local")) == []


def test_the_plan_says_when_the_checks_could_not_run(monkeypatch: pytest.MonkeyPatch) -> None:
    from moe_vlm.engines.megatron import library_checks

    monkeypatch.setattr(library_checks, "stack_problem", lambda: "no Megatron here")
    monkeypatch.setattr(library_checks, "_STACK_IMPORTED", [])  # as in a process that never imported it
    found = library_findings(make_spec(*GB200))
    assert [(f.code, f.is_error) for f in found] == [("LIB-STACK", False)]
    assert "did not run" in found[0].message and "no Megatron here" in found[0].message


@needs_stack
def test_megatron_lm_sees_the_uneven_split_and_the_virtual_stages(recipes: RecipeCache) -> None:
    """LIB-ARGS hands validate_args the pipeline split under Megatron-LM's own argument names (its
    args -> TransformerConfig map, training/argument_utils.py:307-311, read backwards): an uneven
    split passes its layers-divisible-by-PP check (arguments.py:951-963), and the virtual stages
    reach its interleaved-schedule checks (arguments.py:942-943, 966-975) instead of being dropped."""
    from megatron.training.arguments import validate_args

    from moe_vlm.engines.megatron.effective import rank_environment, runtime_update
    from moe_vlm.engines.megatron.library_checks import training_args

    uneven = (*GB200, "model=qwen3_vl_235b_a22b", "nodes=16", "parallelism=3d", "pp=8", "ep=8",
              "parallelism.first_stage_layers=10", "parallelism.last_stage_layers=12")  # fmt: skip
    virtual = (*GB200, "model=qwen35_vl_35b_a3b", "nodes=2", "parallelism=3d", "pp=2", "vp=2", "ep=8")
    for overrides, first, last, vp in ((uneven, 10, 12, None), (virtual, None, None, 2)):
        spec = make_spec(*overrides)
        cfg = recipes.config(spec)
        apply_overrides(cfg, spec)
        update = runtime_update(cfg, spec, planned=True)
        assert update.error is None, update.error
        args = training_args(update.config, spec)
        assert (args.decoder_first_pipeline_num_layers, args.decoder_last_pipeline_num_layers) == (
            first,
            last,
        )
        with rank_environment(spec, set(cfg.env_vars), True):  # as check_config runs it: the job's GPU
            validate_args(args)
        assert args.virtual_pipeline_model_parallel_size == vp
    assert _checks(recipes, uneven) == {} and _checks(recipes, virtual) == {}
