"""Routing, the recipe family, HybridEP tuning and the effective configuration, on the real
ConfigContainer after Bridge's own runtime_config_update (CPU; the cluster's GPU answers Bridge's
device query, as tests/megatron/conftest.py's engine_environment does).

What each test stands on, in the installed library:
- perf recipes force random routing: perf_recipes/qwen_vl/<gpu>/qwen3_vl.py (e.g. gb200 :219),
  qwen_vl/common.py:62; MCore: transformer_config.py:812-814, router.py:856-858;
- HybridEP tuning: perf_recipes/_common.py:86-87 (32 SMs), the GB200 recipes' env
  (NUM_OF_TOKENS_PER_CHUNK_COMBINE_API=128); MCore routes a set deprecated SM alias into
  moe_flex_dispatcher_num_sms whatever the backend (transformer_config.py:1616-1635);
- the runtime update: training/config.py:1853-1888.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from moe_vlm.config.spec import RunSpec
from moe_vlm.engines.megatron.config import apply_overrides, build_config, check_overrides
from moe_vlm.engines.megatron.effective import Effective, differing, effective_config, plan_effective
from moe_vlm.knobs.bridge_recipe import family_recipes, select_recipe
from tests.conftest import make_spec
from tests.megatron.conftest import REPORT, RecipeCache, needs_stack

MEG = ("engine=megatron", "dry_run=true")
# The same model and knobs on 8 GPUs of each cluster (GB200 has 4 per node).
GB200 = (*MEG, "model=qwen3_vl_30b_a3b", "cluster=gb200", "nodes=2")
H200 = (*MEG, "model=qwen3_vl_30b_a3b", "cluster=h200", "nodes=1")
B200 = (*MEG, "model=qwen3_vl_30b_a3b", "cluster=b200", "nodes=1")
MODELS = ("qwen3_vl_30b_a3b", "qwen3_vl_235b_a22b", "qwen35_vl_35b_a3b", "tiny_moe_vlm")
CLUSTERS = ("gb200", "b200", "h100", "h200", "gb300", "b300", "local")


def effective(recipes: RecipeCache, *overrides: str) -> tuple[RunSpec, Any, Effective]:
    spec = make_spec(*overrides)
    cfg = recipes.config(spec)
    apply_overrides(cfg, spec)
    assert check_overrides(cfg, spec) == []
    return spec, cfg, effective_config(cfg, spec, planned=True)


def field(result: Effective, name: str) -> Any:
    """A dotted effective field; absent = equal to the library default."""
    return result.flat().get(name, "<library default>")


# --- routing -----------------------------------------------------------------------------------


@needs_stack
@pytest.mark.parametrize("cluster", ["gb200", "b200", "h100", "h200"])
def test_perf_recipes_force_balance_and_the_knob_routes_for_real(recipes: RecipeCache, cluster: str) -> None:
    overrides = (*MEG, "model=qwen3_vl_30b_a3b", f"cluster={cluster}", "nodes=2")
    raw = recipes.config(make_spec(*overrides))
    assert raw.model.moe_router_force_load_balancing is True  # every perf recipe sets it
    _, cfg, real = effective(recipes, *overrides)
    assert cfg.model.moe_router_force_load_balancing is False
    assert field(real, "model.moe_router_force_load_balancing") == "<library default>"  # MCore's False
    _, cfg, forced = effective(recipes, *overrides, "router=forced_balance")
    assert cfg.model.moe_router_force_load_balancing is True
    assert field(forced, "model.moe_router_force_load_balancing") is True


# --- one recipe family ---------------------------------------------------------------------------


@needs_stack
@pytest.mark.parametrize("model", MODELS)
def test_every_cluster_starts_from_the_model_s_perf_family(recipes: RecipeCache, model: str) -> None:
    """H3: the general recipe differs from every perf recipe in fusions, gradient-reduce precision,
    NaN checks, tokenizer and LR schedule; no cluster gets it any more."""
    families = set()
    for cluster in CLUSTERS:
        spec = make_spec(*MEG, f"model={model}", f"cluster={cluster}")
        recipe = select_recipe(spec)
        assert recipe is not None and recipe.module.startswith("megatron.bridge.perf_recipes.qwen_vl.")
        families.add(recipe.family)
        cfg = recipes.config(spec)
        assert (cfg.model.moe_router_fusion, cfg.model.cross_entropy_fusion_impl) == (True, "te"), cluster
        assert cfg.ddp.grad_reduce_in_fp32 is False and cfg.ddp.check_for_nan_in_grad is False, cluster
        assert cfg.rerun_state_machine.check_for_nan_in_loss is False, cluster
        assert (cfg.tokenizer.tokenizer_type, cfg.tokenizer.tokenizer_model) == ("NullTokenizer", None)
        assert (cfg.scheduler.lr_warmup_iters, cfg.scheduler.lr_decay_iters) == (10, 50), cluster
        assert cfg.comm_overlap is not None, cluster  # TP overlap config present, as on every perf recipe
    assert len(families) == 1, families


@needs_stack
@pytest.mark.parametrize("dispatcher", ["alltoall", "hybridep"])
def test_gb200_and_h200_plans_show_one_family_and_their_differences(dispatcher: str) -> None:
    """Done-when of issue 12: the same model and knobs on GB200 and H200, side by side."""
    from moe_vlm.rules import validate
    from moe_vlm.run.plan import render

    gb200, h200 = make_spec(*GB200, f"dispatcher={dispatcher}"), make_spec(*H200, f"dispatcher={dispatcher}")
    planned = {"gb200": plan_effective(gb200), "h200": plan_effective(h200)}
    assert planned["gb200"].recipe.family == planned["h200"].recipe.family
    assert (planned["gb200"].recipe.gpu, planned["h200"].recipe.gpu) == ("gb200", "h100")
    differ = differing({c: p.effective.flat() for c, p in planned.items()})
    # What remains different, all of it: the H100 recipe's inert moe_a2a_overlap attribute (nothing
    # in Megatron reads it), and with HybridEP the GB200 recipe's tuning and the NVLink topology.
    expected = ["model.moe_a2a_overlap"]
    if dispatcher == "hybridep":
        expected += [
            "model.moe_flex_dispatcher_num_sms",
            "model.moe_hybridep_num_sms",
            "env_vars.NUM_OF_TOKENS_PER_CHUNK_COMBINE_API",
            "env_vars.NVLINK_DOMAIN_SIZE",
            "env_vars.USE_MNNVL",
        ]
    assert sorted(differ) == sorted(expected)
    REPORT.append(f"gb200 vs h200 ({dispatcher}): same recipe family; differing effective fields: {differ}")
    plans = {name: render(spec, validate(spec)) for name, spec in (("gb200", gb200), ("h200", h200))}
    family_lines = {
        name: [ln for ln in text.splitlines() if ln.startswith("recipe family")]
        for name, text in plans.items()
    }
    assert family_lines["gb200"] == family_lines["h200"] and len(family_lines["gb200"]) == 1
    for text in plans.values():
        assert "-- effective configuration" in text and "moe_router_fusion" in text
        assert "routing        real" in text
    # Each plan states what differs across the family for its own point, side by side.
    assert "model.moe_a2a_overlap" in plans["h200"].split("-- recipe family")[1]


# --- HybridEP tuning -----------------------------------------------------------------------------


@needs_stack
def test_gb200_hybridep_tuning_is_kept_unless_a_knob_asks(recipes: RecipeCache) -> None:
    base = (*GB200, "dispatcher=hybridep")
    _, _, kept = effective(recipes, *base)
    # MCore routes the recipe's 32 (the deprecated alias) into the flex SM count: the recipe's value.
    assert field(kept, "model.moe_flex_dispatcher_num_sms") == 32
    assert field(kept, "env_vars.NUM_OF_TOKENS_PER_CHUNK_COMBINE_API") == "128"
    assert field(kept, "env_vars.USE_MNNVL") == "1"
    _, _, asked = effective(
        recipes, *base, "dispatcher.num_sms=24", "dispatcher.hybridep_tokens_per_chunk_combine=64"
    )
    assert field(asked, "model.moe_flex_dispatcher_num_sms") == 24
    assert field(asked, "model.moe_hybridep_num_sms") == "<library default>"
    assert field(asked, "env_vars.NUM_OF_TOKENS_PER_CHUNK_COMBINE_API") == "64"
    _, _, no_mnnvl = effective(recipes, *base, "dispatcher.hybridep_use_mnnvl=false")
    assert field(no_mnnvl, "env_vars.USE_MNNVL") == "0"  # forced off on NVL72


@needs_stack
def test_the_gb200_hybridep_sm_count_never_sizes_deepep(tmp_path: Path) -> None:
    # The GB200 recipe (moe_hybridep_num_sms=32) under a DeepEP run: MCore would route that alias
    # into moe_flex_dispatcher_num_sms for DeepEP too, so the table clears it.
    spec = make_spec(*B200, "dispatcher=deepep")
    gb200_recipe = select_recipe(make_spec(*GB200))
    built = build_config(spec, tmp_path, gb200_recipe)
    assert built.cfg.model.moe_hybridep_num_sms is None
    result = effective_config(built.cfg, spec, tmp_path, planned=True)
    assert result.error is None
    assert field(result, "model.moe_flex_dispatcher_num_sms") == "<library default>"  # DeepEP's own


# --- the effective configuration ------------------------------------------------------------------


@needs_stack
def test_effective_config_is_bridge_s_update_and_leaves_the_process_as_it_was(recipes: RecipeCache) -> None:
    spec = make_spec(*GB200, "parallelism=3d", "tp=2")
    cfg = recipes.config(spec)
    apply_overrides(cfg, spec)
    env, query = dict(os.environ), torch.cuda.get_device_properties
    os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"  # this shell's value: the plan shows the recipe's
    try:
        result = effective_config(cfg, spec, planned=True)
        assert field(result, "env_vars.CUDA_DEVICE_MAX_CONNECTIONS") == "32"
        assert os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] == "1" and result.env_from_process == {}
        # A run uses its rank's environment: the launcher's value wins (setdefault) and is named.
        os.environ.update(WORLD_SIZE="8", RANK="0")
        ran = effective_config(cfg, spec, planned=False)
        assert field(ran, "env_vars.CUDA_DEVICE_MAX_CONNECTIONS") == "1"
        assert ran.env_from_process == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    finally:
        os.environ.clear()
        os.environ.update(env)
    assert dict(os.environ) == env and torch.cuda.get_device_properties is query
    assert cfg.comm_overlap.data_parallel_size is None  # the engine's config is untouched: a copy ran
    # Sections in the order, each only what differs from the library's defaults.
    assert list(result.sections)[:5] == ["model", "ddp", "optimizer", "comm_overlap", "mixed_precision"]
    assert field(result, "comm_overlap.data_parallel_size") == 4  # set by the update (8 GPUs / TP 2)
    assert field(result, "model.tp_comm_overlap") is True  # GB200 recipe's TP overlap, TP > 1
    assert field(result, "mixed_precision.grad_reduce_in_fp32") is False  # perf precision
    assert "model.hidden_dropout" in result.flat() and "model.add_qkv_bias" not in result.flat()
    json.dumps(result.to_record())  # JSON-safe as run.json stores it


@needs_stack
def test_a_config_bridge_rejects_is_reported_not_raised(recipes: RecipeCache) -> None:
    # Bridge's flex-dispatcher check rejects DeepEP on GB200 (training/flex_dispatcher_backend.py:108).
    spec = make_spec(*GB200, "dispatcher=deepep")
    cfg = recipes.config(spec)
    apply_overrides(cfg, spec)
    result = effective_config(cfg, spec, planned=True)
    assert result.error is not None and "deepep" in result.error.lower()
    assert result.lines()[0].startswith("Bridge's runtime update REJECTS this config")


@needs_stack
def test_the_family_comparison_builds_every_perf_recipe_of_the_model() -> None:
    spec = make_spec(*MEG, "model=qwen35_vl_35b_a3b", "cluster=h200")
    assert [r.gpu for r in family_recipes(spec)] == ["h100", "gb200", "b200", "gb300", "b300"]
    planned = plan_effective(spec)
    assert list(planned.family) == ["h100", "gb200", "b200", "gb300", "b300"]
    assert all(e.error is None for e in planned.family.values())


@needs_stack
def test_run_json_records_the_effective_config_and_report_diff_reads_it(tmp_path: Path) -> None:
    """run.json as the engine writes it (launch._write_run_json), for a GB200 and an H200 run."""
    from moe_vlm.base.files import STEPS_JSONL
    from moe_vlm.cli import report as report_cli
    from moe_vlm.engines.megatron.launch import _write_run_json
    from moe_vlm.record.records import StepWriter
    from moe_vlm.run.task import resolved_config
    from tests.conftest import compose_cfg
    from tests.unit.test_metrics import step_records

    runs = {}
    for name, overrides, step_time in (("a", GB200, 3.0), ("b", H200, 4.0)):
        run_dir = tmp_path / name
        spec, config = make_spec(*overrides), resolved_config(compose_cfg(*overrides))
        built = build_config(spec, run_dir)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = effective_config(built.cfg, spec, run_dir, planned=True)
        components = {"vision_encoder": 0.5, "projector": 0.1, "decoder": step_time - 1.0}
        with StepWriter(run_dir / STEPS_JSONL) as writer:
            for line in step_records(spec, [step_time] * spec.train_iters, components_s=components):
                writer.write(line)
        _write_run_json(spec, config, run_dir, built, result)
        runs[name] = run_dir
    record = json.loads((runs["b"] / "run.json").read_text())
    bridge = record["bridge"]
    assert bridge["recipe_kind"] == "stand-in" and bridge["recipe_gpu"] == "h100"
    assert bridge["effective"]["sections"]["model"]["moe_a2a_overlap"] is True
    assert bridge["effective"]["sections"]["model"]["hf_model_id"] == "<run_dir>/hf_config/qwen3_vl_30b_a3b"
    from contextlib import redirect_stdout
    from io import StringIO

    out = StringIO()
    with redirect_stdout(out):
        assert report_cli.main(["--diff", str(runs["a"]), str(runs["b"])]) == 0
    text = out.getvalue()
    effective_part = text.split("## Bridge's effective configuration")[1]
    assert "model.moe_a2a_overlap" in effective_part and "hf_model_id" not in effective_part
    assert "cluster.name" in text.split("## Knobs")[1]
    assert "A runs at 1.333x B's effective tokens/s/GPU" in text


# --- the vision model's TransformerConfig ---------------------------------------------------------


def provided_vision_config(model: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The TransformerConfig the real provide() hands the vision model: Qwen3VLModel is built by the
    provider (layer specs, process groups of one gloo rank, get_vision_model_config) up to the
    vision tower, whose construction (TE layers: a GPU) is stopped once it receives its config."""
    from megatron.bridge.models.qwen_vl.modelling_qwen3_vl import model as qwen3_vl_model

    from moe_vlm.runtime.dist_env import free_port
    from tests.megatron.recording_ranks import join_megatron, leave_megatron

    class Received(Exception):
        pass

    def vision_model(config: Any, *_args: Any, **_kwargs: Any) -> Any:
        raise Received(config)

    monkeypatch.setattr(qwen3_vl_model, "Qwen3VLVisionModel", vision_model)
    join_megatron(0, 1, free_port(), pp=1)
    try:
        with pytest.raises(Received) as received:
            model.provide(pre_process=True, post_process=True)
    finally:
        leave_megatron()
    return received.value.args[0]


