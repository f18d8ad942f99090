"""The straggler view: per-rank steps.jsonl records with one slow rank and one slow node.

The fixture is a Qwen3-VL-30B job on 2 GB200 nodes (8 ranks, 4 per host, the record/records.py format via
tests/unit/test_metrics.step_records): every rank steps in 2.0 s with a 1.2 s decoder, except

    rank 6 (node gb200-b)          step time 2.5 s (1.25x), from the steady window on
    all ranks of node gb200-b      vision encoder 0.65 s where node gb200-a takes 0.40 s,
                                   rank 7 0.90 s (slow against its own node too)
    rank 1 (node gb200-a)          a 9 s warm-up step, which must not count
    rank 2 (node gb200-a)          projector 0.015 s vs 0.010 s: 1.5x, but 5 ms is noise

so the view must name rank 6, node gb200-b and rank 7 with their ratios, and nothing else (the
other ranks of gb200-b are the node's flag, not four more lines).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from moe_vlm.base.files import RUN_JSON, STEPS_JSONL, write_json_atomic
from moe_vlm.cli import report as report_cli
from moe_vlm.config.spec import RunSpec
from moe_vlm.perf import stragglers
from moe_vlm.perf.metrics import by_step, steady_window, summarize
from moe_vlm.record.records import base_record
from moe_vlm.run.task import resolved_config
from tests.conftest import compose_cfg
from tests.unit.test_metrics import step_records

OVERRIDES = ("model=qwen3_vl_30b_a3b", "cluster=gb200", "nodes=2", "train_iters=8", "dispatcher=hybridep")


def host_of(rank: int) -> str:
    return "gb200-a" if rank < 4 else "gb200-b"


def job(with_host: bool = True) -> tuple[RunSpec, dict[str, Any], list[dict[str, Any]]]:
    cfg = compose_cfg(*OVERRIDES)
    spec = RunSpec.from_config(cfg)
    components = {"vision_encoder": 0.40, "projector": 0.010, "decoder": 1.2}
    steps = step_records(spec, [2.0] * spec.train_iters, components_s=components)
    for record in steps:
        rank = record["rank"]
        record["components_s"] = dict(record["components_s"])
        record["data_wait_s"] = 0.02
        if with_host:
            record["host"] = host_of(rank)
        if rank == 6 and not record["warmup"]:
            record["step_time_s"] = 2.5
        if rank >= 4:
            record["components_s"]["vision_encoder"] = 0.90 if rank == 7 else 0.65
        if rank == 1 and record["step"] == 1:
            record["step_time_s"] = 9.0
        if rank == 2:
            record["components_s"]["projector"] = 0.015
    return spec, resolved_config(cfg), steps


def view(with_host: bool = True) -> stragglers.Stragglers:
    spec, _, steps = job(with_host)
    grouped = by_step(steps)
    window = steady_window(grouped, spec.warmup_steps)
    return stragglers.find(stragglers.rank_medians([grouped[n] for n in window.steps]))


def test_slow_rank_and_slow_node_are_named_with_their_host() -> None:
    found = view()
    assert (found.ranks, found.hosts) == (8, 2)
    flagged = {(f.who, f.metric): round(f.ratio, 3) for f in found.flags}
    # Job median step time: the median over 8 ranks of 2.0 x 7 and 2.5 = 2.0 s.
    assert flagged[("rank 6 (gb200-b)", "step_time_s")] == 1.25
    # Vision encoder: 0.40 x 4, 0.65 x 3, 0.90 -> job median 0.525 s; node gb200-b's median 0.65 s.
    assert flagged[("node gb200-b (ranks 4-7)", "vision_encoder")] == round(0.65 / 0.525, 3)
    assert flagged[("rank 7 (gb200-b)", "vision_encoder")] == round(0.90 / 0.525, 3)
    for rank in (4, 5, 6):  # covered by their node's flag
        assert (f"rank {rank} (gb200-b)", "vision_encoder") not in flagged
    # Nothing on node gb200-a: not the warm-up step, not the 5 ms projector difference.
    assert not any("gb200-a" in who for who, _ in flagged), flagged
    assert {metric for _, metric in flagged} == {"step_time_s", "vision_encoder"}
    assert [f.who for f in found.flags[:2]] == ["rank 7 (gb200-b)", "rank 6 (gb200-b)"], "worst first"


def test_threshold_is_strict_and_shown() -> None:
    spec, _, steps = job()
    grouped = by_step(steps)
    steady = [grouped[n] for n in steady_window(grouped, spec.warmup_steps).steps]
    per_rank = stragglers.rank_medians(steady)
    assert not any(f.metric == "step_time_s" for f in stragglers.find(per_rank, threshold=1.25).flags)
    assert any(f.metric == "step_time_s" for f in stragglers.find(per_rank, threshold=1.24).flags)
    assert "1.25x the job's median 2.000 s" in (stragglers.find(per_rank).text() or "")


def test_records_without_a_host_compare_ranks_not_nodes() -> None:
    found = view(with_host=False)
    assert found.hosts == 0
    assert {f.who for f in found.flags} == {"rank 4", "rank 5", "rank 6", "rank 7"}
    assert not any(f.who.startswith("node") for f in found.flags)


def test_a_single_rank_has_nothing_to_compare() -> None:
    per_rank = [{"rank": 0, "host": "h", "steps": 3, "median_s": {"step_time_s": 5.0}}]
    assert stragglers.find(per_rank).flags == []


def write_run(run_dir: Path, keep_per_rank: bool) -> None:
    spec, config, steps = job()
    record = base_record(spec, config, status="completed")
    record["summary"] = summarize(steps, spec)
    if not keep_per_rank:  # a run.json written before summary.per_rank existed
        del record["summary"]["per_rank"]
    write_json_atomic(run_dir / RUN_JSON, record)
    (run_dir / STEPS_JSONL).write_text("".join(json.dumps(s) + "\n" for s in steps))


@pytest.mark.parametrize("keep_per_rank", [True, False], ids=["summary", "steps.jsonl"])
def test_report_shows_the_stragglers(tmp_path: Path, keep_per_rank: bool) -> None:
    write_run(tmp_path / "run", keep_per_rank)
    from contextlib import redirect_stdout
    from io import StringIO

    out = StringIO()
    with redirect_stdout(out):
        assert report_cli.main([str(tmp_path), "--out", str(tmp_path / "report")]) == 0
    text = out.getvalue()
    section = text.split("## Stragglers", 1)[1]
    assert "above **1.10x** the job's median" in section
    assert "1 completed run(s) with 2 or more ranks checked: 1 flagged" in section
    assert "rank 6 (gb200-b): step 2.500 s = 1.25x the job's median 2.000 s" in section
    assert "node gb200-b (ranks 4-7): vision encoder 0.650 s = 1.24x" in section
    assert "`+hydra.launcher.additional_parameters.exclude=gb200-b` (sbatch --exclude)" in section
    results = (tmp_path / "report" / "results.csv").read_text()
    assert "rank 6 (gb200-b)" in results


def test_summary_keeps_every_rank_with_its_host() -> None:
    spec, _, steps = job()
    per_rank = summarize(steps, spec)["per_rank"]
    assert [(r["rank"], r["host"], r["steps"]) for r in per_rank] == [
        (rank, host_of(rank), spec.train_iters - spec.warmup_steps) for rank in range(8)
    ]
    assert per_rank[1]["median_s"]["step_time_s"] == 2.0  # the 9 s warm-up step is outside the window


def test_a_sweep_mixing_flagged_and_even_runs_counts_and_lists_only_the_flagged(tmp_path: Path) -> None:
    """The report's table holds the straggler columns of every run; pandas stores a run without a
    flag as NaN (in a text column too), which once read as a flag: "4 flagged", "run ...: nan"."""
    write_run(tmp_path / "slow", keep_per_rank=True)
    cfg = compose_cfg(*OVERRIDES)
    spec = RunSpec.from_config(cfg)
    for name, mbs in (("even1", 1), ("even2", 2), ("even4", 4)):
        steps = step_records(spec, [2.0] * spec.train_iters, components_s={"decoder": 1.2})
        for step in steps:
            step["host"] = host_of(step["rank"])
        record = base_record(spec, resolved_config(cfg), status="completed")
        record["config"]["mbs"] = mbs  # four configurations, as a sweep has
        record["summary"] = summarize(steps, spec)
        write_json_atomic(tmp_path / name / RUN_JSON, record)
    from contextlib import redirect_stdout
    from io import StringIO

    out = StringIO()
    with redirect_stdout(out):
        assert report_cli.main([str(tmp_path), "--out", str(tmp_path / "report")]) == 0
    section = out.getvalue().split("## Stragglers", 1)[1].split("\n## ", 1)[0]
    assert "4 completed run(s) with 2 or more ranks checked: 1 flagged." in section
    listed = [line for line in section.splitlines() if line.startswith("- run ")]
    assert len(listed) == 1 and listed[0].startswith("- run slow: ") and "nan" not in section
    assert "exclude=gb200-b`" in section  # the one flagged node, no "nan" host


def test_a_slow_rank_s_extra_time_is_attributed_with_what_it_processed() -> None:
    # Rank 6 of the fixture, 0.5 s slow: here 0.30 s of it waiting for data and 0.15 s more decoder,
    # on a step that gave it 6 images and 5,000 real tokens where the other ranks got 2 and 3,000
    # (packing and real data make a rank's share vary).
    spec, _, steps = job()
    for record in steps:
        if record["rank"] == 6 and not record["warmup"]:
            record["data_wait_s"] = 0.32
            record["components_s"]["decoder"] = 1.35
        record["images"] = 6 if record["rank"] == 6 else 2
        record["tokens"] = dict(record["tokens"], real=5000 if record["rank"] == 6 else 3000)
        record["samples"] = 9 if record["rank"] == 6 else 4
    grouped = by_step(steps)
    per_rank = stragglers.rank_medians([grouped[n] for n in steady_window(grouped, spec.warmup_steps).steps])
    assert per_rank[6]["median_load"] == {"images": 6.0, "real_tokens": 5000.0, "samples": 9.0}
    flag = next(
        f
        for f in stragglers.find(per_rank).flags
        if f.who == "rank 6 (gb200-b)" and f.metric == "step_time_s"
    )
    assert flag.attribution is not None
    assert flag.attribution.extra_s == pytest.approx(0.5)
    # Its vision encoder is its node's (0.65 s), above the job's 0.525 s: attributed too, last.
    assert flag.attribution.parts_s == pytest.approx(
        {"data_wait_s": 0.30, "decoder": 0.15, "vision_encoder": 0.125}
    )
    assert list(flag.attribution.parts_s) == ["data_wait_s", "decoder", "vision_encoder"]
    assert (
        "extra 0.500 s: data wait +0.300 s, decoder +0.150 s, vision encoder +0.125 s; processed 6 images "
        "(job 2), 5,000 tokens (job 3,000), 9 samples (job 4) per step"
    ) in flag.text()
