"""Model FLOPs per optimizer step, from the RunSpec's model numbers and the step's token statistics.

Three figures, because each answers a different question:

``model``     useful work: the decoder on REAL (unpadded) tokens, the vision encoder on its
              patches, each module counted frozen-aware (below). MFU uses this one.
``bridge``    what Megatron Bridge's ``num_floating_point_operations`` reports (``bridge_count``):
              PADDED positions of GBS whole rows, the vocabulary padded to 128 x TP, every module
              x3 even when frozen, the ViT on the step's patches divided evenly over the rows and
              one patch merger. Shown beside ours so a user can reconcile the two
              (moe_vlm/perf/flops_basis.py splits the difference term by term).
``hardware``  what the GPUs execute: padded tokens, frozen-aware, plus the forward passes that
              activation recompute re-runs. Reported separately; never used for MFU.

Decoder (Megatron's formula, ``training/utils/flop_utils.py``), forward FLOPs per token, 2 per MAC:

    full-attention layer   2 h (q + 2 kv + gate) + 2 q h        q = heads x head_dim, kv = groups x
                                                                 head_dim, gate = q for Qwen3.5's
                                                                 gated attention, else 0
    attention core         2 q sum(s_i^2) per layer per step    causal: QK^T and AV each touch
                                                                 s^2/2 pairs x q channels x 2 FLOPs
    Gated DeltaNet layer   2 (h (2 qk + 2 v + 2 nv) + c (2 qk + v) + 4 nv dv^2 + h v)
                           qk = key heads x key dim, v = value heads x value dim, nv = value heads,
                           dv = value head dim, c = conv kernel (4): in-projection (q, k, v, z, beta,
                           alpha), depthwise causal conv over q/k/v, the chunked delta-rule update of
                           the dv x dv state per value head, out-projection. Linear in tokens, so a
                           step's GDN FLOPs need no sequence-length statistics.
    MoE MLP                2 h 3 (ffn_moe x top_k + ffn_shared x n_shared)   SwiGLU: 3 projections
    dense MLP              2 h 3 ffn_dense                                     (leading dense layers)
    logits                 2 h vocab

Every Nth layer is full attention (``full_attention_interval``), the rest Gated DeltaNet, where the
architecture has linear attention. Layer kinds and every width come from ``moe_vlm.config.arch``, which
the memory estimate's parameter counts read too: a weight matmul is 2 FLOPs per weight per token.
The router (2 h E per token, under 1% here) and norms are left out, as Megatron leaves them out.

Vision (Bridge's ``vit_flops_from_patch_stats``), forward FLOPs per step:

    ViT blocks   depth x ((8 h^2 + 4 h i) sum(p) + 4 h sum(p^2))    QKV + out projections, GELU MLP,
                                                                    bidirectional attention per image
    mergers      (1 + deepstack) x merged x (2 (h m^2)^2 + 2 (h m^2) out)   m = spatial merge

The Conv3d patch embedding (2 x 1536 x h per patch, ~0.4% of the ViT) is left out as in Bridge.

Frozen-aware training multiplier. Modules run in the order vision encoder -> projector ->
decoder. Backward of a matmul against a weight is an input gradient (dgrad) plus a weight
gradient (wgrad), each as costly as the forward. A frozen module needs no wgrad; it needs dgrad
only if a module before it trains (the gradient must pass through it). So a weight matmul counts

    3x  the module trains
    2x  frozen, something before it trains          (forward + dgrad)
    1x  frozen, nothing before it trains            (forward only, e.g. a frozen ViT at the front)

Attention-core and delta-rule matmuls have no weights: their backward is two input gradients,
so they count 3x whenever a gradient flows through them and 1x otherwise.

Recompute (hardware FLOPs only, decoder layers only, only when a gradient flows through the
decoder): ``full`` re-runs the layer forward (attention + MLP, not the logits) of every layer
(``uniform``) or of ``num_layers`` layers per pipeline stage (``block``); ``selective`` re-runs
the listed modules: ``core_attn`` the attention core, ``moe`` the routed + shared experts,
``shared_experts`` the shared experts, ``mlp`` the dense MLPs. The other selective modules
(layernorm, moe_act, gdn_norm_out, mla_up_proj) are elementwise: no matmul FLOPs.
"""

from __future__ import annotations

from dataclasses import dataclass

from moe_vlm.config.arch import (
    GLU_PROJECTIONS,
    Mixer,
    Mlp,
    attention_shape,
    gdn_shape,
    layer_kinds,
    merger_matmul_weights,
    moe_shape,
    vit_block_matmul_weights,
)
from moe_vlm.config.schema import ModelConfig, RecomputeConfig, RecomputeGranularity, RecomputeMethod
from moe_vlm.config.spec import RunSpec

