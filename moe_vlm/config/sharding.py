"""HSDP: the outer data-parallel size, and the NVLink-domain segment its sharding group should fill.

Megatron cuts each DP x CP group into `dp_outer` consecutive blocks (megatron/core/parallel_state.py:
922-929, 984-1000; experts likewise, :1447-1451). A block is the sharding group: Megatron FSDP
all-gathers parameters and reduce-scatters gradients inside it, the blocks replicate each other
and all-reduce gradients across (megatron/core/distributed/fsdp/mcore_fsdp_adapter.py:342-358,
417-428); on 3D the distributed optimizer shards inside a block. Ranks are laid out
tp-cp-ep-dp-pp, so a block spans world / (PP x dp_outer) consecutive GPUs.

The launcher's `--segment` (`launcher_segment`, rendered by moe_vlm/launch/slurm.py) places a job in blocks of nodes
that each sit inside one NVLink domain; `segment=auto` (the GB200/GB300 presets) picks the largest
such block. A sharding block that is one segment keeps its collectives on NVLink and leaves only the
replicas' all-reduce to the scale-out network; `parallelism.dp_outer=0` asks for exactly that.
"""

from __future__ import annotations

from moe_vlm.config.spec import RunSpec


def launcher_segment(spec: RunSpec, segment: str | None) -> int | None:
    """Nodes per --segment (`segment` as hydra.launcher.segment; None: no --segment): each segment
    must sit inside one NVLink domain, so `auto` is the largest divisor of the job's nodes that fits."""
    if segment is None:
        return None
    if segment != "auto":
        return int(segment)
    nodes = spec.layout.nodes
    per_domain = max(spec.cluster.nvlink_domain_gpus // max(spec.layout.ranks_per_node, 1), 1)
    return max(n for n in range(1, nodes + 1) if nodes % n == 0 and n <= per_domain)


def segment_nodes(spec: RunSpec, segment: str | None = "auto") -> int:
    """Nodes per launcher segment (`segment` as hydra.launcher.segment; null = the whole job)."""
    nodes = launcher_segment(spec, segment)
    return spec.layout.nodes if nodes is None else nodes


def _divides(spec: RunSpec, outer: int) -> bool:
    lay = spec.layout
    return outer > 0 and (lay.dp * lay.cp) % outer == 0 and lay.expert_dp % outer == 0


def dp_outer(spec: RunSpec) -> int:
    """The outer DP size the engine gets: the knob, or for 0 one replica per segment=auto block
    (1 where that does not divide DP x CP and the expert DP, or the job is one segment)."""
    knob = spec.parallelism.dp_outer
    if knob != 0:
        return knob
    lay = spec.layout
    segment_gpus = segment_nodes(spec) * lay.ranks_per_node
    outer = lay.world_size // max(lay.pp * segment_gpus, 1)
    return outer if outer > 1 and _divides(spec, outer) else 1


def block_gpus(spec: RunSpec, outer: int | None = None) -> int:
    """Consecutive GPUs one sharding block spans: world / (PP x dp_outer)."""
    lay = spec.layout
    return lay.world_size // max(lay.pp * (dp_outer(spec) if outer is None else outer), 1)


def segment_mismatch(spec: RunSpec, segment: str | None) -> str | None:
    """Why the HSDP sharding block does not fill one launcher segment (None when it does, or without HSDP)."""
    outer = dp_outer(spec)
    if outer <= 1:
        return None
    lay = spec.layout
    seg_nodes = segment_nodes(spec, segment)
    seg_gpus = seg_nodes * lay.ranks_per_node
    block = block_gpus(spec, outer)
    if block == seg_gpus:
        return None
    where = (
        f"spans {block} GPUs, more than one segment ({seg_nodes} node(s) = {seg_gpus} GPUs): its all-gathers "
        "and reduce-scatters cross the scale-out network"
        if block > seg_gpus
        else f"spans {block} GPUs, less than one segment ({seg_nodes} node(s) = {seg_gpus} GPUs): "
        f"{outer} replicas keep {outer}x the sharded state and all-reduce gradients across more groups "
        "than the NVLink domains need"
    )
    suggested = lay.world_size // max(lay.pp * seg_gpus, 1)
    fix = (
        f"parallelism.dp_outer={suggested} (or 0: one replica per segment)"
        if suggested > 1 and _divides(spec, suggested)
        else "parallelism.dp_outer=1 (plain FSDP inside the job's single segment)"
    )
    return f"the HSDP sharding block (dp_outer={outer}) {where}. Fix: {fix}"
