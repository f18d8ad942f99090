"""Our rule catalogue agrees with the engine, configuration by configuration.

For every configuration of the corpus (each rule's firing and quiet case from tests/unit, every
option of every config group, every sweep-preset point, and engine edge cases below) we build
the real ConfigContainer the engine would run and let the engine judge it:

- on the CPU, with the engine's own pre-flight: ``runtime_config_update`` (the recipe's env,
  mixed precision and comm-overlap setup, then ``ConfigContainer.validate``, which runs Bridge's
  dataset, FSDP, CUDA-graph and flex-dispatcher checks and Megatron Core's TransformerConfig
  post-init). Its device query answers with the GPU of the cluster profile;
- for the rules the engine applies only on the device (model build, dispatcher construction,
  data loading), from their documented condition, read off the engine's config; the test also
  checks that the library still states the condition where we cite it.

Then: a configuration we accept is never rejected by the engine, and a configuration one of our
engine rules rejects is rejected by it. Rules that are ours alone (measurement hygiene, the torch
engine's limits, knobs the engine would ignore) may reject what the engine accepts: they are
counted and listed as "stricter than the engine", never as agreement. Rules that reject what the
engine's pre-flight accepts but its run crashes on (graph capture, model build, the first step)
are counted on a line of their own, with where the run would crash; tests/megatron/
test_first_contact.py runs the library code behind each on CPU.
"""

from __future__ import annotations

import importlib.util
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from moe_vlm.config.spec import RunSpec
from moe_vlm.engines.megatron.config import apply_overrides, check_overrides
from moe_vlm.rules import CATALOGUE, errors, validate
from tests.conftest import make_spec
from tests.megatron.conftest import REPORT, RecipeCache, needs_stack
from tests.megatron.test_config_container import BASE, COMPANIONS, group_options, sweep_points

# Rules whose rejection the engine performs itself in its CPU pre-flight.
ENGINE_CPU = {
    "A001": "EnergonDatasetConfig.validate (buffer packing: our provider's finalize): path must be set",
    "A003": "ConfigContainer.validate: in-batch packing needs micro_batch_size > 1",
    "A010": "TransformerConfig: the allgather dispatcher does not support variable sequence lengths",
    "D001": "validate_flex_dispatcher_backend: DeepEP on Ampere/Hopper/B200/B300 only",
    "D002": "validate_flex_dispatcher_backend: HybridEP on compute capability 8/9/10 only",
    "D006": "TransformerConfig: overlap_moe_expert_parallel_comm prerequisites",
    "G002": "validate_cuda_graph_configuration: local impl only for full-iteration graphs",
    "G003": "TransformerConfig: moe and moe_router graph modules are exclusive",
    "G004": "TransformerConfig: moe_preprocess needs moe_router",
    "G005": "TransformerConfig: moe graph module only for drop-and-pad MoE",
    "G006": "TransformerConfig: mlp graph module only for dense layers",
    "G007": "TransformerConfig: full recompute only with full-iteration graphs",
    "G008": "TransformerConfig: moe recompute with a TE moe_router graph",
    "L001": "ConfigContainer.get_data_parallel_size: world divisible by TP x PP x CP",
    "L006": "ConfigContainer.validate: the (eval) global batch divisible by MBS x DP",
    "L007": "ConfigContainer.validate: seq_length multiple of the CP/SP collate padding",
    "G001": "TransformerConfig: cuda_graph_modules are CudaGraphModule names",
    "X001": "TransformerConfig: padding to capacity needs a capacity factor",
    "X003": "TransformerConfig: the DeepEP flex backend cannot pad to capacity",
    "X004": "TransformerConfig: no moe_preprocess graph while alltoall drops tokens",
    "O008": "TransformerConfig: CPU activation offload needs PP 1, no recompute, no per-layer graphs",
}


@dataclass(frozen=True)
class Documented:
    """A rule the engine applies on the device, and where the installed library states it."""

    module: str  # importable module whose source holds `text`
    text: str
    rejects: Callable[[Any], bool]  # the documented condition, read off the engine's config
    crashes_at: str = ""  # run-time rules: where the run would crash


def _model(cfg: Any) -> Any:
    return cfg.model


def _graph_modules(cfg: Any) -> set[str]:
    return {getattr(m, "name", str(m)) for m in (cfg.model.cuda_graph_modules or [])}


def _first_chunk_layers(cfg: Any) -> int:
    m = cfg.model
    vp = m.virtual_pipeline_model_parallel_size or 1
    first = m.num_layers_in_first_pipeline_stage or m.num_layers // m.pipeline_model_parallel_size
    return first // vp


