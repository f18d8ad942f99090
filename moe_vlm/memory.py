"""Per-rank peak memory, estimated before anything runs, as a sum of named terms.

    estimate(spec) -> MemoryEstimate(terms, capacity, peak stage, what the engine measures)

Two engines, two quantities, one vocabulary of terms:

Megatron engine (GPU; what decides an OOM is the GPU's whole memory)
    parameters          bf16 weights held on this GPU: dense parts / TP (the vision tower,
                        projector and embedding on the first pipeline stage, the output layer on
                        the last), routed experts / (EP x ETP); Megatron FSDP shards both over
                        its data-parallel group (dense: DP x CP, experts: expert DP)
    gradients           fp32 main gradients of trainable parameters (grad_reduce_in_fp32, as the
                        Bridge recipes set it); frozen modules hold none
    optimizer_state     fp32 main weights + Adam m and v (12 bytes per trainable parameter),
                        sharded by the distributed optimizer (3D) or by FSDP's sharding strategy
    fsdp_buffers        Megatron FSDP's unsharded working set: two units of bf16 parameters
                        (current + prefetched) and one unit of fp32 gradients before reduce-scatter
    decoder_activations what autograd keeps for one micro-batch through this stage's decoder
                        layers (bf16, TE flash attention, no dropout), under the recompute mode
    vision_activations  the same for the ViT and the patch merger, from the data kind's patches
    pipeline_in_flight  1F1B: the first stage holds min(PP, micro-batches) micro-batches;
                        interleaving multiplies by 1 + (PP-1)/(PP x VP) (Megatron-LM
                        theoretical_memory_usage.py)
    logits              last stage: bf16 logits + the fp32 softmax the vocab-parallel cross
                        entropy keeps for backward (6 bytes per token per vocab entry / TP)
    dispatcher_buffers  DeepEP / HybridEP communication buffers (cudaMalloc'd, outside the
                        PyTorch allocator; sizing and sources in _deepep_bytes/_hybridep_bytes)
    cuda_graph_pool     static inputs/outputs of the captured scopes, per layer per micro-batch
    framework_overhead  CUDA context, cuBLAS/NCCL buffers (a constant) + allocator fragmentation
                        (a fraction of what the allocator holds)

Torch engine on CPU (cluster=local; what the engine records is the process peak RSS)
    runtime_baseline    the Python/torch/transformers runtime, the engine's imports, the gloo
                        group and the data pipeline: MEASURED (scripts/calibrate_memory.py)
    parameters          fp32 weights: the engine builds the whole model on every rank, then
                        FSDP2 keeps 1/world of it (+ the unsharded units in use)
    gradients           fp32, sharded like the parameters; frozen modules hold none
    optimizer_state     AdamW exp_avg + exp_avg_sq, fp32, sharded
    decoder_activations counted from autograd's saved tensors of transformers' Qwen3-VL-MoE in
                        fp32 with SDPA (tests/unit/test_memory.py checks the count against autograd)
    vision_activations  the same for the ViT and the patch merger, plus the batch's pixel_values
    logits              the logits and their gradient, alive at the start of backward
    heap_retention      glibc keeps freed heap pages: a measured fraction of the activation peak

Every number a user may want to check is in the term's `detail`, in words and figures.
"""

from __future__ import annotations

import functools
import io
import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from moe_vlm.schema import (
    CudaGraphConfig,
    CudaGraphImpl,
    DataKind,
    FlexBackend,
    ModelConfig,
    RecomputeConfig,
    RecomputeGranularity,
    RecomputeMethod,
    ShardingStrategy,
    VisionFreezeConfig,
)
from moe_vlm.spec import RunSpec

GIB = 2**30
MIB = 2**20
BF16 = 2
FP32 = 4
ADAM_STATE_BYTES = 12  # Megatron: fp32 main weight + Adam m + v per trainable parameter
ADAMW_MOMENTS_BYTES = 8  # torch AdamW on fp32 parameters: exp_avg + exp_avg_sq
IMAGE_CHANNELS = 3

# --- constants (stated, not hidden): each is a figure a calibration can revise ----------------

# GPU, outside the PyTorch allocator: CUDA context with lazy module loading (~0.6 GiB on
# Hopper/Blackwell), cuBLAS/cuDNN workspaces, and NCCL communicators for the DP, EP, TP and PP
# groups (buffers of several channels per peer each). Not yet calibrated on a GPU.
GPU_FRAMEWORK_CONSTANT_GIB = 3.0
# Reserved-but-unallocated memory of the caching allocator, as a fraction of what it allocates.
GPU_FRAGMENTATION_FRACTION = 0.05
# A CUDA-graph private pool keeps its capture workspace; a flat allowance per captured graph set.
CUDA_GRAPH_POOL_CONSTANT_GIB = 0.5
# Megatron's default DeepEP SM count (moe_flex_dispatcher_num_sms / moe_deepep_num_sms).
DEEPEP_DEFAULT_NUM_SMS = 20

# CPU (torch engine): peak RSS of one rank of the real engine on the smallest point (tiny model,
# mock data, seq_length=64, mbs=1, 2 ranks), minus the few MiB of that point's own model terms.
# Measured 2026-11-30 with `python scripts/calibrate_memory.py --baseline-only` on the 2-core
# development machine (python 3.12, torch 2.14.1, transformers 5.12.1).
TORCH_CPU_RUNTIME_BASELINE_GIB = 0.561
# glibc keeps part of the freed heap resident: measured in-process on the tiny model (seq 1024 to
# 4096, MBS 1 to 4), ru_maxrss rose 10-30% of the activation peak above mallinfo2's in-use peak.
TORCH_CPU_HEAP_RETENTION_FRACTION = 0.10

# pixel_values are alive twice while a batch is in use: the batch's tensor and the collator's
# per-sample tensors (data/sequence.py collate keeps `batch_rows` referenced across its yield).
PIXEL_VALUE_COPIES = 2

