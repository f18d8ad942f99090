"""The calibration probe: this machine's rates, measured in seconds, for the step model.

On this node, in the dtype the engine computes in (fp32 on CPU, bf16 on GPUs) and with the
intra-op threads one of the point's ranks gets:

GEMMs        the decoder's attention projection, one routed expert's projection and the ViT MLP at
             the micro-batch's tokens: FLOP/s over their fast-tail call times
conv         the patch embedding's Conv3d (stride = kernel) over a micro-batch's patches
attention    SDPA forward at three lengths (a rate and the length of half of it: the shape
             kernels.attention_s uses) and its backward at the longest, with the decoder's heads
memory       a large tensor copy (what norms, activations and the optimizer are bound by)
eager ops    a small module's forward and backward over its op count (dispatch, autograd, Python)
collectives  all-gathers at two sizes between ranks started on this node: latency and bandwidth
data         the data loader's host time: the point's samples and text-only ones, per sample and
             per ViT patch

The result is a ``MeasuredRates`` (hardware.py): the step model's rates for cluster=local, stored
in the calibration file by ``moe-vlm calibrate --probe`` (and by the Slurm canary). Nothing is
fitted to whole steps: a whole step is predicted from these rates alone (docs/step-time-prediction.md
measures how well, knob by knob). On a GPU cluster the datasheet rates apply (hardware.GPU_RATES);
the probe prints how this node compares to them.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from moe_vlm.config.arch import attention_shape, moe_shape
from moe_vlm.config.schema import DataKind
from moe_vlm.config.spec import RunSpec
from moe_vlm.predict.calibration import Calibration, stack_of
from moe_vlm.predict.collectives import Collective, CollectiveCase, measure, ranks_on_node
from moe_vlm.predict.hardware import MeasuredRates, gpu_hardware, rank_threads
from moe_vlm.predict.kernels import attention_flops

# Per kernel: at least this many timed calls, and the 10th percentile of their times. A mean over a
# timed loop counts every wait for the CPU: on a shared 2-core node a descheduled thread or another
# job's time slice costs more than a hundred of these kernels (issue 32: a mean read 0.386 GFLOP/s
# where a lone matmul runs at tens of GFLOP/s). The fast tail is the kernel's own time.
MIN_TIMED_CALLS = 9
WARMUP_CALLS = 3
ATTENTION_LENGTHS = (256, 1024, 2048)
COPY_BYTES_GPU, COPY_BYTES_CPU = 2**30, 64 * 2**20
LINK_SIZES = (2**16, 2**23)  # all-gather sizes for the latency and the bandwidth term
DATA_MICRO_BATCHES = 4


def _on_gpu(spec: RunSpec) -> bool:
    return torch.cuda.is_available() and spec.cluster.is_gpu_cluster


def _sync(gpu: bool) -> None:
    if gpu:
        torch.cuda.synchronize()


def fast_tail(call: Callable[[], object], gpu: bool, seconds: float) -> float:
    """The 10th-percentile time of `call` over at least MIN_TIMED_CALLS calls within ~`seconds`."""
    for _ in range(WARMUP_CALLS):
        call()
    _sync(gpu)
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < MIN_TIMED_CALLS or time.perf_counter() - start < seconds:
        began = time.perf_counter()
        call()
        _sync(gpu)
        times.append(time.perf_counter() - began)
    times.sort()
    return times[len(times) // 10]


def gemm_shapes(spec: RunSpec) -> list[tuple[int, int, int]]:
    """(m, k, n) of the probed GEMMs: tokens x in x out."""
    model = spec.model
    tokens = max(spec.mbs * spec.seq_length // max(spec.layout.tp * spec.layout.cp, 1), 1)
    moe = moe_shape(model)
    shapes = [
        (tokens, model.hidden_size, attention_shape(model).query),
        (
            max(tokens * model.moe_top_k // max(model.num_experts // max(spec.layout.ep, 1), 1), 1),
            model.hidden_size,
            max(moe.active_routed_ffn // max(model.moe_top_k, 1), 1),
        ),
    ]
    if model.vision_depth:
        shapes.append((tokens, model.vision_hidden_size, model.vision_intermediate_size))
    return shapes


class _Threads:
    """The intra-op threads of one of the point's CPU ranks, for the duration of a measurement."""

    def __init__(self, spec: RunSpec, gpu: bool) -> None:
        self.want = None if gpu else rank_threads(spec)
        self.had = torch.get_num_threads()

    def __enter__(self) -> None:
        if self.want is not None:
            torch.set_num_threads(self.want)

    def __exit__(self, *_: object) -> None:
        torch.set_num_threads(self.had)


