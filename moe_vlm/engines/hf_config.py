"""The Hugging Face config of a `model` group option, built offline.

Clusters often have no model-hub access, and Megatron Bridge's recipes call
``AutoBridge.from_hf_pretrained("<hub id>")``, which needs the model's ``config.json``. We
build that config from our `model` group with transformers' own config classes (so it is what
the installed transformers would write for the real checkpoint) and save it into a local
directory the engine points AutoBridge at. The torch engine can build its model from the same
``transformers_config(model)``.

A user who has the checkpoint (or just its config, tokenizer and processor files) on disk sets
``model.hf_model_id=/path/to/dir``; then that directory is used as it is.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from moe_vlm.schema import ModelConfig

# Qwen3-VL's interleaved multimodal RoPE splits the rotary half-dimension (64 for head_dim 128)
# into temporal/height/width sections of 24/20/20; Qwen3.5 rotates a quarter of its 256-wide
# heads, 32 pairs split 11/11/10. Scaled models keep the same proportions.
_MROPE_SECTIONS = {"qwen3_vl_moe": (24, 20, 20), "qwen3_5_moe": (11, 11, 10)}
_PARTIAL_ROTARY_FACTOR = {"qwen3_vl_moe": 1.0, "qwen3_5_moe": 0.25}
ARCHITECTURES = {
    "qwen3_vl_moe": "Qwen3VLMoeForConditionalGeneration",
    "qwen3_5_moe": "Qwen3_5MoeForConditionalGeneration",
}


def mrope_section(model: ModelConfig) -> list[int]:
    """Temporal/height/width rotary sections that sum to the rotary half-dimension."""
    reference = _MROPE_SECTIONS[model.arch]
    half = int(model.head_dim * _PARTIAL_ROTARY_FACTOR[model.arch]) // 2
    spatial = [half * part // sum(reference) for part in reference[1:]]
    return [half - sum(spatial), *spatial]


def is_local_checkpoint(model: ModelConfig) -> bool:
    """`model.hf_model_id` names a directory on disk that already holds a config.json."""
    return (Path(model.hf_model_id).expanduser() / "config.json").is_file()


def _text_config(model: ModelConfig) -> dict[str, Any]:
    text: dict[str, Any] = {
        "vocab_size": model.vocab_size,
        "hidden_size": model.hidden_size,
        "num_hidden_layers": model.num_layers,
        "num_attention_heads": model.num_attention_heads,
        "num_key_value_heads": model.num_query_groups,
        "head_dim": model.head_dim,
        "num_experts": model.num_experts,
        "num_experts_per_tok": model.moe_top_k,
        "moe_intermediate_size": model.moe_ffn_hidden_size,
        "max_position_embeddings": model.max_position_embeddings,
        "tie_word_embeddings": model.tie_word_embeddings,
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
        "attention_bias": False,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": model.rope_theta,
            "mrope_section": mrope_section(model),
            "mrope_interleaved": True,
        },
        "pad_token_id": model.pad_token_id,
    }
    if model.arch == "qwen3_vl_moe":
        text["intermediate_size"] = model.dense_ffn_hidden_size or model.moe_ffn_hidden_size
        text["decoder_sparse_step"] = 1
        text["mlp_only_layers"] = list(range(model.num_dense_layers))
    else:  # qwen3_5_moe: hybrid Gated DeltaNet / full attention decoder with a shared expert
        interval = max(model.full_attention_interval, 1)
        text["layer_types"] = [
            "full_attention" if (layer + 1) % interval == 0 else "linear_attention"
            for layer in range(model.num_layers)
        ]
        text["full_attention_interval"] = interval
        text["partial_rotary_factor"] = _PARTIAL_ROTARY_FACTOR[model.arch]
        text["rope_parameters"]["partial_rotary_factor"] = _PARTIAL_ROTARY_FACTOR[model.arch]
        text["linear_num_key_heads"] = model.linear_num_key_heads
        text["linear_num_value_heads"] = model.linear_num_value_heads
        text["linear_key_head_dim"] = model.linear_key_head_dim
        text["linear_value_head_dim"] = model.linear_value_head_dim
        shared = model.num_shared_experts * model.shared_expert_ffn_hidden_size
        text["shared_expert_intermediate_size"] = shared
    return text


def _vision_config(model: ModelConfig) -> dict[str, Any]:
    vision: dict[str, Any] = {
        "depth": model.vision_depth,
        "hidden_size": model.vision_hidden_size,
        "num_heads": model.vision_num_heads,
        "intermediate_size": model.vision_intermediate_size,
        "patch_size": model.vision_patch_size,
        "spatial_merge_size": model.vision_spatial_merge_size,
        "temporal_patch_size": model.vision_temporal_patch_size,
        "num_position_embeddings": model.vision_num_position_embeddings,
        "out_hidden_size": model.projector_out_size,
        "hidden_act": "gelu_pytorch_tanh",
        "in_channels": 3,
    }
    if model.arch == "qwen3_vl_moe":
        vision["deepstack_visual_indexes"] = list(model.vision_deepstack_layers)
    return vision


def transformers_config(model: ModelConfig) -> Any:
    """transformers' config object for this model (Qwen3VLMoeConfig or Qwen3_5MoeConfig)."""
    from transformers import PretrainedConfig, Qwen3_5MoeConfig, Qwen3VLMoeConfig

    config_class: type[PretrainedConfig]
    if model.arch == "qwen3_vl_moe":
        config_class = Qwen3VLMoeConfig
    elif model.arch == "qwen3_5_moe":
        config_class = Qwen3_5MoeConfig
    else:
        allowed = list(ARCHITECTURES)
        raise ValueError(f"model.arch={model.arch!r} has no Hugging Face config; allowed: {allowed}")
    config = config_class(
        text_config=_text_config(model),
        vision_config=_vision_config(model),
        image_token_id=model.image_token_id,
        # Both families number the video placeholder right after the image one.
        video_token_id=model.image_token_id + 1,
        vision_start_token_id=model.vision_start_token_id,
        vision_end_token_id=model.vision_end_token_id,
        tie_word_embeddings=model.tie_word_embeddings,
        architectures=[ARCHITECTURES[model.arch]],
    )
    config.dtype = "bfloat16"
    return config


def write_hf_config(model: ModelConfig, directory: Path) -> Path:
    """Save config.json for `model` into `directory` (created); returns the directory.

    Written to a temporary name and renamed, so a reader never sees half a file.
    """
    directory.mkdir(parents=True, exist_ok=True)
    payload = transformers_config(model).to_dict()
    target = directory / "config.json"
    tmp = directory / ".config.json.tmp"
    tmp.write_text(json.dumps(payload, indent=2, sort_keys=True, default=str) + "\n")
    tmp.replace(target)
    return directory


def hf_model_dir(model: ModelConfig, workdir: Path) -> Path:
    """The local directory AutoBridge reads: the user's checkpoint dir, or a materialised config."""
    if is_local_checkpoint(model):
        return Path(model.hf_model_id).expanduser().resolve()
    return write_hf_config(model, workdir / "hf_config" / model.name)
