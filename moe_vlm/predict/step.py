"""One micro-batch on one GPU (or CPU rank), as Megatron (or the torch engine) runs it.

``StepModel`` prices the pieces of a micro-batch from the point's knobs and the hardware's rates
(kernels.py): the vision tower at its patches and the wait for the rank with the most image work,
the projector, each decoder layer (attention or Gated DeltaNet, the router, the routed experts at
the tokens each local expert receives, shared experts or a dense MLP), the logits; each kernel
class forward and backward as frozen modules and recompute say; what crosses links per layer (EP
dispatch and combine per dispatcher, ETP, TP/SP) before any overlap; the host's launches that the
device waits for (CUDA graphs capture them away). step_time.py adds the micro-batches up into a step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import NormalDist

from moe_vlm.config.arch import Mixer, Mlp, attention_shape, dense_mlp_weights, gdn_shape, moe_shape
from moe_vlm.config.precision import profile as precision_profile
from moe_vlm.config.schema import (
    CudaGraphImpl,
    Engine,
    ModelConfig,
    Precision,
    RecomputeGranularity,
    RecomputeMethod,
)
from moe_vlm.config.spec import RunSpec
from moe_vlm.data.workers import data_workers
from moe_vlm.perf.flops import Workload, multipliers, padded_vocab_size
from moe_vlm.perf.memory.shared import ParamCounts, param_counts
from moe_vlm.predict import kernels as k
from moe_vlm.predict.hardware import NCCL_EFFICIENCY, Hardware, Link
from moe_vlm.predict.terms import Term, ep_term, routing_load
from moe_vlm.predict.workload import SampleSpread

BF16_BYTES, FP32_BYTES = 2, 4
# Memory-bound bytes per token per decoder layer, forward, in units of the activation's width:
# two RMSNorms (read + write h each), two residual adds (read 2h, write h), rotary on q and k; per
# routed token the SwiGLU (read 2f, write f) and the permute and unpermute copies (read + write h
# each). Backward moves about twice as much.
NORM_RESIDUAL_PASSES = 10
ROPE_PASSES = 4
SWIGLU_PASSES = 3
PERMUTE_PASSES = 4
BACKWARD_MEMORY = 2.0
# Selective recompute of the norms (4 of a layer's 10 norm and residual passes) or of the MoE
# activation (3 of a routed token's 7 passes) runs about a third of the memory-bound work again.
SELECTIVE_ELEMENTWISE_SHARE = 0.3
# The dispatcher's host sync (MCore token_dispatcher.py: tokens per expert copied to the host to
# size the exchange, at `moe_router` / `cuda_sync_point`) stops the host from running ahead once per
# MoE layer and pass: the kernels from the router to the experts' first GEMM are then launched while
# the device waits. Their counts per pass are estimates read off megatron-core 0.19.2's router (top-k,
# softmax, aux loss: router.py) and dispatcher (preprocess: token counts, splits; permute:
# moe_utils.permute), not a profile: no GPU here (docs/step-time-prediction.md says what they miss).
ROUTER_KERNELS = 12
PREPROCESS_KERNELS = 8
PERMUTE_KERNELS = 6
# Kernels per layer and pass a Megatron GPU launches (the host-bound check: a layer whose device
# time is below its launches waits for the host), estimated the same way. TE fuses norms into the GEMMs.
ATTENTION_KERNELS = 12
MLP_KERNELS = 6
GDN_KERNELS = 24
VIT_BLOCK_KERNELS = 14
# The torch engine's eager ops per micro-batch, forward (transformers' Qwen3-VL-MoE, counted with a
# TorchDispatchMode: tests/unit/test_predict_kernels.py recounts them): per ViT block, per decoder
# layer, per merger, and the model's glue (embedding, rotary index, masks, deepstack, the loss).
# Backward runs about as many.
TORCH_OPS = {"vit_block": 52, "decoder_layer": 112, "merger": 8, "patch_embed": 3, "glue": 370}
# EP kernels' bandwidth as a share of the link's one-way line rate, at their recipes' SM counts
# (rates.md 4a). HybridEP, GB200 MNNVL EP8 32 SMs: dispatch 455, combine 569 GB/s of 900; B200 NVL8
# 16 SMs 410 / 531. DeepEP, B200 NVL8 20 SMs (its default): ~400 / 350 (16 SMs 348 / 302, 32 SMs
# 619 / 524). Across domains both move each token once per destination node (DeepEP legacy.md:
# 43-58 GB/s RDMA on 50 GB/s CX7; HybridEP H100 IB 45-58): the NIC's rate on deduplicated bytes.
EP_KERNEL_SHARE = {Term.ep_hybridep: 0.56, Term.ep_deepep: 0.42}


@dataclass
class Tally:
    """Seconds per term, with a line of why each is what it is."""

    seconds: dict[Term, float] = field(default_factory=dict)
    why: dict[Term, str] = field(default_factory=dict)

    def add(self, term: Term, seconds: float, why: str = "") -> None:
        if seconds <= 0:
            return
        self.seconds[term] = self.seconds.get(term, 0.0) + seconds
        if why and term not in self.why:
            self.why[term] = why

    def scaled(self, factor: float) -> Tally:
        return Tally({t: s * factor for t, s in self.seconds.items()}, dict(self.why))

    def merge(self, other: Tally) -> None:
        for term, seconds in other.seconds.items():
            self.add(term, seconds, other.why.get(term, ""))

    @property
    def total(self) -> float:
        return sum(self.seconds.values())


_PARAMS: dict[str, ParamCounts] = {}


def param_counts_of(model: ModelConfig) -> ParamCounts:
    """param_counts, once per model (a big dry run predicts many points of one model)."""
    key = repr(model)
    if key not in _PARAMS:
        _PARAMS[key] = param_counts(model)
    return _PARAMS[key]


def param_split(spec: RunSpec) -> tuple[float, float]:
    """Parameters one rank holds before data-parallel sharding: (dense over TP x PP, routed
    experts over EP x ETP x PP)."""
    lay = spec.layout
    params = param_counts_of(spec.model)
    experts = sum(layer.experts for layer in params.layers)
    return (params.total - experts) / max(lay.tp * lay.pp, 1), experts / max(lay.ep * lay.etp * lay.pp, 1)


@dataclass(frozen=True)
class MicroBatch:
    """What one rank computes for one micro-batch: tokens, attention and vision statistics."""

    tokens: float  # decoder positions per rank (after CP)
    attention_squares: float  # sum of sequence length^2 the attention covers, per rank
    attention_length: float  # its FLOP-weighted mean sequence length
    mask: k.AttentionMask  # how the decoder's attention kernel bounds its square
    patches: float
    patch_squares: float
    samples: float


def micro_batch(spec: RunSpec, workload: Workload) -> MicroBatch:
    lay = spec.layout
    per = max(lay.dp * max(spec.accumulation_steps, 1), 1)
    padded = workload.padded()
    tokens = padded.padded_tokens / per
    squares = padded.sum_seq_len_squared / per
    # transformers' SDPA on a padded row applies a dense mask over the whole row (no triangle
    # skipped); Megatron's fused attention is causal, and so is the torch engine on packed samples.
    causal = spec.engine is Engine.megatron or workload.packed
    mask = k.AttentionMask.causal if causal else k.AttentionMask.dense
    length = squares / tokens if tokens > 0 else 0.0
    samples = (workload.samples or workload.sequences) / per
    return MicroBatch(
        tokens=tokens / max(lay.cp, 1),
        attention_squares=squares / max(lay.cp, 1),
        attention_length=length,
        mask=mask,
        patches=workload.vision_patches / per,
        patch_squares=workload.sum_patches_squared / per,
        samples=samples,
    )


@dataclass(frozen=True)
class Passes:
    """GEMMs in backward per module (2: dgrad + wgrad, 1: dgrad only, 0: none) and whether a
    gradient flows through each module's attention."""

    vision: int
    projector: int
    decoder: int
    vision_grad: bool
    decoder_grad: bool