def _device(spec: RunSpec) -> tuple[torch.device, torch.dtype]:
    return (torch.device("cuda"), torch.bfloat16) if _on_gpu(spec) else (torch.device("cpu"), torch.float32)


def measured_flops(spec: RunSpec, seconds: float = 2.0) -> float:
    """FLOP/s over the point's GEMM shapes: their FLOPs over the sum of their fast-tail times."""
    device, dtype = _device(spec)
    flops = spent = 0.0
    shapes = gemm_shapes(spec)
    for m, kk, n in shapes:
        a = torch.randn(m, kk, device=device, dtype=dtype)
        b = torch.randn(kk, n, device=device, dtype=dtype)
        spent += fast_tail(partial(torch.matmul, a, b), device.type == "cuda", seconds / len(shapes))
        flops += 2.0 * m * kk * n
    return flops / spent


def measured_conv(spec: RunSpec, seconds: float = 0.5) -> float:
    """FLOP/s of the patch embedding's Conv3d over one micro-batch's worth of patches."""
    model = spec.model
    device, dtype = _device(spec)
    if model.vision_depth <= 0:
        return measured_flops(spec, seconds)
    t, p = model.vision_temporal_patch_size, model.vision_patch_size
    patches = 2048
    conv = nn.Conv3d(3, model.vision_hidden_size, (t, p, p), stride=(t, p, p), bias=False).to(device, dtype)
    pixels = torch.randn(patches, 3, t, p, p, device=device, dtype=dtype)
    with torch.no_grad():
        spent = fast_tail(lambda: conv(pixels), device.type == "cuda", seconds)
    return 2.0 * patches * 3 * t * p * p * model.vision_hidden_size / spent


@dataclass(frozen=True)
class AttentionRate:
    flops_per_s: float  # at long sequences
    half_length: float
    backward_ratio: float
    masked_factor: float
    causal_factor: float


def measured_attention(spec: RunSpec, seconds: float = 2.0) -> AttentionRate:
    """SDPA with the decoder's heads: 1 / rate = (1 + half / s) / R over ATTENTION_LENGTHS (a line
    in 1 / s, solved by least squares), and backward over forward at the longest length."""
    shape = attention_shape(spec.model)
    heads, dim = max(shape.heads // max(spec.layout.tp, 1), 1), shape.head_dim
    device, dtype = _device(spec)
    gpu = device.type == "cuda"
    xs, ys = [], []
    for length in ATTENTION_LENGTHS:
        q, kk, v = (torch.randn(1, heads, length, dim, device=device, dtype=dtype) for _ in range(3))
        with torch.no_grad():
            fwd = fast_tail(partial(F.scaled_dot_product_attention, q, kk, v), gpu, seconds / 4)
        xs.append(1.0 / length)
        ys.append(fwd / attention_flops(length * length, heads, dim, causal=False))
    leaves = [
        torch.randn(1, heads, length, dim, device=device, dtype=dtype, requires_grad=True) for _ in range(3)
    ]
    out = F.scaled_dot_product_attention(leaves[0], leaves[1], leaves[2])
    grad = torch.ones_like(out)
    backward = fast_tail(lambda: torch.autograd.grad(out, leaves, grad, retain_graph=True), gpu, seconds / 4)
    backward_ratio = backward / fwd
    # The same longest square with a dense mask (a padded row's) and with is_causal.
    q, kk, v = (t.detach() for t in leaves)
    dense = torch.ones(1, 1, length, length, dtype=torch.bool, device=device).tril()
    with torch.no_grad():
        masked = fast_tail(
            lambda: F.scaled_dot_product_attention(q, kk, v, attn_mask=dense), gpu, seconds / 8
        )
        causal = fast_tail(lambda: F.scaled_dot_product_attention(q, kk, v, is_causal=True), gpu, seconds / 8)
    n = len(xs)
    mean_x, mean_y = sum(xs) / n, sum(ys) / n
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mean_x) ** 2 for x in xs
    )
    intercept = max(mean_y - slope * mean_x, 1e-18)
    return AttentionRate(
        1.0 / intercept, max(slope / intercept, 0.0), backward_ratio, fwd / masked, fwd / 2 / causal
    )


