"""The calibration probe: a first calibration before any point has run, from seconds of timing.

On this node, for the point's shapes and in the dtype the engine computes in (fp32 on CPU, bf16
on GPUs):

GEMMs        the decoder's attention projection and one routed expert's projection at the
             micro-batch's tokens, the ViT MLP (about `seconds` / 2)
memory       a large tensor copy (what the optimizer step is bound by)
collectives  an all-to-all at the job's EP size and an all-gather at its DP size, on ranks started
             on this node (moe_vlm/predict/collectives.py; about a second each)

Each rate becomes the scale of the terms it stands for: base rate / measured rate (the terms'
base rates, moe_vlm/predict/terms.py), so a scale is 1 / the fraction of the datasheet (or
nominal CPU) rate reached. The all-to-all stands for the three EP dispatchers' terms (HybridEP's
and DeepEP's kernels are not NCCL's all-to-all: the probe gives them its rate), the all-gather for
FSDP, the 3D data-parallel gradient and the TP collectives; a collective not timed (one rank here)
borrows the other's rate, and with none both stay 0, said in the source. The per-step constant
is not probed (0), so the calibration is a lower bound (`Calibration.lower_bound`): its
predictions rank points, carry no band and never flag a run.

Where the probe's calibration is worth storing: clusters without the defaults fitted on published
whole-step rows (cluster=local, a site's own preset without a datasheet peak). On GPU clusters those defaults predict the published rows within 8.5-12.1 % out of sample
(mean absolute error, a whole family left out), and a probe of GEMMs and collectives alone misses what a whole step spends between
them (docs/step-time-prediction.md), so there it is printed against the datasheet, not stored,
unless asked.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from moe_vlm.base.processes import cores_here
from moe_vlm.config.arch import attention_shape, moe_shape
from moe_vlm.config.spec import RunSpec
from moe_vlm.predict.calibration import Calibration, stack_of
from moe_vlm.predict.collectives import Collective, CollectiveRate, cases, measure, ranks_on_node
from moe_vlm.predict.hardware import links_of
from moe_vlm.predict.terms import COMPUTE, NOMINAL_CPU_FLOPS, NOMINAL_CPU_LINK, NOMINAL_CPU_MEMORY, Term

# The terms each collective's rate stands for.
STANDS_FOR: dict[Collective, tuple[Term, ...]] = {
    Collective.all_to_all: (Term.ep_alltoall, Term.ep_deepep, Term.ep_hybridep),
    Collective.all_gather: (Term.fsdp, Term.dp_grad, Term.tp),
}
COPY_BYTES_GPU, COPY_BYTES_CPU = 2**30, 64 * 2**20


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


def _on_gpu(spec: RunSpec) -> bool:
    return torch.cuda.is_available() and spec.cluster.is_gpu_cluster


def _sync(gpu: bool) -> None:
    if gpu:
        torch.cuda.synchronize()


# Per GEMM: at least this many timed calls, and the 10th percentile of their times. A mean over a
# timed loop (the probe before issue 32) counts every wait for the CPU: on a shared 2-core node a
# descheduled intra-op thread or another job's time slice costs more than a hundred of these
# GEMMs, and the canary's probe read 0.386 GFLOP/s where a lone matmul runs at tens of GFLOP/s.
# Even the median is a wait under load (measured: 1.9 GFLOP/s median, 129 GFLOP/s fastest, one
# 4096x64x64 GEMM at load 10); the probe is a lower bound of the step, so it takes the kernel's
# own time, the fast tail.
MIN_TIMED_CALLS = 9
WARMUP_CALLS = 3  # the first calls pick and JIT a kernel for the shape and fault the output pages in


def rank_threads(spec: RunSpec) -> int:
    """The intra-op threads one CPU rank of the point computes with (the torch engine's
    run_rank: the cores here over the ranks per node), so the probe times the GEMMs as a rank
    runs them rather than with a thread per core while the ranks share the cores."""
    return max(1, cores_here() // max(spec.layout.ranks_per_node, 1))


def gemm_seconds(a: torch.Tensor, b: torch.Tensor, gpu: bool, seconds: float) -> float:
    """The 10th-percentile time of one a @ b over at least MIN_TIMED_CALLS calls within about
    `seconds`: the kernel's time without the waits for a CPU."""
    for _ in range(WARMUP_CALLS):
        a @ b
    _sync(gpu)
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < MIN_TIMED_CALLS or time.perf_counter() - start < seconds:
        began = time.perf_counter()
        a @ b
        _sync(gpu)
        times.append(time.perf_counter() - began)
    times.sort()
    return times[len(times) // 10]


def measured_flops(spec: RunSpec, seconds: float = 3.0) -> float:
    """FLOP/s over the probed shapes: their FLOPs (2 m k n each) over the sum of their fast-tail call
    times (gemm_seconds), on CPU with the threads one of the point's ranks gets."""
    gpu = _on_gpu(spec)
    device, dtype = ("cuda", torch.bfloat16) if gpu else ("cpu", torch.float32)
    shapes = gemm_shapes(spec)
    threads = torch.get_num_threads()
    if not gpu:
        torch.set_num_threads(rank_threads(spec))
    try:
        flops = spent = 0.0
        for m, k, n in shapes:
            a = torch.randn(m, k, device=device, dtype=dtype)
            b = torch.randn(k, n, device=device, dtype=dtype)
            spent += gemm_seconds(a, b, gpu, seconds / 2 / len(shapes))
            flops += 2.0 * m * k * n
    finally:
        torch.set_num_threads(threads)
    return flops / spent


def measured_memory(spec: RunSpec, seconds: float = 0.5) -> float:
    """Bytes/s of a device-to-device copy, read plus write."""
    gpu = _on_gpu(spec)
    size = COPY_BYTES_GPU if gpu else COPY_BYTES_CPU
    src = torch.ones(size // 4, device="cuda" if gpu else "cpu")
    dst = torch.empty_like(src)
    dst.copy_(src)
    _sync(gpu)
    copies, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds or copies == 0:
        dst.copy_(src)
        copies += 1
        _sync(gpu)
    return 2.0 * size * copies / (time.perf_counter() - start)


@dataclass(frozen=True)
class BaseRates:
    """The terms' base rates for this cluster: the datasheet's, else the nominal CPU bases."""

    flops: float
    link: float
    memory: float
    named: bool  # datasheet figures (a GPU cluster) rather than nominal CPU bases

    @classmethod
    def of(cls, spec: RunSpec) -> BaseRates:
        peak, links = spec.cluster.peak_bf16_flops, links_of(spec.cluster.name)
        return cls(
            flops=peak if peak > 0 else NOMINAL_CPU_FLOPS,
            link=links.nvlink_bytes_per_s if links else NOMINAL_CPU_LINK,
            memory=links.hbm_bytes_per_s if links else NOMINAL_CPU_MEMORY,
            named=peak > 0 and links is not None,
        )


@dataclass(frozen=True)
class ProbeResult:
    spec: RunSpec
    gemm_flops_per_s: float
    memory_bytes_per_s: float
    collectives: tuple[CollectiveRate, ...]
    note: str  # why a collective was not timed, or ""
    device: str = "cpu, fp32"  # where the GEMMs and the copy ran

    def rate_of(self, op: Collective) -> CollectiveRate | None:
        """The collective's measured rate, else the other's as its stand-in, else None."""
        own = [c for c in self.collectives if c.op is op]
        found = own or list(self.collectives)
        return found[0] if found else None

    def scales(self) -> dict[str, float]:
        base = BaseRates.of(self.spec)
        scales = {t.value: 0.0 for t in Term}
        scales |= {t.value: base.flops / self.gemm_flops_per_s for t in COMPUTE}
        scales[Term.optimizer.value] = base.memory / self.memory_bytes_per_s
        for op, terms in STANDS_FOR.items():
            rate = self.rate_of(op)
            if rate is not None:
                scales |= {t.value: base.link / rate.bytes_per_s for t in terms}
        return scales

    def lines(self) -> list[str]:
        """What was measured, against the datasheet where the cluster has one."""
        base = BaseRates.of(self.spec)

        def of(value: float, ref: float, what: str) -> str:
            return f" ({value / ref:.1%} of {what})" if base.named else ""

        out = [
            f"GEMMs at the model's shapes ({self.device}): {self.gemm_flops_per_s / 1e12:.4g} TFLOP/s"
            + of(self.gemm_flops_per_s, base.flops, "the dense BF16 peak"),
            f"memory copy: {self.memory_bytes_per_s / 1e9:.4g} GB/s"
            + of(self.memory_bytes_per_s, base.memory, "HBM"),
        ]
        out += [c.line() + of(c.bytes_per_s, base.link, "NVLink, one direction") for c in self.collectives]
        return out + ([self.note] if self.note else [])

    def calibration(self) -> Calibration:
        timed = ", ".join(f"{c.op} x{c.ranks}" for c in self.collectives) or "no collective"
        return Calibration(
            cluster=self.spec.cluster.name,
            stack=stack_of(self.spec.engine),
            scales=self.scales(),
            sigma=None,
            runs=0,
            source=(
                f"probe: GEMMs {self.gemm_flops_per_s / 1e9:.3g} GFLOP/s, copy {self.memory_bytes_per_s / 1e9:.3g} "
                f"GB/s, {timed}; per-step constant not probed"
            ),
            lower_bound=True,
        )


def probe(spec: RunSpec, seconds: float = 3.0, collectives: bool = True) -> ProbeResult:
    """Time this point's GEMMs, a copy and (with `collectives`) its collectives on this node."""
    ranks = ranks_on_node(spec) if collectives else 0
    todo = cases(spec, ranks, _on_gpu(spec))
    rates = tuple(measure(todo))
    note = "" if todo or not collectives else f"collectives not timed: {ranks} rank(s) on this node"
    device = "cuda, bf16" if _on_gpu(spec) else "cpu, fp32"
    return ProbeResult(spec, measured_flops(spec, seconds), measured_memory(spec), rates, note, device)