# A run whose predicted peak leaves less than this fraction of GPU memory free gets a warning.
THIN_HEADROOM_FRACTION = 0.10
# Until a GPU calibration measures the error, a prediction at most this far over GPU memory is a
# warning (rules.M003), not a rejection (rules.M001): the terms are analytic, not yet measured.
GPU_ESTIMATE_UNCERTAINTY = 0.10
# Real data: image headers read from the start of the dataset to size the vision term.
REAL_DATA_SAMPLES_READ = 256


@dataclass(frozen=True)
class Term:
    name: str
    bytes: float
    detail: str
    # Counted by torch.cuda.max_memory_allocated (what the GPU engines record); False for the CUDA
    # context, NCCL/DeepEP/HybridEP buffers (cudaMalloc'd directly) and allocator fragmentation.
    allocator: bool = True

    @property
    def gib(self) -> float:
        return self.bytes / GIB


@dataclass(frozen=True)
class MemoryEstimate:
    engine: str
    device: str  # "gpu" | "cpu"
    measured_as: str  # the steps.jsonl memory_kind this estimate is compared with
    capacity_gib: float | None  # cluster.gpu_memory_gib; None on CPU
    peak_stage: str  # "only" | "first" | "last" pipeline stage
    terms: tuple[Term, ...]
    notes: tuple[str, ...] = ()

    @property
    def total_gib(self) -> float:
        return sum(t.bytes for t in self.terms) / GIB

    @property
    def allocated_gib(self) -> float:
        """The part torch.cuda.max_memory_allocated sees (GPU); the whole estimate on CPU."""
        return sum(t.bytes for t in self.terms if t.allocator) / GIB

    def comparable_gib(self, memory_kind: str) -> float:
        """The figure to compare with a recorded peak of this memory_kind."""
        return self.allocated_gib if memory_kind == "cuda_max_allocated" else self.total_gib

    @property
    def headroom_gib(self) -> float | None:
        return None if self.capacity_gib is None else self.capacity_gib - self.total_gib

    @property
    def headroom_fraction(self) -> float | None:
        if self.capacity_gib is None or self.capacity_gib <= 0:
            return None
        return (self.capacity_gib - self.total_gib) / self.capacity_gib

    @property
    def fits(self) -> bool | None:
        return None if self.capacity_gib is None else self.total_gib <= self.capacity_gib

    def term(self, name: str) -> Term | None:
        return next((t for t in self.terms if t.name == name), None)

    def gib_of(self, name: str) -> float:
        found = self.term(name)
        return found.gib if found else 0.0

    def lines(self) -> list[str]:
        where = "per GPU" if self.device == "gpu" else "per rank process (peak RSS)"
        stage = "" if self.peak_stage == "only" else f", peak on the {self.peak_stage} pipeline stage"
        out = [f"-- memory {where}: estimate for the {self.engine} engine{stage} --"]
        for t in self.terms:
            out.append(f"  {t.name:<20} {t.gib:9.2f} GiB  {t.detail}")
        if self.capacity_gib is None:
            out.append(
                f"  {'total':<20} {self.total_gib:9.2f} GiB  (compare with steps.jsonl {self.measured_as})"
            )
        else:
            fraction = self.headroom_fraction or 0.0
            verdict = "FITS" if self.fits else "DOES NOT FIT"
            out.append(
                f"  {'total':<20} {self.total_gib:9.2f} GiB  of {self.capacity_gib:.1f} GiB GPU memory: "
                "headroom "
                f"{self.headroom_gib:.2f} GiB ({fraction:.0%}) -> {verdict}; the allocator's share "
                f"{self.allocated_gib:.2f} GiB is what {self.measured_as} records"
            )
        out += [f"  note: {note}" for note in self.notes]
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "device": self.device,
            "measured_as": self.measured_as,
            "capacity_gib": self.capacity_gib,
            "peak_stage": self.peak_stage,
            "total_gib": self.total_gib,
            "allocated_gib": self.allocated_gib,
            "headroom_gib": self.headroom_gib,
            "terms": {
                t.name: {"gib": t.gib, "detail": t.detail, "allocator": t.allocator} for t in self.terms
            },
            "notes": list(self.notes),
        }


# --- parameter counts ----------------------------------------------------------------------------


@dataclass(frozen=True)
class LayerParams:
    dense: int  # attention (or Gated DeltaNet), norms, router, shared experts, dense MLP
    experts: int  # routed experts: split over EP x ETP


@dataclass(frozen=True)
class ParamCounts:
    """Parameters of the whole model, by the parts vision_freeze speaks about."""

    embedding: int
    lm_head: int  # 0 when tied to the embedding
    final_norm: int
    layers: tuple[LayerParams, ...]
    vision: int  # patch embedding, position embedding, ViT blocks
    projector: int  # patch merger + deepstack mergers

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


def is_full_attention(model: ModelConfig, index: int) -> bool:
    # Qwen3.5: every full_attention_interval-th layer is full attention, the others Gated DeltaNet.
    interval = max(model.full_attention_interval, 1)
    return (index + 1) % interval == 0


def _attention_params(model: ModelConfig) -> int:
    h, heads, groups, head_dim = (
        model.hidden_size,
        model.num_attention_heads,
        model.num_query_groups,
        model.head_dim,
    )
    gate = 2 if model.arch == "qwen3_5_moe" else 1  # Qwen3.5 full attention has a gated output
    q = h * heads * head_dim * gate
    kv = 2 * h * groups * head_dim
    out = heads * head_dim * h
    return q + kv + out + 2 * head_dim  # + q_norm, k_norm over head_dim


def _gated_deltanet_params(model: ModelConfig) -> int:
    h = model.hidden_size
    key_dim = model.linear_num_key_heads * model.linear_key_head_dim
    value_dim = model.linear_num_value_heads * model.linear_value_head_dim
    heads_v = model.linear_num_value_heads
    conv_kernel = 4  # linear_conv_kernel_dim of Qwen3.5
    projections = h * (2 * key_dim + value_dim) + h * value_dim + 2 * h * heads_v
    conv = (2 * key_dim + value_dim) * conv_kernel
    return projections + conv + 2 * heads_v + model.linear_value_head_dim + value_dim * h