def measured_memory(spec: RunSpec, seconds: float = 0.5) -> float:
    """Bytes/s of a device-to-device copy, read plus write."""
    gpu = _on_gpu(spec)
    size = COPY_BYTES_GPU if gpu else COPY_BYTES_CPU
    src = torch.ones(size // 4, device="cuda" if gpu else "cpu")
    dst = torch.empty_like(src)
    return 2.0 * size / fast_tail(lambda: dst.copy_(src), gpu, seconds)


class _Block(nn.Module):
    """A small pre-norm MLP block: a dozen eager ops forward, as many backward."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(self.norm(x))))


def measured_op(spec: RunSpec, seconds: float = 0.5) -> float:
    """Seconds per eager op with autograd: a tiny module's forward + backward over its op count."""
    from torch.utils._python_dispatch import TorchDispatchMode  # private to torch: the count only

    device, dtype = _device(spec)
    block = nn.Sequential(*(_Block(8) for _ in range(4))).to(device, dtype)
    x = torch.randn(4, 8, device=device, dtype=dtype)

    def step() -> None:
        block(x).sum().backward()

    class Count(TorchDispatchMode):
        ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.ops += 1
            return func(*args, **(kwargs or {}))

    with Count():
        step()
    return fast_tail(step, device.type == "cuda", seconds) / max(Count.ops, 1)


def measured_link(spec: RunSpec, ranks: int, seconds: float = 0.5) -> tuple[float, float] | None:
    """(bytes/s one way, seconds per call) of all-gathers between `ranks` ranks on this node."""
    if ranks < 2:
        return None
    rates = measure([CollectiveCase(Collective.all_gather, ranks, size) for size in LINK_SIZES], seconds)
    small, large = sorted(rates, key=lambda r: r.message_bytes)
    moved = [r.message_bytes * (r.ranks - 1) / r.ranks for r in (small, large)]
    beta = (large.seconds_per_call - small.seconds_per_call) / max(moved[1] - moved[0], 1.0)
    bandwidth = 1.0 / beta if beta > 0 else large.bytes_per_s
    latency = max(small.seconds_per_call - moved[0] / bandwidth, 0.0)
    return bandwidth, latency


def measured_data(spec: RunSpec) -> tuple[float, float]:
    """(seconds per sample, seconds per ViT patch) of the data loader's host work: the point's own
    samples, and text-only samples of the same lengths to tell the two apart."""
    from moe_vlm.data import build_batches  # the torch data path: only the probe times it here

    def per_micro_batch(probed: RunSpec) -> tuple[float, float, float]:
        stream = build_batches(probed, 0, max(probed.layout.dp, 1))
        next(stream)  # the first builds the processor and tokenizer
        started = time.perf_counter()
        taken = list(itertools.islice(stream, DATA_MICRO_BATCHES))
        spent = time.perf_counter() - started
        samples = sum(b.stats.sequences for b in taken)
        patches = sum(int(b.pixel_values.shape[0]) if b.pixel_values is not None else 0 for b in taken)
        return spent, float(samples), float(patches)

    spent, samples, patches = per_micro_batch(spec)
    text_spent, text_samples, _ = per_micro_batch(replace(spec, data=replace(spec.data, kind=DataKind.mock)))
    per_sample = text_spent / max(text_samples, 1.0)
    per_patch = max(spent - per_sample * samples, 0.0) / patches if patches else 0.0
    return per_sample, per_patch


@dataclass(frozen=True)
class ProbeResult:
    spec: RunSpec
    rates: MeasuredRates
    note: str  # why something was not measured, or ""
    device: str = "cpu, fp32"

    def lines(self) -> list[str]:
        r = self.rates
        hw = gpu_hardware(self.spec.cluster)

        def of(value: float, ref: float | None, what: str) -> str:
            return f" ({value / ref:.1%} of {what})" if ref else ""

        peak = hw.peak(self.spec.precision.format) if hw else None
        out = [
            f"GEMMs at the model's shapes ({self.device}, {r.threads} thread(s)): "
            f"{r.gemm_flops_per_s / 1e9:.4g} GFLOP/s" + of(r.gemm_flops_per_s, peak, "the dense peak"),
            f"patch-embedding conv: {r.conv_flops_per_s / 1e9:.4g} GFLOP/s",
            f"attention (SDPA): {r.attention_flops_per_s / 1e9:.4g} GFLOP/s at long sequences, half of it at "
            f"{r.attention_half_length:,.0f} tokens; backward {r.attention_backward_ratio:.2f}x the forward; with a "
            f"dense mask x{r.attention_masked_factor:.2f}, causal x{r.attention_causal_factor:.2f} per FLOP",
            f"memory copy: {r.memory_bytes_per_s / 1e9:.4g} GB/s"
            + of(r.memory_bytes_per_s, hw.memory_bytes_per_s if hw else None, "the preset's"),
            f"eager op (dispatch + autograd): {r.op_s * 1e6:.3g} us",
            f"link between ranks: {r.link_bytes_per_s / 1e9:.3g} GB/s, {r.link_latency_s * 1e6:.3g} us per call"
            if r.link_bytes_per_s > 0
            else "link between ranks: not timed",
            f"data loader: {r.data_sample_s * 1e3:.3g} ms per sample + {r.data_patch_s * 1e6:.3g} us per ViT patch",
        ]
        return out + ([self.note] if self.note else [])

    def calibration(self) -> Calibration:
        return Calibration(
            cluster=self.spec.cluster.name,
            stack=stack_of(self.spec.engine),
            scales={},
            sigma=None,
            runs=0,
            source=(
                f"probe: this machine's rates ({self.rates.threads} thread(s)/rank: GEMMs "
                f"{self.rates.gemm_flops_per_s / 1e9:.3g} GFLOP/s, attention {self.rates.attention_flops_per_s / 1e9:.3g} "
                f"GFLOP/s, op {self.rates.op_s * 1e6:.3g} us, link {self.rates.link_latency_s * 1e6:.3g} us/call); nothing fitted"
            ),
            rates={str(self.rates.threads): self.rates.to_json()},
        )


def probe(spec: RunSpec, seconds: float = 2.0, collectives: bool = True) -> ProbeResult:
    """Measure this node's rates for the point (collectives: between ranks started here)."""
    gpu = _on_gpu(spec)
    ranks = ranks_on_node(spec) if collectives else 0
    with _Threads(spec, gpu):
        gemm = measured_flops(spec, seconds)
        conv = measured_conv(spec, seconds / 4)
        attention = measured_attention(spec, seconds)
        memory = measured_memory(spec, seconds / 4)
        op = measured_op(spec, seconds / 4)
        per_sample, per_patch = measured_data(spec)
    link = measured_link(spec, ranks)
    note = (
        ""
        if link is not None
        else f"collectives not timed: {ranks} rank(s) on this node; a link of 0 latency assumed"
    )
    bandwidth, latency = link if link is not None else (0.0, 0.0)
    rates = MeasuredRates(
        threads=1 if gpu else rank_threads(spec),
        gemm_flops_per_s=gemm,
        conv_flops_per_s=conv,
        attention_flops_per_s=attention.flops_per_s,
        attention_half_length=attention.half_length,
        attention_head_dim=attention_shape(spec.model).head_dim,
        attention_backward_ratio=attention.backward_ratio,
        attention_masked_factor=attention.masked_factor,
        attention_causal_factor=attention.causal_factor,
        memory_bytes_per_s=memory,
        op_s=op,
        link_bytes_per_s=bandwidth,
        link_latency_s=latency,
        data_sample_s=per_sample,
        data_patch_s=per_patch,
    )
    device = "cuda, bf16" if gpu else "cpu, fp32"
    return ProbeResult(spec, rates, note, device)
