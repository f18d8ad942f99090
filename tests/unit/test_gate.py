"""The baseline gate (moe_vlm/report/gate.py) on runs written as the engines write them: run.json
and steps.jsonl. Real CPU sweeps through it: tests/integration/test_decision.py."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from moe_vlm.base.files import RUN_JSON, STEPS_JSONL, write_json_atomic
from moe_vlm.perf.metrics import summarize
from moe_vlm.record.records import base_record
from moe_vlm.report import build as report
from tests.unit.test_metrics import step_records
from tests.unit.test_report import composed, run_report

RUN = (
    "model=qwen3_vl_30b_a3b",
    "cluster=gb200",
    "nodes=2",
    "train_iters=12",
    "dispatcher=hybridep",
    "data=synthetic",
    "mbs=1",
)
# A noisy step (+-4%) around 4 s: identical runs' bands overlap.
NOISE = [1.0, 1.04, 0.97, 1.02, 0.96, 1.03, 0.99, 1.01, 0.98, 1.04, 0.97, 1.0]


def write(run_dir: Path, scale: float = 1.0, memory: float = 60.0, **edit: Any) -> None:
    """A completed run of 12 steps (warm-up 2) with its steps.jsonl; `edit`: {step: {field: value}}."""
    spec, config = composed(RUN)
    records = step_records(
        spec, [4.0 * scale * n for n in NOISE], sequences_per_rank=64, peak_memory_gib=memory
    )
    for record in records:
        record.update(edit.get(f"step{record['step']}", {}))
        record["step_period_s"] = record["step_time_s"]
    record = base_record(spec, config, status="completed")
    record["summary"] = summarize(records, spec)
    record["env"] = {"torch": "2.14.1", "python": "3.12.1", "git": {"commit": "abc", "dirty": False}}
    run_dir.mkdir(parents=True)
    write_json_atomic(run_dir / RUN_JSON, record)
    (run_dir / STEPS_JSONL).write_text("".join(json.dumps(r) + "\n" for r in records))


def gate(tmp_path: Path, *extra: str) -> tuple[int, str]:
    code, text = run_report(str(tmp_path / "after"), "--baseline", str(tmp_path / "baseline.json"), *extra)
    return code, text.split("## Gate", 1)[1] if "## Gate" in text else text


def saved(tmp_path: Path, *extra: str) -> dict[str, Any]:
    for name in ("a", "b"):
        write(tmp_path / "before" / name)
    code, _ = run_report(str(tmp_path / "before"), "--save-baseline", str(tmp_path / "baseline.json"), *extra)
    assert code == 0
    payload: dict[str, Any] = json.loads((tmp_path / "baseline.json").read_text())
    return payload


def test_identical_runs_pass_and_a_slowdown_inside_the_noise_is_no_regression(tmp_path: Path) -> None:
    baseline = saved(tmp_path)
    (entry,) = baseline["configs"]  # two runs of one config, pooled
    assert baseline["window"] == [3, 12] and len(entry["run_dirs"]) == 2
    assert entry["band"][0] < entry["effective_tokens_per_s_per_gpu"] < entry["band"][1]
    assert entry["software"] == {"python": "3.12.1", "torch": "2.14.1", "git": "abc", "container_image": None}
    write(tmp_path / "after" / "same")
    write(tmp_path / "after" / "noisy", scale=1.06)  # -5.7%, but inside the +-4% steps' band
    code, text = gate(tmp_path)
    assert code == report.EXIT_OK and "GATE FAIL" not in text, text
    assert "gate pass same (the config, steps 3-12)" in text and "same software" in text


def test_each_failing_figure_is_one_line_and_the_exit_status_is_1(tmp_path: Path) -> None:
    saved(tmp_path)
    write(tmp_path / "after" / "slow", scale=1.5)  # -33%: bands apart
    write(tmp_path / "after" / "fat", memory=70.0)  # +16.5% peak memory
    write(tmp_path / "after" / "nan", step5={"loss": math.nan})
    write(tmp_path / "after" / "skip", step7={"exclude": "skipped_iter"})
    write(tmp_path / "after" / "warm", step1={"loss": math.nan})  # outside the window: not judged
    code, text = gate(tmp_path)
    assert code == report.EXIT_REGRESSED
    failing = [line for line in text.splitlines() if line.startswith("- GATE FAIL")]
    assert len(failing) == 4, text
    assert any(
        line.startswith("- GATE FAIL slow (the config, steps 3-12): effective tokens/s/GPU")
        and ": -33.3% (tolerance -5%, bands apart); same software" in line
        for line in failing
    ), failing
    assert any(
        "fat" in line and "peak memory 70.70 GiB vs baseline 60.70 GiB: +16.5% (tolerance +10%)" in line
        for line in failing
    )
    assert any("nan" in line and "NaN loss at step(s) 5" in line for line in failing)
    assert any("skip" in line and "skipped iteration(s) at step(s) 7" in line for line in failing)
    assert "gate pass warm" in text and "1 run(s) failed" not in text
    # A looser gate passes the slow run, not the others.
    code, text = gate(tmp_path, "--tolerance", "0.5", "--memory-tolerance", "0.2")
    assert code == report.EXIT_REGRESSED and "gate pass slow" in text and "gate pass fat" in text


def test_the_window_is_named_and_a_run_that_does_not_cover_it_fails(tmp_path: Path) -> None:
    baseline = saved(tmp_path, "--window", "5-10")
    assert baseline["window"] == [5, 10]
    write(tmp_path / "after" / "run")
    code, text = gate(tmp_path)
    assert code == report.EXIT_OK and "gate pass run (the config, steps 5-10)" in text, text
    code, text = gate(tmp_path, "--window", "5-14")
    assert code == report.EXIT_REGRESSED
    assert (
        "GATE FAIL run (the config, steps 5-14): steps 5-14 not covered (it recorded steps 1-12, warm-up 2)"
        in text
    )


def test_a_software_change_is_named_on_the_failing_line(tmp_path: Path) -> None:
    saved(tmp_path)
    write(tmp_path / "after" / "upgraded", scale=1.5)
    record = json.loads((tmp_path / "after" / "upgraded" / RUN_JSON).read_text())
    record["env"]["torch"] = "2.15.0"
    record["launch"] = {"container_image": "nvcr.io#nvidia/nemo:26.01"}
    write_json_atomic(tmp_path / "after" / "upgraded" / RUN_JSON, record)
    code, text = gate(tmp_path)
    assert code == report.EXIT_REGRESSED
    assert (
        "-33.3% (tolerance -5%, bands apart); software changed: torch 2.14.1 -> 2.15.0, container_image - -> nvcr.io#nvidia/nemo:26.01"
        in text
    ), text


def test_runs_a_baseline_cannot_hold_are_named_and_an_old_baseline_says_it_has_no_software(
    tmp_path: Path,
) -> None:
    for name in ("a", "b"):
        write(tmp_path / "before" / name)
    code, text = run_report(
        str(tmp_path / "before"), "--save-baseline", str(tmp_path / "baseline.json"), "--window", "5-14"
    )
    assert code == 0 and "Saved a baseline of 0 completed config(s) over steps 5-14" in text
    assert "- left out of it: a: steps 5-14 not covered (it recorded steps 1-12, warm-up 2)" in text
    # A baseline written before the gate: a rate per config, no window, band or software.
    run_report(str(tmp_path / "before"), "--save-baseline", str(tmp_path / "baseline.json"))
    old = json.loads((tmp_path / "baseline.json").read_text())
    legacy = {
        "metric": old["metric"],
        "configs": [
            {"config": c["config"], "data": c["data"], old["metric"]: c[old["metric"]]}
            for c in old["configs"]
        ],
    }
    write_json_atomic(tmp_path / "baseline.json", legacy)
    write(tmp_path / "after" / "run")
    code, text = gate(tmp_path)
    assert code == report.EXIT_OK and "gate pass run (the config, steps 3-12)" in text, text
    assert "the baseline records no software" in text