def layer_params(model: ModelConfig, index: int) -> LayerParams:
    h = model.hidden_size
    mixer = _attention_params(model) if is_full_attention(model, index) else _gated_deltanet_params(model)
    norms = 2 * h
    if index < model.num_dense_layers:
        return LayerParams(dense=mixer + norms + 3 * h * model.dense_ffn_hidden_size, experts=0)
    router = model.num_experts * h
    shared = model.num_shared_experts * 3 * h * model.shared_expert_ffn_hidden_size
    shared_gate = h if model.num_shared_experts else 0
    routed = model.num_experts * 3 * h * model.moe_ffn_hidden_size  # SwiGLU: gate, up, down
    return LayerParams(dense=mixer + norms + router + shared + shared_gate, experts=routed)


def param_counts(model: ModelConfig) -> ParamCounts:
    h, vh = model.hidden_size, model.vision_hidden_size
    patch_in = IMAGE_CHANNELS * model.vision_temporal_patch_size * model.vision_patch_size**2
    block = 4 * vh + (3 * vh * vh + 3 * vh) + (vh * vh + vh) + 2 * vh * model.vision_intermediate_size
    block += model.vision_intermediate_size + vh
    vision = patch_in * vh + vh + model.vision_num_position_embeddings * vh + model.vision_depth * block
    merged = vh * model.vision_spatial_merge_size**2
    merger_mlp = merged * merged + merged + merged * model.projector_out_size + model.projector_out_size
    projector = (2 * vh + merger_mlp) + len(model.vision_deepstack_layers) * (2 * merged + merger_mlp)
    return ParamCounts(
        embedding=model.vocab_size * h,
        lm_head=0 if model.tie_word_embeddings else model.vocab_size * h,
        final_norm=h,
        layers=tuple(layer_params(model, i) for i in range(model.num_layers)),
        vision=vision,
        projector=projector,
    )


# --- image patches per micro-batch -----------------------------------------------------------------


@dataclass(frozen=True)
class ImageBudget:
    patches: int  # ViT patches in the largest micro-batch this estimate plans for
    images: int
    max_patches_per_image: int
    source: str  # where the figure comes from, in words


def _round_to(value: float, factor: int) -> int:
    return max(factor, round(value / factor) * factor)


