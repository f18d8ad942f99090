"""The Megatron engine's per-GPU estimate: one function per term, `megatron_stage` assembles them.

Megatron Core + Transformer Engine in bf16 with flash attention and no dropout. The saved-tensor
tables (megatron_saved.py) say what autograd keeps per token in a decoder layer, a ViT block and
a patch merger; each term function sizes one part of the GPU's memory on one pipeline stage (the
first stage holds the vision tower, the embedding and the most micro-batches in flight; the last
stage the logits). The module docstring of moe_vlm.perf.memory lists what each term covers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from moe_vlm.config.precision import non_tn_fp8_gemm, profile, quantized, weight_bytes
from moe_vlm.config.schema import (
    CrossEntropyFusion,
    CudaGraphImpl,
    Engine,
    FlexBackend,
    OuterSharding,
    ParallelismFamily,
    Precision,
    ShardingStrategy,
)
from moe_vlm.config.sharding import dp_outer
from moe_vlm.config.spec import RunSpec
from moe_vlm.perf.memory.estimate import (
    ADAM_STATE_BYTES,
    ADAMW_MOMENTS_BYTES,
    BF16,
    CUDA_GRAPH_POOL_CONSTANT_GIB,
    DEEPEP_DEFAULT_NUM_SMS,
    FP32,
    GIB,
    MemoryEstimate,
    Term,
)
from moe_vlm.perf.memory.images import ImageBudget
from moe_vlm.perf.memory.megatron_saved import (
    bytes_per_token,
    megatron_layer_saved,
    megatron_vision_saved,
    sp_ranks,
)
from moe_vlm.perf.memory.micro_batch import micro_batch_positions, positions_source
from moe_vlm.perf.memory.shared import (
    ParamCounts,
    Training,
    framework_overhead,
    full_recompute_layers,
    param_counts,
    selective_modules,
    training_of,
)


def vision_graph_length(spec: RunSpec) -> int:
    """ViT patches a vision-encoder CUDA graph is captured for: cuda_graph.vision_max_seq_length, or the
    encoder's default num_position_embeddings / merge^2 (Bridge qwen_vl/modelling_qwen3_vl/
    vision_model.py:290-294). Every micro-batch's patches are padded to it (:55-66)."""
    model = spec.model
    default = model.vision_num_position_embeddings // model.vision_spatial_merge_size**2
    return spec.cuda_graph.vision_max_seq_length or default


def _vision_bytes(spec: RunSpec, budget: ImageBudget, training: Training) -> tuple[float, str]:
    if budget.patches == 0:
        return 0.0, "no images in the micro-batch"
    model = spec.model
    patches = max(budget.patches, vision_graph_length(spec)) if spec.cuda_graph.vision else budget.patches
    block, merger = megatron_vision_saved(model)
    vit = bytes_per_token(block, spec, training.vision, training.vision) * model.vision_depth
    mergers = 1 + len(model.vision_deepstack_layers)
    proj_input_grad = training.projector or training.projector_input_grad
    proj = bytes_per_token(merger, spec, training.projector, proj_input_grad) * mergers
    per_patch = vit + proj
    padded = f" (padded to the vision CUDA graph's {patches})" if patches != budget.patches else ""
    detail = (
        f"{budget.patches} patches{padded} x ({vit / 1024:.1f} KiB ViT over {model.vision_depth} blocks"
        f"{'' if training.vision else ' (frozen: nothing kept)'} + {proj / 1024:.2f} KiB in "
        f"{mergers} merger(s)"
        f"{'' if training.projector or training.vision else ' (frozen)'}); {budget.source}"
    )
    return per_patch * patches, detail


# --- one pipeline stage --------------------------------------------------------------------------


