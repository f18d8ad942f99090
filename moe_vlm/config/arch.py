"""What each `model.arch` is, stated once: one ArchProfile per architecture, and the layer shapes.

A model YAML gives sizes (hidden, heads, experts, ...); the architecture decides what is built
from them: which layers are full attention, whether attention has an output gate, how wide the
Gated DeltaNet convolution is, how rotary positions are split, which Hugging Face class and which
Megatron Bridge recipe family build it, and what the engines can and cannot do with it. The HF
config, the Bridge recipe choice, the rules, the memory estimate and the FLOP count all read it
here, so adding an architecture is one profile row plus a model YAML.

The shape helpers below (layer kinds and the weight counts of each layer part) are the single
source for both `moe_vlm.perf.memory` (parameter counts) and `moe_vlm.perf.flops` (2 FLOPs per weight per
token): the two cannot disagree about a model's shape.

Sources (megatron-bridge 0.6.2, site-packages):
    megatron/bridge/models/qwen_vl/qwen3_vl_provider.py:242   mrope_section [24, 20, 20]
    megatron/bridge/models/qwen_vl/qwen3_vl_provider.py:302-306  Qwen3VLMoEModelProvider.finalize:
                                                               sequence_parallel = True when TP > 1
    megatron/bridge/models/qwen_vl/qwen35_vl_provider.py:294  attention_output_gate = True
    megatron/bridge/models/qwen_vl/qwen35_vl_provider.py:296  linear_attention_freq = 4
    megatron/bridge/models/qwen_vl/qwen35_vl_provider.py:299  linear_conv_kernel_dim = 4
    megatron/bridge/models/qwen_vl/qwen35_vl_provider.py:333  rotary_percent = 0.25
    megatron/bridge/models/qwen_vl/qwen35_vl_provider.py:347  mrope_section [11, 11, 10]
    megatron/bridge/models/qwen_vl/qwen35_vl_provider.py:396-399  finalize: no forced SP
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from enum import StrEnum

from moe_vlm.config.schema import Arch, ModelConfig

GLU_PROJECTIONS = 3  # SwiGLU: gate, up, down


@dataclass(frozen=True)
class ArchProfile:
    arch: Arch
    title: str  # as messages name it
    # Decoder layout.
    linear_attention: bool  # Gated DeltaNet layers; every model.full_attention_interval-th is full attention
    gated_attention: bool  # full attention gates its output: the q projection is twice as wide
    gdn_conv_kernel: int  # depthwise causal conv over q/k/v in a Gated DeltaNet layer (0: none)
    deepstack: bool  # the ViT feeds features of model.vision_deepstack_layers into the first decoder layers
    # Rotary embedding: interleaved multimodal RoPE over the rotated part of each head.
    mrope_sections: tuple[int, int, int]  # temporal, height, width, of the reference head_dim
    partial_rotary_factor: float  # fraction of head_dim that is rotated
    # Hugging Face transformers.
    hf_config_class: str
    hf_architecture: str
    # Megatron Bridge.
    provider_forces_sp: bool  # the model provider's finalize turns sequence parallelism on for TP > 1
    bridge_recipe_family: str  # module name under recipes/qwen_vl and perf_recipes/qwen_vl/<gpu>
    bridge_template_model: str  # whose general recipe a model without its own starts from
    # What the engines can do with it (rules read these).
    graphs_capture_attention: bool  # TE CUDA graphs may capture attention (G009: Qwen3VLModel cannot)
    torch_engine_builds: bool  # the embedded torch engine builds it (E005)
    hf_shared_experts: bool  # the transformers model has shared experts (E009)

    @property
    def general_recipe_module(self) -> str:
        return f"megatron.bridge.recipes.qwen_vl.{self.bridge_recipe_family}"

    def perf_recipe_module(self, cluster: str) -> str:
        return f"megatron.bridge.perf_recipes.qwen_vl.{cluster}.{self.bridge_recipe_family}"


PROFILES: dict[Arch, ArchProfile] = {
    Arch.qwen3_vl_moe: ArchProfile(
        arch=Arch.qwen3_vl_moe,
        title="Qwen3-VL-MoE",
        linear_attention=False,
        gated_attention=False,
        gdn_conv_kernel=0,
        deepstack=True,
        mrope_sections=(24, 20, 20),
        partial_rotary_factor=1.0,
        hf_config_class="Qwen3VLMoeConfig",
        hf_architecture="Qwen3VLMoeForConditionalGeneration",
        provider_forces_sp=True,
        bridge_recipe_family="qwen3_vl",
        bridge_template_model="qwen3_vl_30b_a3b",
        graphs_capture_attention=False,
        torch_engine_builds=True,
        hf_shared_experts=False,
    ),
    Arch.qwen3_5_moe: ArchProfile(
        arch=Arch.qwen3_5_moe,
        title="Qwen3.5-MoE",
        linear_attention=True,
        gated_attention=True,
        gdn_conv_kernel=4,
        deepstack=False,
        mrope_sections=(11, 11, 10),
        partial_rotary_factor=0.25,
        hf_config_class="Qwen3_5MoeConfig",
        hf_architecture="Qwen3_5MoeForConditionalGeneration",
        provider_forces_sp=False,
        bridge_recipe_family="qwen35_vl",
        bridge_template_model="qwen35_vl_35b_a3b",
        # Also mRoPE: TE capture feeds rotary embeddings only to 'rope' models (G009).
        graphs_capture_attention=False,
        torch_engine_builds=False,
        hf_shared_experts=True,
    ),
}


def profile(arch: Arch | str) -> ArchProfile:
    return PROFILES[Arch(arch)]


# --- layer shapes ----------------------------------------------------------------------------------


class Mixer(StrEnum):
    full_attention = "full_attention"
    linear_attention = "linear_attention"  # Gated DeltaNet (HF layer_types spells it so)


class Mlp(StrEnum):
    moe = "moe"
    dense = "dense"  # the leading model.num_dense_layers layers


@dataclass(frozen=True)
class LayerKind:
    mixer: Mixer
    mlp: Mlp


def is_full_attention(model: ModelConfig, index: int) -> bool:
    if not profile(model.arch).linear_attention:
        return True
    # Layers interval, 2 x interval, ... (1-based) are full attention, the others Gated DeltaNet.
    return (index + 1) % max(model.full_attention_interval, 1) == 0


def is_dense(model: ModelConfig, index: int) -> bool:
    return index < model.num_dense_layers


def layer_kind(model: ModelConfig, index: int) -> LayerKind:
    return LayerKind(
        Mixer.full_attention if is_full_attention(model, index) else Mixer.linear_attention,
        Mlp.dense if is_dense(model, index) else Mlp.moe,
    )


def layer_kinds(model: ModelConfig) -> tuple[LayerKind, ...]:
    return _layer_kinds(
        Arch(model.arch), model.num_layers, model.full_attention_interval, model.num_dense_layers
    )


@functools.cache
def _layer_kinds(arch: Arch, layers: int, interval: int, dense: int) -> tuple[LayerKind, ...]:
    # Cached: the step model and the FLOPs read every layer's kind several times per point, and a
    # big dry run predicts thousands of points (scripts/bench_predict.py --speed).
    linear = profile(arch).linear_attention
    return tuple(
        LayerKind(
            Mixer.linear_attention if linear and (i + 1) % max(interval, 1) else Mixer.full_attention,
            Mlp.dense if i < dense else Mlp.moe,
        )
        for i in range(layers)
    )


@dataclass(frozen=True)
class AttentionShape:
    """One full-attention layer: q = heads x head_dim, kv = groups x head_dim, gate = q when gated."""

    hidden: int
    query: int
    key_value: int
    gate: int
    heads: int
    groups: int
    head_dim: int

    @property
    def projection_weights(self) -> int:
        """Q (+ gate), K, V and output projections (no biases)."""
        return (
            self.hidden * (self.query + self.gate)
            + 2 * self.hidden * self.key_value
            + self.query * self.hidden
        )

    @property
    def norm_weights(self) -> int:
        return 2 * self.head_dim  # q_norm, k_norm over head_dim


def attention_shape(model: ModelConfig) -> AttentionShape:
    query = model.num_attention_heads * model.head_dim
    return AttentionShape(
        hidden=model.hidden_size,
        query=query,
        key_value=model.num_query_groups * model.head_dim,
        gate=query if profile(model.arch).gated_attention else 0,
        heads=model.num_attention_heads,
        groups=model.num_query_groups,
        head_dim=model.head_dim,
    )


@dataclass(frozen=True)
class GdnShape:
    """One Gated DeltaNet layer: key = key heads x key dim, value = value heads x value dim."""

    hidden: int
    key: int
    value: int
    value_heads: int
    value_head_dim: int
    conv_kernel: int

    @property
    def conv_channels(self) -> int:
        return 2 * self.key + self.value  # q, k, v

    @property
    def in_projection_weights(self) -> int:
        """q, k, v, z (output gate), beta and alpha (one per value head each)."""
        return self.hidden * (2 * self.key + 2 * self.value + 2 * self.value_heads)

    @property
    def conv_weights(self) -> int:
        return self.conv_channels * self.conv_kernel

    @property
    def out_projection_weights(self) -> int:
        return self.value * self.hidden

    @property
    def other_params(self) -> int:
        """A_log and dt_bias per value head, the gated RMSNorm over the value head dim."""
        return 2 * self.value_heads + self.value_head_dim

    @property
    def recurrence_macs(self) -> int:
        """Per token: the chunked delta-rule update of the dv x dv state of each value head."""
        return 4 * self.value_heads * self.value_head_dim**2


def gdn_shape(model: ModelConfig) -> GdnShape:
    return GdnShape(
        hidden=model.hidden_size,
        key=model.linear_num_key_heads * model.linear_key_head_dim,
        value=model.linear_num_value_heads * model.linear_value_head_dim,
        value_heads=model.linear_num_value_heads,
        value_head_dim=model.linear_value_head_dim,
        conv_kernel=profile(model.arch).gdn_conv_kernel,
    )


@dataclass(frozen=True)
class MoeShape:
    """One MoE MLP: SwiGLU routed experts (top_k of num_experts active per token) and shared experts."""

    hidden: int
    experts: int
    top_k: int
    expert_ffn: int  # per routed expert
    shared_ffn: int  # all shared experts together

    @property
    def expert_weights(self) -> int:
        return GLU_PROJECTIONS * self.hidden * self.expert_ffn

    @property
    def active_routed_ffn(self) -> int:
        return self.expert_ffn * self.top_k

    @property
    def shared_weights(self) -> int:
        return GLU_PROJECTIONS * self.hidden * self.shared_ffn

    @property
    def router_weights(self) -> int:
        return self.experts * self.hidden


def moe_shape(model: ModelConfig) -> MoeShape:
    return MoeShape(
        hidden=model.hidden_size,
        experts=model.num_experts,
        top_k=model.moe_top_k,
        expert_ffn=model.moe_ffn_hidden_size,
        shared_ffn=model.shared_expert_ffn_hidden_size * model.num_shared_experts,
    )


def dense_mlp_weights(model: ModelConfig) -> int:
    return GLU_PROJECTIONS * model.hidden_size * model.dense_ffn_hidden_size


def vit_block_matmul_weights(model: ModelConfig) -> int:
    """One ViT block's matmul weights: QKV 3h^2 + projection h^2 + GELU MLP 2 h i (no biases)."""
    h, i = model.vision_hidden_size, model.vision_intermediate_size
    return 4 * h * h + 2 * h * i


def merger_matmul_weights(model: ModelConfig) -> int:
    """One patch merger's MLP weights: merged x merged + merged x out, merged = h x merge^2."""
    merged = model.vision_hidden_size * model.vision_spatial_merge_size**2
    return merged * merged + merged * model.projector_out_size
