"""A short GEMM probe: a first calibration of the compute scales before any point has run.

Times the model's own GEMM shapes on this machine (the decoder's routed-expert projection at
the micro-batch's tokens, the attention projection, the ViT MLP at a synthetic image's patches),
in the dtype the engine computes in (fp32 on CPU, bf16 on GPUs), for about `seconds`, and turns
the FLOP rate into scales: compute scale = base rate / measured rate for every compute term.
Data movement and the per-step constant are not probed (the all-to-all and all-gather need the
job's ranks: left to a calibration on runs), so the entry's band is the uncalibrated one.
"""

from __future__ import annotations

import time

import torch

from moe_vlm.arch import attention_shape, moe_shape
from moe_vlm.predict.calibration import Calibration, stack_of
from moe_vlm.predict.terms import COMPUTE, NOMINAL_CPU_FLOPS, Term
from moe_vlm.spec import RunSpec


def gemm_shapes(spec: RunSpec) -> list[tuple[int, int, int]]:
    """(m, k, n) of the probed GEMMs: tokens x in x out."""
    model = spec.model
    tokens = max(spec.mbs * spec.seq_length // max(spec.layout.tp * spec.layout.cp, 1), 1)
    moe = moe_shape(model)
    shapes = [
        (tokens, model.hidden_size, attention_shape(model).query),
        (
            tokens * model.moe_top_k // max(model.num_experts // max(spec.layout.ep, 1), 1) or 1,
            model.hidden_size,
            max(moe.active_routed_ffn // max(model.moe_top_k, 1), 1),
        ),
    ]
    if model.vision_depth:
        shapes.append((tokens, model.vision_hidden_size, model.vision_intermediate_size))
    return shapes


def measured_flops(spec: RunSpec, seconds: float = 3.0) -> float:
    """FLOP/s over the probed shapes (2 m k n per GEMM), after one warm-up of each."""
    gpu = torch.cuda.is_available() and spec.cluster.is_gpu_cluster
    device, dtype = ("cuda", torch.bfloat16) if gpu else ("cpu", torch.float32)
    pairs = [
        (torch.randn(m, k, device=device, dtype=dtype), torch.randn(k, n, device=device, dtype=dtype))
        for m, k, n in gemm_shapes(spec)
    ]
    for a, b in pairs:
        a @ b
    flops, start = 0.0, time.perf_counter()
    while time.perf_counter() - start < seconds / 2 or flops == 0:
        for a, b in pairs:
            a @ b
            flops += 2.0 * a.shape[0] * a.shape[1] * b.shape[1]
    if gpu:
        torch.cuda.synchronize()
    return flops / (time.perf_counter() - start)


def probe_calibration(spec: RunSpec, seconds: float = 3.0) -> tuple[Calibration, float]:
    """The probe's calibration for this point's cluster and stack, and the FLOP/s it measured."""
    rate = measured_flops(spec, seconds)
    peaks = spec.cluster.peak_bf16_flops
    # Base rates: the dense peak on GPUs (so the scale is 1 / the probed efficiency), nominal on CPU.
    base = peaks if peaks > 0 else NOMINAL_CPU_FLOPS
    scales = {t.value: base / rate for t in COMPUTE} | {t.value: 0.0 for t in Term if t not in COMPUTE}
    found = Calibration(
        cluster=spec.cluster.name,
        stack=stack_of(spec.engine),
        scales=scales,
        sigma=None,
        runs=0,
        source=f"GEMM probe at the model's shapes: {rate / 1e9:.3g} GFLOP/s; collectives and overhead not probed",
    )
    return found, rate
