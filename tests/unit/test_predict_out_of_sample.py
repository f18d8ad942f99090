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
