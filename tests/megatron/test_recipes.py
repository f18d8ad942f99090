"""recipe=<name> against the installed library: one option per in-scope perf recipe function, and each
option's effective ConfigContainer equal, field by field, to the function's own after Bridge's
runtime update, except the documented deliberate differences (vendor_recipes.DELIBERATE).

Also every recipe= dry run as the plan judges it, the library's own checks included (about 30 s
with a cold plan cache), and the verdict on the recipes our rules reject (L004, L013, L014, D008):
the library's own code fails them.
"""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
import warnings
from pathlib import Path
from typing import Any

import pytest

from moe_vlm.knobs.recipes import option_names
from moe_vlm.rules.catalogue import validate
from tests.conftest import make_spec
from tests.megatron.conftest import REPORT, RecipeCache, needs_stack

NAMES = option_names()


@needs_stack
def test_every_library_recipe_in_scope_has_an_option() -> None:
    from moe_vlm.engines.megatron.vendor_recipes import library_recipes

    library = {r.name for r in library_recipes()}
    assert len(library) == 36, sorted(
        library
    )  # 22 Qwen3-VL + 14 Qwen3.5-35B, five GPUs, megatron-bridge 0.6.2
    missing, stale = sorted(library - set(NAMES)), sorted(set(NAMES) - library)
    assert not missing, f"no recipe= option for {missing}: rerun scripts/gen_recipes.py"
    assert not stale, f"recipe= options without a library function: {stale}: rerun scripts/gen_recipes.py"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("recipes")


@needs_stack
@pytest.mark.parametrize("name", NAMES)
def test_recipe_option_equals_its_function(name: str, workdir: Path) -> None:
    """recipe=X dry_run=true builds (through the engine's own build_config) the ConfigContainer the
    function builds: after Bridge's runtime update every field is equal, but the deliberate ones."""
    from moe_vlm.engines.megatron.vendor_recipes import compare, deliberate

    spec = make_spec(f"recipe={name}", "dry_run=true")
    differences = compare(spec, workdir)
    unexplained = {f: d for f, d in differences.items() if not deliberate(f, *d)}
    assert not unexplained, (
        f"recipe={name} drifted from its function (rerun scripts/gen_recipes.py): {unexplained}"
    )
    assert "checkpoint.load" in differences  # the comparison sees the deliberate ones: it can fail
    if name == NAMES[-1]:
        REPORT.append(
            f"recipe= options: {len(NAMES)} equal to their Bridge function but the deliberate differences"
        )


def test_an_option_that_drifts_is_caught(workdir: Path) -> None:
    """The comparison is not blind: the same recipe with one knob changed differs in that knob's field."""
    pytest.importorskip("megatron.bridge")
    from moe_vlm.engines.megatron.vendor_recipes import compare, deliberate

    spec = make_spec("recipe=qwen3_vl_30b_a3b_pretrain_8gpu_gb200_bf16", "dry_run=true", "mbs=2")
    unexplained = {f: d for f, d in compare(spec, workdir).items() if not deliberate(f, *d)}
    assert unexplained["train.micro_batch_size"] == (4, 2)


# --- rules against recipes -------------------------------------------------------------------------

# Every in-scope recipe our rules reject as written (memory aside: the vendornum part of issue 21):
# the six H100 recipes, each for reasons the library's own code confirms below.
REJECTED = {
    "qwen35_vl_35b_a3b_pretrain_16gpu_h100_bf16": {"L004", "D008"},
    "qwen35_vl_35b_a3b_pretrain_16gpu_h100_fp8cs": {"L004", "D008"},
    "qwen3_vl_30b_a3b_pretrain_16gpu_h100_bf16": {"L013", "L014", "D008"},
    "qwen3_vl_30b_a3b_pretrain_16gpu_h100_fp8cs": {"L013", "L014", "D008"},
    "qwen3_vl_235b_a22b_pretrain_256gpu_h100_bf16": {"L004", "L013", "L014", "D008"},
    "qwen3_vl_235b_a22b_pretrain_256gpu_h100_fp8cs": {"L004", "L013", "L014", "D008"},
}
MEMORY_CODES = {"M001", "M002", "M003"}


def test_rules_reject_exactly_these_recipes() -> None:
    rejected = {}
    for name in NAMES:
        found = {f.code for f in validate(make_spec(f"recipe={name}")) if f.is_error} - MEMORY_CODES
        if found:
            rejected[name] = found
    assert rejected == REJECTED


