"""The config.json we materialise offline is read by Megatron Bridge as the model our group describes."""

from __future__ import annotations

from pathlib import Path

import pytest

from moe_vlm.engines.hf_config import write_hf_config
from tests.conftest import make_spec
from tests.megatron.conftest import needs_stack

MODELS = ["qwen3_vl_30b_a3b", "qwen3_vl_235b_a22b", "qwen35_vl_35b_a3b", "tiny_moe_vlm"]


@needs_stack
@pytest.mark.parametrize("model", MODELS)
def test_bridge_provider_matches_the_model_group(model: str, tmp_path: Path) -> None:
    from megatron.bridge import AutoBridge

    m = make_spec(f"model={model}").model
    bridge = AutoBridge.from_hf_pretrained(str(write_hf_config(m, tmp_path)))
    provider = bridge.to_megatron_provider(load_weights=False)

    assert (
        type(provider).__name__
        == {
            "qwen3_vl_moe": "Qwen3VLMoEModelProvider",
            "qwen3_5_moe": "Qwen35VLMoEModelProvider",
        }[m.arch]
    )
    assert provider.num_layers == m.num_layers
    assert provider.hidden_size == m.hidden_size
    assert provider.num_attention_heads == m.num_attention_heads
    assert provider.num_query_groups == m.num_query_groups
    assert provider.kv_channels == m.head_dim
    assert provider.num_moe_experts == m.num_experts
    assert provider.moe_router_topk == m.moe_top_k
    assert provider.moe_ffn_hidden_size == m.moe_ffn_hidden_size
    assert provider.vocab_size == m.vocab_size
    assert provider.rotary_base == m.rope_theta
    assert provider.share_embeddings_and_output_weights == m.tie_word_embeddings
    assert provider.image_token_id == m.image_token_id
    vision = provider.vision_config
    assert (vision.depth, vision.hidden_size, vision.num_heads) == (
        m.vision_depth,
        m.vision_hidden_size,
        m.vision_num_heads,
    )
    assert vision.out_hidden_size == m.projector_out_size
    assert (vision.patch_size, vision.spatial_merge_size) == (
        m.vision_patch_size,
        m.vision_spatial_merge_size,
    )
    if m.arch == "qwen3_vl_moe":
        assert list(vision.deepstack_visual_indexes) == list(m.vision_deepstack_layers)
        # The gotcha the freeze rows exist for: the MoE provider freezes both stacks by default.
        assert (provider.freeze_language_model, provider.freeze_vision_model) == (True, True)
    else:
        assert (
            provider.moe_shared_expert_intermediate_size
            == m.num_shared_experts * m.shared_expert_ffn_hidden_size
        )
