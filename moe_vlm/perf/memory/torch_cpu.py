"""The torch engine's per-rank estimate: one function per term, `torch_estimate` assembles them.

On CPU (cluster=local) what the engine records is the process peak RSS; on a GPU, the allocator's
peak. The activation counts are autograd's saved tensors of transformers' Qwen3-VL-MoE in fp32
(bf16 on GPU) with SDPA; tests/unit/test_memory.py re-counts them against autograd. The module
docstring of moe_vlm.perf.memory lists what each term covers.
"""

from __future__ import annotations

from moe_vlm.config.schema import Engine, ModelConfig, Packing, RecomputeGranularity, ShardingStrategy
from moe_vlm.config.spec import RunSpec
from moe_vlm.perf.memory.estimate import (
    ADAMW_MOMENTS_BYTES,
    BF16,
    FP32,
    GIB,
    IMAGE_CHANNELS,
    MIB,
    PIXEL_VALUE_COPIES,
    TORCH_CPU_HEAP_RETENTION_FRACTION,
    TORCH_CPU_RUNTIME_BASELINE_GIB,
    MemoryEstimate,
    Term,
)
from moe_vlm.perf.memory.images import ImageBudget
from moe_vlm.perf.memory.micro_batch import (
    attention_mask_elements,
    has_padding_mask,
    micro_batch_positions,
    positions_source,
)
from moe_vlm.perf.memory.shared import (
    ParamCounts,
    Training,
    framework_overhead,
    full_recompute_layers,
    selective_modules,
    training_of,
)

# --- what autograd keeps -------------------------------------------------------------------------


def torch_decoder_layer_elements(
    model: ModelConfig, weights_train: bool, selective: set[str], padded: bool = True
) -> float:
    """Elements autograd keeps per token per decoder layer, transformers Qwen3-VL-MoE + SDPA.

    Counted from the saved tensors of the real model (tests/unit/test_memory.py re-counts them):
    norms 2h+2 (RMSNorm internals), attention 4h + 4 a d + 4 g d + 2a + g (projection inputs,
    q/k/v before and after RoPE, SDPA output and log-sum-exp), MoE E + 2kh + 4kF + 10k + 1
    (router softmax, routed-token copies, SwiGLU in/out, top-k indices and weights). With the
    language model frozen only input-gradient tensors remain (2h + 3ad + 3gd + 2a + 2g + E + kh
    + 3kF + 10k + 3).
    The attention mask itself is separate (torch_mask_bytes). The collator pads every row, so
    `padded` is the engine's case unless the micro-batch is packed (no mask: torch_model._varlen_sdpa).
    """
    h, a, g, d = model.hidden_size, model.num_attention_heads, model.num_query_groups, model.head_dim
    e, k, f = model.num_experts, model.moe_top_k, model.moe_ffn_hidden_size
    norms = float(2 * h + 2)
    if weights_train:
        attention = float(4 * h + 4 * a * d + 4 * g * d + 2 * a + g)
        moe = float(e + 2 * k * h + 4 * k * f + 10 * k + 1)
    else:
        attention = float(3 * a * d + 3 * g * d + 2 * a + 2 * g)
        moe = float(e + k * h + 3 * k * f + 10 * k + 1)
    if "layernorm" in selective:
        norms = 0.0
    if "moe" in selective:
        moe = 0.0
    if "core_attn" in selective:
        attention -= a  # the log-sum-exp; q, k, v stay alive as the checkpoint's inputs
    elif padded:
        # With a padding mask SDPA gets k and v repeated to every query head (no native GQA) and
        # keeps them: 2 (a - g) d more. Inside the core_attn checkpoint the repeat is recomputed.
        attention += 2 * (a - g) * d
    return norms + attention + moe


def torch_non_layer_elements(model: ModelConfig, weights_train: bool) -> float:
    """Per token outside the layers: final norm and lm_head input, rotary cos/sin, log-softmax (V)."""
    h, d, v = model.hidden_size, model.head_dim, model.vocab_size
    return (3 * h + 2 * d + v + 5) if weights_train else (h + 2 * d + v + 4)


def torch_vision_patch_elements(model: ModelConfig, training: Training) -> float:
    """Elements the ViT and merger keep per patch (pixel_values excluded), fp32 + SDPA."""
    vh, heads, inter, depth = (
        model.vision_hidden_size,
        model.vision_num_heads,
        model.vision_intermediate_size,
        model.vision_depth,
    )
    deepstack = len(model.vision_deepstack_layers)
    if training.vision:
        head_dim = vh // max(heads, 1)
        return (
            depth * (11 * vh + 2 * inter + heads + 4)
            + deepstack * (3 * vh + 0.5)
            + 4 * vh
            + 10
            + 2 * head_dim
        )
    if training.projector:
        return 4 * vh + deepstack * (3.5 * vh + 11) + 10
    return 0.0


def torch_vision_block_elements(model: ModelConfig) -> float:
    vh, heads, inter = model.vision_hidden_size, model.vision_num_heads, model.vision_intermediate_size
    return 11 * vh + 2 * inter + heads + 4


