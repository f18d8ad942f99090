"""Issue 32, the predictor out of sample: the probe's GEMM rate, the workload each data kind
draws, the hybrid models' own layers, the out-of-sample table and its uncalibrated bands."""

from __future__ import annotations

import time

import torch

from moe_vlm.predict.probe import gemm_shapes, measured_flops, rank_threads
from tests.conftest import make_spec


def _fast_tail_flops(m: int, k: int, n: int, calls: int = 30) -> float:
    a, b = torch.randn(m, k), torch.randn(k, n)
    for _ in range(3):
        a @ b
    times = []
    for _ in range(calls):
        began = time.perf_counter()
        torch.matmul(a, b)
        times.append(time.perf_counter() - began)
    return 2.0 * m * k * n / sorted(times)[calls // 10]


def test_the_probes_gemm_rate_is_what_torch_matmul_does_here() -> None:
    # The canary read 0.386 GFLOP/s: the probe computed with a thread per core while the point's
    # ranks share the cores (one stalled thread holds every GEMM) and averaged the waits in.
    spec = make_spec("cluster=local", "model=tiny_moe_vlm", "data=mock", "nproc=2", "mbs=2")
    threads = torch.get_num_threads()
    torch.set_num_threads(rank_threads(spec))
    try:
        shapes = gemm_shapes(spec)
        reference = sum(2.0 * m * k * n for m, k, n in shapes) / sum(
            2.0 * m * k * n / _fast_tail_flops(m, k, n) for m, k, n in shapes
        )
    finally:
        torch.set_num_threads(threads)
    probed = measured_flops(spec, seconds=1.0)
    assert torch.get_num_threads() == threads  # the probe leaves the process's threads as it found them
    assert reference / 3 < probed < reference * 3, (probed / 1e9, reference / 1e9)


def test_bridge_mock_predictions_use_bridges_own_sample_lengths_not_the_synthetic_images() -> None:
    from moe_vlm.data.bridge_mock import BRIDGE_MOCK, BRIDGE_MOCK_PACKED
    from moe_vlm.predict.workload import expected_workload

    for packing, mock in (("none", BRIDGE_MOCK), ("in_batch", BRIDGE_MOCK_PACKED)):
        spec = make_spec("data=bridge_mock", "model=qwen3_vl_30b_a3b", f"data.packing={packing}")
        work = expected_workload(spec).workload
        # Bridge's base examples, replayed draw for draw (tests/megatron/test_bridge_mock.py checks
        # the replay against mock_vlm_sft.py's own dataset).
        lengths = [mock.real_tokens(i) for i in range(mock.base_examples)]
        assert abs(work.real_tokens / spec.gbs - sum(lengths) / len(lengths)) < 0.5
        assert work.vision_patches == spec.gbs * 784  # one 448x448 image per sample
    padded = make_spec("data=bridge_mock", "model=qwen3_vl_30b_a3b")
    assert 222 <= expected_workload(padded).workload.real_tokens / padded.gbs <= 241
