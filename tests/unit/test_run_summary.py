"""The end-of-run console table (moe_vlm/engines/run_summary.py), from recorded run.json summaries."""

from __future__ import annotations

import json
from pathlib import Path

from moe_vlm.engines.run_summary import summary_lines
from tests.conftest import REPO, make_spec

RECORD = REPO / "tests" / "fixtures" / "advise" / "gb200_30b_sweep" / "p02_full_mbs1" / "run.json"
GB200 = ("cluster=gb200", "model=qwen3_vl_30b_a3b", "nodes=2", "recompute=full")
# What the torch engine records on CPU: no peak, so no MFU; a 16-digit float and per-rank dicts.
CPU_SUMMARY = {
    "effective_tokens_per_s_per_gpu": 207.93612345678901,
    "step_time_s": {"mean": 21.38, "p10": 19.74, "p50": 21.378404483500051, "p90": 23.02},
    "steady_window": {"text": "steps 3-4 (2 steps); excluded warm-up: 1-2"},
    "mfu": None,
    "mfu_note": "cluster=local (cpu) has no dense BF16 peak (cluster.peak_bf16_flops=0), so MFU is not defined",
    "mfu_precision": None,
    "mfu_precision_note": "cluster=local (cpu) has no dense BF16 peak (cluster.peak_bf16_flops=0), so MFU is not defined",
    "peak_memory_gib": 0.9301,
    "memory_kind": "process_peak_rss",
    "components": {"decoder": 0.6197, "projector": 0.03158, "vision_encoder": 0.3487},
    "component_coverage": 0.8848,
    "data_wait": {"fraction_of_step_time": 0.04206, "mean_s": 0.8992},
    "per_rank": {"rank": 0, "median_s": {"step_time_s": 21.37840448350005}},
    "errors": [],
}


def test_a_gpu_run_reads_in_one_short_table(tmp_path: Path) -> None:
    record = json.loads(RECORD.read_text())
    lines = summary_lines(make_spec(*GB200), record, tmp_path)
    text = "\n".join(lines)
    assert len(lines) <= 25
    assert f"run directory             {tmp_path}" in text
    assert "effective tokens/s/GPU    4,000.0" in text
    assert "1.100 s (p10-p90 1.080-1.120 s)" in text
    assert "15.0% of NVIDIA GB200 dense BF16" in text
    assert "41.00 GiB (cuda_max_allocated) vs" in text and "predicted" in text
    assert "decoder 76%, projector 2%, vision_encoder 22%" in text
    assert f"moe-vlm report {tmp_path}" in text and str(tmp_path / "run.json") in text


def test_a_cpu_run_says_why_there_is_no_mfu_once_and_hides_raw_dicts(tmp_path: Path) -> None:
    record = {"status": "completed", "summary": CPU_SUMMARY}
    spec = make_spec("data=mock", "profiling=torch", "logger=tensorboard")
    text = "\n".join(summary_lines(spec, record, tmp_path))
    assert text.count("has no dense BF16 peak") == 1
    assert "21.378404" not in text and "median_s" not in text and "errors" not in text
    assert "effective tokens/s/rank   207.9" in text and "21.378 s (p10-p90 19.740-23.020 s)" in text
    assert "MOCK: image-free" in text and "4.2% of the step (mean 0.899 s)" in text
    assert f"python -m moe_vlm.report.module_table {tmp_path}" in text
    assert f"tensorboard --logdir {tmp_path / 'tensorboard'}" in text


def test_a_record_with_odd_values_still_prints(tmp_path: Path) -> None:
    odd = {
        "status": "completed",
        "summary": {"step_time_s": [], "mfu": float("nan"), "components": "x", "data_wait": 3},
    }
    lines = summary_lines(make_spec(), odd, tmp_path)
    assert any("no steady-state step" in line for line in lines) and len(lines) <= 25


def test_a_packed_run_says_so_in_its_data_row(tmp_path: Path) -> None:
    record = {"status": "completed", "summary": CPU_SUMMARY}
    packed = "\n".join(summary_lines(make_spec("data.packing=in_batch"), record, tmp_path))
    padded = "\n".join(summary_lines(make_spec(), record, tmp_path))
    assert "PACKED (data.packing=in_batch)" in packed and "PACKED" not in padded