@dataclass(frozen=True)
class Stage:
    """One pipeline rank: the decoder layers and model parts it holds, and what trains."""

    spec: RunSpec
    index: int
    budget: ImageBudget
    counts: ParamCounts
    training: Training

    @property
    def pp(self) -> int:
        return max(self.spec.layout.pp, 1)

    @property
    def first(self) -> bool:
        return self.index == 0  # vision tower, projector, embedding, the most micro-batches in flight

    @property
    def last(self) -> bool:
        return self.index == self.pp - 1  # final norm, output layer, logits

    @property
    def layers(self) -> range:
        return self.spec.stage_layer_indices(self.index)

    @property
    def tp(self) -> int:
        return max(self.spec.layout.tp, 1)

    @property
    def ep_etp(self) -> int:
        return max(self.spec.layout.ep, 1) * max(self.spec.layout.etp, 1)

    @property
    def tokens(self) -> float:
        """Tokens of one micro-batch on this rank: CP splits the sequence (packed: the data's
        percentile, memory/micro_batch.py)."""
        return micro_batch_positions(self.spec) / max(self.spec.layout.cp, 1)

    @property
    def in_flight(self) -> float:
        return self.spec.in_flight_micro_batches if self.first else 1.0


@dataclass(frozen=True)
class Sharding:
    """How the distributed optimizer (3D) or Megatron FSDP shards parameters, gradients, optimizer state."""

    strategy: ShardingStrategy
    fsdp: bool
    dense_over: int  # DP x CP
    experts_over: int  # expert DP
    # HSDP (parallelism.dp_outer): each DP group is cut into `outer` replicas that shard inside
    # themselves (megatron/core/parallel_state.py:922-929, 1447-1451); with outer_optim Megatron FSDP
    # shards the optimizer state over the replicas too (param_and_grad_buffer.py:2491-2506).
    outer: int = 1
    outer_optim: bool = False

    @property
    def params(self) -> bool:
        return self.strategy is ShardingStrategy.optim_grads_params

    @property
    def grads(self) -> bool:
        return self.strategy in (ShardingStrategy.optim_grads, ShardingStrategy.optim_grads_params)

    @property
    def optim(self) -> bool:
        return self.strategy is not ShardingStrategy.no_shard

    @property
    def label(self) -> str:
        base = f"Megatron FSDP {self.strategy.value}" if self.fsdp else "3D, distributed optimizer"
        return base + (f", HSDP {self.outer} replicas" if self.outer > 1 else "")

    def per_gpu(self, dense: float, experts: float, sharded: bool, whole_dp: bool = False) -> float:
        """Per-GPU share; sharded within an HSDP replica (DP / outer) unless `whole_dp`."""
        if not sharded:
            return dense + experts
        outer = 1 if whole_dp else self.outer
        return dense * outer / self.dense_over + experts * outer / self.experts_over

    def optimizer_per_gpu(self, dense: float, experts: float) -> float:
        return self.per_gpu(dense, experts, self.optim, whole_dp=self.outer_optim)


def sharding(spec: RunSpec) -> Sharding:
    fsdp = spec.family is ParallelismFamily.fsdp
    return Sharding(
        strategy=spec.parallelism.sharding_strategy if fsdp else ShardingStrategy.optim,
        fsdp=fsdp,
        dense_over=max(spec.layout.dp * spec.layout.cp, 1),
        experts_over=max(spec.layout.expert_dp, 1),
        outer=max(dp_outer(spec), 1),
        outer_optim=fsdp and spec.parallelism.dp_outer_sharding is OuterSharding.optim,
    )


def grad_bytes(spec: RunSpec) -> tuple[int, str]:
    """Bytes per main-gradient element and why: Megatron DDP keeps fp32 with grad_reduce_in_fp32, else
    the parameters' bf16 (megatron/core/distributed/param_and_grad_buffer.py:917; null = the perf
    recipes' false); Megatron FSDP keeps the parameters' dtype whatever it says (its main_grads_dtype
    None: fsdp/src/megatron_fsdp/param_and_grad_buffer.py:2306-2315; bf16 for FP8 parameters too)."""
    if spec.family is ParallelismFamily.fsdp:
        return BF16, "bf16 (Megatron FSDP: the parameters' dtype)"
    if spec.overlap.grad_reduce_in_fp32:
        return FP32, "fp32 (grad_reduce_in_fp32)"
    return BF16, "bf16 (grad_reduce_in_fp32 off, as the perf recipes)"


