"""What one kernel, or one collective, costs on a Hardware: the efficiency curves of the step model.

GEMMs      a large GEMM runs at its precision's peak x gemm_efficiency (TE's GEMM benchmark); a
           small one pays wave quantization: output tiles of TILE x TILE fill the SMs in waves, so
           a GEMM of 48 tiles on 132 SMs keeps 36 % of them busy (NVIDIA's "Matrix Multiplication
           Background" guide, tile and wave quantization). Every GEMM takes at least the device's
           kernel floor. A grouped expert GEMM is TE's GroupedLinear: one GEMM per local expert
           (multi-stream cuBLASLt, TE issue #1386), each at its own token count; checked against
           tgale96/grouped_gemm PR #37 (H100, Qwen3-30B up_proj: 129.5-160.5 TFLOP/s) in
           tests/unit/test_predict_kernels.py.
quantize   FP8/FP4 GEMMs read BF16 inputs and write quantized copies (row- and column-wise, with
           scales) before each GEMM: bytes over the memory rate, per GEMM input (rates.md 1d:
           torchao's MXFP8 DSv3 grouped pass spends 32 % outside the GEMM; TE B300 autocast vs
           pre-quantized: 8.98 vs 7.16 ms per layer).
attention  fused attention (cuDNN / flash) on 4 x s^2 x heads x head_dim FLOPs per sample (QK^T and
           AV, full square; causal halves it), at attention_efficiency x s / (s + half length) of
           the BF16 peak, head dims under the one the rate holds for slower by sqrt(d / d_rate) (FA3
           paper: head dim 64 at ~0.7 of 128); backward is 2.5x the forward's FLOPs at attention_backward_efficiency.
collectives alpha-beta per link class: steps x latency + bytes moved one way / bandwidth.
"""

from __future__ import annotations

import math
from enum import StrEnum

from moe_vlm.config.schema import Precision
from moe_vlm.predict.hardware import Hardware, Link


class AttentionMask(StrEnum):
    """How an attention kernel bounds its square: the causal triangle skipped, a dense mask tensor
    over the whole square (transformers' padded rows), or none (the ViT per image)."""

    causal = "causal"
    dense = "dense"
    none = "none"


TILE = 128  # a CTA's output tile, both dimensions (cuBLAS/CUTLASS on Hopper and Blackwell BF16/FP8)
ATTENTION_BACKWARD_FLOPS = 2.5  # flash backward: five matmuls to the forward's two
QUANTIZE_BYTES_PER_ELEMENT = 2 + 2 * 1  # read BF16, write the row- and column-wise quantized copies


def wave_occupancy(hw: Hardware, m: float, n: float, tiles_in_flight: float = 1.0) -> float:
    """The share of the SMs a GEMM of m x n outputs keeps busy (1 where there is no wave model)."""
    if hw.sms <= 0:
        return 1.0
    tiles = math.ceil(m / TILE) * math.ceil(n / TILE) * tiles_in_flight
    waves = math.ceil(tiles / hw.sms)
    return tiles / (waves * hw.sms)


def gemm_s(hw: Hardware, m: float, n: float, k: float, precision: Precision = Precision.bf16) -> float:
    """One GEMM of (m x k) @ (k x n), forward only."""
    if m <= 0 or n <= 0 or k <= 0:
        return 0.0
    rate = hw.peak(precision) * hw.gemm_efficiency.get(precision, hw.gemm_efficiency[Precision.bf16])
    seconds = 2.0 * m * n * k / (rate * wave_occupancy(hw, m, n))
    return max(seconds, hw.kernel_floor_s)


def quantize_s(hw: Hardware, elements: float, precision: Precision) -> float:
    """Casting `elements` BF16 values to the GEMM's format (nothing for BF16)."""
    if precision is Precision.bf16 or elements <= 0:
        return 0.0
    return elements * QUANTIZE_BYTES_PER_ELEMENT / hw.memory_bytes_per_s + hw.kernel_floor_s