def torch_mask_bytes(spec: RunSpec, padded: bool = True) -> tuple[float, float, str]:
    """(bytes kept per layer, bytes kept once, detail) for the padding mask SDPA receives.

    When a row of the micro-batch has padding, transformers builds a boolean [mbs, 1, s, s]
    mask; SDPA's CPU kernel converts it to an additive float mask per layer and keeps it for
    backward. Recomputing core attention (or whole layers) keeps the boolean mask once instead.
    Without padding (every row full) SDPA runs causal without a mask; a packed micro-batch runs
    causal per sample (torch_model._varlen_sdpa) and transformers builds it no mask.
    """
    square = attention_mask_elements(spec, padded)
    if not square:
        if spec.data.packing is not Packing.none:
            return 0.0, 0.0, "packed: causal SDPA per sample, no mask"
        return 0.0, 0.0, "no padding: causal SDPA without a mask"
    recomputed = spec.recompute.granularity is RecomputeGranularity.full or "core_attn" in selective_modules(
        spec.recompute
    )
    if recomputed:
        return 0.0, float(square), f"bool mask {square / MIB:.0f} MiB once"
    return float(FP32 * square), 0.0, f"float mask {FP32 * square / MIB:.0f} MiB per layer"


def torch_decoder_bytes(
    spec: RunSpec, training: Training, elem: int, padded: bool = True
) -> tuple[float, float, str]:
    """(kept by autograd for one micro-batch, one layer's backward working set, how) for the decoder.

    padded: some row of the micro-batch has padding (the planning default: the worst case). A
    packed micro-batch never has a padding mask (torch_model._sdpa_mask_unless_packed).
    """
    masked = has_padding_mask(spec, padded)
    model = spec.model
    tokens = micro_batch_positions(spec)
    selective = selective_modules(spec.recompute)
    layers = model.num_layers
    if not training.decoder_saves:
        return 0.0, 0.0, "language frozen and nothing before it trains: nothing kept"
    mask_per_layer, mask_once, mask_detail = torch_mask_bytes(spec, padded)
    per_layer = (
        torch_decoder_layer_elements(model, training.language, selective, masked) * elem * tokens
        + mask_per_layer
    )
    recomputed, rematerialised = full_recompute_layers(spec.recompute, layers)
    stored = (layers - recomputed) * per_layer
    kept_inputs = recomputed * elem * model.hidden_size * tokens
    non_layer = torch_non_layer_elements(model, training.language) * elem * tokens
    kept = stored + kept_inputs + mask_once + non_layer
    if recomputed:
        # Backward rematerialises whole layers, float mask included.
        full_layer = torch_decoder_layer_elements(model, training.language, set(), masked) * elem * tokens
        mask = FP32 * attention_mask_elements(spec, padded)
        working = (full_layer + mask) * rematerialised
        how = f"full recompute: {recomputed} layer inputs kept, {rematerialised} layer(s) rematerialised"
    else:
        # Backward works on one layer at a time: its activation gradients come on top.
        working = per_layer - mask_per_layer
        if "core_attn" in selective and masked:
            # Recomputing core attention rebuilds one layer's float mask and repeated k, v; they live
            # while that attention runs backward, after the layer's MoE gradients are freed.
            a, g, d = model.num_attention_heads, model.num_query_groups, model.head_dim
            attention_rebuilt = FP32 * attention_mask_elements(spec, padded) + 2 * (a - g) * d * elem * tokens
            working = max(working, attention_rebuilt)
        how = f"{per_layer / tokens / 1024:.1f} KiB/token/layer incl. {mask_detail}" + (
            f"; selective {', '.join(sorted(selective))}" if selective else ""
        )
    return kept, working, how


def torch_vision_bytes(
    spec: RunSpec, training: Training, patches: int, elem: int
) -> tuple[float, float, float]:
    """(kept by autograd excluding pixel_values, one block's working set, pixel_values held) for the ViT.

    pixel_values held counts PIXEL_VALUE_COPIES copies; autograd's patch-embedding input is one of them.
    """
    model = spec.model
    kept = torch_vision_patch_elements(model, training) * elem * patches
    working = torch_vision_block_elements(model) * elem * patches if training.vision else 0.0
    per_patch = IMAGE_CHANNELS * model.vision_temporal_patch_size * model.vision_patch_size**2 * FP32
    pixels = PIXEL_VALUE_COPIES * patches * per_patch
    return kept, working, pixels


# --- the terms -----------------------------------------------------------------------------------


def runtime_baseline() -> Term:
    return Term(
        "runtime_baseline",
        TORCH_CPU_RUNTIME_BASELINE_GIB * GIB,
        "measured: python + torch + transformers + engine imports + gloo group + data pipeline "
        "(scripts/calibrate_memory.py --baseline-only)",
    )


def build_bytes(counts: ParamCounts) -> float:
    """The model is built whole, in fp32, on every rank before fully_shard."""
    return float(FP32 * counts.total)


