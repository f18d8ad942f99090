"""The rates a step is made of, per cluster preset: each number with its source.

A ``Hardware`` is what one GPU (or one CPU rank) does per second: GEMMs by shape and precision,
attention by sequence length and head size, memory, links with a latency and a bandwidth term,
and the host's cost per kernel launch. The step model (moe_vlm/predict/step.py) divides the work
of a step by these rates (moe_vlm/predict/kernels.py); nothing here is fitted to whole steps.

GPU presets: the dense peaks are the cluster preset's own (conf/cluster/*.yaml: one fact, one
place); everything else is in ``GPU_RATES`` and the constants below, each with its source
(../shared/reference/rates.md collects them). ``cluster=local`` (CPU ranks over gloo) has no
datasheet: its rates are measured on the machine by the calibration probe (moe_vlm/predict/
probe.py, ``moe-vlm calibrate --probe``) and stored as ``MeasuredRates`` in the calibration file.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from moe_vlm.base.processes import cores_here
from moe_vlm.config.precision import peak_flops
from moe_vlm.config.precision import profile as precision_profile
from moe_vlm.config.schema import ClusterConfig, Precision
from moe_vlm.config.spec import RunSpec

GB = 1e9
US = 1e-6


@dataclass(frozen=True)
class Link:
    """One link class as a collective sees it: a base latency per call, a latency per algorithm
    step (NCCL's hop), and the bytes per second one rank moves one way at large sizes."""

    bytes_per_s: float
    base_s: float
    hop_s: float

    def seconds(self, moved_bytes: float, steps: int = 1) -> float:
        return self.base_s + steps * self.hop_s + moved_bytes / self.bytes_per_s


@dataclass(frozen=True)
class Hardware:
    """Per-device rates (kernels.py turns them into seconds)."""

    name: str
    peak_flops: Mapping[Precision, float]  # dense, per precision the cluster runs
    gemm_efficiency: Mapping[Precision, float]  # a large GEMM kernel's share of its precision's peak
    sms: int  # streaming multiprocessors: a GEMM's tiles fill them in waves (0: no wave model, CPU)
    attention_efficiency: float  # fused attention forward at long sequences, share of the BF16 peak
    attention_half_length: float  # the sequence length at which attention reaches half of that
    attention_backward_efficiency: float  # backward's rate per FLOP relative to the forward's
    attention_head_dim: int  # the head dim that rate holds for (smaller ones run slower: kernels.py)
    memory_bytes_per_s: float  # achieved by memory-bound kernels (norms, activations, permutes, Adam)
    nvlink: Link  # inside the NVLink domain (CPU: between ranks on this machine)
    scale_out: Link  # across NVLink domains, per GPU NIC
    launch_s: float  # host time per kernel (GPU: exposed where the host cannot run ahead; CPU: every op)
    kernel_floor_s: float  # the shortest a kernel takes on the device
    synchronous: bool = False  # CPU: the host runs every op, so each op's dispatch adds to the step
    # The attention kernel's rate per FLOP with a dense mask (transformers' padded rows) and with the
    # causal triangle skipped, relative to the unmasked full square (GPU: the curve is causal already).
    attention_masked_factor: float = 1.0
    attention_causal_factor: float = 1.0
    conv_efficiency: float = 1.0  # the patch embedding's Conv3d relative to a GEMM of its FLOPs
    host_link_bytes_per_s: float = 0.0  # GPU <-> host memory, one way (optimizer offload)
    host_memory_bytes_per_s: float = 0.0  # the host memory bandwidth one GPU's share of the CPUs streams
    # Host time to build one sample in the data loader: per sample (text, collate) and per ViT patch
    # (draw or decode, resize, normalise). 0: not measured (the plan lists it as not modelled).
    data_sample_s: float = 0.0
    data_patch_s: float = 0.0
    sources: Mapping[str, str] = field(default_factory=dict)

    def peak(self, precision: Precision) -> float:
        return self.peak_flops.get(precision) or self.peak_flops[Precision.bf16]

    @property
    def measured(self) -> bool:
        return "probe" in self.sources


# Each source once; the GPU rows cite them by key (`moe-vlm explain` prints them).
SOURCES: dict[str, str] = {
    "gemm_hopper": "TransformerEngine docs/examples/gemm_profiling/gemm_profiling.rst, H200 NVL, hidden "
    "4096: pre-quantized BF16 600 TFLOP/s (0.61 of 989), FP8 current scaling 1142 (0.58 of 1979)",
    "gemm_blackwell": "TransformerEngine gemm_profiling.rst, B300: pre-quantized BF16 1463 TFLOP/s (0.65 of "
    "2250), FP8 current scaling 2814 (0.63 of 4500), MXFP8 2677 (0.59), NVFP4 5093 (0.36 of 14 PF)",
    "attention": "FlashAttention-3 paper (Shah et al., arXiv 2407.08608), 'Attention forward speed, head dim "
    "128 (H100)': cuDNN causal 315/410/484/518/529/539 TFLOP/s at 0.5k-16k tokens (0.55 of 989, half of "
    "it at ~256 tokens), head dim 64 at ~0.7 of 128; FlashAttention-4 on B200: 1613 TFLOP/s, 1.3x "
    "cuDNN 9.13 (cuDNN: 0.55 of 2250)",
    "attention_backward": "FlashAttention-2 paper (Dao, arXiv 2307.08691): backward at ~0.86 of the "
    "forward's rate per FLOP, counting backward as 2.5x the forward's matmul FLOPs",
    "sms": "H100 SXM5: 132 SMs; Blackwell B200/GB200/B300/GB300: 148 SMs (NVIDIA architecture whitepapers)",
    "memory": "datasheets: H100 SXM 3.35 TB/s, H200 4.8 TB/s, B200/GB200/B300/GB300 8 TB/s; memory-bound "
    "kernels at 0.8 of it (torchao's MXFP8 quantize kernels reach 72-83 % of peak bandwidth, rates.md 1d)",
    "nvlink": "NVLink 4 (Hopper) 900 GB/s, NVLink 5 (Blackwell) 1.8 TB/s per GPU, both directions; "
    "nccl-tests #212 (sjeaugey): ~370 of 450 GB/s one way on NVL8 (0.82); NCCL src/graph/tuning.cc: "
    "Simple protocol base latency 8.4 us, 3.4 us per NVLink ring hop",
    "nic": "one 400 Gb/s NIC per GPU (ConnectX-7; 800 Gb/s ConnectX-8 on B300/GB300); nccl-tests #267: "
    "48-49 GB/s per NDR NIC (0.96); NCCL tuning.cc: 14 us per network hop (Simple)",
    "launch": "HolisticTraceAnalysis docs/source/features/cuda_kernel_launch_stats.rst: CPU launch time is "
    "usually 5-20 us; taken at their geometric middle, 10 us",
    "host": "host link: PCIe Gen5 x16, 128 GB/s both ways (H100 SXM datasheet; HGX B200), NVLink-C2C 900 GB/s "
    "both ways (GB200/GB300 NVL72 datasheets); host memory per GPU: DGX H100 2x Xeon 8480C, 8 x DDR5-4800 "
    "channels per socket (614 GB/s / 8 GPUs), DGX B200 2x Xeon 8570, DDR5-5600 (717 GB/s / 8), one Grace "
    "LPDDR5X at up to 512 GB/s per 2 GPUs (GB200/GB300); streamed at the same 0.8 as HBM",
    "kernel_floor": "a kernel's launch-to-completion floor on the device, ~2.5 us (Primus "
    "collective_args.py uses 2.8 us per launch, AMD-calibrated)",
}

HOPPER_EFFICIENCY: Mapping[Precision, float] = {
    Precision.bf16: 0.61,
    Precision.fp8cs: 0.58,
    Precision.fp8mx: 0.58,
    Precision.nvfp4: 0.36,
}
BLACKWELL_EFFICIENCY: Mapping[Precision, float] = {
    Precision.bf16: 0.65,
    Precision.fp8cs: 0.63,
    Precision.fp8mx: 0.59,
    Precision.nvfp4: 0.36,
}
NCCL_EFFICIENCY = 0.82
NIC_EFFICIENCY = 0.96
MEMORY_EFFICIENCY = 0.8
ATTENTION_EFFICIENCY = 0.55
ATTENTION_HALF_LENGTH = 256.0
ATTENTION_BACKWARD_EFFICIENCY = 0.86
ATTENTION_HEAD_DIM = 128  # the FA3 paper's and FA4's figures
NCCL_BASE_S = 8.4 * US
NVLINK_HOP_S = 3.4 * US
NIC_HOP_S = 14.0 * US
LAUNCH_S = 10 * US
KERNEL_FLOOR_S = 2.5 * US


@dataclass(frozen=True)
class GpuRates:
    """What a GPU preset adds to the cluster preset's peaks."""

    efficiency: Mapping[Precision, float]
    gemm_source: str
    sms: int
    memory_tb_s: float
    nvlink_gb_s_one_way: float
    nic_gb_s: float
    host_link_gb_s_one_way: float
    host_memory_gb_s: float  # per GPU


GPU_RATES: dict[str, GpuRates] = {
    "h100": GpuRates(HOPPER_EFFICIENCY, "gemm_hopper", 132, 3.35, 450, 50, 64, 77),
    "h200": GpuRates(HOPPER_EFFICIENCY, "gemm_hopper", 132, 4.8, 450, 50, 64, 77),
    "b200": GpuRates(BLACKWELL_EFFICIENCY, "gemm_blackwell", 148, 8.0, 900, 50, 64, 90),
    "gb200": GpuRates(BLACKWELL_EFFICIENCY, "gemm_blackwell", 148, 8.0, 900, 50, 450, 256),
    "b300": GpuRates(BLACKWELL_EFFICIENCY, "gemm_blackwell", 148, 8.0, 900, 100, 64, 90),
    "gb300": GpuRates(BLACKWELL_EFFICIENCY, "gemm_blackwell", 148, 8.0, 900, 100, 450, 256),
}

_GPU: dict[tuple[str, float, float, float], Hardware] = {}


def gpu_hardware(cluster: ClusterConfig) -> Hardware | None:
    """The preset's published rates, or None (cluster=local, a site's own preset): uncalibrated."""
    rates = GPU_RATES.get(cluster.name)
    if rates is None or cluster.peak_bf16_flops <= 0:
        return None
    key = (cluster.name, cluster.peak_bf16_flops, cluster.peak_fp8_flops, cluster.peak_fp4_flops)
    if key not in _GPU:
        peaks = {p: peak_flops(cluster, precision_profile(p).peak) for p in Precision}
        _GPU[key] = Hardware(
            name=cluster.name,
            peak_flops={p: v for p, v in peaks.items() if v > 0},
            gemm_efficiency=rates.efficiency,
            sms=rates.sms,
            attention_efficiency=ATTENTION_EFFICIENCY,
            attention_half_length=ATTENTION_HALF_LENGTH,
            attention_backward_efficiency=ATTENTION_BACKWARD_EFFICIENCY,
            attention_head_dim=ATTENTION_HEAD_DIM,
            memory_bytes_per_s=rates.memory_tb_s * 1e12 * MEMORY_EFFICIENCY,
            nvlink=Link(rates.nvlink_gb_s_one_way * GB * NCCL_EFFICIENCY, NCCL_BASE_S, NVLINK_HOP_S),
            scale_out=Link(rates.nic_gb_s * GB * NIC_EFFICIENCY, NCCL_BASE_S, NIC_HOP_S),
            launch_s=LAUNCH_S,
            kernel_floor_s=KERNEL_FLOOR_S,
            host_link_bytes_per_s=rates.host_link_gb_s_one_way * GB,
            host_memory_bytes_per_s=rates.host_memory_gb_s * GB * MEMORY_EFFICIENCY,
            sources={
                "peaks": f"conf/cluster/{cluster.name}.yaml",
                "gemm": SOURCES[rates.gemm_source],
                **{k: SOURCES[k] for k in ("attention", "attention_backward", "sms", "memory")},
                **{k: SOURCES[k] for k in ("nvlink", "nic", "launch", "kernel_floor", "host")},
            },
        )
    return _GPU[key]


@dataclass(frozen=True)
class MeasuredRates:
    """A CPU machine's rates as the probe measured them (stored in the calibration file)."""

    threads: int  # intra-op threads per rank the rates hold for
    gemm_flops_per_s: float  # over the model's GEMM shapes
    conv_flops_per_s: float  # the patch embedding's Conv3d
    attention_flops_per_s: float  # SDPA forward at long sequences (kernels.attention_flops)
    attention_half_length: float
    attention_head_dim: int  # the decoder's head dim, which the probe times
    attention_backward_ratio: float  # backward seconds / forward seconds at the same length
    attention_masked_factor: float  # rate per FLOP with a dense bool mask, relative to none
    attention_causal_factor: float  # rate per (causal) FLOP with is_causal, relative to none
    memory_bytes_per_s: float
    op_s: float  # one eager op: dispatch, autograd node, the Python around it
    link_bytes_per_s: float  # gloo between ranks here, one way
    link_latency_s: float  # per call
    data_sample_s: float
    data_patch_s: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> MeasuredRates:
        counts = ("threads", "attention_head_dim")
        values = {f.name: float(raw[f.name]) for f in fields(cls) if f.name not in counts}
        return cls(threads=int(raw["threads"]), attention_head_dim=int(raw["attention_head_dim"]), **values)

    def over(self, hw: Hardware) -> Hardware:
        """A GPU preset's description with this node's measured GEMM, attention, memory and data
        rates in place of the published ones (`moe-vlm calibrate --probe --store` on a GPU
        cluster): its links, SMs and launch cost stay, and every precision's GEMM share moves by
        the BF16 one's measured / published ratio (the probe times BF16 only)."""
        published = hw.peak(Precision.bf16) * hw.gemm_efficiency[Precision.bf16]
        ratio = self.gemm_flops_per_s / published
        return replace(
            hw,
            gemm_efficiency={p: e * ratio for p, e in hw.gemm_efficiency.items()},
            attention_efficiency=self.attention_flops_per_s / hw.peak(Precision.bf16),
            attention_half_length=self.attention_half_length,
            attention_head_dim=self.attention_head_dim,
            memory_bytes_per_s=self.memory_bytes_per_s,
            data_sample_s=self.data_sample_s,
            data_patch_s=self.data_patch_s,
            sources={
                **hw.sources,
                "probe": f"GEMMs, attention and memory measured on a node ({self.threads} thread(s))",
            },
        )

    def hardware(self, name: str) -> Hardware:
        # The GEMM rate stands in for the peak, so each kernel class keeps its own measured rate.
        peak = self.gemm_flops_per_s
        # 0: one rank here, nothing to time (and nothing that crosses a link on this machine).
        link = Link(self.link_bytes_per_s if self.link_bytes_per_s > 0 else 1e18, self.link_latency_s, 0.0)
        return Hardware(
            name=name,
            peak_flops={Precision.bf16: peak},
            gemm_efficiency={Precision.bf16: 1.0},
            sms=0,
            attention_efficiency=self.attention_flops_per_s / peak,
            attention_half_length=self.attention_half_length,
            # kernels.attention_s charges backward 2.5x the forward's FLOPs: the measured ratio in its terms.
            attention_backward_efficiency=2.5 / max(self.attention_backward_ratio, 1e-9),
            attention_head_dim=self.attention_head_dim,
            memory_bytes_per_s=self.memory_bytes_per_s,
            nvlink=link,
            scale_out=link,
            launch_s=self.op_s,
            kernel_floor_s=0.0,
            synchronous=True,
            attention_masked_factor=self.attention_masked_factor,
            attention_causal_factor=self.attention_causal_factor,
            conv_efficiency=self.conv_flops_per_s / peak,
            data_sample_s=self.data_sample_s,
            data_patch_s=self.data_patch_s,
            sources={
                "probe": f"measured on this machine (moe-vlm calibrate --probe, {self.threads} thread(s))"
            },
        )


def rank_threads(spec: RunSpec) -> int:
    """The intra-op threads one CPU rank of the point computes with (the torch engine's run_rank:
    the cores here over the ranks per node): the rates a CPU point is predicted at."""
    return max(1, cores_here() // max(spec.layout.ranks_per_node, 1))