def passes(spec: RunSpec) -> Passes:
    factors = multipliers(spec.freeze.vision, spec.freeze.projector, spec.freeze.language)
    return Passes(
        vision=factors["vision_encoder"].weight - 1,
        projector=factors["projector"].weight - 1,
        decoder=factors["decoder"].weight - 1,
        vision_grad=factors["vision_encoder"].activation > 1,
        decoder_grad=factors["decoder"].activation > 1,
    )


def full_graph(spec: RunSpec) -> bool:
    """One graph for the whole forward-backward (cuda_graph=full_iteration): no launch is paid."""
    graphs = spec.cuda_graph
    return spec.engine is Engine.megatron and (
        graphs.impl is CudaGraphImpl.full_iteration or "full_iteration" in graphs.scope
    )


def _graphed(spec: RunSpec, scope: str) -> bool:
    """Whether a TE-scoped (or full-iteration) CUDA graph captures `scope`'s kernels."""
    graphs = spec.cuda_graph
    if graphs.impl is CudaGraphImpl.none or spec.engine is not Engine.megatron:
        return False
    return full_graph(spec) or scope in graphs.scope


@dataclass(frozen=True)
class VisionCost:
    """The ViT and projector of one micro-batch on one rank."""

    seconds: Tally
    kernels: float  # kernels the device runs (GPU) or eager ops (CPU)
    attention_s: float  # of which the attention per image: the part that grows with patches squared


