"""The RunSpec's derived facts and the architecture profiles (moe_vlm/config/arch.py) against the library.

The provider comes from the recipe the engine picks, converted from our offline HF config, with
THE field table applied; its own finalize, Megatron Core's layer-pattern parser and its
pipeline split run here on CPU. What the memory estimate, the FLOP count, the rules and the
field table assume is what the engine builds.
"""

from __future__ import annotations

import warnings

import pytest

from moe_vlm.config.arch import Mixer, layer_kinds
from moe_vlm.engines.megatron.config import apply_overrides
from tests.conftest import make_spec
from tests.megatron.conftest import RecipeCache, needs_stack


@needs_stack
@pytest.mark.parametrize("model", ["qwen3_vl_30b_a3b", "qwen35_vl_35b_a3b"])
def test_profile_is_what_the_bridge_provider_builds(recipes: RecipeCache, model: str) -> None:
    from megatron.core.models.gpt.experimental_attention_variant_module_specs import (
        get_linear_attention_pattern,
    )

    spec = make_spec(
        "engine=megatron", "dry_run=true", "cluster=b200", f"model={model}", "parallelism=3d", "tp=2"
    )
    arch = spec.arch_profile
    provider = recipes.config(spec).model
    assert type(provider).__name__ in ("Qwen3VLMoEModelProvider", "Qwen35VLMoEModelProvider")
    assert list(provider.mrope_section) == list(arch.mrope_sections)
    assert provider.rotary_percent == arch.partial_rotary_factor
    assert bool(getattr(provider, "attention_output_gate", False)) is arch.gated_attention
    if arch.linear_attention:
        assert provider.linear_conv_kernel_dim == arch.gdn_conv_kernel
        # Megatron Core's own parser of the layer pattern (1 = linear attention, 0 = full attention).
        pattern = get_linear_attention_pattern(provider)
        assert [kind.mixer is Mixer.linear_attention for kind in layer_kinds(spec.model)] == [
            bool(p) for p in pattern
        ]
    else:
        assert all(kind.mixer is Mixer.full_attention for kind in layer_kinds(spec.model))
        assert getattr(provider, "experimental_attention_variant", None) is None
    # The provider's own finalize with the knob off: SP as RunSpec.sequence_parallel says.
    provider.tensor_model_parallel_size = 2
    provider.sequence_parallel = False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        provider.finalize()
    assert provider.sequence_parallel is arch.provider_forces_sp is spec.sequence_parallel


@needs_stack
@pytest.mark.parametrize(
    "split",
    [
        ["pp=4"],
        ["pp=4", "parallelism.last_stage_layers=16"],  # only the last set: the first gets (40-16)/3
        ["pp=4", "parallelism.first_stage_layers=7"],
        ["pp=8", "vp=2", "parallelism.first_stage_layers=2", "parallelism.last_stage_layers=2"],
        ["pp=2", "parallelism.first_stage_layers=18", "parallelism.last_stage_layers=22"],
    ],
)
def test_stage_layer_counts_are_megatrons(recipes: RecipeCache, split: list[str]) -> None:
    """Megatron Core's get_num_layers_to_build (transformer_block.py:70-180) on the real config."""
    from megatron.core.transformer.transformer_block import get_num_layers_to_build

    spec = make_spec("engine=megatron", "dry_run=true", "cluster=b200", "model=qwen35_vl_35b_a3b", "nodes=2",
                     "parallelism=3d", *split)  # fmt: skip
    cfg = recipes.config(spec)
    apply_overrides(cfg, spec)
    vp = spec.layout.vp
    built = [get_num_layers_to_build(cfg.model, vp_stage=0, pp_rank=r) * vp for r in range(spec.layout.pp)]
    assert tuple(built) == spec.stage_layer_counts
