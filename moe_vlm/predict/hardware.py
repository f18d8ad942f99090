"""Per-GPU link and memory bandwidths the step-time model divides bytes by, each with its source.

One row per cluster preset (conf/cluster/*.yaml names). Datasheet NVLink figures are the total of
both directions; a collective's ring or all-to-all moves data one way per link, so the model uses
half (per direction). Scale-out is the NIC per GPU (InfiniBand/Ethernet line rate, one direction).
``cluster=local`` (CPU ranks over gloo) has no datasheet figure: its rates are uncalibrated and
come from a calibration only (moe_vlm/predict/calibration.py).
"""

from __future__ import annotations

from dataclasses import dataclass

GB = 1e9


@dataclass(frozen=True)
class Links:
    nvlink_bytes_per_s: float  # per GPU, one direction
    scale_out_bytes_per_s: float  # per GPU NIC, one direction
    hbm_bytes_per_s: float  # per GPU memory bandwidth (the optimizer step is bound by it)
    source: str


LINKS: dict[str, Links] = {
    "h100": Links(
        450 * GB,
        50 * GB,
        3.35e12,
        "NVIDIA H100 SXM datasheet (NVLink 900 GB/s, HBM3 3.35 TB/s); DGX H100 user guide "
        "(8x ConnectX-7 400 Gb/s, one per GPU)",
    ),
    "h200": Links(
        450 * GB,
        50 * GB,
        4.8e12,
        "NVIDIA H200 SXM datasheet (NVLink 900 GB/s, HBM3e 4.8 TB/s); DGX H200 (8x ConnectX-7 400 Gb/s)",
    ),
    "b200": Links(
        900 * GB,
        50 * GB,
        8.0e12,
        "NVIDIA DGX B200 datasheet (NVLink 5 1.8 TB/s per GPU, HBM3e 8 TB/s per GPU, 8x ConnectX-7 400 Gb/s)",
    ),
    "b300": Links(
        900 * GB,
        100 * GB,
        8.0e12,
        "NVIDIA DGX B300 datasheet (NVLink 5 1.8 TB/s per GPU, 8x ConnectX-8 800 Gb/s); HBM3e 8 TB/s per GPU",
    ),
    "gb200": Links(
        900 * GB,
        50 * GB,
        8.0e12,
        "NVIDIA GB200 NVL72 datasheet (NVLink 130 TB/s / 72 GPUs = 1.8 TB/s, HBM3e 576 TB/s / 72 = "
        "8 TB/s; ConnectX-7 400 Gb/s per GPU)",
    ),
    "gb300": Links(
        900 * GB,
        100 * GB,
        8.0e12,
        "NVIDIA GB300 NVL72 datasheet (NVLink 130 TB/s / 72 GPUs, HBM3e 576 TB/s / 72; ConnectX-8 "
        "800 Gb/s per GPU)",
    ),
}


def links_of(cluster_name: str) -> Links | None:
    """The cluster's datasheet links, or None (cluster=local, a site's own preset): uncalibrated."""
    return LINKS.get(cluster_name)
