"""FLOPs against hand-computed values for the Qwen3-VL 30B-A3B and 235B-A22B configs.

Conventions: 2 FLOPs per multiply-accumulate; "forward" numbers; training = forward x the
frozen-aware multiplier (3 for a trained module). Every constant below is worked out in the
docstring of the test that uses it, from the numbers in conf/model/*.yaml.
"""

from __future__ import annotations

from functools import cache

import pytest

from moe_vlm.config.arch import is_full_attention
from moe_vlm.config.spec import RunSpec
from moe_vlm.perf.flops import (
    Workload,
    attention_projection_flops_per_token,
    decoder_forward,
    gdn_flops_per_token,
    layer_counts,
    multipliers,
    padded_vocab_size,
    projector_forward,
    step_flops,
    vision_encoder_forward,
)
from moe_vlm.perf.memory import param_counts
from tests.conftest import make_spec


@cache
def spec(*overrides: str) -> RunSpec:
    return make_spec(*overrides)


def text_only(lengths: list[int], padded_to: int) -> Workload:
    return Workload(
        sequences=len(lengths),
        padded_tokens=padded_to * len(lengths),
        real_tokens=sum(lengths),
        sum_seq_len_squared=sum(s * s for s in lengths),
        vision_patches=0,
        sum_patches_squared=0,
    )


ONE_FULL_SEQUENCE = text_only([4096], padded_to=4096)
ONE_IMAGE_1024_PATCHES = Workload(
    sequences=1, padded_tokens=4096, real_tokens=4096, sum_seq_len_squared=4096**2,
    vision_patches=1024, sum_patches_squared=1024**2,
)  # fmt: skip

# 30B-A3B decoder, one 4096-token sequence, training (x3); derived in test_30b_decoder_one_sequence.
DECODER_30B_4096_TRAIN = 94_233_729_957_888


def test_30b_per_token_terms() -> None:
    """Qwen3-VL-30B-A3B: h=2048, 32 heads, 4 KV groups, head_dim 128, 128 experts top-8 of 768, vocab 151936.

    q = 32 x 128 = 4096, kv = 4 x 128 = 512
    attention projections / token / layer = 2 (h (q + 2 kv) + q h)
        = 2 (2048 x 5120 + 4096 x 2048) = 2 (10,485,760 + 8,388,608) = 37,748,736
    MoE / token / layer = 2 h x 3 (SwiGLU) x 768 x 8 (top-k) = 2 x 2048 x 18,432 = 75,497,472
    logits / token = 2 h V = 2 x 2048 x 151,936 = 622,329,856
    """
    model = spec("model=qwen3_vl_30b_a3b", "cluster=gb200", "nodes=2").model
    assert attention_projection_flops_per_token(model) == 37_748_736
    one_token = decoder_forward(model, text_only([1], 1), model.vocab_size)
    assert one_token.moe_routed == 48 * 75_497_472
    assert one_token.moe_shared == 0 and one_token.dense_mlp == 0
    assert one_token.logits == 622_329_856
    assert layer_counts(model) == {"full_attention": 48, "gdn": 0, "moe": 48, "dense": 0}


def test_30b_decoder_one_sequence() -> None:
    """One real 4096-token sequence through the 30B decoder.

    linear / token = 48 layers x (37,748,736 + 75,497,472) + 622,329,856
                   = 48 x 113,246,208 + 622,329,856 = 5,435,817,984 + 622,329,856 = 6,058,147,840
    linear = 4096 x 6,058,147,840 = 24,814,173,552,640
    attention core = layers x 2 q sum(s^2) = 48 x 8192 x 4096^2 = 48 x 8192 x 16,777,216
                   = 6,597,069,766,656
    forward = 31,411,243,319,296; training (x3) = 94,233,729,957,888
    """
    s = spec("model=qwen3_vl_30b_a3b", "cluster=gb200", "nodes=2")
    forward = decoder_forward(s.model, ONE_FULL_SEQUENCE, s.model.vocab_size).as_forward()
    assert forward.activation == 6_597_069_766_656
    assert forward.weight == 24_814_173_552_640
    flops = step_flops(s, ONE_FULL_SEQUENCE)
    assert flops.model == DECODER_30B_4096_TRAIN
    # No padding, no images, nothing frozen, vocab already a multiple of 128: Bridge agrees with us.
    assert flops.bridge == flops.model == flops.hardware


