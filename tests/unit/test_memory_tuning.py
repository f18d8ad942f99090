"""The memory terms the overlap, HSDP and offload knobs change, against figures worked out by hand
(Qwen3-VL-30B-A3B parameter counts and its per-token decoder figure from tests/unit/test_memory.py)."""

from __future__ import annotations

import pytest

from moe_vlm.perf.memory import estimate, fits_after, memory_variants
from moe_vlm.rules import validate
from tests.conftest import make_spec
from tests.unit.test_memory import (
    EXPERT_LAYER,
    REPLICATED_LAYER,
    REPLICATED_VISION,
    SPLIT_FIRST,
    THREE_D,
    stage_terms,
)

# THREE_D's first stage: 24 layers + embedding + vision + projector, dense / TP2; experts / (EP4 x ETP1);
# the distributed optimizer shards over DP x CP = 4 (dense) and expert DP = 2 (experts).
DENSE = SPLIT_FIRST / 2 + 24 * REPLICATED_LAYER + REPLICATED_VISION  # 660,111,288
EXPERTS = 24 * EXPERT_LAYER / 4  # 3,623,878,656
OPTIMIZER_PARAMS = DENSE / 4 + EXPERTS / 2  # 1,976,967,150 per GPU
# One B200 node, 30B, 3D TP2 PP1 (sequence parallel): a decoder layer keeps 92,036 B per token.
ONE_NODE_TP2 = ["cluster=b200", "model=qwen3_vl_30b_a3b", "parallelism=3d", "tp=2", "data=mock"]
LAYER_BYTES = 4096 * 92_036  # 376,979,456 B per layer per micro-batch


def test_gradients_follow_grad_reduce_in_fp32_on_3d_only() -> None:
    # Megatron DDP: bf16 main grads unless grad_reduce_in_fp32 (param_and_grad_buffer.py:917).
    assert stage_terms(THREE_D, 0)["gradients"] == 2 * (DENSE + EXPERTS)  # 8,567,979,888 B
    assert stage_terms([*THREE_D, "overlap.grad_reduce_in_fp32=true"], 0)["gradients"] == 4 * (
        DENSE + EXPERTS
    )
    # Megatron FSDP keeps gradients in the parameters' dtype whatever the knob says (and O003 rejects it).
    fsdp = ["cluster=b200", "model=qwen3_vl_30b_a3b", "data=mock"]
    on = stage_terms([*fsdp, "overlap.grad_reduce_in_fp32=true"], 0)
    assert on["gradients"] == stage_terms(fsdp, 0)["gradients"]
    assert "O003" in {f.code for f in validate(make_spec(*fsdp, "overlap.grad_reduce_in_fp32=true"))}


@pytest.mark.parametrize("fraction", [1.0, 0.5])
def test_optimizer_offload_moves_the_adam_moments(fraction: float) -> None:
    terms = stage_terms([*THREE_D, f"offload.optimizer_fraction={fraction}"], 0)
    assert terms["optimizer_state"] == 12 * OPTIMIZER_PARAMS  # 23,723,605,800 B, as without offload
    # HybridDeviceOptimizer: Adam m, v (8 B/param) of `fraction` of the shard in host memory; the fp32
    # main weights stay on the GPU. 1.0: -15,815,737,200 B; 0.5: -7,907,868,600 B.
    assert terms["optimizer_offload"] == pytest.approx(-fraction * 8 * OPTIMIZER_PARAMS)
    assert "optimizer_offload" not in stage_terms(THREE_D, 0)


def test_activation_offload_frees_the_offloaded_layers() -> None:
    base = estimate(make_spec(*ONE_NODE_TP2))
    offloaded = estimate(make_spec(*ONE_NODE_TP2, "offload.activation_layers=12"))
    # TE's CPU offload keeps (layers - N) layers' saved tensors on the GPU at the backward's start
    # (cpu_offload.py:602-626): 12 of 48 layers = 12 x 511,197,184 B = 5.71 GiB less.
    term = offloaded.term("activation_offload")
    assert term is not None and term.bytes == -12 * LAYER_BYTES
    assert offloaded.gib_of("decoder_activations") == base.gib_of(
        "decoder_activations"
    )  # what autograd saves
    # The allocator's share drops by exactly that; the total by that plus its 5% fragmentation allowance.
    assert (base.allocated_gib - offloaded.allocated_gib) * 2**30 == pytest.approx(12 * LAYER_BYTES)
    assert (base.total_gib - offloaded.total_gib) * 2**30 == pytest.approx(12 * LAYER_BYTES * 1.05)
    assert not {f.code for f in validate(make_spec(*ONE_NODE_TP2, "offload.activation_layers=12"))} & {"O008"}


def test_hsdp_shards_inside_each_replica() -> None:
    # 30B FSDP on 8 B200 GPUs, EP4: DP 8, expert DP 2. Two replicas shard over 4 and 1 instead.
    base = ["cluster=b200", "model=qwen3_vl_30b_a3b", "data=mock", "ep=4"]
    flat = stage_terms(base, 0)
    hsdp = stage_terms([*base, "parallelism.dp_outer=2"], 0)
    outer_optim = stage_terms([*base, "parallelism.dp_outer=2", "parallelism.dp_outer_sharding=optim"], 0)
    for name in ("parameters", "gradients", "optimizer_state"):
        assert hsdp[name] == pytest.approx(2 * flat[name]), name
    # dp_outer_sharding=optim shards the optimizer state over the replicas too: back to the whole DP.
    assert outer_optim["optimizer_state"] == pytest.approx(flat["optimizer_state"])
    assert outer_optim["parameters"] == pytest.approx(hsdp["parameters"])


def test_vision_graphs_pad_the_vision_activations() -> None:
    base = ["cluster=b200", "model=qwen3_vl_30b_a3b", "parallelism=3d"]  # synthetic: 7,776 patches at most
    plain = estimate(make_spec(*base)).gib_of("vision_activations")
    padded = estimate(make_spec(*base, "cuda_graph.vision=true", "cuda_graph.vision_max_seq_length=15552"))
    assert padded.gib_of("vision_activations") == pytest.approx(2 * plain)  # padded to 2 x 7,776 patches


def test_optimizer_offload_is_the_last_memory_lever() -> None:
    # 30B 3D on one H100 node with full recompute and a frozen ViT: 74.8 of 79.6 GiB, thin headroom;
    # no other single change leaves 10% free, the optimizer on the CPU does (about 30 GiB less).
    tight = make_spec(
        "cluster=h100", "model=qwen3_vl_30b_a3b", "parallelism=3d", "recompute=full", "vision_freeze=vision"
    )
    variants = memory_variants(tight)
    assert variants[-1].overrides == "offload=optimizer"
    fit = fits_after(tight)
    assert fit is not None and fit.variant.overrides == "offload=optimizer"
    assert fit.estimate.total_gib < 0.9 * 79.6 < estimate(tight).total_gib < 79.6
    # The torch engine keeps its optimizer on the device: no such lever there.
    assert all("offload" not in v.overrides for v in memory_variants(make_spec("model=tiny_moe_vlm")))
