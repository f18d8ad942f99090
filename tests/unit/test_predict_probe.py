"""The calibration probe (moe_vlm/predict/probe.py, collectives.py), its lower bound, and the canary
that runs it: real GEMMs, a real copy and real gloo collectives on ranks started here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from moe_vlm.engines import run_summary
from moe_vlm.launch.canary import PROBE_PREFIX
from moe_vlm.predict import calibration as cal
from moe_vlm.predict.collectives import Collective, CollectiveRate, cases
from moe_vlm.predict.model import FLAG_SIGMAS, predict, record_section
from moe_vlm.predict.probe import ProbeResult
from moe_vlm.predict.report_section import row_fields, section
from moe_vlm.predict.terms import NOMINAL_CPU_FLOPS, NOMINAL_CPU_LINK, NOMINAL_CPU_MEMORY, Term
from tests.conftest import REPO, make_spec

TINY = ("model=tiny_moe_vlm", "data=mock", "nproc=2")


def test_the_collectives_are_the_jobs_all_to_all_and_all_gather_at_its_message_sizes() -> None:
    spec = make_spec("cluster=gb200", "model=qwen3_vl_30b_a3b", "nodes=2", "ep=8")
    found = {c.op: c for c in cases(spec, ranks_here=4, gpu=True)}
    a2a = found[Collective.all_to_all]
    # One MoE layer's dispatch per rank and micro-batch: tokens x hidden x top-k x bf16.
    tokens = spec.mbs * spec.seq_length // (spec.layout.tp * spec.layout.cp)
    assert a2a.ranks == 4  # EP 8, capped by the 4 GPUs one node has
    assert a2a.message_bytes == tokens * spec.model.hidden_size * spec.model.moe_top_k * 2
    gather = found[Collective.all_gather]
    assert gather.ranks == min(spec.layout.dp * spec.layout.cp, 4) and gather.message_bytes > 0
    assert cases(spec, ranks_here=1, gpu=True) == []  # one rank: nothing to time
    # EP=1 still gets an all-to-all rate (a sweep may vary EP), at 2 ranks.
    tiny = make_spec(*TINY)
    assert tiny.layout.ep == 1 and {c.op: c.ranks for c in cases(tiny, 2, False)} == {
        Collective.all_to_all: 2,
        Collective.all_gather: 2,
    }


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


def _result(*collectives: CollectiveRate) -> ProbeResult:
    return ProbeResult(make_spec(*TINY), 2e11, 4e10, collectives, "")


def test_each_rate_becomes_the_scale_of_the_terms_it_stands_for() -> None:
    a2a = CollectiveRate(Collective.all_to_all, 2, 2_000_000, 0.002, "gloo")  # 0.5 GB/s
    gather = CollectiveRate(Collective.all_gather, 2, 2_000_000, 0.004, "gloo")  # 0.25 GB/s
    scales = _result(a2a, gather).scales()
    assert scales["experts"] == scales["vision"] == pytest.approx(NOMINAL_CPU_FLOPS / 2e11)
    assert scales["optimizer"] == pytest.approx(NOMINAL_CPU_MEMORY / 4e10)
    for term in ("ep_alltoall", "ep_deepep", "ep_hybridep"):
        assert scales[term] == pytest.approx(NOMINAL_CPU_LINK / 0.5e9)
    for term in ("fsdp", "dp_grad", "tp"):
        assert scales[term] == pytest.approx(NOMINAL_CPU_LINK / 0.25e9)
    assert scales["overhead"] == 0.0
    # One collective timed: it stands in for the other; none: data movement stays 0.
    assert _result(gather).scales()["ep_alltoall"] == pytest.approx(NOMINAL_CPU_LINK / 0.25e9)
    assert _result().scales()["fsdp"] == 0.0
    found = _result(a2a, gather).calibration()
    assert found.lower_bound and found.sigma is None and found.runs == 0


def test_a_probes_prediction_is_a_lower_bound_that_ranks_and_never_flags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gather = CollectiveRate(Collective.all_gather, 2, 2_000_000, 0.004, "gloo")
    file = tmp_path / "cal.json"
    cal.store([_result(gather).calibration()], file)
    monkeypatch.setenv(cal.CALIBRATION_ENV, str(file))
    spec = make_spec(*TINY)
    found = predict(spec)
    assert found.lower_bound and found.step_time_s and found.band(found.step_time_s) is None
    assert found.to_json()["sigma"] is None and found.to_json()["step_time_band_s"] is None
    text = "\n".join(found.lines())
    assert "at least: a probe's lower bound" in text and "calibration    probe: GEMMs" in text
    # Ten times slower than the bound: an error, but no sigmas and no flag.
    slow = found.step_time_s * 10
    section_ = record_section(spec, {"step_period_s": {"mean": slow}})
    assert section_["error"] == pytest.approx(9.0) and section_["sigmas"] is None and "flag" not in section_
    assert run_summary._predicted({"prediction": section_}).startswith(">= ")  # the end-of-run table
    row = {"run": "r", **row_fields({"prediction": json.loads(json.dumps(section_))})}
    lines = section([row], top=5)
    assert "0 more than" in lines[3] and "| lower bound |" in lines[-1] and "FLAGGED" not in lines[-1]
    # The same error against a calibration with a band is flagged.
    banded = cal.Calibration("local", cal.stack_of(spec.engine), _result(gather).scales(), 0.1, 5, "fit")
    cal.store([banded], file)
    assert record_section(spec, {"step_period_s": {"mean": slow}})["sigmas"] > FLAG_SIGMAS


def test_the_cli_probe_stores_where_no_defaults_apply_and_only_prints_on_gpu_clusters(tmp_path: Path) -> None:
    out = tmp_path / "probe.json"
    command = ["calibrate", "--probe", "cluster=gb200", "model=tiny_moe_vlm", "--out", str(out)]
    gpu = subprocess.run(
        [sys.executable, "-m", "moe_vlm.cli.main", *command],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert gpu.returncode == 0, gpu.stderr
    assert "of the dense BF16 peak" in gpu.stdout and "not stored: cluster=gb200" in gpu.stdout
    assert not out.exists()


def _canary_probe(file: Path) -> str:
    """The canary with --probe as the job runs it: its own process (the probe forks its ranks; a test
    process that imported Transformer Engine earlier loses its captured stdout to that fork)."""
    done = subprocess.run(
        [sys.executable, "-m", "moe_vlm.launch.canary", "--probe", *TINY],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, cal.CALIBRATION_ENV: str(file)},
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_the_canary_probes_and_stores_a_first_calibration_but_never_over_a_fit_on_runs(
    tmp_path: Path,
) -> None:
    file = tmp_path / "cal.json"
    out = _canary_probe(file)
    probed = [line for line in out.splitlines() if line.startswith(PROBE_PREFIX)]
    assert [line.removeprefix(PROBE_PREFIX).split(":")[0] for line in probed[:2]] == [
        " GEMMs at the model's shapes (cpu, fp32)",
        " memory copy",
    ]
    assert any("all_to_all over 2 ranks (gloo)" in line for line in probed)
    assert out.splitlines()[-1].endswith(f"probe calibration stored in {file}")
    [stored] = cal.read_calibrations(file)
    assert stored.lower_bound and stored.scale(Term.fsdp) > 0 and stored.scale(Term.experts) > 0
    fitted = cal.Calibration(stored.cluster, stored.stack, stored.scales, 0.05, 6, "fitted on runs")
    cal.store([fitted], file)
    assert "probe not stored: a calibration fitted on 6 run(s) exists" in _canary_probe(file)
    assert cal.read_calibrations(file) == [fitted]