def test_30b_padding_counts_for_bridge_not_for_us() -> None:
    """Two sequences of 3000 and 1000 real tokens, each padded to 4096.

    ours:   real 4000 tokens, sum(s^2) = 9,000,000 + 1,000,000 = 10,000,000
            3 x (4000 x 6,058,147,840 + 48 x 8192 x 10,000,000)
            = 3 x (24,232,591,360,000 + 3,932,160,000,000) = 84,494,254,080,000
    Bridge: padded 8192 tokens, sum(s^2) = 2 x 4096^2 = 33,554,432
            3 x (8192 x 6,058,147,840 + 48 x 8192 x 33,554,432)
            = 3 x (49,628,347,105,280 + 13,194,139,533,312) = 188,467,459,915,776
    """
    s = spec("model=qwen3_vl_30b_a3b", "cluster=gb200", "nodes=2")
    flops = step_flops(s, text_only([3000, 1000], padded_to=4096))
    assert flops.model == 84_494_254_080_000
    assert flops.bridge == 188_467_459_915_776
    assert flops.hardware == flops.bridge  # the GPUs do compute the padding; nothing frozen, no recompute


def test_235b_decoder_one_sequence() -> None:
    """Qwen3-VL-235B-A22B: h=4096, 64 heads, 4 KV groups, head_dim 128, 94 layers, top-8 of 1536.

    q = 64 x 128 = 8192, kv = 512
    attention projections / token / layer = 2 (4096 x (8192 + 1024) + 8192 x 4096)
        = 2 (37,748,736 + 33,554,432) = 142,606,336
    MoE / token / layer = 2 x 4096 x 3 x 1536 x 8 = 301,989,888
    logits / token = 2 x 4096 x 151,936 = 1,244,659,712
    linear / token = 94 x 444,596,224 + 1,244,659,712 = 41,792,045,056 + 1,244,659,712 = 43,036,704,768
        (about 2 x 22B active parameters, as expected)
    linear = 4096 x 43,036,704,768 = 176,278,342,729,728
    core = 94 x 2 x 8192 x 4096^2 = 94 x 16,384 x 16,777,216 = 25,838,523,252,736
    forward = 202,116,865,982,464; training (x3) = 606,350,597,947,392
    """
    s = spec("model=qwen3_vl_235b_a22b", "cluster=gb200", "nodes=16")
    assert attention_projection_flops_per_token(s.model) == 142_606_336
    forward = decoder_forward(s.model, ONE_FULL_SEQUENCE, s.model.vocab_size)
    assert forward.moe_routed == 94 * 301_989_888 * 4096
    assert forward.logits == 1_244_659_712 * 4096
    assert forward.attention_core == 25_838_523_252_736
    assert step_flops(s, ONE_FULL_SEQUENCE).model == 606_350_597_947_392


def test_vocab_padding_with_tensor_parallel() -> None:
    """Megatron pads the vocab to a multiple of 128 x TP: 151,936 = 128 x 1187 fits TP=1, but at
    TP=2 the divisor is 256 and 151,936 / 256 = 593.5 -> 594 x 256 = 152,064. Bridge's logits count
    the padded vocab (useless columns); ours count the real one.
    Difference for 4096 tokens = 3 x 2 x 4096 h x (152,064 - 151,936) x 4096 = 3 x 4,294,967,296
    """
    assert padded_vocab_size(151_936, 1) == 151_936
    assert padded_vocab_size(151_936, 2) == 152_064
    s = spec("model=qwen3_vl_235b_a22b", "cluster=gb200", "nodes=16", "parallelism=3d", "tp=2")
    flops = step_flops(s, ONE_FULL_SEQUENCE)
    assert flops.bridge - flops.model == 3 * 2 * 4096 * 128 * 4096