MEGATRON_VOCAB_DIVISOR = 128  # make_vocab_size_divisible_by: Megatron pads the vocab to 128 x TP
MODULES = ("vision_encoder", "projector", "decoder")  # forward order


@dataclass(frozen=True)
class Workload:
    """One optimizer step's token and patch statistics, summed over data-parallel ranks."""

    sequences: int
    padded_tokens: int  # positions computed, padding included
    real_tokens: int  # non-padding positions (text + image placeholders)
    sum_seq_len_squared: int  # sum over sequences of real length^2
    vision_patches: int  # ViT patches before the spatial merge
    sum_patches_squared: int  # sum over images of patches^2
    # Samples in those sequences: more than `sequences` when rows are packed (data.packing=in_batch,
    # attention confined to each sample); 0 = unknown, one sample per sequence.
    samples: int = 0

    @property
    def packed(self) -> bool:
        return self.samples > self.sequences > 0

    def padded(self) -> Workload:
        """The same step as Bridge and the hardware see it: every position computed, padding too."""
        if self.padded_tokens == self.real_tokens or self.sequences == 0:
            return self
        if self.packed:
            # Packed rows pad each sample only to the CP/SP alignment: every sample grows by the
            # same factor on average, and attention stays inside it.
            grown = self.padded_tokens / max(self.real_tokens, 1)
            sum_squares = round(self.sum_seq_len_squared * grown**2)
        else:
            # Padding makes every sequence padded_tokens / sequences long.
            sum_squares = round(self.padded_tokens**2 / self.sequences)
        return Workload(
            sequences=self.sequences,
            padded_tokens=self.padded_tokens,
            real_tokens=self.padded_tokens,
            sum_seq_len_squared=sum_squares,
            vision_patches=self.vision_patches,
            sum_patches_squared=self.sum_patches_squared,
            samples=self.samples,
        )


@dataclass(frozen=True)
class ForwardFlops:
    """Forward FLOPs of one module for one step, split by what its backward costs."""

    weight: float  # matmuls against parameters: backward = dgrad + wgrad
    activation: float  # matmuls between activations (attention core, delta rule): backward = 2 dgrads

    @property
    def total(self) -> float:
        return self.weight + self.activation


@dataclass(frozen=True)
class DecoderForward:
    """Decoder forward FLOPs for one step, by part (summed over layers)."""

    attention_projections: float
    attention_core: float
    gdn_weight: float  # Gated DeltaNet projections and conv
    gdn_recurrence: float  # Gated DeltaNet delta-rule state updates
    moe_routed: float
    moe_shared: float
    dense_mlp: float
    logits: float

    def as_forward(self) -> ForwardFlops:
        weight = (
            self.attention_projections
            + self.gdn_weight
            + self.moe_routed
            + self.moe_shared
            + self.dense_mlp
            + self.logits
        )
        return ForwardFlops(weight=weight, activation=self.attention_core + self.gdn_recurrence)


@dataclass(frozen=True)
class Multiplier:
    """Training multiplier of one module: forward FLOPs x this = forward + backward FLOPs."""

    weight: int  # 3 trains, 2 frozen with gradient passing through, 1 forward only
    activation: int  # 3 when a gradient flows through, 1 otherwise

    def apply(self, forward: ForwardFlops) -> float:
        return self.weight * forward.weight + self.activation * forward.activation


@dataclass(frozen=True)
class StepFlops:
    model: float  # ours: real tokens, frozen-aware
    bridge: float  # Bridge-comparable: padded tokens, padded vocab, x3 everywhere
    hardware: float  # executed: padded tokens, padded vocab, frozen-aware, plus recompute
    model_by_module: dict[str, float]  # ours, per module (vision_encoder, projector, decoder)
    multipliers: dict[str, Multiplier]  # per module
    recompute: float  # the forward FLOPs recompute adds (included in hardware)