@needs_stack
@pytest.mark.parametrize(
    "knobs",
    [
        ("precision=fp8mx", "recompute=full"),
        ("precision=nvfp4", "parallelism=3d", "tp=2", "ep=4"),
        (
            "precision=bf16",
            "parallelism=3d",
            "ep=8",
            "cuda_graph.vision=true",
            "cuda_graph.vision_max_seq_length=8192",
        ),
    ],
)
def test_the_effective_config_shows_the_vision_config_provide_builds(
    recipes: RecipeCache, monkeypatch: pytest.MonkeyPatch, knobs: tuple[str, ...]
) -> None:
    import copy

    from megatron.bridge.training.config import runtime_config_update

    from moe_vlm.engines.megatron import effective as eff

    spec, cfg, result = effective(recipes, *GB200, *knobs)
    assert result.error is None, result.error
    updated = copy.deepcopy(cfg)
    with eff.rank_environment(spec, set(cfg.env_vars), planned=True), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        runtime_config_update(updated)  # what effective_config ran on its copy
    provided = provided_vision_config(updated.model, monkeypatch)
    # Ours is the provider's, field by field (callables by name).
    assert eff.leaves(eff.vision_config(updated.model)) == eff.leaves(provided)
    section = result.sections[eff.VISION_SECTION]
    assert list(result.sections)[-1] == eff.VISION_SECTION
    for name in ("fp8", "fp4", "recompute_granularity", "cuda_graph_impl", "tensor_model_parallel_size"):
        assert section[name] == eff.plain(getattr(provided, name)), name
    # Whatever the decoder's format, the vision tower's config has none: it runs BF16.
    assert provided.fp8 is None and provided.fp4 is None and section["precision"] == "bf16"
    fmt = spec.precision.format.value
    assert (updated.model.fp8 is not None) == fmt.startswith("fp8")
    assert (updated.model.fp4 is not None) == (fmt == "nvfp4")
    assert provided.recompute_granularity == updated.model.recompute_granularity
    assert provided.cuda_graph_impl == ("transformer_engine" if spec.cuda_graph.vision else "none")
    assert provided.sequence_parallel is False and provided.tensor_model_parallel_size == spec.layout.tp
    assert any(line.strip().startswith("precision") for line in result.lines())
    json.dumps(result.to_record())