# --- the terms -----------------------------------------------------------------------------------


def quantized_weights(stage: Stage, dense_gemm: float, experts: float) -> Term | None:
    """FP8/FP4: the decoder's GEMM weights as Transformer Engine keeps them, in place of bf16.

    The perf recipes' precisions keep the primary weights quantized (fp8_param / fp4_param), built
    under TE's quantized init (megatron/core/transformer/transformer_block.py:340-347) and held in
    the DDP buffer as uint8 (megatron/core/distributed/param_and_grad_buffer.py:888-916); each keeps
    a column-wise copy for the backward GEMMs (bytes per element: moe_vlm/config/precision.py). The vision
    tower builds its own config without FP8 (Bridge qwen_vl/modelling_qwen3_vl/transformer_config.py:68)
    and stays bf16, as do norms, the router, the embedding and the output layer.
    """
    spec = stage.spec
    fmt = spec.precision.format
    if not quantized(fmt):
        return None
    shard = sharding(spec)
    per_element = weight_bytes(fmt, spec.cluster.compute_capability)
    return Term(
        "quantized_weights",
        per_element * shard.per_gpu(dense_gemm, experts, shard.params),
        f"{fmt.value}: {(dense_gemm + experts) / 1e9:.3f}B decoder GEMM weights ({dense_gemm / 1e9:.3f}B "
        f"dense/TP{stage.tp} + {experts / 1e9:.3f}B routed-expert) x {per_element:.4g} B "
        f"({profile(fmt).label}, forward + backward copy, TE's allocation"
        + (
            "; no separate transpose on Blackwell"
            if fmt is Precision.fp8cs and non_tn_fp8_gemm(spec.cluster.compute_capability)
            else ""
        )
        + ")"
        + (f", sharded ({shard.label})" if shard.params else ""),
    )


@dataclass(frozen=True)
class RankParams:
    """Parameters one GPU of this stage holds before any DP sharding: the dense parts split over TP
    (what Megatron Core replicates counted whole: LayerParams.replicated, the final norm), the routed
    experts over EP x ETP."""

    language: float  # decoder layers' dense part, embedding, output layer, final norm
    experts: float
    vision: float
    projector: float

    @property
    def dense(self) -> float:
        return self.language + self.vision + self.projector


def rank_params(stage: Stage) -> RankParams:
    counts, tp = stage.counts, stage.tp
    language = sum(counts.layers[i].dense_per_rank(tp) for i in stage.layers)
    language += counts.embedding / tp if stage.first else 0
    language += (counts.lm_head / tp + counts.final_norm) if stage.last else 0
    vision = (counts.vision - counts.vision_replicated) / tp + counts.vision_replicated
    projector = (counts.projector - counts.projector_replicated) / tp + counts.projector_replicated
    return RankParams(
        language=language,
        experts=sum(counts.layers[i].experts for i in stage.layers) / stage.ep_etp,
        vision=vision if stage.first else 0.0,
        projector=projector if stage.first else 0.0,
    )


