"""The estimate's vocabulary: units, the stated constants, a Term and the MemoryEstimate."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from moe_vlm.config.schema import Engine

GIB = 2**30  # the one GiB: memory estimates, and both engines' measured peaks
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
    engine: Engine
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