def params_terms(spec: RunSpec, counts: ParamCounts, training: Training, elem: int) -> list[Term]:
    """parameters (fp32, FSDP2-sharded + unsharded units), gradients and AdamW moments."""
    gpu = spec.cluster.is_gpu_cluster
    world = max(spec.layout.world_size, 1)
    strategy = spec.parallelism.sharding_strategy
    shard = 1 if strategy is ShardingStrategy.no_shard else world
    trainable = (
        (counts.language if training.language else 0)
        + (counts.vision if training.vision else 0)
        + (counts.projector if training.projector else 0)
    )
    unit = max(
        [layer.dense + layer.experts for layer in counts.layers]
        + [counts.embedding + counts.lm_head + counts.vision]
    )
    if strategy is ShardingStrategy.optim_grads_params:
        params = FP32 * counts.total / world + 2 * elem * unit
        params_detail = (
            f"fp32 {counts.total / 1e6:.2f}M params / {world} ranks + 2 unsharded units ({unit / 1e6:.2f}M)"
        )
    else:
        params = FP32 * counts.total
        params_detail = f"fp32 {counts.total / 1e6:.2f}M params, unsharded ({strategy.value})"
    return [
        Term("parameters", max(params, build_bytes(counts)) if not gpu else params, params_detail),
        Term(
            "gradients",
            FP32 * trainable / shard,
            f"fp32 grads of {trainable / 1e6:.2f}M trainable params / {shard} rank(s)",
        ),
        Term(
            "optimizer_state",
            ADAMW_MOMENTS_BYTES * trainable / shard,
            f"AdamW exp_avg + exp_avg_sq, fp32, / {shard} rank(s)",
        ),
    ]


def decoder_activations(spec: RunSpec, training: Training, elem: int, padded: bool) -> Term:
    tokens = micro_batch_positions(spec)
    decoder, working, how = torch_decoder_bytes(spec, training, elem, padded)
    return Term(
        "decoder_activations",
        decoder + working,
        f"{spec.model.num_layers} layers x {tokens} tokens ({positions_source(spec)}): {how}; "
        f"+ one layer's backward working set {working / MIB:.0f} MiB",
    )


def vision_activations(spec: RunSpec, training: Training, budget: ImageBudget, elem: int) -> Term:
    kept, working, pixel_bytes = torch_vision_bytes(spec, training, budget.patches, elem)
    frozen = "" if training.vision or training.projector else " (vision and projector frozen)"
    detail = (
        f"{budget.patches} patches: kept {kept / MIB:.0f} MiB{frozen} + block working set "
        f"{working / MIB:.0f} MiB + pixel_values {pixel_bytes / MIB:.0f} MiB; {budget.source}"
    )
    return Term(
        "vision_activations", kept + working + pixel_bytes, detail if budget.patches else budget.source
    )


def logits(spec: RunSpec, training: Training) -> Term:
    """The fp32 logits, and their gradient when backward runs through the decoder."""
    tokens, vocab = micro_batch_positions(spec), spec.model.vocab_size
    copies = 2 if training.decoder_saves else 1
    return Term(
        "logits",
        copies * FP32 * tokens * vocab,
        f"fp32 logits{' + their gradient' if copies == 2 else ''}: {copies} x {tokens} tokens x {vocab} vocab",
    )


def heap_retention(activation_peak: float) -> Term:
    return Term(
        "heap_retention",
        TORCH_CPU_HEAP_RETENTION_FRACTION * activation_peak,
        f"measured: glibc keeps {TORCH_CPU_HEAP_RETENTION_FRACTION:.0%} of the activation peak resident",
    )


# --- assembly ------------------------------------------------------------------------------------


def torch_estimate(spec: RunSpec, budget: ImageBudget, counts: ParamCounts, padded: bool) -> MemoryEstimate:
    gpu = spec.cluster.is_gpu_cluster
    elem = BF16 if gpu else FP32  # activations: bf16 autocast-free mixed precision on GPU, fp32 on CPU
    training = training_of(spec, budget)
    terms = [] if gpu else [runtime_baseline()]
    terms += params_terms(spec, counts, training, elem)
    activations = [
        decoder_activations(spec, training, elem, padded),
        vision_activations(spec, training, budget, elem),
        logits(spec, training),
    ]
    terms += activations
    peak = sum(t.bytes for t in activations)
    terms.append(framework_overhead(terms) if gpu else heap_retention(peak))
    notes = [
        "the model is built whole on every rank before fully_shard: the parameters term is at least the "
        f"full fp32 model ({build_bytes(counts) / MIB:.1f} MiB)",
    ]
    if not gpu:
        notes.append(
            "on a tiny model the runtime baseline dominates; scripts/calibrate_memory.py reports the error "
            "of the total and of the part above the baseline"
        )
    return MemoryEstimate(
        engine=Engine.torch,
        device="gpu" if gpu else "cpu",
        measured_as="cuda_max_allocated" if gpu else "process_peak_rss",
        capacity_gib=(spec.cluster.gpu_memory_gib or None) if gpu else None,
        peak_stage="only",
        terms=tuple(terms),
        notes=tuple(notes),
    )