@dataclass(frozen=True)
class LayerCost:
    """One decoder layer of one micro-batch on one rank: device seconds per term, its EP and TP
    exchange before any overlap, and the host's seconds and kernels."""

    device: Tally
    comm: Tally
    host: float  # launch or op-dispatch seconds the step pays (see _host)
    kernels: float  # kernels the device runs (the host-bound check)


class StepModel:
    """The step's pieces for one point on one Hardware (built once per prediction)."""

    def __init__(self, spec: RunSpec, workload: Workload, hw: Hardware, spread: SampleSpread) -> None:
        self.spec, self.hw, self.workload, self.spread = spec, hw, workload, spread
        self.in_loop_data = data_workers(spec).count == 0
        self.model = spec.model
        self.lay = spec.layout
        self.mb = micro_batch(spec, workload)
        self.passes = passes(spec)
        self.precision = spec.precision.format
        self.torch = spec.engine is Engine.torch
        self.routing = routing_load(spec)
        self.load = self.routing.factor if self.routing is not None else 1.0
        self.micro_batches = max(spec.accumulation_steps, 1)
        self.sp_tp = self.lay.tp if spec.sequence_parallel else 1

    # --- kernels ------------------------------------------------------------------------------

    def linear(
        self, m: float, n: float, kk: float, backward: int, precision: Precision | None = None
    ) -> float:
        return k.linear_s(self.hw, m, n, kk, precision or self.precision, backward)

    def ops(self, count: float) -> float:
        """Host seconds of `count` kernels or eager ops."""
        return count * self.hw.launch_s

    # --- the vision tower ---------------------------------------------------------------------

    def imbalance(self, vision: VisionCost) -> Tally:
        """Waiting, per micro-batch, for the data-parallel rank that drew the most image work.

        Each rank's micro-batch holds different samples; every rank waits for the slowest at the
        next collective (FSDP's gather of the first decoder layer, the gradient reduction). A
        micro-batch's ViT seconds are a x P + b x Q over its samples (P patches, Q squared patch
        counts per image: the attention); with the samples' spread (workload.SampleSpread) the
        slowest of n ranks takes mean + sigma x e(n), e(n) the expected largest of n standard
        normals (Blom's approximation, Phi^-1((n - 0.375) / (n + 0.25)))."""
        out = Tally()
        n, spread, mb = self.lay.dp * self.lay.cp, self.spread, self.mb
        if n <= 1 or spread.p_var <= 0 or mb.patches <= 0 or mb.samples <= 0:
            return out
        core = vision.attention_s
        linear = vision.seconds.total - core
        per_patch = linear / mb.patches + (self.hw.data_patch_s if self.in_loop_data else 0.0)
        per_square = core / max(mb.patch_squares, 1.0)
        variance = mb.samples * (
            per_patch**2 * spread.p_var
            + per_square**2 * spread.q_var
            + 2 * per_patch * per_square * spread.pq_cov
        )
        largest = NormalDist().inv_cdf((n - 0.375) / (n + 0.25))
        seconds = math.sqrt(max(variance, 0.0)) * largest
        out.add(
            Term.imbalance,
            seconds,
            f"the slowest of {n} data-parallel ranks: +{largest:.2f} sigma of a micro-batch's image work "
            f"({math.sqrt(max(variance, 0.0)) * 1e3:,.3g} ms)",
        )
        return out

    def vision(self) -> VisionCost:
        """The ViT and the projector for one micro-batch."""
        out, model, mb, hw = Tally(), self.model, self.mb, self.hw
        if model.vision_depth <= 0 or mb.patches <= 0:
            return VisionCost(out, 0.0, 0.0)
        tp = self.lay.tp
        h, inter = model.vision_hidden_size, model.vision_intermediate_size
        back, grad = self.passes.vision, self.passes.vision_grad
        heads = max(model.vision_num_heads // tp, 1)
        head_dim = h // max(model.vision_num_heads, 1)
        pixels = 3 * model.vision_temporal_patch_size * model.vision_patch_size**2
        bf16 = Precision.bf16  # the vision tower never enters FP8/FP4 (perf/peaks.py BF16_MODULES)
        embed = k.conv_s(hw, mb.patches, h, pixels, backward=back >= 2)
        block = (
            self.linear(mb.patches, 3 * h / tp, h, back, bf16)
            + self.linear(mb.patches, h, h / tp, back, bf16)
            + self.linear(mb.patches, inter / tp, h, back, bf16)
            + self.linear(mb.patches, h, inter / tp, back, bf16)
        )
        length = mb.patch_squares / mb.patches
        core = k.attention_s(hw, mb.patch_squares, length, heads, head_dim, k.AttentionMask.none, grad)
        memory = k.memory_s(hw, mb.patches * h * BF16_BYTES * 8 * (1 + BACKWARD_MEMORY * grad))
        depth = model.vision_depth
        out.add(
            Term.vision,
            embed + depth * (block + core + memory),
            f"{mb.patches:,.0f} patches/micro-batch, {depth} blocks; attention per image ~{length:,.0f} patches",
        )
        merge = model.vision_spatial_merge_size**2
        merged = mb.patches / merge
        mergers = 1 + len(model.vision_deepstack_layers)
        pback = self.passes.projector
        merger = self.linear(merged, h * merge, h * merge / tp, pback, bf16) + self.linear(
            merged, model.projector_out_size, h * merge / tp, pback, bf16
        )
        out.add(Term.projector, mergers * merger, f"{mergers} merger(s) over {merged:,.0f} merged tokens")
        if self.torch:
            count = TORCH_OPS["patch_embed"] + depth * TORCH_OPS["vit_block"] + mergers * TORCH_OPS["merger"]
            return VisionCost(out, count * (1 + (back > 0)), depth * core)
        return VisionCost(
            out, (2 + depth * VIT_BLOCK_KERNELS + 4 * mergers) * (1 + 2 * (back > 0)), depth * core
        )

    # --- a decoder layer ----------------------------------------------------------------------

    def experts_per_rank(self) -> tuple[int, float]:
        """(local experts, tokens each receives per micro-batch), at the routing load."""
        model, lay = self.model, self.lay
        experts = max(model.num_experts, 1)
        tokens = self.mb.tokens / self.sp_tp
        per_expert = tokens * model.moe_top_k * lay.ep * lay.etp / experts * self.load
        # FP8/FP4 expert inputs are padded to the format's token multiple (config/precision.py).
        multiple = precision_profile(self.precision).token_multiple
        per_expert = math.ceil(per_expert / multiple) * multiple if per_expert > 0 else 0.0
        return max(experts // max(lay.ep, 1), 1), per_expert

    def layer(self, mixer: Mixer, mlp: Mlp) -> LayerCost:
        model, mb, lay, hw = self.model, self.mb, self.lay, self.hw
        device, comm = Tally(), Tally()
        back, grad = self.passes.decoder, self.passes.decoder_grad
        tp, tokens = lay.tp, mb.tokens
        h = model.hidden_size
        kernels = 0.0
        if mixer is Mixer.full_attention:
            shape = attention_shape(model)
            qkv = (shape.query + shape.gate + 2 * shape.key_value) / tp
            device.add(
                Term.dense,
                self.linear(tokens, qkv, h, back) + self.linear(tokens, h, shape.query / tp, back),
                f"GEMMs at {tokens:,.0f} tokens/micro-batch ({self.precision.value}, {back} backward GEMM(s) each)",
            )
            heads = max(shape.heads // tp, 1)
            device.add(
                Term.attention,
                k.attention_s(
                    hw, mb.attention_squares, mb.attention_length, heads, shape.head_dim, mb.mask, grad
                ),
                f"sum s^2 {mb.attention_squares:.3g}/micro-batch, mean s {mb.attention_length:,.0f}, "
                f"{heads} heads x {shape.head_dim}, {mb.mask.value} mask",
            )
            device.add(Term.elementwise, k.memory_s(hw, tokens * shape.query / tp * BF16_BYTES * ROPE_PASSES))
            kernels += self.launched(ATTENTION_KERNELS, "attn")
        else:
            gdn = gdn_shape(model)
            weights = (gdn.in_projection_weights + gdn.out_projection_weights) / tp
            gemm = self.linear(tokens, weights / h, h, back)
            # fla's chunked delta rule (core/ssm/gated_delta_net) in BF16: no published rate, so at
            # the attention kernels' long-sequence rate (the plan calls the architecture uncalibrated).
            recurrence = 2.0 * tokens * gdn.recurrence_macs / tp
            rate = hw.peak(Precision.bf16) * hw.attention_efficiency
            device.add(
                Term.gdn, gemm + recurrence / rate * (1 + 2.5 / hw.attention_backward_efficiency * grad)
            )
            kernels += self.launched(GDN_KERNELS, "attn")  # Qwen3.5's GDN layers graph as `attn`
        device.add(
            Term.elementwise,
            k.memory_s(hw, tokens / self.sp_tp * h * BF16_BYTES * NORM_RESIDUAL_PASSES),
            "norms, residuals, rotary, SwiGLU and token permutes at the memory rate",
        )
        if mlp is Mlp.moe:
            moe = moe_shape(model)
            moe_tokens = tokens / self.sp_tp
            device.add(
                Term.router,
                self.linear(moe_tokens, moe.experts, h, back, Precision.bf16),
                f"{moe_tokens:,.0f} tokens x {moe.experts} experts",
            )
            local, per_expert = self.experts_per_rank()
            f = moe.expert_ffn / lay.etp
            experts = k.grouped_linear_s(hw, local, per_expert, 2 * f, h, self.precision, back) + (
                k.grouped_linear_s(hw, local, per_expert, h, f, self.precision, back)
            )
            load = f" at routing load x{self.load:g}" if self.load != 1 else ""
            device.add(
                Term.experts,
                experts,
                f"{local} local experts x {per_expert:,.0f} tokens each per micro-batch{load} ({self.precision.value})",
            )
            routed = local * per_expert
            # Permuted and unpermuted before the ETP all-gather (each routed copy once), sorted by
            # expert again after it (every ETP rank holds all of its experts' tokens).
            before_gather = moe_tokens * moe.top_k * self.load
            device.add(
                Term.elementwise,
                k.memory_s(
                    hw,
                    BF16_BYTES
                    * (
                        routed * SWIGLU_PASSES * f
                        + (before_gather * PERMUTE_PASSES + routed * 2 * (lay.etp > 1)) * h
                    ),
                ),
            )
            if moe.shared_ffn:
                sf = moe.shared_ffn / tp
                # Column- and row-parallel like any TP MLP: every token (gathered under SP), width / TP.
                device.add(
                    Term.dense, self.linear(tokens, 2 * sf, h, back) + self.linear(tokens, h, sf, back)
                )
            kernels += (
                self.launched(ROUTER_KERNELS, "moe_router")
                + self.launched(PREPROCESS_KERNELS, "moe_preprocess")
                + self.launched(PERMUTE_KERNELS + 4 + 2 * local, "moe")
            )
            comm.merge(self.ep_exchange(moe_tokens))
        else:
            ffn = model.dense_ffn_hidden_size / tp
            device.add(Term.dense, self.linear(tokens, 2 * ffn, h, back) + self.linear(tokens, h, ffn, back))
            kernels += self.launched(MLP_KERNELS, "mlp")
        memory_back = BACKWARD_MEMORY if grad else 0.0
        device.seconds[Term.elementwise] = device.seconds.get(Term.elementwise, 0.0) * (1 + memory_back)
        comm.merge(self.tp_exchange(collectives_per_layer=4 * (1 + grad)))
        if self.torch:
            return LayerCost(device, comm, self.ops(TORCH_OPS["decoder_layer"] * (1 + grad)), 0.0)
        return LayerCost(device, comm, self.moe_sync_launches(mlp), kernels * (1 + 2 * grad))

    def launched(self, kernels: int, scope: str) -> int:
        """Launches the host makes for `kernels` kernels of a graph scope: one when a CUDA graph
        captures the scope (a TE-scoped graph replays per layer), else each."""
        return 1 if _graphed(self.spec, scope) else kernels

    def moe_sync_launches(self, mlp: Mlp) -> float:
        """Host seconds the device waits for after each MoE dispatcher sync, per layer and
        micro-batch (forward and backward), less what CUDA graphs capture."""
        if mlp is not Mlp.moe or full_graph(self.spec):
            return 0.0
        router = 1 if _graphed(self.spec, "moe_router") else ROUTER_KERNELS
        preprocess = 1 if _graphed(self.spec, "moe_preprocess") else PREPROCESS_KERNELS
        return self.ops(router + preprocess + PERMUTE_KERNELS) * (1 + self.passes.decoder_grad)

    # --- links --------------------------------------------------------------------------------

    def link_for(self, extent: int) -> Link:
        """The link a group of `extent` consecutive ranks crosses: NVLink inside one domain."""
        return self.hw.nvlink if extent <= self.lay.nvlink_domain_gpus else self.hw.scale_out

    def ep_exchange(self, moe_tokens: float) -> Tally:
        """Dispatch and combine for one MoE layer and micro-batch, forward and backward, before any
        overlap (step_time.py's exposed() decides what it hides)."""
        out = Tally()
        lay, model = self.lay, self.model
        group = lay.ep
        if group <= 1:
            return out
        term = ep_term(self.spec)
        passes = 2 * (1 + self.passes.decoder_grad) + self.moe_recompute_passes()
        width = model.hidden_size * BF16_BYTES
        domain = lay.nvlink_domain_gpus
        inside = min(group, domain)
        remote_domains = max(math.ceil(group / domain), 1)
        # MCore's all-to-all dispatcher permutes a copy per routed expert; DeepEP and HybridEP send a
        # token once per destination rank (their tests count received tokens per rank: DeepEP
        # tests/test_intranode.py), so the copies are the distinct ranks its top-k experts sit on.
        copies = model.moe_top_k * self.load
        if term in EP_KERNEL_SHARE:
            copies = group * (1 - (1 - 1 / group) ** model.moe_top_k) * self.load
        # Spread over the group: a share (inside - 1) / (group - 1) stays in the domain, the rest crosses it.
        sent = moe_tokens * copies * width * (group - 1) / group
        intra_share = (inside - 1) / max(group - 1, 1)
        hw = self.hw
        if term is Term.ep_allgather:
            gathered = moe_tokens * width * group
            seconds = k.ring_s(self.link_for(group * lay.tp), gathered, group) * passes
            why = f"all-gather of {moe_tokens:,.0f} tokens x {group} ranks"
        elif term in EP_KERNEL_SHARE:
            share = EP_KERNEL_SHARE[term]
            line_rate = hw.nvlink.bytes_per_s / NCCL_EFFICIENCY
            intra = sent * intra_share / (line_rate * share) if intra_share > 0 else 0.0
            # Deduplicated across domains: a token goes once to each other domain holding one of its experts.
            touched = (remote_domains - 1) * (1 - (1 - 1 / remote_domains) ** model.moe_top_k)
            inter = moe_tokens * width * touched / hw.scale_out.bytes_per_s
            seconds = (max(intra, inter) + hw.nvlink.base_s) * passes
            why = f"{sent * intra_share / 1e6:,.1f} MB/pass inside the domain (a copy per destination rank)"
            if touched > 0:
                why += f", {moe_tokens * width * touched / 1e6:,.1f} MB/pass across (a copy per destination domain)"
        else:
            intra = sent * intra_share / hw.nvlink.bytes_per_s
            inter = sent * (1 - intra_share) / hw.scale_out.bytes_per_s
            link = hw.nvlink if intra_share >= 1 else hw.scale_out
            # The token counts first (MCore preprocess: a small all-to-all/all-gather), then the tokens.
            seconds = (max(intra, inter) + 2 * (link.base_s + link.hop_s)) * passes
            why = f"{sent / 1e6:,.1f} MB/pass, {1 - intra_share:.0%} across domains"
        if lay.etp > 1:
            # ETP: the received tokens all-gathered over the expert-TP group before the experts and
            # reduce-scattered after them (MCore's dispatcher), per pass.
            _local, per_expert = self.experts_per_rank()
            routed = _local * per_expert * width
            seconds += k.ring_s(self.link_for(group * lay.etp), routed, lay.etp) * passes
            why += f"; ETP {lay.etp} all-gather/reduce-scatter of {routed / 1e6:,.1f} MB"
        out.add(term, seconds, f"{why}; {passes} passes")
        return out

    def moe_recompute_passes(self) -> int:
        recompute = self.spec.recompute
        if recompute.granularity is RecomputeGranularity.full:
            return 2
        if recompute.granularity is RecomputeGranularity.selective and "moe" in recompute.modules:
            return 2
        return 0

    def tp_exchange(self, collectives_per_layer: int) -> Tally:
        out = Tally()
        tp = self.lay.tp
        if tp <= 1:
            return out
        size = self.mb.tokens * self.model.hidden_size * BF16_BYTES
        count = collectives_per_layer + (
            4 if self.spec.recompute.granularity is RecomputeGranularity.full else 0
        )
        seconds = k.ring_s(self.link_for(tp), size, tp) * count
        out.add(Term.tp, seconds, f"{count} SP collectives/layer of {size / 1e6:,.1f} MB over TP {tp}")
        return out

    def logits(self) -> Tally:
        out = Tally()
        mb = self.mb
        vocab = padded_vocab_size(self.model.vocab_size, self.lay.tp) / self.lay.tp
        gemm = self.linear(mb.tokens, vocab, self.model.hidden_size, self.passes.decoder, Precision.bf16)
        # Cross-entropy in fp32 over the vocabulary: logits written, read for the softmax, gradient written.
        entropy = k.memory_s(self.hw, mb.tokens * vocab * FP32_BYTES * (3 if self.passes.decoder_grad else 1))
        out.add(Term.logits, gemm + entropy, f"{mb.tokens:,.0f} tokens x {vocab:,.0f} vocabulary/rank")
        return out

    # --- recompute ----------------------------------------------------------------------------

    def recomputed_share(self) -> dict[str, float]:
        """The share of each layer part's forward that backward runs again."""
        recompute = self.spec.recompute
        if not self.passes.decoder_grad:
            return {}
        if recompute.granularity is RecomputeGranularity.full:
            layers = self.model.num_layers
            if recompute.method is RecomputeMethod.block:
                share = min(recompute.num_layers * self.lay.pp * max(self.lay.vp, 1), layers) / max(layers, 1)
            else:
                share = 1.0
            return dict.fromkeys(("dense", "attention", "gdn", "router", "experts", "elementwise"), share)
        if recompute.granularity is RecomputeGranularity.selective:
            modules = set(recompute.modules)
            out: dict[str, float] = {}
            if "core_attn" in modules:
                out["attention"] = 1.0
            if "moe" in modules:
                out |= {"experts": 1.0, "router": 1.0}
            if modules & {"layernorm", "moe_act", "gdn_norm_out"}:
                out["elementwise"] = SELECTIVE_ELEMENTWISE_SHARE
            if modules & {"mlp", "shared_experts", "moe"}:
                out["dense"] = self.mlp_share_of_dense()
            return out
        return {}

    def mlp_share_of_dense(self) -> float:
        """The share of the dense term's GEMMs that are the MLP's (shared experts or a dense MLP),
        by weights: what recomputing the MLP (or the whole MoE block) runs again of it."""
        model = self.model
        mlp = moe_shape(model).shared_weights or dense_mlp_weights(model)
        attention = attention_shape(model).projection_weights
        return mlp / max(mlp + attention, 1)

    def forward_of(self, layer: LayerCost) -> Tally:
        """The forward share of a layer's device seconds (recompute re-runs it)."""
        grad = self.passes.decoder_grad
        back = self.passes.decoder
        out = Tally()
        for term, seconds in layer.device.seconds.items():
            if term is Term.attention:
                share = 1 / (1 + 2.5 / self.hw.attention_backward_efficiency) if grad else 1.0
            elif term is Term.elementwise:
                share = 1 / (1 + BACKWARD_MEMORY) if grad else 1.0
            else:
                share = 1 / (1 + back)
            out.add(term, seconds * share)
        return out
