"""One optimizer step on one GPU (or CPU rank), as Megatron (or the torch engine) runs it.

``loads(spec, workload, hw)`` walks the step: per micro-batch and pipeline stage, the vision tower
at its patches, the projector, each decoder layer (attention or Gated DeltaNet, the router, the
routed experts at the tokens each local expert receives, shared experts or a dense MLP), the
logits; each kernel class at its rate (kernels.py), forward and backward as frozen modules and
recompute say; then what crosses links (EP dispatch and combine per dispatcher, TP/SP collectives,
FSDP or the distributed optimizer's gathers and reductions) minus the share each overlap knob
hides; the pipeline's bubble; the host's kernel launches the device waits for (CUDA graphs capture
them away); the optimizer; the data loader's host time against its workers. Every term is a
function of knobs; what no source gives a basis for is in NOT_MODELLED, which the plan prints.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from statistics import NormalDist

from moe_vlm.config.arch import Mixer, Mlp, attention_shape, gdn_shape, layer_kinds, moe_shape
from moe_vlm.config.schema import (
    CudaGraphImpl,
    Engine,
    ModelConfig,
    ParallelismFamily,
    Precision,
    RecomputeGranularity,
    RecomputeMethod,
    ShardingStrategy,
    TokenDispatcher,
)
from moe_vlm.config.spec import RunSpec
from moe_vlm.data.workers import data_workers
from moe_vlm.perf.flops import Workload, multipliers, padded_vocab_size
from moe_vlm.perf.memory.megatron import grad_bytes
from moe_vlm.perf.memory.shared import ParamCounts, param_counts
from moe_vlm.predict import kernels as k
from moe_vlm.predict.hardware import Hardware, Link
from moe_vlm.predict.terms import Load, Term, ep_term, routing_load
from moe_vlm.predict.workload import SampleSpread, expected_workload

BF16_BYTES, FP32_BYTES = 2, 4
# Adam with fp32 main weights, per trainable parameter: read param, grad, m, v (4 x 4 B), write
# param, m, v (3 x 4 B) and the bf16 model copy (2 B) (megatron/core/optimizer/distrib_optimizer.py).
ADAM_BYTES_PER_PARAM = 4 * 4 + 3 * 4 + 2
# On the host (MCore's HybridDeviceOptimizer steps offloaded parameters with torch.optim.AdamW,
# megatron/core/optimizer/__init__.py:11, 512), torch runs AdamW one tensor at a time on CPU tensors
# (torch/optim/adam.py _single_tensor_adam): the weight decay, lerp_, mul_ + addcmul_, sqrt, the
# divide, add_(eps) and addcdiv_ each stream whole fp32 tensors: 12 reads and 8 writes per parameter.
HOST_ADAM_BYTES_PER_PARAM = (12 + 8) * 4
# Memory-bound bytes per token per decoder layer, forward, in units of the activation's width:
# two RMSNorms (read + write h each), two residual adds (read 2h, write h), rotary on q and k; per
# routed token the SwiGLU (read 2f, write f) and the permute and unpermute copies (read + write h
# each). Backward moves about twice as much.
NORM_RESIDUAL_PASSES = 10
ROPE_PASSES = 4
SWIGLU_PASSES = 3
PERMUTE_PASSES = 4
BACKWARD_MEMORY = 2.0
# The dispatcher's host sync (MCore token_dispatcher.py: tokens per expert copied to the host to
# size the exchange, at `moe_router` / `cuda_sync_point`) stops the host from running ahead once per
# MoE layer and pass: the kernels from the router to the experts' first GEMM are then launched while
# the device waits. Their counts, per pass, from megatron-core 0.19.2's router (top-k, softmax, aux
# loss: router.py) and dispatcher (preprocess: token counts, splits; permute: moe_utils.permute):
ROUTER_KERNELS = 12
PREPROCESS_KERNELS = 8
PERMUTE_KERNELS = 6
# Kernels per layer and pass a Megatron GPU launches (the host-bound check: a layer whose device
# time is below its launches waits for the host). TE fuses norms into the GEMMs.
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
# The share of the expert GEMMs' SMs a DeepEP/HybridEP kernel holds while it overlaps them.
NOT_MODELLED = (
    "cuda_graph.warmup_steps: capture happens in warm-up, outside the steady window",
    "HSDP (parallelism.dp_outer): no published rate for Megatron FSDP's outer replicas; their all-reduce "
    "is priced as the inner DP's",
    "CP's KV exchange (cp > 1): no published rate for the ring attention's overlap",
    "offload.activation_layers: TE's activation offload overlaps its copies with compute at a share "
    "no source measures (sister-skills.md 2.5 gives only the optimizer's)",
    "gc (manual / auto): Python garbage-collection pauses depend on the host's heap, which no source measures",
    "fusion knobs (moe_permute_fusion, moe_router_fusion, cross_entropy, bias_activation_fusion): no "
    "published per-kernel A/B; their kernels are in the fixed counts",
    "dispatcher.num_sms and HybridEP chunking: published rates exist at 16-48 SMs but not their cost to "
    "the overlapped GEMMs; the EP kernels run at their recipes' default-SM rate",
)


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


def _param_counts(model: ModelConfig) -> ParamCounts:
    """param_counts, once per model (a big dry run predicts many points of one model)."""
    key = repr(model)
    if key not in _PARAMS:
        _PARAMS[key] = param_counts(model)
    return _PARAMS[key]


def param_split(spec: RunSpec) -> tuple[float, float]:
    """Parameters one rank holds before data-parallel sharding: (dense over TP x PP, routed
    experts over EP x ETP x PP)."""
    lay = spec.layout
    params = _param_counts(spec.model)
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


def _full_graph(spec: RunSpec) -> bool:
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
    return _full_graph(spec) or scope in graphs.scope


@dataclass(frozen=True)
class LayerCost:
    """One decoder layer of one micro-batch on one rank: device seconds per term, exposed EP and
    TP seconds, host seconds (launches), and what recompute re-runs."""

    device: Tally
    comm: Tally
    host: float  # launch or op-dispatch seconds the step pays (see _host)
    kernels: float  # kernels the device runs (the host-bound check)


class StepModel:
    """The step's pieces for one point on one Hardware (built once per prediction)."""

    def __init__(self, spec: RunSpec, workload: Workload, hw: Hardware, spread: SampleSpread) -> None:
        self.spec, self.hw, self.workload, self.spread = spec, hw, workload, spread
        self.vision_core = 0.0  # the ViT's attention seconds per micro-batch (vision() sets it)
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

    def imbalance(self, vision: Tally) -> Tally:
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
        core = self.vision_core
        linear = vision.total - core
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

    def vision(self) -> tuple[Tally, float]:
        """The ViT and the projector for one micro-batch: device seconds and kernel/op count."""
        out, model, mb, hw = Tally(), self.model, self.mb, self.hw
        if model.vision_depth <= 0 or mb.patches <= 0:
            return out, 0.0
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
        self.vision_core = model.vision_depth * core
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
            return out, count * (1 + (back > 0))
        return out, (2 + depth * VIT_BLOCK_KERNELS + 4 * mergers) * (1 + 2 * (back > 0))

    # --- a decoder layer ----------------------------------------------------------------------

    def experts_per_rank(self) -> tuple[int, float]:
        """(local experts, tokens each receives per micro-batch), at the routing load."""
        model, lay = self.model, self.lay
        experts = max(model.num_experts, 1)
        tokens = self.mb.tokens / self.sp_tp
        per_expert = tokens * model.moe_top_k * lay.ep * lay.etp / experts * self.load
        multiple = {Precision.fp8mx: 32, Precision.nvfp4: 16, Precision.fp8cs: 16}.get(self.precision, 1)
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
                device.add(
                    Term.dense,
                    self.linear(moe_tokens * tp / self.sp_tp, 2 * sf, h, back)
                    + self.linear(moe_tokens * tp / self.sp_tp, h, sf, back),
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
        if mlp is not Mlp.moe or _full_graph(self.spec):
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
        overlap (ep_overlap decides what it hides)."""
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
            intra = sent * intra_share / (hw.nvlink.bytes_per_s / 0.82 * share) if intra_share > 0 else 0.0
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
                out["elementwise"] = 0.3
            if "mlp" in modules or "shared_experts" in modules or "moe" in modules:
                out["dense"] = 0.3  # the MLP's (or shared experts') share of the dense GEMMs
            return out
        return {}

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


def _counts(kinds: Iterable[tuple[Mixer, Mlp]]) -> dict[tuple[Mixer, Mlp], int]:
    out: dict[tuple[Mixer, Mlp], int] = {}
    for kind in kinds:
        out[kind] = out.get(kind, 0) + 1
    return out


def loads(spec: RunSpec, workload: Workload, hw: Hardware, spread: SampleSpread | None = None) -> list[Load]:
    """Every nonzero term of one step on one GPU (or CPU rank) at the hardware's rates; `spread`:
    the samples' image-work spread (default: the data distribution's, workload.expected_workload)."""
    model = StepModel(spec, workload, hw, spread if spread is not None else expected_workload(spec).spread)
    lay = spec.layout
    m = model.micro_batches
    kinds = layer_kinds(spec.model)
    costs = {pair: model.layer(*pair) for pair in {(kind.mixer, kind.mlp) for kind in kinds}}
    recompute = model.recomputed_share()
    vision, vision_kernels = model.vision()

    # Per pipeline stage, one micro-batch: its layers, the vision tower on the first, the logits on the last.
    logits = model.logits()
    stages: list[tuple[Tally, Tally, float, float]] = []
    for stage in range(max(lay.pp, 1)):
        device, comm, host, kernels_ = Tally(), Tally(), 0.0, 0.0
        indices = spec.stage_layer_indices(stage) if lay.pp > 1 else range(spec.model.num_layers)
        for kind, count in _counts((kinds[i].mixer, kinds[i].mlp) for i in indices).items():
            cost = costs[kind]
            device.merge(cost.device.scaled(count))
            comm.merge(cost.comm.scaled(count))
            host += cost.host * count
            kernels_ += cost.kernels * count
            redo = model.forward_of(cost)
            for term, seconds in redo.seconds.items():
                device.add(term, seconds * recompute.get(term.value, 0.0) * count)
            if recompute and model.torch:  # the recomputed modules' forward ops run again
                full = spec.recompute.granularity is RecomputeGranularity.full
                host += cost.host / 2 * count * (recompute.get("dense", 0.0) if full else 0.2)
        if stage == 0:
            device.merge(vision)
            device.merge(model.imbalance(vision))
            kernels_ += vision_kernels
            if model.torch:
                host += model.ops(vision_kernels + TORCH_OPS["glue"] * (1 + model.passes.decoder_grad))
        if stage == lay.pp - 1:
            device.merge(logits)
        stages.append((device, comm, host, kernels_))

    # The slowest stage sets the pace; its device time, its exposed exchange, its host time.
    def stage_seconds(entry: tuple[Tally, Tally, float, float]) -> float:
        device, comm, host, kernels_ = entry
        return device.total + _exposed_ep(model, device, comm).total + _host(model, device, host, kernels_)

    slowest = max(stages, key=stage_seconds)
    device, comm, host, kernels_ = slowest
    per_mb = Tally()
    per_mb.merge(device)
    per_mb.merge(_exposed_ep(model, device, comm))
    host_s = _host(model, device, host, kernels_)
    out = per_mb.scaled(m)
    if host_s > 0:
        out.add(
            Term.launch,
            host_s * m,
            f"{'eager ops at ' + f'{hw.launch_s * 1e6:.3g} us' if hw.synchronous else 'launches after the MoE sync at ' + f'{hw.launch_s * 1e6:.3g} us'}"
            f" each, {m} micro-batch(es)",
        )
    for term, why in device.why.items():
        out.why.setdefault(term, why)
    if lay.pp > 1:
        stage_mb = stage_seconds(slowest)
        bubble = (lay.pp - 1) / max(lay.vp, 1) * stage_mb
        p2p = 0.0
        if lay.vp <= 1:  # overlap_p2p_comm is on only with VP (sister-skills C16)
            size = model.mb.tokens * spec.model.hidden_size * BF16_BYTES / model.sp_tp
            p2p = 2 * m * model.link_for(lay.ranks_per_node + 1).seconds(size)
        out.add(
            Term.pipeline,
            bubble + p2p,
            f"bubble (PP-1)/VP = {(lay.pp - 1) / max(lay.vp, 1):.3g} stage-times of {stage_mb * 1e3:,.1f} ms, "
            f"{m} micro-batches; slowest stage of {lay.pp}",
        )
    out.merge(_data_parallel(model, out))
    out.merge(_optimizer(model))
    out.merge(_data(model, out.total))
    return [
        Load(term, seconds, out.why.get(term, "")) for term, seconds in out.seconds.items() if seconds > 0
    ]


def _exposed_ep(model: StepModel, device: Tally, comm: Tally) -> Tally:
    """The EP exchange and TP collectives of one stage and micro-batch left exposed: EP overlap
    (MCore's combined 1F1B) runs one micro-batch's dispatch and combine under another's compute, so
    all but the first forward's and last backward's can hide, up to the compute there is."""
    out = Tally()
    spec = model.spec
    overlap = spec.dispatcher.overlap_moe_expert_parallel_comm and model.micro_batches > 1
    compute = (
        device.seconds.get(Term.experts, 0.0)
        + device.seconds.get(Term.attention, 0.0)
        + device.seconds.get(Term.dense, 0.0)
    )
    for term, seconds in comm.seconds.items():
        why = comm.why.get(term, "")
        if term is Term.tp:
            if _tp_overlap(spec):
                hidden = min(
                    seconds, device.seconds.get(Term.dense, 0.0) + device.seconds.get(Term.experts, 0.0)
                )
                out.add(term, seconds - hidden, f"{why}; userbuffers overlap hides {hidden / seconds:.0%}")
            else:
                out.add(term, seconds, why)
            continue
        if overlap:
            hidden = min(seconds, compute) * (model.micro_batches - 1) / model.micro_batches
            out.add(term, seconds - hidden, f"{why}; EP overlap hides {hidden / seconds:.0%}")
        else:
            out.add(term, seconds, f"{why}; not overlapped")
    return out


def _tp_overlap(spec: RunSpec) -> bool:
    tp_comm = spec.overlap.tp_comm
    return spec.sequence_parallel and (tp_comm if tp_comm is not None else True)


def _host(model: StepModel, device: Tally, host: float, kernels_: float) -> float:
    """Host seconds per micro-batch the device waits for. CPU: every op (the host is the device).
    GPU: the launches after each MoE sync, and any excess of all launches over the device time
    (a layer too small to cover its own launches); full-iteration graphs launch once."""
    if model.hw.synchronous:
        return host
    if _full_graph(model.spec):
        return 0.0
    launches = model.ops(kernels_)
    return host + max(0.0, launches - device.total)


def _data_parallel(model: StepModel, step: Tally) -> Tally:
    """FSDP's or the distributed optimizer's traffic per step, less what its overlap hides."""
    out = Tally()
    spec, lay, hw = model.spec, model.lay, model.hw
    params = _param_counts(spec.model)
    frozen = (params.vision if spec.freeze.vision else 0) + (params.projector if spec.freeze.projector else 0)
    dense_local, experts_local = param_split(spec)
    frozen_local = frozen / max(lay.tp * lay.pp, 1)
    width = FP32_BYTES if model.torch and hw.synchronous else BF16_BYTES
    gbytes = grad_bytes(spec)[0] if spec.engine is Engine.megatron else width
    dense_n, expert_n = max(lay.dp * lay.cp, 1), max(lay.expert_dp, 1)
    dense_link = model.link_for(dense_n * lay.tp * lay.cp)
    expert_link = model.link_for(expert_n * lay.ep * lay.etp)
    m = model.micro_batches

    def ring(link: Link, size: float, n: int) -> float:
        return k.ring_s(link, size, n)

    gather = ring(dense_link, dense_local * width, dense_n) + ring(
        expert_link, experts_local * width, expert_n
    )
    reduce = ring(dense_link, (dense_local - frozen_local) * gbytes, dense_n) + ring(
        expert_link, experts_local * gbytes, expert_n
    )
    if gather + reduce <= 0:
        return out
    compute = sum(step.seconds.get(t, 0.0) for t in Term if t.is_compute) / m
    strategy = spec.parallelism.sharding_strategy
    if spec.family is ParallelismFamily.fsdp:
        reshard = strategy is ShardingStrategy.optim_grads_params
        per_mb = gather * (2 if reshard else 0) + reduce
        once = 0.0 if reshard else gather
        if model.torch and hw.synchronous:
            # FSDP2 over gloo on CPU ranks: one all-gather per unit forward (and backward when it
            # reshards), one reduce-scatter per unit backward; the rank's one thread waits for each.
            units = spec.model.num_layers + spec.model.vision_depth + 1
            calls = units * ((2 if reshard else 1) + 1)
            latency = calls * (hw.nvlink.base_s + hw.nvlink.hop_s * (dense_n - 1))
            seconds = (per_mb + latency) * m + once
            why = (
                f"{calls} gloo collectives/micro-batch over {dense_n} ranks, {per_mb / 1e-3:,.3g} ms of bytes"
            )
        else:
            # Megatron FSDP prefetches the next layer's gather under this layer's compute: what
            # exceeds the compute stays exposed, and the first layer's gather always does.
            layers = max(spec.model.num_layers // max(lay.pp, 1), 1)
            exposed = max(per_mb - compute, 0.0) + per_mb / layers / 3
            seconds = exposed * m + once
            why = f"{per_mb * 1e3:,.3g} ms of gathers and reductions per micro-batch, {compute * 1e3:,.3g} ms of compute to hide them"
        out.add(Term.fsdp, seconds, why)
        return out
    overlap = spec.overlap.grad_reduce is True
    bucket = (spec.overlap.bucket_size or 128 * 1024**2) * gbytes
    if overlap:
        # Reduced bucket by bucket under the last micro-batch's backward; the last bucket is exposed.
        last = reduce * min(1.0, bucket / max((dense_local + experts_local) * gbytes, 1.0))
        exposed_reduce = max(reduce - compute * 2 / 3, last)
    else:
        exposed_reduce = reduce
    exposed_gather = gather if spec.overlap.param_gather is not True else max(gather - compute / 3, 0.0)
    out.add(
        Term.dp_grad,
        exposed_reduce + exposed_gather,
        f"reduce-scatter {reduce * 1e3:,.3g} ms + all-gather {gather * 1e3:,.3g} ms over DP {dense_n} / "
        f"expert DP {expert_n}; overlap {'on' if overlap else 'off (the perf recipes)'}",
    )
    return out


def _optimizer(model: StepModel) -> Tally:
    out = Tally()
    spec, lay, hw = model.spec, model.lay, model.hw
    params = _param_counts(spec.model)
    frozen = (params.vision if spec.freeze.vision else 0) + (params.projector if spec.freeze.projector else 0)
    trainable = params.total - frozen - (params.language if spec.freeze.language else 0)
    local = trainable / max(lay.world_size, 1)
    offloaded = spec.offload.optimizer_fraction if spec.engine is Engine.megatron else 0.0
    seconds = k.memory_s(hw, (1 - offloaded) * local * ADAM_BYTES_PER_PARAM)
    why = f"{local:,.3g} trainable params/rank x {ADAM_BYTES_PER_PARAM} B"
    if hw.synchronous:
        # torch's AdamW, one tensor at a time over the sharded parameters: ~12 ops per tensor.
        seconds += model.ops(12 * _tensor_count(spec.model))
    if offloaded > 0 and hw.host_memory_bytes_per_s > 0:
        # MCore's HybridDeviceOptimizer: the offloaded share steps on the host, its gradients copied
        # down and its parameters up, one after the other (overlap_cpu_optimizer_d2h_h2d is off).
        shard = offloaded * local
        host = shard * HOST_ADAM_BYTES_PER_PARAM / hw.host_memory_bytes_per_s
        copies = shard * (grad_bytes(spec)[0] + BF16_BYTES) / hw.host_link_bytes_per_s
        seconds += host + copies
        why += (
            f"; {offloaded:.0%} on the host: {host * 1e3:,.3g} ms of Adam, {copies * 1e3:,.3g} ms of copies"
        )
    out.add(Term.optimizer, seconds, why)
    return out


def _tensor_count(model: ModelConfig) -> int:
    """Parameter tensors of the torch engine's model: per decoder layer (norms, q/k/v/o, q/k norms,
    gate, experts' two), per ViT block (two norms, qkv and proj with biases, two MLP with biases),
    and the rest (embeddings, mergers, head)."""
    return model.num_layers * 12 + model.vision_depth * 12 + 10 + 6 * (1 + len(model.vision_deepstack_layers))


def _data(model: StepModel, step_s: float) -> Tally:
    """The loader's host time per step not hidden by its workers (the torch engine builds batches
    in its loop: all of it)."""
    out = Tally()
    hw, spec = model.hw, model.spec
    if hw.data_sample_s <= 0 and hw.data_patch_s <= 0:
        return out
    m = model.micro_batches
    per_mb = model.mb.samples * hw.data_sample_s + model.mb.patches * hw.data_patch_s
    workers = data_workers(spec).count
    total = per_mb * m
    exposed = total if workers <= 0 else max(total / workers - step_s, 0.0)
    out.add(
        Term.data,
        exposed,
        f"{per_mb * 1e3:,.3g} ms host time per micro-batch, {workers} worker(s)"
        + ("" if workers else " (built in the training loop)"),
    )
    return out


def not_modelled(spec: RunSpec, hw: Hardware) -> tuple[str, ...]:
    """What the step model does not represent for this point (the plan's "not modelled" list)."""
    out = list(NOT_MODELLED)
    if hw.data_sample_s <= 0 and hw.data_patch_s <= 0:
        out.append(
            "the data loader's host time: not measured for this cluster (moe-vlm calibrate --probe measures "
            "it on the machine it runs on)"
        )
    if spec.dispatcher.token_dispatcher is TokenDispatcher.allgather and spec.layout.ep > 1:
        out.append("the all-gather dispatcher: no published rate; priced as NCCL ring all-gathers")
    return tuple(out)