def test_vision_encoder_and_mergers_one_image() -> None:
    """The Qwen3-VL ViT (27 blocks, h=1152, MLP 4304) on one image of 32 x 32 = 1024 patches.

    per patch per block: 8 h^2 + 4 h i = 8 x 1,327,104 + 4 x 1152 x 4304 = 10,616,832 + 19,832,832
        = 30,449,664; x 27 blocks = 822,140,928
    blocks, weight matmuls = 1024 x 822,140,928 = 841,872,310,272
    blocks, attention core = 27 x 4 h x p^2 = 27 x 4608 x 1,048,576 = 130,459,631,616
    mergers: 1024 / 2^2 = 256 merged tokens, merged width 4 x 1152 = 4608,
        per token 2 x 4608^2 + 2 x 4608 x 2048 = 42,467,328 + 18,874,368 = 61,341,696
        x (1 main + 3 deepstack) x 256 = 62,813,896,704
    Bridge (x3): 3 x (841,872,310,272 + 130,459,631,616 + 62,813,896,704) = 3,105,437,515,776
    """
    s = spec("model=qwen3_vl_30b_a3b", "cluster=gb200", "nodes=2")
    vit = vision_encoder_forward(s.model, ONE_IMAGE_1024_PATCHES)
    assert vit.weight == 841_872_310_272
    assert vit.activation == 130_459_631_616
    assert projector_forward(s.model, ONE_IMAGE_1024_PATCHES).total == 62_813_896_704

    # Bridge 0.6.2's vit_flops (flop_utils.py:361-422) counts ONE merger, not the deepstack ones:
    # 3 x (841,872,310,272 + 130,459,631,616 + 61,341,696 x 256) = 2,964,106,248,192; the library's
    # own function on the real ConfigContainer: tests/megatron/test_flops_basis.py.
    depth, h, i, out, merge = 27, 1152, 4304, 2048, 2
    patch_sum, patch_sq, merged = 1024, 1024**2, 1024 // merge**2
    transformer = depth * ((8 * h**2 + 4 * h * i) * patch_sum + 4 * h * patch_sq)
    merged_hidden = h * merge**2
    merger = merged * (2 * merged_hidden * merged_hidden + 2 * merged_hidden * out)
    assert (transformer + merger) * 3 == 2_964_106_248_192
    decoder_train = DECODER_30B_4096_TRAIN
    assert step_flops(s, ONE_IMAGE_1024_PATCHES).bridge == decoder_train + 2_964_106_248_192


@pytest.mark.parametrize(
    ("frozen", "expected"),
    [
        # nothing frozen: every module trains
        ((False, False, False), {"vision_encoder": (3, 3), "projector": (3, 3), "decoder": (3, 3)}),
        # frozen ViT at the front: nothing before it trains -> forward only
        ((True, False, False), {"vision_encoder": (1, 1), "projector": (3, 3), "decoder": (3, 3)}),
        ((True, True, False), {"vision_encoder": (1, 1), "projector": (1, 1), "decoder": (3, 3)}),
        # frozen decoder behind a training ViT: forward + input gradient; attention core keeps both dgrads
        ((False, False, True), {"vision_encoder": (3, 3), "projector": (3, 3), "decoder": (2, 3)}),
        # frozen projector between a training ViT and a training decoder
        ((False, True, False), {"vision_encoder": (3, 3), "projector": (2, 3), "decoder": (3, 3)}),
    ],
)
def test_frozen_aware_multipliers(
    frozen: tuple[bool, bool, bool], expected: dict[str, tuple[int, int]]
) -> None:
    got = multipliers(*frozen)
    assert {m: (f.weight, f.activation) for m, f in got.items()} == expected


def test_frozen_vision_counts_forward_only_but_bridge_counts_x3() -> None:
    """vision_freeze=vision on one image of 1024 patches + one 4096-token sequence.

    ours:   ViT x1 = 841,872,310,272 + 130,459,631,616 = 972,331,941,888
            mergers x3 = 3 x 62,813,896,704 = 188,441,690,112
            decoder x3 = 94,233,729,957,888
            total = 95,394,503,589,888
    Bridge: ViT x3 = 2,916,995,825,664, but only the main merger (Bridge 0.6.2's vit_flops), so
            Bridge - ours = 2 x 972,331,941,888 - 3 deepstack mergers x3 (3 x 3 x 15,703,474,176)
                          = 1,944,663,883,776 - 141,331,267,584 = 1,803,332,616,192
    vision_freeze=vision_projector: the mergers have nothing training before them either -> x1:
            ours = 972,331,941,888 + 62,813,896,704 + 94,233,729,957,888 = 95,268,875,796,480
    """
    base = ("model=qwen3_vl_30b_a3b", "cluster=gb200", "nodes=2")
    frozen_vit = step_flops(spec(*base, "vision_freeze=vision"), ONE_IMAGE_1024_PATCHES)
    assert frozen_vit.model_by_module["vision_encoder"] == 972_331_941_888
    assert frozen_vit.model_by_module["projector"] == 188_441_690_112
    assert frozen_vit.model == 95_394_503_589_888
    assert frozen_vit.bridge - frozen_vit.model == 1_803_332_616_192
    both = step_flops(spec(*base, "vision_freeze=vision_projector"), ONE_IMAGE_1024_PATCHES)
    assert both.model == 95_268_875_796_480


