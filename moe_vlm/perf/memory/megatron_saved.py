"""What autograd keeps per token under Megatron Core + Transformer Engine (bf16, flash attention,
no dropout): one table per decoder layer, ViT block and patch merger, and the bytes a rank keeps
after sequence/tensor parallelism and selective recompute have taken their share."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from moe_vlm.config.arch import attention_shape, gdn_shape, is_dense, is_full_attention
from moe_vlm.config.schema import ModelConfig
from moe_vlm.config.spec import RunSpec
from moe_vlm.perf.memory.estimate import BF16, FP32
from moe_vlm.perf.memory.shared import selective_modules


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
    h, k, f, e = model.hidden_size, model.moe_top_k, model.moe_ffn_hidden_size, model.num_experts
    saved = [
        Saved("input_layernorm input", BF16 * h, "sp", "dgrad"),
        Saved("input_layernorm rsigma", FP32, "sp", "dgrad"),
        Saved("input_layernorm output (QKV input)", BF16 * h, "sp", "wgrad", "layernorm"),
    ]
    if is_full_attention(model, index):
        att = attention_shape(model)
        q, kv = att.query, att.key_value
        saved += [
            Saved("q, k, v for flash attention", BF16 * (q + 2 * kv), "tp", "dgrad"),
            Saved("q_norm / k_norm inputs", BF16 * (q + kv), "tp", "dgrad"),
            Saved("attention output (o_proj input)", BF16 * q, "tp", "both"),
            Saved("softmax log-sum-exp", FP32 * att.heads, "tp", "dgrad", "core_attn"),
        ]
    else:
        saved += gdn_saved(model)
    saved += [
        Saved("pre_mlp_layernorm input", BF16 * h, "sp", "dgrad"),
        Saved("pre_mlp_layernorm rsigma", FP32, "sp", "dgrad"),
        Saved("pre_mlp_layernorm output (MLP input)", BF16 * h, "sp", "wgrad", "layernorm"),
    ]
    if is_dense(model, index):
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
        # No k x h expert output for the combine: megatron-core 0.19 multiplies the routing probs
        # inside the experts' activation (transformer/moe/experts.py:807-886) and unpermutes without
        # probs (token_dispatcher.py:884-891, 1451-1458), which keeps no floating-point tensor
        # (tests/megatron/test_vendor_memory.py::test_the_combine_keeps_no_expert_output, on CPU).
    ]
    if model.num_shared_experts:
        fs = model.shared_expert_ffn_hidden_size * model.num_shared_experts
        saved += [
            Saved("shared expert fc1 output", BF16 * 2 * fs, "tp", "dgrad", "shared_experts"),
            Saved("shared expert SwiGLU output", BF16 * fs, "tp", "wgrad", "shared_experts"),
        ]
    return saved


def gdn_saved(model: ModelConfig) -> list[Saved]:
    """A Gated DeltaNet mixer on the FLA path (megatron/core/ssm/gated_delta_net/gdn.py:129-272,
    common.py:370-445; FLA 0.4.2 kernels), per token, from each op's save_for_backward. The in_proj
    output itself is not kept: every part of it the later ops save is a contiguous copy. No chunked
    recurrent state is kept: FLA recomputes h in backward from what it saved (chunk.py:261)."""
    gdn = gdn_shape(model)
    kd, vd, nv = gdn.key, gdn.value, gdn.value_heads
    key_heads = model.linear_num_key_heads
    # The kernel sees q and k repeated to the value heads (common.py:418-421), each head of key_head_dim.
    qk_wide = nv * model.linear_key_head_dim
    return [
        # fla causal_conv1d saves its input, made contiguous by input_guard (fla modules/conv/triton/ops.py:364).
        Saved("GDN conv input (q, k, v channels)", BF16 * (2 * kd + vd), "tp", "dgrad"),
        # g in fp32 from softplus(alpha.float() + dt_bias); beta = sigmoid(beta), which the kernel saves too.
        Saved("GDN alpha (fp32 softplus input) + beta", FP32 * nv + BF16 * nv, "tp", "dgrad"),
        # l2norm(query_key) saves its output and the per-head rstd (fla modules/l2norm.py:249; common.py:411).
        Saved("GDN q/k L2-norm output + rstd", BF16 * 2 * kd + FP32 * 2 * key_heads, "tp", "dgrad"),
        # chunk_gated_delta_rule saves q, k, v, g, beta, A (fla ops/gated_delta_rule/chunk.py:261).
        Saved("GDN kernel q, k (value-head width), v", BF16 * (2 * qk_wide + vd), "tp", "dgrad"),
        # A: the WY matrix, 64 (the chunk) per head per token, solved in k's dtype (chunk.py:39-52); g: its
        # fp32 chunk cumsum (chunk.py:38).
        Saved("GDN kernel A (WY, chunk 64) + g cumsum", BF16 * 64 * nv + FP32 * nv, "tp", "dgrad"),
        # The gated norm's inputs: a gdn_norm_out checkpoint keeps them too (its args, core/tensor_parallel/
        # random.py:704), dropping what the norm computed (gdn.py:255-276).
        Saved("GDN core output + gate z (gated-norm inputs)", BF16 * 2 * vd, "tp", "dgrad"),
        Saved("GDN RMSNorm output (the gate's multiplicand)", BF16 * vd, "tp", "dgrad", "gdn_norm_out"),
        Saved("GDN out_proj input", BF16 * vd, "tp", "wgrad", "gdn_norm_out"),
    ]


def _kept(entry: Saved, weights_train: bool, input_grad: bool, selective: set[str]) -> bool:
    if entry.dropped_by and entry.dropped_by in selective:
        return False
    if entry.dropped_by == "moe_act" and "moe" in selective:
        return False
    wanted = {"wgrad": weights_train, "dgrad": input_grad, "both": weights_train or input_grad}
    return wanted[entry.needed_for]


def bytes_per_token(entries: Iterable[Saved], spec: RunSpec, weights_train: bool, input_grad: bool) -> float:
    lay = spec.layout
    divisor = {"sp": sp_ranks(spec), "tp": lay.tp, "experts": 1, "none": 1}
    selective = selective_modules(spec.recompute)
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


def sp_ranks(spec: RunSpec) -> int:
    """How many ranks share a token's hidden state: TP under sequence parallelism (as the engine runs it)."""
    return spec.layout.tp if spec.sequence_parallel else 1