def linear_s(hw: Hardware, m: float, n: float, k: float, precision: Precision, backward: int) -> float:
    """A linear layer's GEMMs for one micro-batch: forward, plus `backward` more GEMMs of the same
    FLOPs (2: dgrad and wgrad; 1: dgrad only, a frozen layer; 0: none), with their casts."""
    fwd = gemm_s(hw, m, n, k, precision) + quantize_s(hw, m * k, precision)
    if backward <= 0:
        return fwd
    # dgrad: (m x n) @ (n x k); wgrad: (k x m) @ (m x n); the output gradient is cast once.
    bwd = gemm_s(hw, m, k, n, precision) + quantize_s(hw, m * n, precision)
    if backward > 1:
        bwd += gemm_s(hw, k, n, m, precision)
    return fwd + bwd


def grouped_linear_s(
    hw: Hardware, experts: int, m_each: float, n: float, k: float, precision: Precision, backward: int
) -> float:
    """TE's GroupedLinear over `experts` local experts of m_each tokens each."""
    if experts <= 0 or m_each <= 0:
        return 0.0
    return experts * linear_s(hw, m_each, n, k, precision, backward)


def attention_flops(sum_length_squared: float, heads: int, head_dim: int, causal: bool) -> float:
    """Forward FLOPs of the attention core: QK^T and AV over the (causal: lower) square."""
    full = 4.0 * sum_length_squared * heads * head_dim
    return full / 2 if causal else full


def attention_s(
    hw: Hardware,
    sum_length_squared: float,
    length: float,
    heads: int,
    head_dim: int,
    mask: AttentionMask,
    backward: bool,
) -> float:
    """The fused attention core for one micro-batch: sequences of mean length `length`."""
    if sum_length_squared <= 0 or length <= 0:
        return 0.0
    shape = (
        length / (length + hw.attention_half_length) * min(1.0, math.sqrt(head_dim / hw.attention_head_dim))
    )
    factor = {
        AttentionMask.causal: hw.attention_causal_factor,
        AttentionMask.dense: hw.attention_masked_factor,
        AttentionMask.none: 1.0,
    }[mask]
    rate = hw.peak(Precision.bf16) * hw.attention_efficiency * shape * factor
    fwd = attention_flops(sum_length_squared, heads, head_dim, mask is AttentionMask.causal) / rate
    if not backward:
        return fwd
    return fwd * (1 + ATTENTION_BACKWARD_FLOPS / hw.attention_backward_efficiency)


def memory_s(hw: Hardware, moved_bytes: float) -> float:
    return moved_bytes / hw.memory_bytes_per_s if moved_bytes > 0 else 0.0


def conv_s(hw: Hardware, m: float, n: float, k: float, backward: bool) -> float:
    """The patch embedding: a Conv3d with stride = kernel, a GEMM of patches x (C t p p) x hidden; its
    input is pixels, so backward is the weight gradient only."""
    if m <= 0:
        return 0.0
    rate = hw.peak(Precision.bf16) * hw.gemm_efficiency[Precision.bf16] * hw.conv_efficiency
    return 2.0 * m * n * k * (2 if backward else 1) / rate


def ring_s(link: Link, size_bytes: float, ranks: int) -> float:
    """An all-gather or reduce-scatter of `size_bytes` (the whole, gathered size) over a ring."""
    if ranks <= 1 or size_bytes <= 0:
        return 0.0
    return link.seconds(size_bytes * (ranks - 1) / ranks, steps=ranks - 1)


def all_to_all_s(link: Link, sent_bytes: float, ranks: int) -> float:
    """Each rank sends `sent_bytes` in all to the other ranks (pairwise exchange)."""
    if ranks <= 1 or sent_bytes <= 0:
        return 0.0
    return link.seconds(sent_bytes, steps=ranks - 1)
