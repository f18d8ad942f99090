"""What the Megatron and torch estimates share: parameter counts, which gradients exist,
what recompute drops, and the framework overhead of a GPU process."""

from __future__ import annotations

from dataclasses import dataclass

from moe_vlm.config.arch import (
    attention_shape,
    dense_mlp_weights,
    gdn_shape,
    is_dense,
    is_full_attention,
    merger_matmul_weights,
    moe_shape,
    vit_block_matmul_weights,
)
from moe_vlm.config.schema import ModelConfig, RecomputeConfig, RecomputeGranularity, RecomputeMethod
from moe_vlm.config.spec import RunSpec
from moe_vlm.perf.memory.estimate import (
    GIB,
    GPU_FRAGMENTATION_FRACTION,
    GPU_FRAMEWORK_CONSTANT_GIB,
    IMAGE_CHANNELS,
    Term,
)
from moe_vlm.perf.memory.images import ImageBudget

# --- parameter counts ----------------------------------------------------------------------------


@dataclass(frozen=True)
class LayerParams:
    dense: int  # attention (or Gated DeltaNet), norms, router, shared experts, dense MLP
    experts: int  # routed experts: split over EP x ETP
    # Of `dense`, the weights of Transformer Engine GEMMs (projections, dense MLP, shared experts):
    # what FP8/FP4 keeps quantized. Norms, the router and the GDN convolution stay BF16; every
    # routed-expert weight is a GEMM weight.
    dense_gemm: int
    # Of `dense`, what every tensor-parallel rank holds whole: the layer norms, q/k norms, the GDN
    # output norm, the router and the shared-expert gate carry no tensor_model_parallel attribute in
    # Megatron Core (megatron/core/transformer/moe/router.py, torch_norm.py; the GDN's A_log, dt_bias
    # and conv1d are split: ssm/gated_delta_net/common.py:233-253). tests/megatron/test_param_counts.py
    # counts them on the library's own layers.
    replicated: int = 0

    def dense_per_rank(self, tp: int) -> float:
        return (self.dense - self.replicated) / tp + self.replicated


@dataclass(frozen=True)
class ParamCounts:
    """Parameters of the whole model, by the parts vision_freeze speaks about."""

    embedding: int
    lm_head: int  # 0 when tied to the embedding
    final_norm: int
    layers: tuple[LayerParams, ...]
    vision: int  # patch embedding, position embedding, ViT blocks
    projector: int  # patch merger + deepstack mergers
    # Of vision / projector, what each TP rank holds whole: the patch and position embeddings, the
    # LayerNorms and the row-parallel (output) biases (no tensor_model_parallel mark in Megatron Core).
    vision_replicated: int = 0
    projector_replicated: int = 0

    @property
    def language(self) -> int:
        return (
            self.embedding
            + self.lm_head
            + self.final_norm
            + sum(layer.dense + layer.experts for layer in self.layers)
        )

    @property
    def total(self) -> int:
        return self.language + self.vision + self.projector


def _attention_params(model: ModelConfig) -> int:
    shape = attention_shape(model)
    return shape.projection_weights + shape.norm_weights


def _gated_deltanet_params(model: ModelConfig) -> int:
    shape = gdn_shape(model)
    return (
        shape.in_projection_weights + shape.conv_weights + shape.other_params + shape.out_projection_weights
    )


def _mixer_replicated(model: ModelConfig, index: int) -> int:
    """q/k norms over head_dim (full attention) or the gated RMSNorm over the value head dim (GDN)."""
    if is_full_attention(model, index):
        return attention_shape(model).norm_weights
    return gdn_shape(model).value_head_dim


def _mixer_gemm_weights(model: ModelConfig, index: int) -> int:
    if is_full_attention(model, index):
        return attention_shape(model).projection_weights
    shape = gdn_shape(model)
    return shape.in_projection_weights + shape.out_projection_weights


