"""The node preflight's judgement, expected rates, settings and exclusions (the measurements run for
real on the local Slurm: tests/integration/test_slurm_preflight.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from moe_vlm.base.errors import BadInput
from moe_vlm.config.schema import ClusterConfig
from moe_vlm.launch import preflight, slurm
from moe_vlm.launch.settings import PreflightSettings, SlurmSettings
from moe_vlm.predict.hardware import gpu_hardware
from moe_vlm.runtime.node_probe import RankFigures, fault_delay

GB200 = ClusterConfig(name="gb200", peak_bf16_flops=2.5e15, peak_fp8_flops=5.0e15, is_gpu_cluster=True)
MIB64 = 64 * 2**20


def rank(rank: int, node: str, tflops: float, intra_s: float | None = None) -> RankFigures:
    figures = RankFigures(rank, node, rank % 4, "cuda:0", {"bf16": tflops * 1e12})
    if intra_s is not None:
        figures.collectives["intra:all_reduce"] = (intra_s, 2 * 3 / 4 * MIB64)
    return figures


def test_expected_rates_come_from_the_preset_and_a_figure_set_in_the_config_replaces_its_own() -> None:
    expected = preflight.expected_rates(GB200, PreflightSettings())
    hw = gpu_hardware(GB200)
    assert hw is not None
    # A healthy node's large GEMM, at TE's measured share of the dense peak (0.65 BF16, 0.63 FP8).
    assert expected.gemm_flops == {"bf16": 2.5e15 * 0.65, "fp8": 5.0e15 * 0.63}
    assert (expected.intra_bytes_per_s, expected.inter_bytes_per_s) == (
        hw.nvlink.bytes_per_s,
        hw.scale_out.bytes_per_s,
    )
    tightened = preflight.expected_rates(GB200, PreflightSettings(gemm_tflops=1800, inter_gbps=40))
    # The FP8 figure follows the BF16 one set, at the description's FP8 / BF16 ratio.
    fp8 = 1.8e15 * (5.0e15 * 0.63) / (2.5e15 * 0.65)
    assert tightened.gemm_flops == {"bf16": 1.8e15, "fp8": pytest.approx(fp8)}
    assert tightened.inter_bytes_per_s == 40e9
    assert "gemm_tflops, inter_gbps" in tightened.source
    local = preflight.expected_rates(ClusterConfig(), PreflightSettings())
    assert local.gemm_flops == {"bf16": None, "fp8": None} and local.intra_bytes_per_s is None


def test_a_slow_gpu_and_a_slow_node_link_are_named_with_their_figures_and_healthy_nodes_pass() -> None:
    expected = preflight.expected_rates(GB200, PreflightSettings())
    # 96 MiB bus bytes per call: 0.25 ms is 403 GB/s (healthy), 2 ms is 50 GB/s (< 0.25 x 738).
    healthy = [rank(r, "a", 1900, 0.00025) for r in range(4)]
    slow_gpu = [rank(4, "b", 700, 0.00025), *(rank(r, "b", 1900, 0.00025) for r in range(5, 8))]
    slow_link = [rank(r, "c", 1900, 0.002 if r == 9 else 0.00025) for r in range(8, 12)]
    nodes, _, job = preflight.judge([*healthy, *slow_gpu, *slow_link], expected, PreflightSettings())
    verdict = {n.node: n for n in nodes}
    assert verdict["a"].passed and verdict["a"].problems == [] and job == []
    assert verdict["b"].problems == [
        "gemm bf16 TFLOP/s 700 < 0.5 x 1,625 expected (cluster=gb200)",
        "gemm bf16 TFLOP/s 700 < 0.5 x 1,900 expected (the job's best node)",
    ]
    assert verdict["c"].problems == [
        "intra all_reduce GB/s 50.3 < 0.25 x 738 expected (cluster=gb200)",
        "intra all_reduce GB/s 50.3 < 0.5 x 403 expected (the job's best node)",
    ]
    # The job's best node: one node at a third of its peer fails without any datasheet figure.
    local = preflight.expected_rates(ClusterConfig(), PreflightSettings())
    nodes, _, _ = preflight.judge([rank(0, "x", 0.09), rank(1, "y", 0.03)], local, PreflightSettings())
    assert [n.passed for n in nodes] == [True, False] and "the job's best node" in nodes[1].problems[0]
    # Alone, nothing to hold a local node to: it passes.
    nodes, _, _ = preflight.judge([rank(0, "x", 0.03)], local, PreflightSettings())
    assert nodes[0].passed


def test_an_inter_node_collective_below_threshold_stops_the_job_but_excludes_no_node() -> None:
    expected = preflight.expected_rates(GB200, PreflightSettings())
    a, b = rank(0, "a", 1900), rank(1, "b", 1900)
    for each in (a, b):  # 32 MiB of bus bytes in 10 ms: 3.4 GB/s against 0.25 x 50
        each.collectives["inter:all_to_all"] = (0.01, 32 * 2**20)
    nodes, figures, job = preflight.judge([a, b], expected, PreflightSettings())
    assert all(n.passed for n in nodes) and figures == {"inter all_to_all GB/s": 3.355443}
    assert len(job) == 1 and "between nodes a, b: not pinned to one node, none excluded" in job[0]


def test_the_sweeps_failing_nodes_are_excluded_with_the_users_own(tmp_path: Path) -> None:
    settings = SlurmSettings(additional_parameters={"exclude": "gpu9"})
    assert preflight.with_exclusions(settings, tmp_path) is settings  # nothing failed yet
    for job, node, passed in (("1", "gpu1", False), ("2", "gpu2", True), ("3", "gpu3", False)):
        verdict = preflight.Verdict(
            job, f"p{job}", float(job), 0.5, 4, [preflight.NodeVerdict(node, passed, {}, [])], {}, [], {}, {}
        )
        preflight.record_verdict(tmp_path, verdict)
    # gpu3 passed later: its latest verdict counts.
    later = preflight.Verdict(
        "4", "p4", 4.0, 0.5, 4, [preflight.NodeVerdict("gpu3", True, {}, [])], {}, [], {}, {}
    )
    preflight.record_verdict(tmp_path, later)
    assert preflight.excluded_nodes(tmp_path) == ["gpu1"]
    assert preflight.with_exclusions(settings, tmp_path).additional_parameters == {"exclude": "gpu9,gpu1"}
    off = SlurmSettings(preflight=PreflightSettings(exclude_failed=False))
    assert preflight.with_exclusions(off, tmp_path) is off
    nodes = tmp_path / preflight.NODES
    assert (nodes / preflight.PASSING).read_text() == "gpu2\ngpu3\n"
    assert (nodes / preflight.FAILING).read_text() == "gpu1\t\n"


def test_preflight_settings_are_checked_with_a_fix_and_the_fault_reads_only_its_node() -> None:
    assert slurm.settings_from({"preflight": {"gemm_fraction": 0.3}}).preflight.gemm_fraction == 0.3

    def check(**values: float) -> None:
        slurm.check_preflight(PreflightSettings(**values))  # type: ignore[arg-type]

    with pytest.raises(BadInput, match=r"preflight\.gemm_fraction=2: expected a fraction in \[0, 1\]"):
        check(gemm_fraction=2)
    with pytest.raises(BadInput, match=r"preflight\.seconds=0: expected a positive number"):
        check(seconds=0)
    with pytest.raises(BadInput, match=r"preflight\.collective_iters=0: expected a whole number"):
        check(collective_iters=0)
    env = {"MOE_VLM_TEST_PREFLIGHT_FAULT": "node1:gemm=0.2,intra=0.1;node2:inter=0.3"}
    assert fault_delay("node1", "gemm", env) == 0.2 and fault_delay("node1", "intra", env) == 0.1
    assert fault_delay("node2", "gemm", env) == 0.0 and fault_delay("node2", "inter", env) == 0.3
    assert fault_delay("node3", "gemm", env) == 0.0


def _probe_rank(rank: int, port: int, out: str) -> None:
    """One of four gloo ranks on two fake nodes (a: ranks 0-1, b: ranks 2-3), EP 2 x ETP 2."""
    import os
    import pickle

    import torch

    from moe_vlm.runtime import node_probe
    from moe_vlm.runtime.dist_env import DistEnv

    os.environ["SLURMD_NODENAME"] = "ab"[rank // 2]
    torch.set_num_threads(1)
    env = DistEnv(rank, 4, rank % 2, 2, "127.0.0.1", port - 1, "spawn")  # probe_port: port - 1 + 1
    device = torch.device("cpu")
    with node_probe.group(env, device):
        figures = node_probe.measure(
            env, device, ["bf16"], {}, 64, 0.01, 2**16, 2, node_probe.ep_groups(4, 2, 2)
        )
        node_probe.barrier(env)
    if rank == 0:
        with open(out, "wb") as handle:
            pickle.dump(figures, handle)


def test_the_probe_times_each_nodes_ranks_one_rank_per_node_and_the_ep_groups_over_gloo(
    tmp_path: Path,
) -> None:
    """Real gloo collectives in the probe's own groups: intra-node (a: 0-1, b: 2-3), inter-node (0, 2)
    and the EP groups of EP 2 x ETP 2 ([0, 2], [1, 3]: across the nodes), judged as one job."""
    import pickle

    import torch.multiprocessing as mp

    from moe_vlm.runtime.dist_env import free_port

    out = tmp_path / "figures.pkl"
    mp.spawn(_probe_rank, args=(free_port(), str(out)), nprocs=4)
    figures = pickle.loads(out.read_bytes())
    assert [(f.rank, f.node) for f in figures] == [(0, "a"), (1, "a"), (2, "b"), (3, "b")]
    assert all(
        {"intra:all_reduce", "intra:all_to_all", "ep:all_to_all"} <= set(f.collectives) for f in figures
    )
    assert [("inter:all_reduce" in f.collectives) for f in figures] == [True, False, True, False]
    assert [f.ep_group for f in figures] == [[0, 2], [1, 3], [0, 2], [1, 3]]
    expected = preflight.expected_rates(GB200, PreflightSettings(inter_gbps=1e-9))
    nodes, job_figures, job = preflight.judge(figures, expected, PreflightSettings(relative_fraction=0.0))
    assert {"inter all_reduce GB/s", "inter all_to_all GB/s", "ep all_to_all GB/s"} == set(job_figures)
    # The EP groups span both nodes: held to the NIC's figure, not NVLink's (which CPU ranks miss).
    assert job == [] and preflight._ep_inside_nodes(figures) is False
    assert [n.node for n in nodes] == ["a", "b"] and all("intra all_to_all GB/s" in n.figures for n in nodes)