def _world() -> int:
    import os

    return int(os.environ["WORLD_SIZE"])


def _layers_split_unevenly(cfg: Any) -> bool:
    """MCore's get_num_layers_to_build: the layers of each stage split evenly over PP (and VP)."""
    m = cfg.model
    pp, vp = m.pipeline_model_parallel_size, m.virtual_pipeline_model_parallel_size or 1
    if pp <= 1:
        return False
    first, last = m.num_layers_in_first_pipeline_stage or 0, m.num_layers_in_last_pipeline_stage or 0
    middle_stages = pp - (first > 0) - (last > 0)
    middle = m.num_layers - first - last
    if middle_stages <= 0:
        return middle != 0
    per_stage = [first] * (first > 0) + [last] * (last > 0) + [middle // middle_stages]
    return middle % middle_stages != 0 or any(layers % vp for layers in per_stage)


ON_DEVICE = {
    "L004": Documented(
        "megatron.core.transformer.transformer_block",
        "should be divisible by",
        _layers_split_unevenly,
    ),
    "L005": Documented(
        "megatron.core.utils",
        "is not divisible by",
        lambda cfg: cfg.model.num_attention_heads % cfg.model.tensor_model_parallel_size != 0,
    ),
    "L008": Documented(
        "megatron.core.parallel_state",
        "pipeline-model-parallel size should be greater than 1 with interleaved schedule",
        lambda cfg: (
            cfg.model.virtual_pipeline_model_parallel_size is not None
            and cfg.model.pipeline_model_parallel_size <= 1
        ),
    ),
    "L002": Documented(
        "megatron.core.parallel_state",
        "is not divisible by expert_tensor_model_pipeline_parallel size",
        lambda cfg: (
            _world()
            % (
                (cfg.model.expert_tensor_parallel_size or cfg.model.tensor_model_parallel_size)
                * cfg.model.expert_model_parallel_size
                * cfg.model.pipeline_model_parallel_size
            )
            != 0
        ),
    ),
    "D003": Documented(
        "megatron.core.transformer.moe.token_dispatcher",
        "DeepEP dispatcher requires TPxEP > 1",
        lambda cfg: (
            _model(cfg).moe_token_dispatcher_type == "flex"
            and _model(cfg).moe_flex_dispatcher_backend == "deepep"
            and _model(cfg).tensor_model_parallel_size * _model(cfg).expert_model_parallel_size <= 1
        ),
    ),
    "G009": Documented(
        "megatron.core.transformer.cuda_graphs",
        "transformer_module.position_embedding_type == 'rope'",
        lambda cfg: (
            cfg.model.position_embedding_type == "mrope"
            and cfg.model.cuda_graph_impl == "transformer_engine"
            and ("attn" in _graph_modules(cfg) or not _graph_modules(cfg))
        ),
    ),
    "G010": Documented(
        "megatron.bridge.models.qwen_vl.modelling_qwen3_vl.model",
        "Qwen3-VL MoE with CUDA graph requires fixed sequence lengths",
        lambda cfg: cfg.model.cuda_graph_impl != "none" and bool(cfg.model.variable_seq_lengths),
    ),
    "L013": Documented(
        "megatron.bridge.models.qwen_vl.modelling_qwen3_vl.model",
        "the deepstack_visual_embeds should on the first pp-stage of language model",
        lambda cfg: (
            len(getattr(cfg.model.vision_config, "deepstack_visual_indexes", None) or [])
            > _first_chunk_layers(cfg)
        ),
    ),
    # TE's own capability check for the model's format, on the device the cluster declares.
    "P001": Documented(
        "transformer_engine.pytorch.quantization",
        "Device compute capability 10.0 or higher required for MXFP8 execution.",
        lambda cfg: _te_refuses_the_format(cfg),
    ),
}


def _te_refuses_the_format(cfg: Any) -> bool:
    import torch
    from transformer_engine.pytorch import quantization

    m = cfg.model
    check = "_compute_mxfp8_support" if m.fp8 and m.fp8_recipe == "mxfp8" else "_compute_fp8_support"
    check = "_compute_nvfp4_support" if m.fp4 else check if m.fp8 else ""
    if not check:
        return False
    device = torch.cuda.get_device_properties(0)  # the cluster's declared GPU (engine_environment)
    original = quantization.get_device_compute_capability
    quantization.get_device_compute_capability = lambda: (device.major, device.minor)
    try:
        return not getattr(quantization, check)()[0]
    finally:
        quantization.get_device_compute_capability = original


def _builds_qwen3vl_model(cfg: Any) -> bool:
    """Both MoE providers build Qwen3VLModel (test_first_contact checks their provide())."""
    return type(cfg.model).__name__ in ("Qwen3VLMoEModelProvider", "Qwen35VLMoEModelProvider")


def _te_graphs_capture_layers(cfg: Any) -> bool:
    """TE per-layer graphs with a scope that selects MoE or attention layers (cuda_graphs.py _layer_is_graphable)."""
    modules = _graph_modules(cfg)
    return cfg.model.cuda_graph_impl == "transformer_engine" and (
        not modules or bool(modules & {"attn", "moe", "moe_router", "moe_preprocess"})
    )


# Rules the engine's pre-flight cannot see: the configuration builds and validates, then the run
# crashes. Each condition is read off the engine's config; the text is where the library says why.
RUN_TIME = {
    "F005": Documented(
        "megatron.bridge.training.train",
        "return not use_megatron_fsdp and use_distributed_optimizer and overlap_param_gather",
        lambda cfg: (
            bool(cfg.ddp.use_megatron_fsdp)
            and cfg.ddp.data_parallel_sharding_strategy != "no_shard"
            and _te_graphs_capture_layers(cfg)
        ),
        "CUDA-graph capture (TE refuses the layers Megatron FSDP hooks)",
    ),
    "G012": Documented(
        "megatron.bridge.models.qwen_vl.qwen3_vl_step",
        "max_seqlen_in_batch = seqlens_in_batch.max().item()",
        lambda cfg: cfg.model.cuda_graph_impl == "full_iteration" and _builds_qwen3vl_model(cfg),
        "full-iteration graph capture (host syncs in the Qwen3-VL step)",
    ),
    "D008": Documented(
        "megatron.core.pipeline_parallel.combined_1f1b",
        '"build_schedule_plan", return_model_obj=True',
        lambda cfg: bool(cfg.model.overlap_moe_expert_parallel_comm) and _builds_qwen3vl_model(cfg),
        "step 1 (Qwen3VLModel has no build_schedule_plan)",
    ),
    "L014": Documented(
        "megatron.core.transformer.transformer_layer",
        "vp_stage must be provided if virtual pipeline model parallel size is set",
        lambda cfg: (
            type(cfg.model).__name__ == "Qwen3VLMoEModelProvider"
            and cfg.model.virtual_pipeline_model_parallel_size is not None
        ),
        "model build (the Qwen3-VL-MoE provider drops vp_stage)",
    ),
    # Issue 19 (tests/megatron/test_runtime_refusals.py runs each library check on CPU).
    "P004": Documented(
        "megatron.core.distributed.fsdp.src.megatron_fsdp.mixed_precision",
        "of old_data doesn't match",
        lambda cfg: bool(cfg.ddp.use_megatron_fsdp) and bool(cfg.model.fp4_param),
        "model wrap (Megatron FSDP's buffers take NVFP4 weights for FP8: fp8_set_raw_data)",
    ),
    "P005": Documented(
        "transformer_engine.pytorch.module.base",
        "Unsupported quantizer for Userbuffers",
        lambda cfg: bool(cfg.model.fp4) and bool(cfg.model.tp_comm_overlap),
        "the first forward (TE's userbuffer all-gather refuses the NVFP4 quantizer)",
    ),
    "X009": Documented(
        "transformer_engine.pytorch.router",
        "Current TE does not support float64 router type.",
        lambda cfg: cfg.model.moe_router_dtype == "fp64" and bool(cfg.model.moe_router_fusion),
        "the first forward (TE's fused router refuses float64 logits)",
    ),
    "G013": Documented(
        "megatron.core.transformer.moe.token_dispatcher",
        "tokens_per_expert = self.local_map.sum(dim=0).long().cpu()",
        lambda cfg: (
            cfg.model.cuda_graph_impl == "transformer_engine"
            and "moe" in _graph_modules(cfg)
            and cfg.model.moe_token_dispatcher_type == "allgather"
        ),
        "CUDA-graph capture (the allgather dispatcher's host syncs inside the moe scope)",
    ),
    # Issue 49 (library_checks LIB-MOE runs MoELayer.forward's check on the config).
    "L015": Documented(
        "megatron.core.transformer.moe.moe_layer",
        "if self.training and self.attn_tp_group.size() > 1 and not self.config.sequence_parallel:",
        lambda cfg: (
            bool(cfg.model.num_moe_experts)
            and cfg.model.tensor_model_parallel_size > 1
            and not cfg.model.sequence_parallel
        ),
        "the first MoE forward (MoELayer refuses TP > 1 without sequence parallelism in training)",
    ),
}

# Engine edge cases beyond the rule cases: layouts, packing, graphs, and their combinations.
GB = ("engine=megatron", "dry_run=true", "cluster=gb200", "model=qwen3_vl_30b_a3b")
B2 = ("engine=megatron", "dry_run=true", "cluster=b200", "model=qwen3_vl_30b_a3b")
B35 = ("engine=megatron", "dry_run=true", "cluster=b200", "model=qwen35_vl_35b_a3b")
EXTRA: list[tuple[str, ...]] = [
    (*GB, "nodes=2", "dispatcher=hybridep", "cuda_graph=te_moe", "recompute=selective"),
    (*GB, "nodes=16", "model=qwen3_vl_235b_a22b", "dispatcher=hybridep", "parallelism=3d", "pp=8",
     "parallelism.first_stage_layers=10", "parallelism.last_stage_layers=12", "mbs=2"),
    (*B2, "nodes=2", "parallelism=3d", "tp=2", "ep=8"),
    (*B2, "nodes=2", "parallelism=3d", "tp=2", "ep=8", "parallelism.sequence_parallel=true"),
    (*B2, "nodes=2", "parallelism=3d", "tp=2", "seq_length=4094"),
    (*B2, "nodes=2", "parallelism=3d", "tp=4", "cp=2", "seq_length=4104"),
    (*B2, "nodes=2", "parallelism=3d", "tp=4", "cp=2", "seq_length=4096"),
    (*B2, "nodes=2", "parallelism=3d", "cp=2", "seq_length=4096", "data=synthetic"),
    (*B2, "nodes=4", "parallelism=3d", "pp=4", "vp=2", "dispatcher.overlap_moe_expert_parallel_comm=true"),
    (*B2, "nodes=4", "parallelism=3d", "pp=4", "dispatcher.overlap_moe_expert_parallel_comm=true"),
    (*B2, "dispatcher.overlap_moe_expert_parallel_comm=true", "dispatcher=allgather"),
    (*B2, "dispatcher=deepep", "cuda_graph=te_moe", "recompute=selective", "recompute.modules=[moe_act]"),
    (*B2, "cuda_graph=full_iteration", "recompute=full"),
    (*B2, "cuda_graph=te_moe", "cuda_graph.scope=[]"),
    (*B2, "data.packing=in_batch", "mbs=2"),
    (*B2, "data.packing=in_batch", "mbs=2", "cuda_graph=te_moe"),
    (*B2, "data.packing=in_batch", "mbs=2", "parallelism=3d", "cp=2", "seq_length=4096"),
    (*B2, "data=real", "data.path=/datasets/shards", "data.packing=in_batch", "mbs=2"),
    (*B2, "data=synthetic", "mbs=4", "vision_freeze=vision"),
    (*B2, "data=real", "data.path=/datasets/shards", "mbs=2"),
    (*B2, "data=real"),
    (*B35, "dispatcher=hybridep", "recompute=selective", "recompute.modules=[core_attn,gdn_norm_out]"),
    (*B35, "nodes=2", "parallelism=3d", "tp=2", "ep=8"),
    (*B2, "recompute=selective", "recompute.modules=[mla_up_proj]"),
    (*B2, "recompute=selective", "recompute.modules=[gdn_norm_out]"),
    (*B2, "recompute=selective", "recompute.modules=[shared_experts]"),
    (*B35, "recompute=selective", "recompute.modules=[shared_experts,moe_act,layernorm]"),
    (*B2, "recompute=selective", "recompute.modules=[core_attn,mlp,moe]"),
    ("engine=megatron", "dry_run=true", "cluster=h100", "model=qwen3_vl_30b_a3b", "nodes=2", "parallelism=3d",
     "pp=2", "vp=12", "ep=8"),
    ("engine=megatron", "dry_run=true", "cluster=h200", "model=qwen3_vl_30b_a3b", "dispatcher=deepep"),
    # Run-time crashes and their boundaries.
    (*B2, "parallelism=3d", "cuda_graph=te_moe"),
    (*B2, "parallelism.sharding_strategy=no_shard", "cuda_graph=te_moe"),
    (*B2, "parallelism.sharding_strategy=optim", "cuda_graph=te_moe"),
    (*B2, "parallelism=3d", "cuda_graph=full_iteration"),
    (*B35, "parallelism=3d", "cuda_graph=te_moe"),
    (*B35, "nodes=2", "parallelism=3d", "pp=2", "vp=2"),
    (*B35, "dispatcher.overlap_moe_expert_parallel_comm=true"),
    ("engine=megatron", "dry_run=true", "cluster=gb200", "model=qwen3_vl_235b_a22b", "nodes=16", "parallelism=3d",
     "pp=4", "vp=2", "dispatcher=hybridep"),
]  # fmt: skip


def corpus() -> list[tuple[str, tuple[str, ...]]]:
    from tests.unit.test_rules import CASES, SHARDS, long_shards

    def real(overrides: list[str]) -> tuple[str, ...]:  # the cases that name a real dataset get one
        return tuple(o.replace(SHARDS, long_shards()) if SHARDS in o else o for o in overrides)

    cases: list[tuple[str, tuple[str, ...]]] = []
    for code, (fires, quiet) in sorted(CASES.items()):
        cases += [(f"{code} fires", real(fires)), (f"{code} quiet", real(quiet))]
    for group, option in group_options():
        cases.append(
            (f"{group}={option}", (*BASE, f"{group}={option}", *COMPANIONS.get((group, option), ())))
        )
    for preset, point in sweep_points():
        cases.append((f"sweep={preset}", (*BASE, *point)))
    cases += [("edge", overrides) for overrides in EXTRA]
    seen: set[tuple[str, ...]] = set()
    unique = []
    for name, overrides in cases:
        if overrides not in seen:
            seen.add(overrides)
            unique.append((name, overrides))
    return unique


@dataclass
class Verdict:
    name: str
    overrides: tuple[str, ...]
    ours: set[str]  # error codes of our catalogue
    engine_cpu: str | None  # the engine's CPU pre-flight error, None when it passed
    engine_device: set[str]  # documented device conditions that hold
    rewritten: list[str]  # table rows the engine's pre-flight changed (empty: it runs what we planned)

    @property
    def engine_rejects(self) -> bool:
        return self.engine_cpu is not None or bool(self.engine_device)

    @property
    def ours_engine(self) -> set[str]:
        return self.ours & (set(ENGINE_CPU) | set(ON_DEVICE) | set(RUN_TIME))

    @property
    def crashes_only(self) -> bool:
        """The engine's pre-flight and build checks pass; the run would crash later (RUN_TIME)."""
        return self.engine_cpu is None and bool(self.engine_device) and self.engine_device <= set(RUN_TIME)

    def disagreement(self) -> str | None:
        if not self.ours and self.engine_rejects:
            return f"we accept, the engine rejects: {self.engine_cpu or sorted(self.engine_device)}"
        if self.ours_engine and not self.engine_rejects:
            return f"our engine rules {sorted(self.ours_engine)} reject, the engine accepts"
        return None


def judge(
    recipes: RecipeCache,
    prepare: Callable[[RunSpec], None],
    name: str,
    overrides: tuple[str, ...],
    spec: RunSpec,
) -> Verdict:
    from megatron.bridge.training.config import runtime_config_update

    ours = {f.code for f in errors(validate(spec))}
    cfg = recipes.config(spec)
    prepare(spec)
    engine_cpu = None
    try:
        apply_overrides(cfg, spec)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            runtime_config_update(cfg)
    except Exception as exc:  # the engine's verdict: any error its pre-flight raises
        engine_cpu = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    device = (
        set()
        if engine_cpu
        else {code for code, rule in {**ON_DEVICE, **RUN_TIME}.items() if rule.rejects(cfg)}
    )
    # What the engine will actually run: the table's values must survive its own finalisation.
    rewritten = [] if engine_cpu else check_overrides(cfg, spec)
    return Verdict(name, overrides, ours, engine_cpu, device, rewritten)


OPTIONAL_TRACKERS = ("mlflow", "wandb")


def _tracker_missing_here(engine_error: str | None) -> bool:
    if not engine_error or not engine_error.startswith("ModuleNotFoundError"):
        return False
    return any(
        f"'{name}'" in engine_error and importlib.util.find_spec(name) is None for name in OPTIONAL_TRACKERS
    )


@needs_stack
def test_device_rules_are_stated_where_we_cite_them() -> None:
    for code, rule in {**ON_DEVICE, **RUN_TIME}.items():
        spec = importlib.util.find_spec(rule.module)
        if spec is None or spec.origin is None:
            pytest.skip(f"{rule.module} not installed")
        assert rule.text in Path(spec.origin).read_text(), (
            f"{code}: {rule.module} no longer says {rule.text!r}"
        )


def test_classified_codes_exist() -> None:
    codes = {r.code for r in CATALOGUE}
    assert set(ENGINE_CPU) <= codes and set(ON_DEVICE) <= codes and set(RUN_TIME) <= codes
    assert all(rule.crashes_at for rule in RUN_TIME.values())


@needs_stack
@pytest.mark.slow
def test_catalogue_agrees_with_the_engine(recipes: RecipeCache, engine_environment: Any) -> None:
    specs = [(name, overrides, make_spec(*overrides)) for name, overrides in corpus()]
    # The torch engine's configurations (its own rule cases) are not the Megatron engine's to judge.
    megatron = [(name, overrides, spec) for name, overrides, spec in specs if spec.engine == "megatron"]
    judged = [judge(recipes, engine_environment, *case) for case in megatron]
    # Bridge imports an experiment tracker only when asked for it (logger=mlflow): where the package is
    # not in this venv the engine's refusal says nothing about the configuration, only about the venv.
    absent = [v for v in judged if _tracker_missing_here(v.engine_cpu)]
    verdicts = [v for v in judged if v not in absent]
    if absent:
        REPORT.append(
            f"not judged: {len(absent)} configuration(s) whose tracker package is not installed in this venv "
            f"({sorted({v.engine_cpu for v in absent if v.engine_cpu})})"
        )
    disagreements = [(v, v.disagreement()) for v in verdicts if v.disagreement()]
    accepted = sum(1 for v in verdicts if not v.ours and not v.engine_rejects)
    crashes = [v for v in verdicts if v.ours_engine and v.crashes_only]
    rejected = sum(1 for v in verdicts if v.ours_engine and v.engine_rejects) - len(crashes)
    stricter = [v for v in verdicts if v.ours and not v.ours_engine and not v.engine_rejects]
    both_other = len(verdicts) - accepted - rejected - len(crashes) - len(stricter) - len(disagreements)
    torch_runs = len(specs) - len(verdicts)
    REPORT.append(
        f"agreement: {len(verdicts) - len(disagreements)}/{len(verdicts)} engine=megatron configurations "
        f"agree with the engine (corpus of {len(specs)}, {torch_runs} torch-engine runs not judged)"
    )
    REPORT.append(
        f"  {accepted} accepted by both; {rejected} rejected by our engine rules and by the engine; "
        f"{len(crashes)} rejected by our rules where the engine would start and crash at run time; "
        f"{both_other} rejected by our own rules and by the engine; {len(stricter)} rejected only by our "
        "own rules (stricter by design)"
    )
    crash_codes = sorted({code for v in crashes for code in v.engine_device})
    for code in crash_codes:
        count = sum(1 for v in crashes if code in v.engine_device)
        REPORT.append(
            f"rejected: the run would crash at {RUN_TIME[code].crashes_at}: {code}, {count} configurations"
        )
    both_other_codes = sorted(
        {code for v in verdicts if not v.ours_engine and v.ours and v.engine_rejects for code in v.ours}
    )
    REPORT.append(
        f"our own rules whose configurations the engine also rejects: {', '.join(both_other_codes) or 'none'}"
    )
    stricter_codes = sorted({code for v in stricter for code in v.ours})
    REPORT.append(f"stricter than the engine (our own rules): {', '.join(stricter_codes) or 'none'}")
    engine_codes_seen = sorted({code for v in verdicts for code in v.ours_engine})
    REPORT.append(f"engine rules confirmed by the engine: {', '.join(engine_codes_seen)}")
    rewrites = sorted({problem for v in verdicts for problem in v.rewritten})
    REPORT.append(f"table rows the engine rewrote during its pre-flight: {len(rewrites)}")
    detail = "\n".join(f"  {v.name} {' '.join(v.overrides)}: {why}" for v, why in disagreements)
    assert not disagreements, f"{len(disagreements)} disagreement(s):\n{detail}"
    assert not rewrites, "the engine's pre-flight changed table values:\n" + "\n".join(rewrites)
    # Every engine rule was exercised by at least one configuration the engine rejects.
    assert set(ENGINE_CPU) | set(ON_DEVICE) | set(RUN_TIME) <= set(engine_codes_seen)
    # Every run-time rule met a configuration that only the crash would have rejected.
    assert set(RUN_TIME) <= set(crash_codes)