def params_terms(stage: Stage) -> list[Term]:
    """parameters (bf16; FP8/FP4 GEMM weights in quantized_weights), gradients (fp32 main grads) and
    optimizer_state (fp32 main + Adam m, v)."""
    counts, training, tp, ep_etp = stage.counts, stage.training, stage.tp, stage.ep_etp
    on_rank = rank_params(stage)
    lang_dense, vision_params, projector_params = on_rank.language, on_rank.vision, on_rank.projector
    dense, experts = on_rank.dense, on_rank.experts
    quantizing = quantized(stage.spec.precision.format)
    dense_gemm = sum(counts.layers[i].dense_gemm for i in stage.layers) / tp if quantizing else 0.0
    bf16_experts = 0.0 if quantizing else experts
    trainable_dense = (
        (lang_dense if training.language else 0)
        + (vision_params if training.vision else 0)
        + (projector_params if training.projector else 0)
    )
    trainable_experts = experts if training.language else 0.0
    shard = sharding(stage.spec)
    quantized_term = quantized_weights(stage, dense_gemm, experts)
    return [
        Term(
            "parameters",
            BF16 * shard.per_gpu(dense - dense_gemm, bf16_experts, shard.params),
            f"bf16: {(dense - dense_gemm) / 1e9:.3f}B dense/TP{tp} + {bf16_experts / 1e9:.3f}B routed-expert/"
            f"(EP x ETP = {ep_etp})"
            + (" (the decoder GEMM weights are in quantized_weights)" if quantizing else "")
            + (
                f", sharded over {shard.dense_over} / {shard.experts_over} ranks ({shard.label})"
                if shard.params
                else f" ({shard.label})"
            ),
        ),
        *([quantized_term] if quantized_term else []),
        gradients(stage, trainable_dense, trainable_experts),
        optimizer_state(stage, trainable_dense, trainable_experts),
        *(t for t in (optimizer_offload(stage, trainable_dense, trainable_experts),) if t),
    ]


def gradients(stage: Stage, trainable_dense: float, trainable_experts: float) -> Term:
    """Main gradients of the trainable parameters held on this GPU, in grad_bytes' dtype."""
    shard, (size, dtype) = sharding(stage.spec), grad_bytes(stage.spec)
    return Term(
        "gradients",
        size * shard.per_gpu(trainable_dense, trainable_experts, shard.grads),
        f"{dtype} main grads of {(trainable_dense + trainable_experts) / 1e9:.3f}B trainable on this GPU"
        + (f", sharded ({shard.label})" if shard.grads else "")
        + ("" if stage.training.anything else "; nothing trains"),
    )