def padded_vocab_size(vocab_size: int, tp: int) -> int:
    divisor = MEGATRON_VOCAB_DIVISOR * max(tp, 1)
    return -(-vocab_size // divisor) * divisor


def layer_counts(model: ModelConfig) -> dict[str, int]:
    """Layers by kind: full attention vs Gated DeltaNet, MoE vs dense MLP."""
    kinds = layer_kinds(model)
    return {
        "full_attention": sum(kind.mixer is Mixer.full_attention for kind in kinds),
        "gdn": sum(kind.mixer is Mixer.linear_attention for kind in kinds),
        "moe": sum(kind.mlp is Mlp.moe for kind in kinds),
        "dense": sum(kind.mlp is Mlp.dense for kind in kinds),
    }


def attention_projection_flops_per_token(model: ModelConfig) -> float:
    """Forward FLOPs per token of one full-attention layer's Q/K/V(/gate) and output projections."""
    return 2.0 * attention_shape(model).projection_weights


def gdn_flops_per_token(model: ModelConfig) -> tuple[float, float]:
    """Forward FLOPs per token of one Gated DeltaNet layer: (projections + conv, delta-rule update)."""
    gdn = gdn_shape(model)
    weights = gdn.in_projection_weights + gdn.conv_weights + gdn.out_projection_weights
    return 2.0 * weights, 2.0 * gdn.recurrence_macs


def decoder_forward(model: ModelConfig, workload: Workload, vocab_size: int) -> DecoderForward:
    """Decoder forward FLOPs for a step on ``workload.real_tokens`` (``workload.padded()``: padded)."""
    counts = layer_counts(model)
    tokens = workload.real_tokens
    h = model.hidden_size
    query = attention_shape(model).query
    gdn_weight, gdn_recurrence = gdn_flops_per_token(model) if counts["gdn"] else (0.0, 0.0)
    moe = moe_shape(model)
    routed_ffn = moe.active_routed_ffn  # active routed experts only
    shared_ffn = moe.shared_ffn
    return DecoderForward(
        attention_projections=counts["full_attention"] * tokens * attention_projection_flops_per_token(model),
        attention_core=counts["full_attention"] * 2.0 * query * workload.sum_seq_len_squared,
        gdn_weight=counts["gdn"] * tokens * gdn_weight,
        gdn_recurrence=counts["gdn"] * tokens * gdn_recurrence,
        moe_routed=counts["moe"] * tokens * 2.0 * h * GLU_PROJECTIONS * routed_ffn,
        moe_shared=counts["moe"] * tokens * 2.0 * h * GLU_PROJECTIONS * shared_ffn,
        dense_mlp=counts["dense"] * tokens * 2.0 * h * GLU_PROJECTIONS * model.dense_ffn_hidden_size,
        logits=tokens * 2.0 * h * vocab_size,
    )


def vision_encoder_forward(model: ModelConfig, workload: Workload) -> ForwardFlops:
    """ViT blocks: Bridge's vit_flops_from_patch_stats transformer term, forward only."""
    h = model.vision_hidden_size
    return ForwardFlops(
        weight=model.vision_depth * 2 * vit_block_matmul_weights(model) * workload.vision_patches,
        activation=model.vision_depth * 4 * h * workload.sum_patches_squared,
    )


def projector_forward(model: ModelConfig, workload: Workload) -> ForwardFlops:
    """Patch merger plus one deepstack merger per deepstack layer, forward only."""
    merged_tokens = workload.vision_patches // model.vision_spatial_merge_size**2
    mergers = 1 + len(model.vision_deepstack_layers)
    per_token = 2 * merger_matmul_weights(model)
    return ForwardFlops(weight=float(mergers * merged_tokens * per_token), activation=0.0)


def multipliers(vision_frozen: bool, projector_frozen: bool, language_frozen: bool) -> dict[str, Multiplier]:
    """Frozen-aware training multipliers in forward order (see the module docstring)."""
    frozen = dict(zip(MODULES, (vision_frozen, projector_frozen, language_frozen), strict=True))
    result: dict[str, Multiplier] = {}
    upstream_trains = False
    for module in MODULES:
        trains = not frozen[module]
        gradient_flows = trains or upstream_trains
        result[module] = Multiplier(
            weight=1 + int(gradient_flows) + int(trains), activation=3 if gradient_flows else 1
        )
        upstream_trains = upstream_trains or trains
    return result


def recompute_forward(
    recompute: RecomputeConfig, decoder: DecoderForward, num_layers: int, pp: int, vp: int
) -> float:
    """Forward FLOPs that activation recompute re-runs in the decoder for one step."""
    layer_forward = (
        decoder.attention_projections
        + decoder.attention_core
        + decoder.gdn_weight
        + decoder.gdn_recurrence
        + decoder.moe_routed
        + decoder.moe_shared
        + decoder.dense_mlp
    )
    if recompute.granularity is RecomputeGranularity.full:
        if recompute.method is RecomputeMethod.block:
            # block: the first num_layers layers of every (virtual) pipeline stage
            recomputed_layers = min(recompute.num_layers * max(pp, 1) * max(vp, 1), num_layers)
            return layer_forward * recomputed_layers / max(num_layers, 1)
        return layer_forward
    if recompute.granularity is RecomputeGranularity.selective:
        by_module = {
            "core_attn": decoder.attention_core,
            "moe": decoder.moe_routed + decoder.moe_shared,
            "shared_experts": decoder.moe_shared,
            "mlp": decoder.dense_mlp,
        }
        modules = set(recompute.modules)
        if "moe" in modules:
            modules.discard("shared_experts")  # the moe module already contains the shared experts
        return sum(by_module.get(name, 0.0) for name in modules)
    return 0.0


def step_flops(spec: RunSpec, workload: Workload) -> StepFlops:
    model = spec.model
    factors = multipliers(spec.freeze.vision, spec.freeze.projector, spec.freeze.language)
    padded = workload.padded()
    padded_vocab = padded_vocab_size(model.vocab_size, spec.layout.tp)

    vision = vision_encoder_forward(model, workload)  # the ViT never sees text padding
    projector = projector_forward(model, workload)
    decoder_real = decoder_forward(model, workload, model.vocab_size)
    decoder_padded = decoder_forward(model, padded, padded_vocab)

    by_module = {
        "vision_encoder": factors["vision_encoder"].apply(vision),
        "projector": factors["projector"].apply(projector),
        "decoder": factors["decoder"].apply(decoder_real.as_forward()),
    }
    bridge = bridge_count(spec, workload)
    recomputed = (
        recompute_forward(spec.recompute, decoder_padded, model.num_layers, spec.layout.pp, spec.layout.vp)
        if factors["decoder"].activation > 1
        else 0.0
    )
    hardware = (
        by_module["vision_encoder"]
        + by_module["projector"]
        + factors["decoder"].apply(decoder_padded.as_forward())
        + recomputed
    )
    return StepFlops(
        model=sum(by_module.values()),
        bridge=bridge,
        hardware=hardware,
        model_by_module=by_module,
        multipliers=factors,
        recompute=recomputed,
    )


def bridge_vision_forward(model: ModelConfig, workload: Workload, rows: int) -> float:
    """Bridge 0.6.2's ``vit_flops`` forward (training/utils/flop_utils.py:361-422, called from
    :1186-1198): the step's patches divided evenly over the batch's rows (one image per row, which
    the mock's one image per sample is), ViT blocks with bidirectional attention over that count,
    and ONE patch merger (the deepstack mergers are not counted)."""
    if workload.vision_patches <= 0 or rows <= 0:
        return 0.0
    h, i = model.vision_hidden_size, model.vision_intermediate_size
    patches = workload.vision_patches / rows
    per_patch_per_block = 8 * h**2 + 4 * h * patches + 4 * h * i
    merge_unit = model.vision_spatial_merge_size**2
    merged_hidden = h * merge_unit
    merger = (patches // merge_unit) * (
        2 * merged_hidden * merged_hidden + 2 * merged_hidden * model.projector_out_size
    )
    return (per_patch_per_block * patches * model.vision_depth + merger) * rows


def bridge_rows(workload: Workload) -> int:
    """The batch_size Bridge's train loop passes: DP x MBS x micro-batches = GBS (training/train.py:570),
    whatever the packing: the step's sequences unpacked, its samples when in-batch packing put several
    in one row."""
    return workload.samples if workload.packed else workload.sequences


def bridge_statistics(workload: Workload) -> Workload:
    """The step as Bridge's FLOPs accumulator gathers it (training/vlm_step.py:262-276,
    training/utils/flop_utils.py:318-333): seqlen_sum = every position of the rows (MBS x row width,
    padding included); seqlen_sq_sum = the sum over cu_seqlens' sub-sequences of s_i^2, the unpadded
    ones preferred (_real_subseq_lengths). Unpacked, qwen3_vl_step's cu_seqlens are whole rows: row^2
    per row. Packed (in-batch), they are the samples: each sample's real length squared, not the
    packed row's (which overstates attention by the row / sample ratio)."""
    rows = bridge_rows(workload)
    positions = workload.padded_tokens
    whole = round(positions**2 / rows) if rows else 0
    squares = workload.sum_seq_len_squared if workload.packed else whole
    return Workload(
        sequences=rows,
        padded_tokens=positions,
        real_tokens=positions,
        sum_seq_len_squared=squares,
        vision_patches=workload.vision_patches,
        sum_patches_squared=workload.sum_patches_squared,
    )


def bridge_count(spec: RunSpec, workload: Workload) -> float:
    """The FLOPs Bridge logs for this step (``num_floating_point_operations``, flop_utils.py:425-1271).

    The decoder count is of every position Bridge's accumulator sees (bridge_statistics), its
    attention of the sub-sequences' squares; the logits run over the vocabulary padded to 128 x TP;
    every term is x3 (forward + backward) whatever is frozen. tests/megatron/test_flops_basis.py
    calls the library's function on the real ConfigContainer and checks this figure against it."""
    rows = bridge_rows(workload)
    whole_rows = bridge_statistics(workload)
    padded_vocab = padded_vocab_size(spec.model.vocab_size, spec.layout.tp)
    decoder = decoder_forward(spec.model, whole_rows, padded_vocab).as_forward().total
    return 3.0 * (decoder + bridge_vision_forward(spec.model, workload, rows))