@needs_stack
def test_every_recipe_dry_run_with_the_library_checks() -> None:
    """recipe=X dry_run=true judged as the plan judges it (moe_vlm/run/task.py): the rules, then, on
    what they let through, the library's own checks (through the plan cache). Only REJECTED is
    refused, by the rules that name the library line that fails it (shown below); every other recipe
    the vendor ran passes Bridge, the ViT config, TE and Megatron-LM's validate_args. The six
    235B GB200/B200 recipes split 94 layers 10 + 6 x 12 + 12: LIB-ARGS refused them while the
    argument mapping dropped the first/last stage layers (arguments.py:951-963)."""
    from moe_vlm.run.plan import library_findings

    refused: dict[str, set[str]] = {}
    library: dict[str, list[str]] = {}
    for name in NAMES:
        spec = make_spec(f"recipe={name}", "dry_run=true")
        found = {f.code for f in validate(spec) if f.is_error}
        if not found:
            refusals = [f for f in library_findings(spec) if f.is_error]
            found = {f.code for f in refusals}
            if refusals:
                library[name] = [f"{f.code}: {f.message}" for f in refusals]
        if found:
            refused[name] = found
    assert not library, library
    assert refused == REJECTED
    REPORT.append(
        f"recipe= dry runs with the library checks: {len(NAMES) - len(refused)} of {len(NAMES)} pass; "
        f"{len(refused)} refused by rules citing the library ({', '.join(sorted(refused))})"
    )


# A library line a rule's message cites (file.py:line), as the rules that port a library refusal do.
LIBRARY_LINE = re.compile(r"\w+\.py:\d+")
CARD_ROWS = sorted(p.stem for p in (Path(__file__).resolve().parents[2] / "conf" / "card").glob("*.yaml"))


@needs_stack
def test_every_card_row_dry_run_with_the_library_checks() -> None:
    """card=<row> dry_run=true (every published row, conf/card/) judged as the plan judges it: the
    rules, then the library's own checks on what they let through. No error finding unless the
    library itself refuses the row: a LIB-* finding, or a rule citing the library line."""
    from moe_vlm.run.plan import library_findings

    assert len(CARD_ROWS) >= 4, CARD_ROWS
    unexplained: dict[str, list[str]] = {}
    for row in CARD_ROWS:
        spec = make_spec(f"card={row}", "dry_run=true")
        found = [f for f in validate(spec) if f.is_error]
        if not found:
            found = [f for f in library_findings(spec) if f.is_error]
        bad = [
            f.line() for f in found if not f.code.startswith("LIB-") and not LIBRARY_LINE.search(f.message)
        ]
        if bad:
            unexplained[row] = bad
    assert not unexplained, unexplained
    REPORT.append(
        f"card= dry runs with the library checks: {len(CARD_ROWS)} rows, no unexplained error finding"
    )


def _call_keywords(function: Any, callee: str) -> set[str]:
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == callee]
    assert calls, f"{function.__qualname__} no longer calls {callee}"
    return {k.arg for call in calls for k in call.keywords if k.arg}


