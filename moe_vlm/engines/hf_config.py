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

from pathlib import Path
from typing import Any

from moe_vlm.base.files import write_json_atomic
from moe_vlm.config.arch import PROFILES, layer_kinds, profile
from moe_vlm.config.schema import Arch, ModelConfig


def mrope_section(model: ModelConfig) -> list[int]:
    """Temporal/height/width rotary sections that sum to the rotary half-dimension.

    Qwen3-VL splits the rotary half-dimension (64 for head_dim 128) 24/20/20; Qwen3.5 rotates a
    quarter of its 256-wide heads, 32 pairs split 11/11/10. Scaled models keep the proportions.
    """
    arch = profile(model.arch)
    reference = arch.mrope_sections
    half = int(model.head_dim * arch.partial_rotary_factor) // 2
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
    if model.arch is Arch.qwen3_vl_moe:
        text["intermediate_size"] = model.dense_ffn_hidden_size or model.moe_ffn_hidden_size
        text["decoder_sparse_step"] = 1
        text["mlp_only_layers"] = list(range(model.num_dense_layers))
    else:  # qwen3_5_moe: hybrid Gated DeltaNet / full attention decoder with a shared expert
        text["layer_types"] = [str(kind.mixer) for kind in layer_kinds(model)]
        text["full_attention_interval"] = max(model.full_attention_interval, 1)
        text["partial_rotary_factor"] = profile(model.arch).partial_rotary_factor
        text["rope_parameters"]["partial_rotary_factor"] = profile(model.arch).partial_rotary_factor
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
    if profile(model.arch).deepstack:
        vision["deepstack_visual_indexes"] = list(model.vision_deepstack_layers)
    return vision


def transformers_config(model: ModelConfig) -> Any:
    """transformers' config object for this model (Qwen3VLMoeConfig or Qwen3_5MoeConfig)."""
    import transformers

    arch = PROFILES.get(model.arch)
    if arch is None:
        allowed = [str(a) for a in PROFILES]
        raise ValueError(f"model.arch={model.arch!r} has no Hugging Face config; allowed: {allowed}")
    config_class: Any = getattr(transformers, arch.hf_config_class)  # Qwen3VLMoeConfig, Qwen3_5MoeConfig
    config = config_class(
        text_config=_text_config(model),
        vision_config=_vision_config(model),
        image_token_id=model.image_token_id,
        # Both families number the video placeholder right after the image one.
        video_token_id=model.image_token_id + 1,
        vision_start_token_id=model.vision_start_token_id,
        vision_end_token_id=model.vision_end_token_id,
        tie_word_embeddings=model.tie_word_embeddings,
        architectures=[arch.hf_architecture],
    )
    config.dtype = "bfloat16"
    return config


def write_hf_config(model: ModelConfig, directory: Path) -> Path:
    """Save config.json for `model` into `directory` (created); returns the directory.

    Every rank of a job writes the same file at once; the atomic writer's unique temp names make
    that safe (identical content, last rename wins) and a reader never sees half a file.
    """
    write_json_atomic(directory / "config.json", transformers_config(model).to_dict())
    return directory


def hf_model_dir(model: ModelConfig, workdir: Path) -> Path:
    """The local directory AutoBridge reads: the user's checkpoint dir, or a materialised config."""
    if is_local_checkpoint(model):
        return Path(model.hf_model_id).expanduser().resolve()
    return write_hf_config(model, workdir / "hf_config" / model.name)