def layer_params(model: ModelConfig, index: int) -> LayerParams:
    h = model.hidden_size
    mixer = _attention_params(model) if is_full_attention(model, index) else _gated_deltanet_params(model)
    mixer_gemm = _mixer_gemm_weights(model, index)
    norms = 2 * h
    replicated = norms + _mixer_replicated(model, index)
    if is_dense(model, index):
        mlp = dense_mlp_weights(model)
        return LayerParams(
            dense=mixer + norms + mlp, experts=0, dense_gemm=mixer_gemm + mlp, replicated=replicated
        )
    moe = moe_shape(model)
    shared_gate = h if model.num_shared_experts else 0
    return LayerParams(
        dense=mixer + norms + moe.router_weights + moe.shared_weights + shared_gate,
        experts=moe.experts * moe.expert_weights,
        dense_gemm=mixer_gemm + moe.shared_weights,
        replicated=replicated + moe.router_weights + shared_gate,
    )


def param_counts(model: ModelConfig) -> ParamCounts:
    h, vh = model.hidden_size, model.vision_hidden_size
    patch_in = IMAGE_CHANNELS * model.vision_temporal_patch_size * model.vision_patch_size**2
    # matmuls + 2 LayerNorms (weight, bias) + qkv, proj, fc1 and fc2 biases
    block = vit_block_matmul_weights(model) + 4 * vh + 3 * vh + vh + model.vision_intermediate_size + vh
    embeddings = patch_in * vh + vh + model.vision_num_position_embeddings * vh
    vision = embeddings + model.vision_depth * block
    merged = vh * model.vision_spatial_merge_size**2
    merger_mlp = merger_matmul_weights(model) + merged + model.projector_out_size  # + fc biases
    deepstack = len(model.vision_deepstack_layers)
    projector = (2 * vh + merger_mlp) + deepstack * (2 * merged + merger_mlp)
    return ParamCounts(
        embedding=model.vocab_size * h,
        lm_head=0 if model.tie_word_embeddings else model.vocab_size * h,
        final_norm=h,
        layers=tuple(layer_params(model, i) for i in range(model.num_layers)),
        vision=vision,
        projector=projector,
        # 2 LayerNorms (weight, bias) + the projection's and fc2's biases per block.
        vision_replicated=embeddings + model.vision_depth * 6 * vh,
        projector_replicated=(2 * vh + model.projector_out_size)
        + deepstack * (2 * merged + model.projector_out_size),
    )


# --- gradients and recompute ---------------------------------------------------------------------


@dataclass(frozen=True)
class Training:
    """Which gradients exist: weight gradients per part, and input gradients through each part."""

    vision: bool
    projector: bool
    language: bool
    images: bool

    @property
    def projector_input_grad(self) -> bool:
        return self.vision

    @property
    def decoder_input_grad(self) -> bool:
        # The decoder must pass gradients back only when something before it trains and feeds it.
        return self.images and (self.vision or self.projector)

    @property
    def decoder_saves(self) -> bool:
        return self.language or self.decoder_input_grad

    @property
    def anything(self) -> bool:
        return self.vision or self.projector or self.language


def training_of(spec: RunSpec, budget: ImageBudget) -> Training:
    f = spec.freeze
    return Training(
        vision=not f.vision, projector=not f.projector, language=not f.language, images=budget.patches > 0
    )


def selective_modules(recompute: RecomputeConfig) -> set[str]:
    return set(recompute.modules) if recompute.granularity is RecomputeGranularity.selective else set()


def full_recompute_layers(recompute: RecomputeConfig, layers: int) -> tuple[int, int]:
    """(layers recomputed, layers rematerialised at once in backward) under full recompute."""
    if recompute.granularity is not RecomputeGranularity.full:
        return 0, 0
    chunk = max(recompute.num_layers, 1)
    if recompute.method is RecomputeMethod.block:
        return min(chunk, layers), 1
    return layers, min(chunk, layers)


# --- GPU process overhead ------------------------------------------------------------------------


def framework_overhead(terms: list[Term]) -> Term:
    """CUDA context, cuBLAS and NCCL (a constant) + fragmentation of what the allocator holds."""
    allocated = sum(t.bytes for t in terms if t.allocator)
    return Term(
        "framework_overhead",
        GPU_FRAMEWORK_CONSTANT_GIB * GIB + GPU_FRAGMENTATION_FRACTION * allocated,
        f"CUDA context + cuBLAS + NCCL communicators {GPU_FRAMEWORK_CONSTANT_GIB:.1f} GiB (constant) + "
        f"{GPU_FRAGMENTATION_FRACTION:.0%} allocator fragmentation of {allocated / GIB:.1f} GiB",
        allocator=False,
    )
