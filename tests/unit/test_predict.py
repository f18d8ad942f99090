"""The step-time prediction (moe_vlm/predict): terms, calibration, the file, where it is shown."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hydra_plugins.moe_vlm_sweeper._planning import Point, keep_predicted_top
from moe_vlm.base.errors import BadInput
from moe_vlm.perf.metrics import by_step, steady_window, workload_of
from moe_vlm.predict import calibration as cal
from moe_vlm.predict.families import band_for
from moe_vlm.predict.model import (
    FLAG_SIGMAS,
    MIN_JUDGED_STEPS,
    calibration_for,
    hardware_for,
    measured_window,
    predict,
    record_section,
)
from moe_vlm.predict.report_section import row_fields, section
from moe_vlm.predict.runs import find_runs, measured_step_s, recorded
from moe_vlm.predict.step_time import loads
from moe_vlm.predict.terms import Term
from moe_vlm.predict.workload import expected_workload
from moe_vlm.record.records import read_steps
from moe_vlm.report.table import throughput_band
from moe_vlm.run.plan import render
from tests.conftest import REPO, make_spec

FIXTURE = REPO / "tests" / "fixtures" / "cpu_sweep"
GB200 = ("cluster=gb200", "model=qwen3_vl_30b_a3b", "nodes=2")


def _base(spec) -> dict[Term, float]:
    hw, _ = hardware_for(spec, calibration_for(spec))
    assert hw is not None
    return {load.term: load.base_s for load in loads(spec, expected_workload(spec).workload, hw)}


def test_expected_workload_is_near_what_the_fixture_runs_recorded():
    for run_dir in find_runs([FIXTURE]):
        found = recorded(run_dir)
        assert not isinstance(found, str), found
        grouped = by_step(read_steps(run_dir / "steps.jsonl"))
        steps = [workload_of(grouped[n]) for n in steady_window(grouped, 0).steps]
        real = sum(w.real_tokens for w in steps) / len(steps)
        expected = expected_workload(found.spec).workload
        assert expected.padded_tokens == steps[0].padded_tokens
        assert expected.real_tokens == pytest.approx(real, rel=0.25)


def test_mock_rows_fill_three_quarters_on_average():
    spec = make_spec("data=mock")
    work = expected_workload(spec).workload
    assert work.vision_patches == 0
    assert work.real_tokens == pytest.approx(0.75 * spec.gbs * spec.seq_length, rel=1e-3)


def _samples(truth: dict[Term, float]) -> list[cal.Sample]:
    specs = [make_spec(f"gbs={g}", f"recompute={r}") for g in (2, 4, 8) for r in ("none", "full")]
    return [cal.Sample(str(i), _base(s), cal.predicted_s(truth, _base(s))) for i, s in enumerate(specs)]


def test_fit_recovers_step_times_made_from_known_group_scales(cpu_rates: Path):
    truth = {t: 1.3 for t in Term if t.is_compute} | {t: 0.7 for t in Term if not t.is_compute}
    samples = _samples(truth)
    found = cal.calibrate("local", "torch x", samples, "synthetic")
    assert found.sigma is not None and found.sigma < 0.06  # the ridge toward 1 trades a little bias
    assert found.scale(Term.vision) == pytest.approx(1.3, rel=0.1)
    assert set(found.scales) <= {t.value for t in Term}  # at most one scale per group, per term stored
    for s in samples:
        got = cal.predicted_s({Term(k): v for k, v in found.scales.items()}, s.base)
        assert got == pytest.approx(s.measured_s, rel=0.06)


def test_file_round_trip_replaces_by_cluster_and_stack(tmp_path: Path):
    path = tmp_path / "c.json"
    a = cal.Calibration("local", "torch 1", {"vision": 1.0}, 0.1, 6, "a")
    b = cal.Calibration("gb200", "megatron-core 1", {"vision": 2.0}, None, 2, "b")
    cal.store([a, b], path)
    cal.store([cal.Calibration("local", "torch 1", {"vision": 3.0}, 0.2, 7, "a2")], path)
    found = {(c.cluster, c.stack): c for c in cal.read_calibrations(path)}
    assert (
        found[("local", "torch 1")].scales == {"vision": 3.0}
        and found[("gb200", "megatron-core 1")].sigma is None
    )
    assert not list(tmp_path.glob(".*tmp"))  # atomic: no temp file left
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(BadInput, match="not valid JSON"):  # a corrupt file is refused, not read as empty
        cal.read_calibrations(tmp_path / "bad.json")


def test_local_without_rates_says_how_to_measure_them_and_gpu_has_published_rates():
    found = predict(make_spec())
    assert found.step_time_s is None and "moe-vlm calibrate --probe" in (found.note or "")
    gpu = predict(make_spec(*GB200))
    assert gpu.step_time_s and gpu.step_time_s > 0 and gpu.sigma == band_for(make_spec(*GB200)).width
    assert gpu.mfu is not None and "GB200 dense BF16" in (gpu.peak_name or "")
    assert "published rates" in gpu.source and "nothing fitted" in gpu.source


def test_calibration_file_is_what_the_plan_reads(cpu_rates: Path):
    spec = make_spec()
    at_rates = predict(spec)
    assert at_rates.step_time_s and "measured on this machine by the probe" in at_rates.source
    stack = cal.stack_of(spec.engine)
    scales = {t.value: 2.0 for t in Term}
    [stored] = cal.read_calibrations(cpu_rates)
    cal.store([cal.replace(stored, scales=scales, runs=6, source="test fit")], cpu_rates)
    text = render(spec, [], deep=False)
    found = predict(spec)
    assert found.step_time_s == pytest.approx(2 * at_rates.step_time_s)
    assert "-- predicted speed" in text and f"{found.step_time_s:.4g} s" in text and "test fit" in text
    assert found.unit == "rank" and stack == stored.stack


def test_calibrate_command_on_the_fixture_sweep(tmp_path: Path):
    out = tmp_path / "cal.json"
    done = subprocess.run(
        [sys.executable, "-m", "moe_vlm.cli.main", "calibrate", str(FIXTURE), "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    assert "2 run(s), spread none (fewer than 3 runs)" in done.stdout
    # every printed scale says what it multiplies: its group and the group's terms
    assert "scale = measured seconds / the group's seconds at the rates" in done.stdout
    scale_lines = [line for line in done.stdout.splitlines() if re.match(r"\s+\w+\s+scale \d", line)]
    assert scale_lines and all(line.split()[0] in cal.GROUPS for line in scale_lines)
    # No rates stored for cluster=local yet: the command measured them first and keeps them.
    assert "no rates yet; measuring this machine's" in done.stdout
    [found] = cal.read_calibrations(out)
    assert found.cluster == "local" and found.stack.startswith("torch ") and found.sigma is None
    assert found.rates and found.measured_rates(1) is not None
    bad = subprocess.run(
        [sys.executable, "-m", "moe_vlm.cli.main", "calibrate", str(tmp_path / "nothing")],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert bad.returncode == 2 and "no such directory" in bad.stderr and len(bad.stderr.splitlines()) == 1


def test_record_section_flags_a_run_2_sigma_slower():
    spec = make_spec(*GB200)
    predicted = predict(spec).step_time_s or 0.0
    slow = record_section(spec, {"step_period_s": {"mean": predicted * (1 + 3 * predict(spec).sigma)}})
    near = record_section(spec, {"step_period_s": {"mean": predicted * 1.1}})
    assert slow["sigmas"] > FLAG_SIGMAS and "regression" in slow["flag"]
    assert near["flag"] is None and near["error"] == pytest.approx(0.1)
    rows = [
        {"run": "slow", **row_fields({"prediction": slow})},
        {"run": "near", **row_fields({"prediction": near})},
    ]
    text = "\n".join(section(rows, 10))
    assert "1 more than 2 sigma slower" in text and text.count("FLAGGED") == 2  # the note and the row


def quantiles(predicted: float, p10: float, p50: float, p90: float, mean: float) -> dict[str, float]:
    """A summary's step-time spread (the four figures measured_window reads), each a multiple of
    the predicted step time."""
    return {"p10": predicted * p10, "p50": predicted * p50, "p90": predicted * p90, "mean": predicted * mean}


def test_judged_on_the_windows_median_not_one_slow_step():
    """Ten steady steps, one of them slow: the mean is +28 % ("2.5 sigma"), the median +3 %. The
    record judges the median, keeps the spread, and flags nothing."""
    spec = make_spec(*GB200)
    predicted = predict(spec).step_time_s or 0.0
    spread = quantiles(predicted, p10=1.01, p50=1.03, p90=1.06, mean=1.28)
    found = record_section(spec, {"step_period_s": spread, "steady_window": {"steps": 10}})
    assert found["error"] == pytest.approx(0.03) and found["flag"] is None
    assert found["measured_p10_s"] == spread["p10"] and found["measured_p90_s"] == spread["p90"]
    text = "\n".join(section([{"run": "r", **row_fields({"prediction": found})}], 10))
    assert (
        "FLAGGED" not in text
        and f"{predicted * 1.03:.3f} ({predicted * 1.01:.3f}-{predicted * 1.06:.3f})" in text
    )


def test_which_seconds_the_rates_divide_by_is_decided_once():
    """A record whose step periods are unusable (zero: a clock that did not move) divides by its
    step times, in the prediction's judgement, the calibration's samples and the report's band
    alike (the report took the zeroed periods and showed no band)."""
    times = quantiles(2.0, p10=0.9, p50=1.0, p90=1.2, mean=1.05)
    summary = {
        "step_period_s": quantiles(0.0, p10=1, p50=1, p90=1, mean=1),
        "step_time_s": times,
        "effective_tokens_per_s_per_gpu": 1000.0,
    }
    window = measured_window(summary)
    assert window is not None and window[0] is times
    assert measured_step_s(summary) == times["mean"]
    band = throughput_band(summary)
    assert band["eff_p50"] == pytest.approx(1000.0 * 1.05 / 1.0) and band["eff_low"] == pytest.approx(
        1000.0 * 1.05 / 1.2
    )
    # No reader but measured_window spells the summary's time keys.
    for module in ("moe_vlm/predict/runs.py", "moe_vlm/report/table.py", "moe_vlm/launch/halving.py"):
        assert '"step_period_s"' not in (REPO / module).read_text(), module


def test_a_window_too_short_is_recorded_never_judged():
    spec = make_spec(*GB200)
    predicted = predict(spec).step_time_s or 0.0
    one_step = quantiles(predicted, p10=1.28, p50=1.28, p90=1.28, mean=1.28)
    short = record_section(spec, {"step_time_s": one_step, "steady_window": {"steps": 1}})
    assert short["error"] == pytest.approx(0.28) and short["flag"] is None
    assert "too few to judge" in short["note"]
    same = 1 + 3 * predict(spec).sigma
    slow = quantiles(predicted, p10=same, p50=same, p90=same, mean=same)
    judged = record_section(spec, {"step_time_s": slow, "steady_window": {"steps": MIN_JUDGED_STEPS}})
    assert "regression" in judged["flag"]


def _point(index: int, *overrides: str) -> Point:
    spec = make_spec(*GB200, *overrides)
    return Point(index, list(overrides), f"p{index}", {}, spec, [])


def test_predict_keep_keeps_the_predicted_fastest():
    points = [_point(i, f"mbs={m}") for i, m in enumerate((1, 2, 4))]
    rate = {p.point_id: predict(p.spec).effective_tokens_per_s_per_gpu or 0 for p in points}
    kept = keep_predicted_top(points, 0.34)
    assert len(kept) == 2 and {p.point_id for p in kept} == set(sorted(rate, key=lambda k: -rate[k])[:2])
    assert keep_predicted_top(points, 1.0) == points
    for bad in (0.0, 1.5):
        with pytest.raises(BadInput, match="predict_keep"):
            keep_predicted_top(points, bad)


def test_predict_keep_names_the_points_it_drops(capsys: pytest.CaptureFixture[str]) -> None:
    points = [_point(i, f"mbs={m}") for i, m in enumerate((1, 2, 4))]
    kept = keep_predicted_top(points, 0.34)
    (dropped,) = [p for p in points if p not in kept]
    out = capsys.readouterr().out
    assert "1 dropped:" in out and f"dropped {dropped.label()}: predicted " in out


def test_predict_keep_refuses_points_without_a_prediction():
    points = [Point(0, [], "p0", {}, make_spec(), [])]
    with pytest.raises(BadInput, match="no prediction"):
        keep_predicted_top(points, 0.5)


def test_no_nan_in_the_terms_of_every_sweep_preset_layout():
    spec = make_spec(
        "cluster=gb200", "model=qwen3_vl_235b_a22b", "nodes=16", "parallelism=3d", "tp=2", "pp=4", "ep=16"
    )
    assert all(math.isfinite(v) and v >= 0 for v in _base(spec).values())
    assert json.dumps(predict(spec).to_json())
