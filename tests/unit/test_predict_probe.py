"""The calibration probe (moe_vlm/predict/probe.py, collectives.py) and the canary that runs it:
real GEMMs, attention, a copy, eager ops, the data loader and real gloo collectives on ranks
started here, stored as the rates cluster=local is predicted at."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from moe_vlm.config.schema import Precision
from moe_vlm.launch.canary import PROBE_PREFIX
from moe_vlm.predict import calibration as cal
from moe_vlm.predict.collectives import Collective, CollectiveRate
from moe_vlm.predict.hardware import MeasuredRates, gpu_hardware
from moe_vlm.predict.model import predict
from moe_vlm.predict.probe import probe
from tests.conftest import CPU_RATES, REPO, make_spec

TINY = ("model=tiny_moe_vlm", "data=synthetic", "nproc=2")


def test_a_collective_rate_counts_what_each_rank_moves() -> None:
    rate = CollectiveRate(Collective.all_gather, 4, 4_000_000, 0.001, "gloo")
    assert rate.bytes_per_s == pytest.approx(3_000_000 / 0.001)  # (n - 1) / n of the message


def test_collectives_run_on_real_ranks_even_after_this_process_computed() -> None:
    # A GEMM in the parent first: forked ranks inherit its OpenMP pool without threads, and hang
    # unless they compute on one thread. A subprocess, so that a hang is a timeout, not a stuck run.
    code = (
        "import torch; a = torch.randn(1500, 1500); (a @ a).sum()\n"
        "from moe_vlm.predict.collectives import *\n"
        "todo = [CollectiveCase(Collective.all_to_all, 2, 2**20), CollectiveCase(Collective.all_gather, 2, 2**20)]\n"
        "for r in measure(todo, seconds=0.3): print(r.op, r.ranks, r.backend, r.bytes_per_s > 0)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[:2] == ["all_to_all 2 gloo True", "all_gather 2 gloo True"]


def test_the_probe_measures_every_rate_the_step_model_reads_and_predicts_from_them(
    calibration_file: Path,
) -> None:
    spec = make_spec(*TINY)
    result = probe(spec, seconds=0.3, collectives=False)
    rates = result.rates
    for name, value in rates.to_json().items():
        assert math.isfinite(value) and value >= 0, name
    assert rates.gemm_flops_per_s > 1e8 and rates.attention_flops_per_s > 1e8 and rates.op_s < 1e-3
    # A padded row's dense mask and the causal triangle each run at their own rate per FLOP.
    assert 0.1 < rates.attention_masked_factor < 2 and 0.1 < rates.attention_causal_factor < 2
    assert rates.data_sample_s > 0 and rates.data_patch_s > 0  # synthetic images: both measured
    assert "link between ranks: not timed" in "\n".join(result.lines())
    found = result.calibration()
    assert found.rates and found.measured_rates(rates.threads) == rates
    assert MeasuredRates.from_json(rates.to_json()) == rates
    step = predict(spec, found)
    assert step.step_time_s and "measured on this machine by the probe" in step.source


def test_the_cli_probe_stores_rates_for_local_and_only_prints_on_gpu_clusters(tmp_path: Path) -> None:
    out = tmp_path / "probe.json"
    command = ["calibrate", "--probe", "cluster=gb200", "model=tiny_moe_vlm", "data=mock", "--out", str(out)]
    gpu = subprocess.run(
        [sys.executable, "-m", "moe_vlm.cli.main", *command], capture_output=True, text=True, cwd=REPO
    )
    assert gpu.returncode == 0, gpu.stderr
    assert "of the dense peak" in gpu.stdout and "not stored: cluster=gb200" in gpu.stdout
    assert not out.exists()
    bad = subprocess.run(
        [sys.executable, "-m", "moe_vlm.cli.main", "calibrate", "--probe", "nodes=0"],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert bad.returncode == 2 and "C001" in bad.stderr and len(bad.stderr.splitlines()) == 1


def _canary_probe(file: Path) -> str:
    """The canary with --probe as the job runs it: its own process (the probe forks its ranks)."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "moe_vlm.launch.canary",
            "--probe",
            "model=tiny_moe_vlm",
            "data=mock",
            "nproc=2",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, cal.CALIBRATION_ENV: str(file)},
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_the_canary_stores_its_rates_beside_a_fit_on_runs_and_never_over_it(tmp_path: Path) -> None:
    file = tmp_path / "cal.json"
    stack = cal.stack_of(make_spec().engine)
    fitted = cal.Calibration(
        "local", stack, {"vision": 1.2}, 0.05, 6, "fitted on runs", rates={"2": {**CPU_RATES, "threads": 2}}
    )
    cal.store([fitted], file)
    out = _canary_probe(file)
    probed = [line.removeprefix(PROBE_PREFIX) for line in out.splitlines() if line.startswith(PROBE_PREFIX)]
    assert probed[0].startswith(" GEMMs at the model's shapes (cpu, fp32, 1 thread(s))")
    assert any(line.startswith(" link between ranks:") and "GB/s" in line for line in probed)
    assert out.splitlines()[-1].endswith(f"probe rates stored in {file}")
    [stored] = cal.read_calibrations(file)
    # The fit's scales and band stay; the probe's rates join the ones measured at other thread counts.
    assert stored.scales == fitted.scales and stored.runs == 6 and set(stored.rates) == {"1", "2"}


def test_a_nodes_rates_stored_on_a_gpu_cluster_replace_its_gemms_and_keep_its_links() -> None:
    # `moe-vlm calibrate --probe --store` on a GPU cluster: the node's GEMM, attention and memory
    # rates in place of the published ones; the links, SMs and launch cost stay the preset's.
    spec = make_spec("cluster=gb200", "model=qwen3_vl_30b_a3b", "nodes=2", "data=mock")
    published = predict(spec, lookup=False)
    hw = gpu_hardware(spec.cluster)
    assert hw is not None and published.step_time_s
    half = {**CPU_RATES, "gemm_flops_per_s": hw.peak(Precision.bf16) * hw.gemm_efficiency[Precision.bf16] / 2}
    half |= {
        "attention_flops_per_s": hw.peak(Precision.bf16) * hw.attention_efficiency,
        "attention_head_dim": 128,
    }
    half |= {"memory_bytes_per_s": hw.memory_bytes_per_s}
    stored = cal.Calibration("gb200", "any", {}, None, 0, "a node's probe", rates={"1": half})
    slower = predict(spec, stored)
    over = MeasuredRates.from_json(half).over(hw)
    assert over.nvlink == hw.nvlink and over.sms == hw.sms and not over.synchronous
    assert over.gemm_efficiency[Precision.fp8mx] == pytest.approx(hw.gemm_efficiency[Precision.fp8mx] / 2)
    assert slower.step_time_s and slower.step_time_s > published.step_time_s
    assert "measured GEMM, attention and memory rates" in slower.source