def optimizer_state(stage: Stage, trainable_dense: float, trainable_experts: float) -> Term:
    """fp32 main weights + Adam m, v: sharded by the distributed optimizer / FSDP strategy (within an
    HSDP replica, or over all of DP with dp_outer_sharding=optim)."""
    shard = sharding(stage.spec)
    over = (
        (shard.dense_over, shard.experts_over)
        if shard.outer_optim or shard.outer == 1
        else (shard.dense_over // shard.outer, shard.experts_over // shard.outer)
    )
    return Term(
        "optimizer_state",
        ADAM_STATE_BYTES * shard.optimizer_per_gpu(trainable_dense, trainable_experts),
        f"{ADAM_STATE_BYTES} B/trainable param (fp32 main + Adam m, v)"
        + (f" / {over[0]} (dense), / {over[1]} (experts)" if shard.optim else ", not sharded")
        + (f" ({shard.label})" if shard.outer > 1 else ""),
    )


def optimizer_offload(stage: Stage, trainable_dense: float, trainable_experts: float) -> Term | None:
    """offload.optimizer_fraction: Adam m, v of that share of the optimizer's parameters in pinned host
    memory. Megatron's HybridDeviceOptimizer clones the first `fraction` of the shard's elements to the
    CPU and steps them there; the GPU keeps every fp32 main-weight shard it copies results back into
    (megatron/core/optimizer/cpu_offloading/hybrid_optimizer.py:251-300, 114-130)."""
    fraction = min(stage.spec.offload.optimizer_fraction, 1.0)
    if fraction <= 0:
        return None
    shard = sharding(stage.spec)
    moved = fraction * ADAMW_MOMENTS_BYTES * shard.optimizer_per_gpu(trainable_dense, trainable_experts)
    return Term(
        "optimizer_offload",
        -moved,
        f"{fraction:.0%} of the optimizer on the CPU: its Adam m, v ({ADAMW_MOMENTS_BYTES} B/param) in pinned "
        "host memory; the fp32 main weights stay on the GPU (HybridDeviceOptimizer)",
    )


def fsdp_buffers(stage: Stage) -> Term | None:
    """Megatron FSDP's unsharded working set: 2 units of bf16 parameters + 1 of fp32 gradients."""
    shard = sharding(stage.spec)
    if not (shard.fsdp and (shard.params or shard.grads)):
        return None
    counts, tp, spec = stage.counts, stage.tp, stage.spec
    fmt = spec.precision.format
    gemm_bytes = weight_bytes(fmt, spec.cluster.compute_capability)  # BF16: 2
    # (params, gathered bytes) per unit: FP8/FP4 units gather their GEMM weights quantized.
    units = [
        (
            counts.layers[i].dense_per_rank(tp) + counts.layers[i].experts / stage.ep_etp,
            BF16 * (counts.layers[i].dense_per_rank(tp) - counts.layers[i].dense_gemm / tp)
            + gemm_bytes * (counts.layers[i].dense_gemm / tp + counts.layers[i].experts / stage.ep_etp),
        )
        for i in stage.layers
    ]
    units += [
        (n, BF16 * n)
        for n in (counts.embedding / tp if stage.first else 0, counts.lm_head / tp if stage.last else 0)
    ]
    unit, unit_bytes = max(units, key=lambda u: u[1])
    unsharded_params = 2 * unit_bytes if shard.params else 0.0
    grad_size, grad_dtype = grad_bytes(spec)
    return Term(
        "fsdp_buffers",
        unsharded_params + grad_size * unit,
        f"largest FSDP unit {unit / 1e6:.1f}M params: "
        + (
            f"2 x {f'{unit_bytes / unit:.3g} B/param' if quantized(fmt) else 'bf16'} all-gathered (current + prefetch) + "
            if shard.params
            else ""
        )
        + f"1 x {grad_dtype.split(' ')[0]} gradient before reduce-scatter",
    )


def _layer_kept(stage: Stage) -> list[float]:
    """Bytes per token autograd keeps in each of this stage's decoder layers (no recompute)."""
    spec, training = stage.spec, stage.training
    # Gradients cross every layer whenever anything in or before the decoder trains.
    return [
        bytes_per_token(
            megatron_layer_saved(spec.model, i, spec.layout.etp),
            spec,
            training.language,
            training.decoder_saves,
        )
        for i in stage.layers
    ]


def decoder_activations(stage: Stage) -> Term:
    """What autograd keeps for one micro-batch through this stage's decoder layers."""
    spec, training, tokens = stage.spec, stage.training, stage.tokens
    indices = stage.layers
    sp = sp_ranks(spec)
    layer_kept = _layer_kept(stage)
    recomputed, rematerialised = full_recompute_layers(spec.recompute, len(indices))
    if not training.decoder_saves:
        decoder_bytes, how = 0.0, "language frozen and nothing before it trains: nothing kept"
    elif recomputed:
        kept_inputs = BF16 * spec.model.hidden_size / sp * recomputed / max(rematerialised, 1)
        stored = sum(layer_kept[recomputed:])
        working = max(layer_kept) * rematerialised
        decoder_bytes = tokens * (kept_inputs + stored) + tokens * working
        how = (
            f"full recompute of {recomputed}/{len(indices)} layers: chunk inputs kept + "
            f"{rematerialised} layer(s) "
            f"rematerialised in backward ({max(layer_kept) * tokens / GIB:.2f} GiB)"
        )
    else:
        decoder_bytes = tokens * sum(layer_kept)
        selective = sorted(selective_modules(spec.recompute))
        how = f"{sum(layer_kept) / len(indices) / 1024:.1f} KiB/token/layer" + (
            f", selective recompute of {', '.join(selective)}" if selective else ", no recompute"
        )
    return Term(
        "decoder_activations",
        decoder_bytes,
        f"{len(indices)} layer(s) x {tokens:.0f} tokens ({positions_source(spec)} / CP"
        f"{' / TP (SP)' if sp > 1 else ''}): {how}",
    )


def activation_offload(stage: Stage) -> Term | None:
    """offload.activation_layers: TE's CPU offload moves the saved tensors of decoder layers 0..N-1 to pinned
    host memory during forward and brings them back in time for backward, so that the saved-activation
    peak is (layers - N) x a layer's (transformer_engine/pytorch/cpu_offload.py:602-626; MCore passes
    cpu_offloading_num_layers, megatron/core/transformer/transformer_block.py:298-308)."""
    offloaded = min(stage.spec.offload.activation_layers, len(stage.layers) - 1)
    if offloaded <= 0 or not stage.training.decoder_saves:
        return None
    kept = _layer_kept(stage)
    moved = stage.tokens * sum(kept[:offloaded])
    return Term(
        "activation_offload",
        -moved,
        f"saved tensors of decoder layers 0-{offloaded - 1} ({offloaded} of {len(kept)}) in pinned host memory "
        f"between forward and backward ({stage.tokens * kept[0] / GIB:.2f} GiB per layer)",
    )


def vision_activations(stage: Stage) -> Term | None:
    """The ViT's and patch mergers' saved tensors for one micro-batch (first stage only)."""
    if not stage.first:
        return None
    value, detail = _vision_bytes(stage.spec, stage.budget, stage.training)
    return Term("vision_activations", value, detail)


def pipeline_in_flight(stage: Stage, activations: float) -> Term | None:
    """1F1B: the first stage holds the activations of more than one micro-batch."""
    in_flight = stage.in_flight
    if in_flight <= 1:
        return None
    vp = stage.spec.layout.vp
    return Term(
        "pipeline_in_flight",
        (in_flight - 1) * activations,
        f"{in_flight:.2f} micro-batches in flight on the first stage (1F1B"
        f"{', interleaved VP' + str(vp) if vp > 1 else ''}): {in_flight - 1:.2f} more x "
        "(decoder + vision activations)",
    )


def logits_bytes_per_entry(spec: RunSpec) -> tuple[int, str]:
    """Bytes per token per vocabulary entry the loss holds at the end of forward, and why.

    TE's fused cross entropy (every perf recipe's: perf_recipes/_common.py:68, `fusion=recipe`)
    keeps a bf16 copy of the logits and writes the gradient into it in backward
    (transformer_engine/pytorch/cross_entropy.py:36-58, triton/cross_entropy.py:40-44; MCore calls
    it without overwrite_input, extensions/transformer_engine.py:3490-3503): the bf16 logits and
    the copy, no fp32 softmax. Megatron's own (native, fused_cross_entropy.py:119) and the unfused
    vocab-parallel one cast to fp32 and keep the fp32 softmax beside the bf16 logits."""
    impl = spec.fusion.cross_entropy or CrossEntropyFusion.te
    if impl is CrossEntropyFusion.te:
        return 2 * BF16, "bf16 logits + the bf16 copy TE's fused cross entropy keeps"
    return BF16 + FP32, f"bf16 logits + fp32 softmax kept by the {impl.value} vocab-parallel cross entropy"


def logits(stage: Stage) -> Term | None:
    """Last stage: the logits and what the cross entropy keeps of them."""
    if not (stage.last and stage.training.anything):
        return None
    tokens, vocab, tp = stage.tokens, stage.spec.model.vocab_size, stage.tp
    per_entry, why = logits_bytes_per_entry(stage.spec)
    return Term(
        "logits",
        tokens * vocab / tp * per_entry,
        f"{tokens:.0f} tokens x {vocab} vocab / TP{tp} x ({why})",
    )


def _deepep_bytes(spec: RunSpec) -> tuple[float, str]:
    """DeepEP normal-mode buffers: Megatron fused_a2a.get_buffer sizes them with DeepEP's hints.

    DeepEP csrc/config.hpp get_nvl_buffer_size_hint: channels (num_sms/2) x NVLink ranks (<= 8) x
    recv-chunk tokens x (hidden bytes + top-k index/weight slots + FP8 scale slots + source meta);
    get_rdma_buffer_size_hint adds the same per RDMA rank (x2: send + receive) past 8 ranks.
    Recv-chunk tokens come from Buffer.get_dispatch_config (256 for <= 8 ranks, 288 up to 64).
    """
    model, lay = spec.model, spec.layout
    ranks = max(lay.ep * lay.tp, 1)
    num_sms = spec.dispatcher.num_sms or DEEPEP_DEFAULT_NUM_SMS
    channels = num_sms // 2
    nvl_ranks = min(ranks, 8)
    rdma_ranks = max(ranks // 8, 1)
    max_topk, max_scales, source_meta = 128, 128, 8
    per_token = BF16 * model.hidden_size + max_topk * 8 + max_topk * FP32 + max_scales * FP32 + source_meta
    recv_tokens = 256 if ranks <= 8 else 288 if ranks <= 64 else 560 if ranks <= 128 else 720
    nvl = channels * nvl_ranks * recv_tokens * per_token
    rdma = 2 * channels * rdma_ranks * 128 * per_token if ranks > 8 else 0
    detail = (
        f"DeepEP: {channels} channels x {nvl_ranks} NVLink ranks x {recv_tokens} tokens x {per_token} B"
        + (f" + RDMA 2 x {channels} x {rdma_ranks} ranks x 128 tokens x {per_token} B" if rdma else "")
        + " (DeepEP config.hpp size hints, as Megatron fused_a2a.get_buffer requests them)"
    )
    return float(nvl + rdma), detail


def _hybridep_bytes(spec: RunSpec) -> tuple[float, str]:
    """HybridEP buffers: DeepEP hybrid-ep csrc allocate_buffer_for_dispatch / _for_combine.

    Sized for the worst case, every token of every rank in the NVLink domain routed to one
    rank: max tokens = tokens per rank x ranks per domain x domains. Dispatch and combine each
    hold a bf16 token buffer of max tokens x hidden and an fp32 prob buffer of max tokens x the
    domain's experts; dispatch adds fp32 scaling factors (hidden/128 per token); across domains
    (multi-node NVLink off) three staging buffers of tokens x (domains - 1) x hidden more.
    """
    model, lay = spec.model, spec.layout
    tokens = spec.mbs * spec.seq_length // max(lay.tp * lay.cp, 1)
    ranks_per_domain = max(min(lay.ep, spec.cluster.nvlink_domain_gpus), 1)
    domains = max(math.ceil(lay.ep / ranks_per_domain), 1)
    max_tokens = tokens * ranks_per_domain * domains
    experts_in_domain = model.num_experts // max(lay.ep, 1) * ranks_per_domain
    h = model.hidden_size
    token_buffers = 2 * max_tokens * h * BF16
    prob_buffers = 2 * max_tokens * experts_in_domain * FP32
    scaling = max_tokens * (h // 128) * FP32
    staging = 3 * tokens * (domains - 1) * (h * BF16 + experts_in_domain * FP32)
    detail = (
        f"HybridEP worst case {max_tokens} tokens ({tokens}/rank x {ranks_per_domain} ranks x "
        f"{domains} domain(s)): "
        f"2 x bf16 token buffers {token_buffers / GIB:.2f} GiB + fp32 probs over {experts_in_domain} experts "
        f"{prob_buffers / GIB:.2f} GiB + scales"
        + (f" + inter-domain staging {staging / GIB:.2f} GiB" if staging else "")
    )
    return float(token_buffers + prob_buffers + scaling + staging), detail


def dispatcher_buffers(spec: RunSpec) -> Term:
    backend = spec.dispatcher.backend
    if backend is FlexBackend.deepep:
        value, detail = _deepep_bytes(spec)
    elif backend is FlexBackend.hybridep:
        value, detail = _hybridep_bytes(spec)
    else:
        value, detail = (
            0.0,
            f"{spec.dispatcher.name}: permute buffers are ordinary activations (counted above)",
        )
    return Term("dispatcher_buffers", value, detail, allocator=False)


def cuda_graph_pool(stage: Stage, activations: float) -> Term:
    """Static inputs/outputs of the captured scopes, per layer per micro-batch graph set."""
    spec = stage.spec
    graph = spec.cuda_graph
    if graph.impl is CudaGraphImpl.none:
        return Term("cuda_graph_pool", 0.0, "no CUDA graphs")
    if graph.impl is CudaGraphImpl.full_iteration:
        # Every intermediate of the captured iteration lives in the graph's private pool, which
        # eager allocations cannot reuse: one more micro-batch of activations, an upper bound.
        return Term(
            "cuda_graph_pool",
            activations + CUDA_GRAPH_POOL_CONSTANT_GIB * GIB,
            "full-iteration graph: its private pool keeps one micro-batch of activations apart from the "
            f"eager pool (upper bound) + {CUDA_GRAPH_POOL_CONSTANT_GIB} GiB capture workspace",
        )
    model = spec.model
    hidden = BF16 * model.hidden_size / sp_ranks(spec)
    per_scope = {
        "attn": 2 * hidden,  # static input + output hidden states
        "moe_router": hidden + (FP32 + 1) * model.num_experts,  # input + probs + routing map
        "moe_preprocess": 8 * model.moe_top_k,  # permutation indices
        "mlp": 2 * hidden,
        "moe": 2 * hidden,
        "mamba": 2 * hidden,
    }
    scopes = graph.scope or ["attn", "mlp"]
    per_token = sum(per_scope.get(s, 2 * hidden) for s in scopes)
    graph_sets = max(math.ceil(stage.in_flight), 1)
    layers, tokens = len(stage.layers), stage.tokens
    static = per_token * tokens * layers * graph_sets
    return Term(
        "cuda_graph_pool",
        static + CUDA_GRAPH_POOL_CONSTANT_GIB * GIB,
        f"TE graphs of [{', '.join(scopes)}]: static I/O {per_token:.0f} B/token x {tokens:.0f} tokens "
        f"x {layers} "
        f"layers x {graph_sets} micro-batch graph set(s) + {CUDA_GRAPH_POOL_CONSTANT_GIB} GiB pool workspace",
    )


# --- assembly ------------------------------------------------------------------------------------


def megatron_stage(spec: RunSpec, stage: int, budget: ImageBudget, counts: ParamCounts) -> MemoryEstimate:
    at = Stage(spec, stage, budget, counts, training_of(spec, budget))
    terms = params_terms(at)
    terms += [t for t in (fsdp_buffers(at),) if t]
    decoder, vision, offload = decoder_activations(at), vision_activations(at), activation_offload(at)
    activations = decoder.bytes + (vision.bytes if vision else 0.0) + (offload.bytes if offload else 0.0)
    optional = (offload, vision, pipeline_in_flight(at, activations), logits(at))
    terms += [decoder, *(t for t in optional if t)]
    terms += [dispatcher_buffers(spec), cuda_graph_pool(at, activations)]
    terms.append(framework_overhead(terms))
    return MemoryEstimate(
        engine=Engine.megatron,
        device="gpu",
        measured_as="cuda_max_allocated",
        capacity_gib=spec.cluster.gpu_memory_gib or None,
        peak_stage="only" if at.pp == 1 else ("first" if at.first else "last"),
        terms=tuple(terms),
        notes=(
            "GPU terms are analytic and not yet calibrated on a GPU (scripts/calibrate_memory.py measures "
            "the torch engine on CPU; see docs/memory-and-advisor.md).",
            "expert activations assume balanced routing: exact with router=forced_balance; with real "
            "routing (the default) an overloaded expert adds to the expert terms.",
        ),
    )


def megatron_estimate(spec: RunSpec, budget: ImageBudget) -> MemoryEstimate:
    """The fuller of the first and last pipeline stages (the only one without PP)."""
    counts = param_counts(spec.model)
    pp = max(spec.layout.pp, 1)
    stages = [megatron_stage(spec, s, budget, counts) for s in sorted({0, pp - 1})]
    return max(stages, key=lambda e: e.total_gib)