def test_recompute_adds_hardware_flops_only() -> None:
    """30B, one 4096-token sequence. Full recompute re-runs each layer's forward (not the logits):
        48 x 113,246,208 x 4096 + 6,597,069,766,656 = 22,265,110,462,464 + 6,597,069,766,656
        = 28,862,180,229,120 extra hardware FLOPs.
    Selective (core_attn) re-runs the attention core only: 6,597,069,766,656.
    Model FLOPs (the MFU numerator) do not change.
    """
    base = ("model=qwen3_vl_30b_a3b", "cluster=gb200", "nodes=2")
    full = step_flops(spec(*base, "recompute=full"), ONE_FULL_SEQUENCE)
    selective = step_flops(spec(*base, "recompute=selective"), ONE_FULL_SEQUENCE)
    assert full.recompute == 28_862_180_229_120
    assert full.hardware == DECODER_30B_4096_TRAIN + 28_862_180_229_120
    assert selective.hardware == DECODER_30B_4096_TRAIN + 6_597_069_766_656
    assert full.model == selective.model == DECODER_30B_4096_TRAIN


def test_qwen35_hybrid_layers() -> None:
    """Qwen3.5-35B-A3B: 40 layers, every 4th full attention -> 10 attention + 30 Gated DeltaNet.

    Gated DeltaNet / token: qk = 16 x 128 = 2048, v = 32 x 128 = 4096, 32 value heads, dv 128
        in-projection h (2 qk + 2 v + 2 nv) = 2048 x 12,352 = 25,296,896
        conv 4 x (2 qk + v) = 32,768; out-projection h v = 8,388,608
        weight = 2 x 33,718,272 = 67,436,544; delta rule = 2 x 4 x 32 x 128^2 = 4,194,304
    gated attention / token: q = 16 x 256 = 4096, kv = 2 x 256 = 512, gate = q
        2 (2048 x (4096 + 1024 + 4096) + 4096 x 2048) = 2 (18,874,368 + 8,388,608) = 54,525,952
    MoE / token: 2 x 2048 x 3 x (512 x 8 routed + 512 shared) = 56,623,104
    """
    model = spec("model=qwen35_vl_35b_a3b", "cluster=gb200", "nodes=2").model
    assert layer_counts(model) == {"full_attention": 10, "gdn": 30, "moe": 40, "dense": 0}
    assert gdn_flops_per_token(model) == (67_436_544, 4_194_304)
    assert attention_projection_flops_per_token(model) == 54_525_952
    one = decoder_forward(model, text_only([1], 1), model.vocab_size)
    assert one.moe_routed + one.moe_shared == 40 * 56_623_104
    assert one.gdn_weight == 30 * 67_436_544


@pytest.mark.parametrize(
    "name", ["tiny_moe_vlm", "qwen3_vl_30b_a3b", "qwen3_vl_235b_a22b", "qwen35_vl_35b_a3b"]
)
def test_flops_and_parameter_counts_agree_on_the_shape(name: str) -> None:
    """A token's weight FLOPs are 2 per active matmul weight the memory estimate counts.

    Active matmul weights per layer = the layer's parameters minus what does no matmul (2 RMSNorms,
    q/k norms or the Gated DeltaNet's A_log, dt_bias and gated norm, the router and the shared
    expert gate, which Megatron's FLOP formula leaves out), with top_k of the routed experts.
    """
    model = spec(f"model={name}").model
    counts = param_counts(model)
    h = model.hidden_size
    active = 0.0
    for index, layer in enumerate(counts.layers):
        if is_full_attention(model, index):
            mixer_extra = 2 * model.head_dim
        else:
            mixer_extra = 2 * model.linear_num_value_heads + model.linear_value_head_dim
        moe_extra = (
            0
            if index < model.num_dense_layers
            else model.num_experts * h + (h if model.num_shared_experts else 0)
        )
        routed = layer.experts * model.moe_top_k / model.num_experts if layer.experts else 0
        active += layer.dense - 2 * h - mixer_extra - moe_extra + routed
    forward = decoder_forward(model, text_only([1], 1), model.vocab_size)
    weight = forward.as_forward().weight - forward.logits
    assert weight == pytest.approx(2 * active, rel=1e-12)
    assert forward.logits == 2 * counts.lm_head or counts.lm_head == 0