def resized_pixels(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Qwen2-VL's smart_resize: multiples of `factor`, area clamped to [min_pixels, max_pixels]."""
    h_bar, w_bar = _round_to(height, factor), _round_to(width, factor)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def patches_for_image(spec: RunSpec, height: int, width: int) -> int:
    model, data = spec.model, spec.data
    factor = model.vision_patch_size * model.vision_spatial_merge_size
    h_bar, w_bar = resized_pixels(height, width, factor, data.min_pixels, data.max_pixels)
    return (h_bar // model.vision_patch_size) * (w_bar // model.vision_patch_size)


def _synthetic_largest_image(spec: RunSpec) -> int:
    data = spec.data
    largest = 0
    for ratio in data.aspect_ratios or [1.0]:
        long_side = data.max_long_side_px
        if ratio >= 1.0:
            height, width = max(1, round(long_side / ratio)), long_side
        else:
            height, width = long_side, max(1, round(long_side * ratio))
        largest = max(largest, patches_for_image(spec, height, width))
    return largest


@functools.lru_cache(maxsize=16)
def _real_image_sizes(path: str, samples: int) -> tuple[tuple[int, int], ...]:
    """(height, width) from the image headers of the first `samples` samples (nothing decoded)."""
    from PIL import Image

    from moe_vlm.data.energon import IMAGE_PARTS, iter_samples, read_meta

    sizes: list[tuple[int, int]] = []
    for sample in iter_samples(read_meta(Path(path).expanduser())):
        part = next((p for p in IMAGE_PARTS if p in sample.parts), None)
        if part is not None:
            with Image.open(io.BytesIO(sample.parts[part])) as image:
                width, height = image.size
            sizes.append((height, width))
        if len(sizes) >= samples:
            break
    return tuple(sizes)


def image_budget(spec: RunSpec) -> ImageBudget:
    """ViT patches of the largest micro-batch the data kind can produce.

    A sample's image tokens must fit seq_length (the collator skips samples whose images do
    not), so a row holds at most merge^2 x seq_length patches whatever the distribution says.
    """
    data, model = spec.data, spec.model
    merge = model.vision_spatial_merge_size**2
    row_cap = merge * max(spec.seq_length - 1, 0)
    if data.kind is DataKind.mock:
        return ImageBudget(0, 0, 0, "mock data: no images")
    if data.kind is DataKind.synthetic:
        per_image = _synthetic_largest_image(spec)
        images = data.max_images
        source = (
            f"synthetic worst case: {images} image(s)/sample x {per_image} patches "
            f"({data.max_long_side_px} px long side, max_pixels={data.max_pixels})"
        )
    else:
        sizes: tuple[tuple[int, int], ...] = ()
        if data.path:
            try:
                sizes = _real_image_sizes(str(data.path), REAL_DATA_SAMPLES_READ)
            except Exception:  # unreadable here (planning on a login node): fall back to the bound
                sizes = ()
        if sizes:
            per_image = max(patches_for_image(spec, h, w) for h, w in sizes)
            source = f"real data: largest of {len(sizes)} image headers in {data.path} -> {per_image} patches"
        else:
            per_image = data.max_pixels // model.vision_patch_size**2
            source = (
                f"real data without readable statistics: max_pixels={data.max_pixels} -> {per_image} patches"
            )
        images = 1  # one image per sample in the Energon captioning layout
    per_row = min(images * per_image, row_cap)
    if data.pack_sequences:
        per_row = row_cap if per_image else 0  # packed rows fill up with images up to seq_length
    return ImageBudget(spec.mbs * per_row, spec.mbs * images, per_image, source)


# --- shared layout arithmetic --------------------------------------------------------------------


def stage_layer_counts(spec: RunSpec) -> list[int]:
    """Decoder layers held by each pipeline rank (virtual chunks of a rank summed)."""
    pp = max(spec.layout.pp, 1)
    total = spec.model.num_layers
    first, last = spec.parallelism.first_stage_layers, spec.parallelism.last_stage_layers
    if pp == 1:
        return [total]
    middle_stages = pp - (first > 0) - (last > 0)
    middle = total - first - last
    even = middle // middle_stages if middle_stages > 0 else 0
    counts = [even] * pp
    if first:
        counts[0] = first
    if last:
        counts[-1] = last
    return counts


def stage_layer_indices(spec: RunSpec, stage: int) -> range:
    counts = stage_layer_counts(spec)
    start = sum(counts[:stage])
    return range(start, start + counts[stage])


def in_flight_micro_batches(spec: RunSpec) -> float:
    """Micro-batches whose activations the first stage holds at its peak (Megatron 1F1B)."""
    pp, vp = max(spec.layout.pp, 1), max(spec.layout.vp, 1)
    if pp == 1:
        return 1.0
    micro_batches = max(spec.accumulation_steps, 1)
    in_flight = float(min(pp, micro_batches))
    if vp > 1:
        in_flight *= 1 + (pp - 1) / (pp * vp)
    return in_flight


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


def _selective(recompute: RecomputeConfig) -> set[str]:
    return set(recompute.modules) if recompute.granularity is RecomputeGranularity.selective else set()


def _full_recompute_layers(recompute: RecomputeConfig, layers: int) -> tuple[int, int]:
    """(layers recomputed, layers rematerialised at once in backward) under full recompute."""
    if recompute.granularity is not RecomputeGranularity.full:
        return 0, 0
    chunk = max(recompute.num_layers, 1)
    if recompute.method is RecomputeMethod.block:
        return min(chunk, layers), 1
    return layers, min(chunk, layers)


# --- Megatron engine (GPU) ---------------------------------------------------------------------


@dataclass(frozen=True)
class Saved:
    """One tensor autograd keeps for backward, per token of the micro-batch."""

    name: str
    bytes_per_token: float
    split: str  # "sp": token-sharded under sequence parallelism; "tp": split over TP; "experts"; "none"
    needed_for: str  # "wgrad" (weight gradient only) | "dgrad" (input gradient) | "both"
    dropped_by: str = ""  # the selective-recompute module that discards it


def megatron_layer_saved(model: ModelConfig, index: int, etp: int) -> list[Saved]:
    """Megatron Core + TE, bf16, flash attention, no dropout: what a decoder layer keeps per token."""
    h, a, g, d = model.hidden_size, model.num_attention_heads, model.num_query_groups, model.head_dim
    k, f, e = model.moe_top_k, model.moe_ffn_hidden_size, model.num_experts
    saved = [
        Saved("input_layernorm input", BF16 * h, "sp", "dgrad"),
        Saved("input_layernorm rsigma", FP32, "sp", "dgrad"),
        Saved("input_layernorm output (QKV input)", BF16 * h, "sp", "wgrad", "layernorm"),
    ]
    if is_full_attention(model, index):
        saved += [
            Saved("q, k, v for flash attention", BF16 * (a * d + 2 * g * d), "tp", "dgrad"),
            Saved("q_norm / k_norm inputs", BF16 * (a * d + g * d), "tp", "dgrad"),
            Saved("attention output (o_proj input)", BF16 * a * d, "tp", "both"),
            Saved("softmax log-sum-exp", FP32 * a, "tp", "dgrad", "core_attn"),
        ]
    else:
        kd = model.linear_num_key_heads * model.linear_key_head_dim
        vd = model.linear_num_value_heads * model.linear_value_head_dim
        nv = model.linear_num_value_heads
        saved += [
            Saved("GDN projections (qkv, z, b, a)", BF16 * (2 * kd + 2 * vd + 2 * nv), "tp", "dgrad"),
            Saved("GDN conv output", BF16 * (2 * kd + vd), "tp", "dgrad"),
            Saved("GDN core output + gated norm input", BF16 * 2 * vd, "tp", "dgrad", "gdn_norm_out"),
            Saved("GDN out_proj input", BF16 * vd, "tp", "wgrad", "gdn_norm_out"),
        ]
    saved += [
        Saved("pre_mlp_layernorm input", BF16 * h, "sp", "dgrad"),
        Saved("pre_mlp_layernorm rsigma", FP32, "sp", "dgrad"),
        Saved("pre_mlp_layernorm output (MLP input)", BF16 * h, "sp", "wgrad", "layernorm"),
    ]
    if index < model.num_dense_layers:
        fd = model.dense_ffn_hidden_size
        return [
            *saved,
            Saved("dense fc1 output (SwiGLU input)", BF16 * 2 * fd, "tp", "dgrad", "mlp"),
            Saved("dense SwiGLU output (fc2 input)", BF16 * fd, "tp", "wgrad", "mlp"),
        ]
    saved += [
        Saved("router probs (fp32) + routing map", (FP32 + 1) * e, "sp", "dgrad", "moe"),
        # Every token goes to k experts; with ETP each expert rank sees its whole ETP group's tokens.
        Saved("expert fc1 input (permuted tokens)", BF16 * h * k * etp, "experts", "wgrad", "moe"),
        Saved("expert fc1 output (SwiGLU input)", BF16 * 2 * f * k, "experts", "dgrad", "moe"),
        Saved("expert SwiGLU output (fc2 input)", BF16 * f * k, "experts", "wgrad", "moe_act"),
        Saved("expert output for the prob-weighted combine", BF16 * h * k, "experts", "dgrad", "moe"),
    ]
    if model.num_shared_experts:
        fs = model.shared_expert_ffn_hidden_size * model.num_shared_experts
        saved += [
            Saved("shared expert fc1 output", BF16 * 2 * fs, "tp", "dgrad", "shared_experts"),
            Saved("shared expert SwiGLU output", BF16 * fs, "tp", "wgrad", "shared_experts"),
        ]
    return saved


def _kept(entry: Saved, weights_train: bool, input_grad: bool, selective: set[str]) -> bool:
    if entry.dropped_by and entry.dropped_by in selective:
        return False
    if entry.dropped_by == "moe_act" and "moe" in selective:
        return False
    wanted = {"wgrad": weights_train, "dgrad": input_grad, "both": weights_train or input_grad}
    return wanted[entry.needed_for]


def _bytes_per_token(entries: Iterable[Saved], spec: RunSpec, weights_train: bool, input_grad: bool) -> float:
    lay = spec.layout
    sp = lay.tp if spec.parallelism.sequence_parallel else 1
    divisor = {"sp": sp, "tp": lay.tp, "experts": 1, "none": 1}
    selective = _selective(spec.recompute)
    return sum(
        e.bytes_per_token / divisor[e.split]
        for e in entries
        if _kept(e, weights_train, input_grad, selective)
    )


def megatron_vision_saved(model: ModelConfig) -> tuple[list[Saved], list[Saved]]:
    """(per ViT block, per patch-merger) saved bytes per ViT patch: TE LayerNorm + flash attention, bf16."""
    vh, heads, inter = model.vision_hidden_size, model.vision_num_heads, model.vision_intermediate_size
    block = [
        Saved("norm1 input + mean/rstd", BF16 * vh + 2 * FP32, "none", "dgrad"),
        Saved("norm1 output (qkv input)", BF16 * vh, "none", "wgrad"),
        Saved("q, k, v", BF16 * 3 * vh, "tp", "dgrad"),
        Saved("attention output (proj input)", BF16 * vh, "tp", "both"),
        Saved("log-sum-exp", FP32 * heads, "tp", "dgrad"),
        Saved("norm2 input + mean/rstd", BF16 * vh + 2 * FP32, "none", "dgrad"),
        Saved("norm2 output (fc1 input)", BF16 * vh, "none", "wgrad"),
        Saved("fc1 output (GELU input)", BF16 * inter, "tp", "dgrad"),
        Saved("GELU output (fc2 input)", BF16 * inter, "tp", "wgrad"),
    ]
    # Per ViT patch: a merged token is merge^2 patches wide, so per-patch widths are vh.
    merger = [
        Saved("merger norm input", BF16 * vh, "none", "dgrad"),
        Saved("merger norm output (fc1 input)", BF16 * vh, "none", "wgrad"),
        Saved("merger fc1 output (GELU input)", BF16 * vh, "tp", "dgrad"),
        Saved("merger GELU output (fc2 input)", BF16 * vh, "tp", "wgrad"),
    ]
    return block, merger


def _megatron_vision_bytes(spec: RunSpec, budget: ImageBudget, training: Training) -> tuple[float, str]:
    if budget.patches == 0:
        return 0.0, "no images in the micro-batch"
    model = spec.model
    block, merger = megatron_vision_saved(model)
    vit = _bytes_per_token(block, spec, training.vision, training.vision) * model.vision_depth
    mergers = 1 + len(model.vision_deepstack_layers)
    proj_input_grad = training.projector or training.projector_input_grad
    proj = _bytes_per_token(merger, spec, training.projector, proj_input_grad) * mergers
    per_patch = vit + proj
    detail = (
        f"{budget.patches} patches x ({vit / 1024:.1f} KiB ViT over {model.vision_depth} blocks"
        f"{'' if training.vision else ' (frozen: nothing kept)'} + {proj / 1024:.2f} KiB in "
        f"{mergers} merger(s)"
        f"{'' if training.projector or training.vision else ' (frozen)'}); {budget.source}"
    )
    return per_patch * budget.patches, detail


def megatron_stage(spec: RunSpec, stage: int, budget: ImageBudget, counts: ParamCounts) -> MemoryEstimate:
    lay, model, par = spec.layout, spec.model, spec.parallelism
    pp = max(lay.pp, 1)
    first, last = stage == 0, stage == pp - 1
    training = training_of(spec, budget)
    indices = stage_layer_indices(spec, stage)
    tp, ep_etp = max(lay.tp, 1), max(lay.ep, 1) * max(lay.etp, 1)

    # Parameters on this GPU, split into what trains and what does not.
    lang_dense = sum(counts.layers[i].dense for i in indices) + (counts.embedding if first else 0)
    lang_dense += (counts.lm_head + counts.final_norm) if last else 0
    lang_experts = sum(counts.layers[i].experts for i in indices)
    vision_params = counts.vision if first else 0
    projector_params = counts.projector if first else 0
    dense = (lang_dense + vision_params + projector_params) / tp
    experts = lang_experts / ep_etp
    trainable_dense = (
        (lang_dense if training.language else 0)
        + (vision_params if training.vision else 0)
        + (projector_params if training.projector else 0)
    ) / tp
    trainable_experts = experts if training.language else 0.0

    dense_shard = max(lay.dp * lay.cp, 1)  # distributed optimizer / FSDP over DP x CP
    expert_shard = max(lay.expert_dp, 1)
    fsdp = spec.family == "fsdp"
    strategy = par.sharding_strategy if fsdp else ShardingStrategy.optim
    shard_params = strategy is ShardingStrategy.optim_grads_params
    shard_grads = strategy in (ShardingStrategy.optim_grads, ShardingStrategy.optim_grads_params)
    shard_optim = strategy is not ShardingStrategy.no_shard

    def sharded(dense_count: float, expert_count: float, on: bool) -> float:
        return dense_count / dense_shard + expert_count / expert_shard if on else dense_count + expert_count

    param_bytes = BF16 * sharded(dense, experts, shard_params)
    grad_bytes = FP32 * sharded(trainable_dense, trainable_experts, shard_grads)
    optim_bytes = ADAM_STATE_BYTES * sharded(trainable_dense, trainable_experts, shard_optim)
    family = f"Megatron FSDP {strategy.value}" if fsdp else "3D, distributed optimizer"
    terms = [
        Term(
            "parameters",
            param_bytes,
            f"bf16: {dense / 1e9:.3f}B dense/TP{tp} + {experts / 1e9:.3f}B routed-expert/"
            f"(EP x ETP = {ep_etp})"
            + (
                f", sharded over {dense_shard} / {expert_shard} ranks ({family})"
                if shard_params
                else f" ({family})"
            ),
        ),
        Term(
            "gradients",
            grad_bytes,
            f"fp32 main grads of {(trainable_dense + trainable_experts) / 1e9:.3f}B trainable on this GPU"
            + (f", sharded ({family})" if shard_grads else "")
            + ("" if training.anything else "; nothing trains"),
        ),
        Term(
            "optimizer_state",
            optim_bytes,
            f"{ADAM_STATE_BYTES} B/trainable param (fp32 main + Adam m, v)"
            + (f" / {dense_shard} (dense), / {expert_shard} (experts)" if shard_optim else ", not sharded"),
        ),
    ]
    if fsdp and (shard_params or shard_grads):
        unit = max(
            [counts.layers[i].dense / tp + counts.layers[i].experts / ep_etp for i in indices]
            + [counts.embedding / tp if first else 0, counts.lm_head / tp if last else 0]
        )
        unsharded_params = 2 * BF16 * unit if shard_params else 0.0
        terms.append(
            Term(
                "fsdp_buffers",
                unsharded_params + FP32 * unit,
                f"largest FSDP unit {unit / 1e6:.1f}M params: "
                + ("2 x bf16 all-gathered (current + prefetch) + " if shard_params else "")
                + "1 x fp32 gradient before reduce-scatter",
            )
        )

    # Activations of one micro-batch on this stage.
    tokens = spec.mbs * spec.seq_length / max(lay.cp, 1)
    sp = tp if par.sequence_parallel else 1
    # Gradients cross every layer whenever anything in or before the decoder trains.
    layer_kept = [
        _bytes_per_token(
            megatron_layer_saved(model, i, lay.etp), spec, training.language, training.decoder_saves
        )
        for i in indices
    ]
    recomputed, rematerialised = _full_recompute_layers(spec.recompute, len(indices))
    if not training.decoder_saves:
        decoder_bytes, how = 0.0, "language frozen and nothing before it trains: nothing kept"
    elif recomputed:
        kept_inputs = BF16 * model.hidden_size / sp * recomputed / max(rematerialised, 1)
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
        selective = sorted(_selective(spec.recompute))
        how = f"{sum(layer_kept) / len(indices) / 1024:.1f} KiB/token/layer" + (
            f", selective recompute of {', '.join(selective)}" if selective else ", no recompute"
        )
    terms.append(
        Term(
            "decoder_activations",
            decoder_bytes,
            f"{len(indices)} layer(s) x {tokens:.0f} tokens (MBS {spec.mbs} x seq {spec.seq_length} / CP"
            f"{' / TP (SP)' if sp > 1 else ''}): {how}",
        )
    )
    vision_bytes, vision_detail = _megatron_vision_bytes(spec, budget, training) if first else (0.0, "")
    if first:
        terms.append(Term("vision_activations", vision_bytes, vision_detail))
    in_flight = in_flight_micro_batches(spec) if first else 1.0
    if in_flight > 1:
        terms.append(
            Term(
                "pipeline_in_flight",
                (in_flight - 1) * (decoder_bytes + vision_bytes),
                f"{in_flight:.2f} micro-batches in flight on the first stage (1F1B"
                f"{', interleaved VP' + str(lay.vp) if lay.vp > 1 else ''}): {in_flight - 1:.2f} more x "
                "(decoder + vision activations)",
            )
        )
    if last and training.anything:
        terms.append(
            Term(
                "logits",
                tokens * model.vocab_size / tp * (BF16 + FP32),
                f"{tokens:.0f} tokens x {model.vocab_size} vocab / TP{tp} x (bf16 logits + fp32 softmax "
                "kept by "
                "the vocab-parallel cross entropy)",
            )
        )
    terms.append(_dispatcher_term(spec))
    terms.append(_cuda_graph_term(spec, len(indices), tokens, in_flight, decoder_bytes + vision_bytes))
    allocated = sum(t.bytes for t in terms if t.allocator)
    terms.append(
        Term(
            "framework_overhead",
            GPU_FRAMEWORK_CONSTANT_GIB * GIB + GPU_FRAGMENTATION_FRACTION * allocated,
            f"CUDA context + cuBLAS + NCCL communicators {GPU_FRAMEWORK_CONSTANT_GIB:.1f} GiB (constant) + "
            f"{GPU_FRAGMENTATION_FRACTION:.0%} allocator fragmentation of {allocated / GIB:.1f} GiB",
            allocator=False,
        )
    )
    return MemoryEstimate(
        engine="megatron",
        device="gpu",
        measured_as="cuda_max_allocated",
        capacity_gib=spec.cluster.gpu_memory_gib or None,
        peak_stage="only" if pp == 1 else ("first" if first else "last"),
        terms=tuple(terms),
        notes=(
            "GPU terms are analytic and not yet calibrated on a GPU (scripts/calibrate_memory.py measures "
            "the torch engine on CPU; see docs/readme/memory.md).",
            "activations assume balanced routing (Bridge perf recipes force it); imbalance adds to the "
            "expert terms.",
        ),
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


def _dispatcher_term(spec: RunSpec) -> Term:
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


def _cuda_graph_term(spec: RunSpec, layers: int, tokens: float, in_flight: float, activations: float) -> Term:
    graph = spec.cuda_graph
    if graph.impl is CudaGraphImpl.none:
        return Term("cuda_graph_pool", 0.0, "no CUDA graphs")
    model, lay = spec.model, spec.layout
    sp = lay.tp if spec.parallelism.sequence_parallel else 1
    if graph.impl is CudaGraphImpl.full_iteration:
        # Every intermediate of the captured iteration lives in the graph's private pool, which
        # eager allocations cannot reuse: one more micro-batch of activations, an upper bound.
        return Term(
            "cuda_graph_pool",
            activations + CUDA_GRAPH_POOL_CONSTANT_GIB * GIB,
            "full-iteration graph: its private pool keeps one micro-batch of activations apart from the "
            f"eager pool (upper bound) + {CUDA_GRAPH_POOL_CONSTANT_GIB} GiB capture workspace",
        )
    hidden = BF16 * model.hidden_size / sp
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
    graph_sets = max(math.ceil(in_flight), 1)
    static = per_token * tokens * layers * graph_sets
    return Term(
        "cuda_graph_pool",
        static + CUDA_GRAPH_POOL_CONSTANT_GIB * GIB,
        f"TE graphs of [{', '.join(scopes)}]: static I/O {per_token:.0f} B/token x {tokens:.0f} tokens "
        f"x {layers} "
        f"layers x {graph_sets} micro-batch graph set(s) + {CUDA_GRAPH_POOL_CONSTANT_GIB} GiB pool workspace",
    )


def _megatron_estimate(spec: RunSpec, budget: ImageBudget) -> MemoryEstimate:
    counts = param_counts(spec.model)
    pp = max(spec.layout.pp, 1)
    stages = [megatron_stage(spec, s, budget, counts) for s in sorted({0, pp - 1})]
    return max(stages, key=lambda e: e.total_gib)


# --- torch engine ------------------------------------------------------------------------------------


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
    The attention mask itself is separate (torch_mask_bytes). The collator pads every row (unless a
    packed row is exactly full), so `padded` is the engine's case.
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
    Without padding (every row full) SDPA runs causal without a mask.
    """
    if not padded:
        return 0.0, 0.0, "no padding: causal SDPA without a mask"
    square = spec.mbs * spec.seq_length**2
    recomputed = spec.recompute.granularity is RecomputeGranularity.full or "core_attn" in _selective(
        spec.recompute
    )
    if recomputed:
        return 0.0, float(square), f"bool mask {square / MIB:.0f} MiB once"
    return float(FP32 * square), 0.0, f"float mask {FP32 * square / MIB:.0f} MiB per layer"


def torch_decoder_bytes(
    spec: RunSpec, training: Training, elem: int, padded: bool = True
) -> tuple[float, float, str]:
    """(kept by autograd for one micro-batch, one layer's backward working set, how) for the decoder.

    padded: some row of the micro-batch has padding (the planning default: the worst case).
    """
    model = spec.model
    tokens = spec.mbs * spec.seq_length
    selective = _selective(spec.recompute)
    layers = model.num_layers
    if not training.decoder_saves:
        return 0.0, 0.0, "language frozen and nothing before it trains: nothing kept"
    mask_per_layer, mask_once, mask_detail = torch_mask_bytes(spec, padded)
    per_layer = (
        torch_decoder_layer_elements(model, training.language, selective, padded) * elem * tokens
        + mask_per_layer
    )
    recomputed, rematerialised = _full_recompute_layers(spec.recompute, layers)
    stored = (layers - recomputed) * per_layer
    kept_inputs = recomputed * elem * model.hidden_size * tokens
    non_layer = torch_non_layer_elements(model, training.language) * elem * tokens
    kept = stored + kept_inputs + mask_once + non_layer
    if recomputed:
        # Backward rematerialises whole layers, float mask included.
        full_layer = torch_decoder_layer_elements(model, training.language, set(), padded) * elem * tokens
        mask = FP32 * spec.mbs * spec.seq_length**2 if padded else 0.0
        working = (full_layer + mask) * rematerialised
        how = f"full recompute: {recomputed} layer inputs kept, {rematerialised} layer(s) rematerialised"
    else:
        # Backward works on one layer at a time: its activation gradients come on top.
        working = per_layer - mask_per_layer
        if "core_attn" in selective and padded:
            # Recomputing core attention rebuilds one layer's float mask and repeated k, v; they live
            # while that attention runs backward, after the layer's MoE gradients are freed.
            a, g, d = model.num_attention_heads, model.num_query_groups, model.head_dim
            attention_rebuilt = FP32 * spec.mbs * spec.seq_length**2 + 2 * (a - g) * d * elem * tokens
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


def _torch_estimate(spec: RunSpec, budget: ImageBudget, counts: ParamCounts, padded: bool) -> MemoryEstimate:
    model, lay = spec.model, spec.layout
    gpu = spec.cluster.is_gpu_cluster
    elem = BF16 if gpu else FP32  # activations: bf16 autocast-free mixed precision on GPU, fp32 on CPU
    training = training_of(spec, budget)
    world = max(lay.world_size, 1)
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
    build = FP32 * counts.total  # built whole on every rank before fully_shard
    terms: list[Term] = []
    if not gpu:
        terms.append(
            Term(
                "runtime_baseline",
                TORCH_CPU_RUNTIME_BASELINE_GIB * GIB,
                "measured: python + torch + transformers + engine imports + gloo group + data pipeline "
                "(scripts/calibrate_memory.py --baseline-only)",
            )
        )
    terms += [
        Term("parameters", max(params, build) if not gpu else params, params_detail),
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

    tokens = spec.mbs * spec.seq_length
    layers = model.num_layers
    decoder, working, how = torch_decoder_bytes(spec, training, elem, padded)
    terms.append(
        Term(
            "decoder_activations",
            decoder + working,
            f"{layers} layers x {tokens} tokens (MBS {spec.mbs} x seq {spec.seq_length}): {how}; "
            "+ one layer's "
            f"backward working set {working / MIB:.0f} MiB",
        )
    )
    vision_kept, vision_working, pixel_bytes = torch_vision_bytes(spec, training, budget.patches, elem)
    vision_total = vision_kept + vision_working + pixel_bytes
    terms.append(
        Term(
            "vision_activations",
            vision_total,
            (
                f"{budget.patches} patches: kept {vision_kept / MIB:.0f} MiB"
                f"{'' if training.vision or training.projector else ' (vision and projector frozen)'}"
                f" + block working set {vision_working / MIB:.0f} MiB + pixel_values "
                f"{pixel_bytes / MIB:.0f} MiB; "
                f"{budget.source}"
            )
            if budget.patches
            else budget.source,
        )
    )
    copies = 2 if training.decoder_saves else 1
    logits = copies * FP32 * tokens * model.vocab_size
    terms.append(
        Term(
            "logits",
            logits,
            f"fp32 logits{' + their gradient' if copies == 2 else ''}: {copies} x {tokens} tokens x "
            f"{model.vocab_size} vocab",
        )
    )
    activation_peak = decoder + working + vision_total + logits
    if gpu:
        allocated = sum(t.bytes for t in terms)
        terms.append(
            Term(
                "framework_overhead",
                GPU_FRAMEWORK_CONSTANT_GIB * GIB + GPU_FRAGMENTATION_FRACTION * allocated,
                f"CUDA context + NCCL {GPU_FRAMEWORK_CONSTANT_GIB:.1f} GiB + "
                f"{GPU_FRAGMENTATION_FRACTION:.0%} "
                "fragmentation",
                allocator=False,
            )
        )
    else:
        terms.append(
            Term(
                "heap_retention",
                TORCH_CPU_HEAP_RETENTION_FRACTION * activation_peak,
                f"measured: glibc keeps {TORCH_CPU_HEAP_RETENTION_FRACTION:.0%} of the activation peak "
                "resident",
            )
        )
    notes = [
        "the model is built whole on every rank before fully_shard: the parameters term is at least the "
        f"full fp32 model ({build / MIB:.1f} MiB)",
    ]
    if not gpu:
        notes.append(
            "on a tiny model the runtime baseline dominates; scripts/calibrate_memory.py reports the error "
            "of the total and of the part above the baseline"
        )
    return MemoryEstimate(
        engine="torch",
        device="gpu" if gpu else "cpu",
        measured_as="cuda_max_allocated" if gpu else "process_peak_rss",
        capacity_gib=(spec.cluster.gpu_memory_gib or None) if gpu else None,
        peak_stage="only",
        terms=tuple(terms),
        notes=tuple(notes),
    )


# --- entry points ------------------------------------------------------------------------------------


def estimate(
    spec: RunSpec, patches_per_micro_batch: int | None = None, padded: bool = True
) -> MemoryEstimate:
    """The per-rank peak memory of `spec`.

    patches_per_micro_batch overrides the data kind's worst case, and padded=False says every
    row was full (calibration passes what a run actually saw, so the comparison measures the
    estimator, not the draw).
    """
    budget = image_budget(spec)
    if patches_per_micro_batch is not None:
        budget = replace(
            budget,
            patches=patches_per_micro_batch,
            source=f"{patches_per_micro_batch} patches per micro-batch (given)",
        )
    if spec.engine == "torch":
        return _torch_estimate(spec, budget, param_counts(spec.model), padded)
    return _megatron_estimate(spec, budget)


SELECTIVE_DEFAULT = RecomputeConfig(
    name="selective", granularity=RecomputeGranularity.selective, modules=["core_attn"]
)


def with_recompute(spec: RunSpec, recompute: RecomputeConfig) -> RunSpec:
    return replace(spec, recompute=recompute)


# Deeper selective recompute Megatron offers for MoE layers, before whole-layer recompute.
SELECTIVE_MOE = RecomputeConfig(
    name="selective",
    granularity=RecomputeGranularity.selective,
    modules=["core_attn", "moe_act", "layernorm"],
)
FULL_RECOMPUTE = RecomputeConfig(
    name="full", granularity=RecomputeGranularity.full, method=RecomputeMethod.uniform, num_layers=1
)
NO_GRAPHS = CudaGraphConfig(name="none")


@dataclass(frozen=True)
class Variant:
    overrides: str  # the command-line overrides that produce it
    spec: RunSpec


def memory_variants(spec: RunSpec) -> list[Variant]:
    """Single changes that lower memory, cheapest in throughput first (the order the guide implies)."""
    variants: list[Variant] = []
    scoped_graphs = spec.cuda_graph.impl not in (CudaGraphImpl.none, CudaGraphImpl.full_iteration)
    if spec.recompute.granularity is RecomputeGranularity.none:
        variants.append(Variant("recompute=selective", with_recompute(spec, SELECTIVE_DEFAULT)))
    deeper = not set(SELECTIVE_MOE.modules) <= set(spec.recompute.modules)
    if spec.recompute.granularity is not RecomputeGranularity.full and deeper:
        variants.append(
            Variant(
                "recompute=selective 'recompute.modules=[core_attn,moe_act,layernorm]'",
                with_recompute(spec, SELECTIVE_MOE),
            )
        )
    if spec.recompute.granularity is not RecomputeGranularity.full:
        full = with_recompute(spec, FULL_RECOMPUTE)
        if scoped_graphs:
            variants.append(Variant("recompute=full cuda_graph=none", replace(full, cuda_graph=NO_GRAPHS)))
        else:
            variants.append(Variant("recompute=full", full))
    if not spec.freeze.vision:
        frozen = VisionFreezeConfig(
            name="vision", vision=True, projector=spec.freeze.projector, language=spec.freeze.language
        )
        variants.append(Variant("vision_freeze=vision", replace(spec, freeze=frozen)))
    mbs = spec.mbs
    while mbs > 1:
        mbs //= 2
        variants.append(Variant(f"mbs={mbs}", replace(spec, mbs=mbs)))
    return variants


def fits_after(spec: RunSpec) -> str | None:
    """The first single change (memory_variants order) predicted to fit, as 'overrides (N GiB)'."""
    estimates = [(variant, estimate(variant.spec)) for variant in memory_variants(spec)]
    # Prefer a change that leaves real headroom; a bare fit only when nothing else does.
    for minimum in (THIN_HEADROOM_FRACTION, 0.0):
        for variant, found in estimates:
            if found.headroom_fraction is not None and found.headroom_fraction >= minimum:
                return (
                    f"{variant.overrides} (predicted {found.total_gib:.1f} GiB of {found.capacity_gib:.1f})"
                )
    return None