@needs_stack
@pytest.mark.parametrize("name", sorted(REJECTED))
def test_the_library_fails_each_rejected_recipe(name: str, workdir: Path) -> None:
    """The verdict on each rule that rejects a vendor recipe: the library's own code, given the
    recipe's own ConfigContainer after Bridge's runtime update (which accepts every one of them),
    fails at model build (L004, L013, L014) or at step 1 (D008).

    L014: Bridge builds each virtual stage with provider.provide(..., vp_stage=i)
    (models/model_provider.py:729-740); Qwen3VLMoEModelProvider.provide constructs Qwen3VLModel
    without it (qwen3_vl_provider.py:322-331), so the layers are laid out with vp_stage=None and
    MCore's layer offset asserts. L004: MCore asserts each stage's layers divide by VP
    (core/transformer/transformer_block.py:96-170). L013: Qwen3VLModel asserts its first chunk holds
    every deepstack level (modelling_qwen3_vl/model.py:358-364). D008: the EP-overlap schedule needs
    build_schedule_plan, which Qwen3VLModel lacks (tests/megatron/test_first_contact.py).
    """
    from megatron.bridge.models.qwen_vl.modelling_qwen3_vl.model import Qwen3VLModel
    from megatron.core.transformer.transformer_block import get_num_layers_to_build
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    from moe_vlm.config.compose import compose_config
    from moe_vlm.engines.megatron.effective import runtime_update
    from moe_vlm.engines.megatron.vendor_recipes import build_recipe, library_recipes

    (recipe,) = [r for r in library_recipes() if r.name == name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = build_recipe(recipe, compose_config([f"recipe={name}"]), workdir)
        update = runtime_update(cfg, make_spec(f"recipe={name}"), planned=True)
    assert update.error is None, update.error  # Bridge's own pre-flight accepts it
    model, codes = update.config.model, REJECTED[name]
    vp = model.virtual_pipeline_model_parallel_size
    if "L004" in codes:
        with pytest.raises(AssertionError):
            get_num_layers_to_build(model, vp_stage=0, pp_rank=0)
    if "L014" in codes:
        provider = type(model)
        assert model.pipeline_model_parallel_size > 1 and (vp or 1) > 1
        assert "vp_stage" in inspect.signature(provider.provide).parameters  # it receives it,
        assert "vp_stage" not in _call_keywords(provider.provide, "Qwen3VLModel")  # drops it,
        assert "vp_stage" in inspect.signature(Qwen3VLModel.__init__).parameters  # though the model takes it
        with pytest.raises(AssertionError, match="vp_stage must be provided"):
            get_transformer_layer_offset(model, None, pp_rank=0)
    if "L013" in codes:
        deepstack = len(model.vision_config.deepstack_visual_indexes)
        if "L004" not in codes:
            assert get_num_layers_to_build(model, vp_stage=0, pp_rank=0) < deepstack
        else:  # the even split the rule assumes: layers per stage and chunk
            assert model.num_layers // model.pipeline_model_parallel_size // vp < deepstack
        assert "deepstack_visual_embeds should on the first pp-stage" in inspect.getsource(
            Qwen3VLModel.__init__
        )
    if "D008" in codes:
        assert update.config.comm_overlap.overlap_moe_expert_parallel_comm is True
        assert not hasattr(Qwen3VLModel, "build_schedule_plan")


@needs_stack
def test_l004_is_megatron_cores_split(recipes: RecipeCache) -> None:
    """L004 against Megatron Core's own stage split (transformer_block.py:96-170) on the engine's
    config: with a set first stage under VP, the first stage's layers must divide by VP too."""
    from megatron.core.transformer.transformer_block import get_num_layers_to_build

    from moe_vlm.engines.megatron.config import apply_overrides

    base = ("engine=megatron", "dry_run=true", "cluster=b200", "nodes=1", "model=qwen35_vl_35b_a3b",
            "parallelism=3d", "pp=4", "vp=2", "ep=2")  # fmt: skip
    for first, last in ((3, 5), (4, 4), (5, 5)):
        spec = make_spec(
            *base, f"parallelism.first_stage_layers={first}", f"parallelism.last_stage_layers={last}"
        )
        cfg = recipes.config(spec)
        apply_overrides(cfg, spec)
        fired = "L004" in {f.code for f in validate(spec) if f.is_error}
        try:
            for rank in range(spec.layout.pp):
                get_num_layers_to_build(cfg.model, vp_stage=0, pp_rank=rank)
        except AssertionError:
            assert fired, (first, last)
        else:
            assert not fired, (first, last)


# shared/reference/vendor-workload.md's BF16 table (TP/PP/VP/EP, MBS/GBS), as the library has it. One
# row there is wrong: Qwen3.5-35B on 16 H100 is PP 2 with VP 12 (perf_recipes/qwen_vl/h100/
# qwen35_vl.py sets virtual_pipeline_model_parallel_size = 12), not "1/2/-/8".
LIBRARY_LAYOUTS = {  # name: (TP, PP, VP, EP, MBS, GBS)
    "qwen3_vl_30b_a3b_pretrain_8gpu_gb200_bf16": (1, 1, None, 8, 4, 512),
    "qwen3_vl_30b_a3b_pretrain_8gpu_gb300_bf16": (1, 1, None, 8, 8, 512),
    "qwen3_vl_30b_a3b_pretrain_8gpu_b200_bf16": (1, 1, None, 8, 1, 512),
    "qwen3_vl_30b_a3b_pretrain_16gpu_h100_bf16": (1, 2, 12, 8, 1, 512),
    "qwen3_vl_235b_a22b_pretrain_64gpu_gb200_bf16": (1, 8, None, 8, 2, 1024),
    "qwen3_vl_235b_a22b_pretrain_64gpu_gb300_bf16": (1, 1, None, 64, 1, 1024),
    "qwen3_vl_235b_a22b_pretrain_64gpu_b200_bf16": (1, 8, None, 8, 1, 1024),
    "qwen3_vl_235b_a22b_pretrain_256gpu_h100_bf16": (2, 8, 4, 32, 1, 1024),
    "qwen35_vl_35b_a3b_pretrain_8gpu_gb200_bf16": (1, 1, None, 8, 4, 512),
    "qwen35_vl_35b_a3b_pretrain_8gpu_gb300_bf16": (1, 1, None, 8, 8, 512),
    "qwen35_vl_35b_a3b_pretrain_8gpu_b200_bf16": (1, 1, None, 8, 1, 512),
    "qwen35_vl_35b_a3b_pretrain_8gpu_b300_bf16": (1, 1, None, 8, 8, 512),
    "qwen35_vl_35b_a3b_pretrain_16gpu_h100_bf16": (1, 2, 12, 8, 1, 512),  # the reference says VP "-"
}


@needs_stack
def test_the_reference_tables_layouts_against_the_library(workdir: Path) -> None:
    from moe_vlm.config.compose import compose_config
    from moe_vlm.engines.megatron.vendor_recipes import build_recipe, library_recipes

    by_name = {r.name: r for r in library_recipes()}
    for name, layout in LIBRARY_LAYOUTS.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cfg = build_recipe(by_name[name], compose_config([f"recipe={name}"]), workdir)
        m, t = cfg.model, cfg.train
        found = (m.tensor_model_parallel_size, m.pipeline_model_parallel_size,
                 m.virtual_pipeline_model_parallel_size, m.expert_model_parallel_size,
                 t.micro_batch_size, t.global_batch_size)  # fmt: skip
        assert found == layout, name
        spec = make_spec(f"recipe={name}")  # and the option carries it
        assert (spec.layout.tp, spec.layout.pp, spec.layout.vp if spec.layout.vp > 1 else None, spec.layout.ep,
                spec.mbs, spec.gbs) == layout, name  # fmt: skip
