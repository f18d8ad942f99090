"""`moe-vlm report` on run directories written the way the engines write them (run.json from
record.base_record + metrics.summarize over hand-built steps.jsonl records)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle

from moe_vlm.base.files import RUN_JSON, write_json_atomic
from moe_vlm.cli import report as report_cli
from moe_vlm.config.spec import RunSpec
from moe_vlm.perf.metrics import summarize
from moe_vlm.record.records import base_record
from moe_vlm.report import build as report
from moe_vlm.report import compare as report_compare
from moe_vlm.report import plots
from moe_vlm.report import table as report_table
from moe_vlm.run.task import resolved_config
from tests.conftest import REPO, compose_cfg
from tests.unit.test_metrics import step_records

GB200 = ("model=qwen3_vl_30b_a3b", "cluster=gb200", "nodes=2", "train_iters=6", "dispatcher=hybridep")


@cache
def composed(overrides: tuple[str, ...]) -> tuple[RunSpec, dict[str, Any]]:
    cfg = compose_cfg(*overrides)
    return RunSpec.from_config(cfg), resolved_config(cfg)


def write_run(
    run_dir: Path, overrides: tuple[str, ...], step_time_s: float, status: str = "completed", **steps: Any
) -> dict[str, Any]:
    spec, config = composed(overrides)
    record = base_record(spec, config, status=status)
    if status == "completed":
        record["summary"] = summarize(step_records(spec, [step_time_s] * spec.train_iters, **steps), spec)
    elif status == "failed":
        record["failure"] = {"class": "oom", "message": "CUDA out of memory at step 3", "log_tail": []}
    else:
        record["findings"] = [
            {"code": "L001", "level": "error", "keys": ["tp"], "message": "bad", "fix": "x"}
        ]
    write_json_atomic(run_dir / RUN_JSON, record)
    return record


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Synthetic-data MBS x recompute points, faster mock-data points, one OOM, one rejected."""
    root = tmp_path_factory.mktemp("sweep")
    # (mbs, recompute, step time, peak memory): full recompute is slower and lighter.
    points = [(1, "none", 4.0, 90.0), (2, "none", 7.0, 150.0), (1, "full", 5.0, 60.0), (2, "full", 8.5, 95.0)]
    components = {"vision_encoder": 1.0, "projector": 0.1, "decoder": 2.5}
    for index, (mbs, recompute, step_time, memory) in enumerate(points):
        overrides = (*GB200, "data=synthetic", f"mbs={mbs}", f"recompute={recompute}")
        write_run(
            root / str(index),
            overrides,
            step_time,
            sequences_per_rank=64,
            real_len=3072,
            images_per_rank=64,
            patches_per_image=1024,
            peak_memory_gib=memory,
            components_s=components,
        )
    # Image-free mock data: about 2x faster. Must never be ranked with the synthetic rows.
    for index, mbs in enumerate((1, 2), start=4):
        write_run(root / str(index), (*GB200, "data=mock", f"mbs={mbs}", "recompute=none"), 2.0,
                  sequences_per_rank=64, peak_memory_gib=80.0)  # fmt: skip
    write_run(root / "6", (*GB200, "data=synthetic", "mbs=4", "recompute=none"), 0.0, status="failed")
    write_run(root / "7", (*GB200, "data=synthetic", "mbs=8", "recompute=none"), 0.0, status="rejected")
    return root


def run_report(*argv: str) -> tuple[int, str]:
    from contextlib import redirect_stdout
    from io import StringIO

    buffer = StringIO()
    with redirect_stdout(buffer):
        code = report_cli.main(list(argv))
    return code, buffer.getvalue()


def ydata(line: Line2D) -> list[float]:
    return [float(y) for y in np.asarray(line.get_ydata())]


def section(text: str, title_start: str) -> str:
    """The body of the '## <title...>' section."""
    match = re.search(rf"^## {re.escape(title_start)}.*?$(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, f"no section {title_start!r} in:\n{text}"
    return match.group(1)


def table_rows(markdown: str) -> list[list[str]]:
    rows = [line.strip().strip("|").split("|") for line in markdown.splitlines() if line.startswith("| ")]
    return [[cell.strip() for cell in row] for row in rows[1:]]  # without the header


def test_mock_is_never_ranked_with_synthetic(sweep: Path) -> None:
    code, text = run_report(str(sweep))
    assert code == 0
    ranked = table_rows(section(text, "Ranked"))
    mock = table_rows(section(text, "MOCK data"))
    assert len(ranked) == 4 and {row[-2] for row in ranked} == {"synthetic"}
    assert len(mock) == 2 and {row[-2] for row in mock} == {"mock"}
    # Mock is ~2x faster, yet the ranked table starts with the best synthetic run (mbs=1, none).
    header = section(text, "Ranked").splitlines()[2]
    columns = [c.strip() for c in header.strip("|").split("|")]
    top = dict(zip(columns, ranked[0], strict=True))
    assert (top["mbs"], top["recompute"]) == ("1", "none")
    # 8 x 64 x 3072 real tokens / (4 s x 8 GPUs) = 49,152 effective tokens/s/GPU
    assert top["eff tok/s/GPU"] == "49,152.0"
    assert top["nominal tok/s/GPU"] == "65,536.0"  # GBS 512 x 4096 / (4 s x 8 GPUs)
    effective = [float(row[columns.index("eff tok/s/GPU")].replace(",", "")) for row in ranked]
    assert effective == sorted(effective, reverse=True)
    assert (
        "MFU = model FLOPs (ours: real tokens, frozen-aware) / peak of NVIDIA GB200 dense BF16 2500" in text
    )
    assert "Steady window: steps 3-6 (4 steps); excluded warm-up: 1-2." in text


def test_every_run_json_is_in_the_table(sweep: Path) -> None:
    code, text = run_report(str(sweep))
    assert code == 0
    csv = pd.read_csv(sweep / "results.csv")
    parquet = pd.read_parquet(sweep / "results.parquet")
    assert len(csv) == len(parquet) == 8
    assert sorted(parquet["status"]) == ["completed"] * 6 + ["failed", "rejected"]
    unfinished = section(text, "Not completed")
    assert "oom: CUDA out of memory at step 3" in unfinished and "L001 bad" in unfinished
    assert (sweep / "report.md").read_text() == text


def test_compare_flags_different_effective_work(tmp_path: Path) -> None:
    """FSDP vs 3D at equal model, data, GBS tokens and seq length.

    Equal work (64 sequences x 3072 real tokens per FSDP rank x DP 8 = 128 x 3072 per 3D rank x DP 4):
    FSDP 4 s/step, 3D 5 s/step on the same 8 GPUs -> FSDP is 5/4 = 1.25x 3D (the first value).
    Different work (3D packs 4000 real tokens per sequence): flagged, no ratio.
    """
    fsdp = ("parallelism=fsdp",)
    three_d = ("parallelism=3d", "pp=2")
    write_run(tmp_path / "equal" / "fsdp", (*GB200, "data=synthetic", *fsdp), 4.0,
              sequences_per_rank=64, real_len=3072)  # fmt: skip
    write_run(tmp_path / "equal" / "3d", (*GB200, "data=synthetic", *three_d), 5.0,
              sequences_per_rank=128, real_len=3072)  # fmt: skip
    comparisons = report_compare.compare(report_table.load_table([str(tmp_path / "equal")]), "parallelism")
    assert len(comparisons) == 1 and comparisons[0].flags == []
    assert comparisons[0].ratios == pytest.approx({"3d": 1.0, "fsdp": 1.25})  # 5 s / 4 s

    write_run(tmp_path / "unequal" / "fsdp", (*GB200, "data=synthetic", *fsdp), 4.0,
              sequences_per_rank=64, real_len=3072)  # fmt: skip
    write_run(tmp_path / "unequal" / "3d", (*GB200, "data=synthetic", *three_d), 5.0,
              sequences_per_rank=128, real_len=4000)  # fmt: skip
    code, text = run_report(str(tmp_path / "unequal"), "--compare", "parallelism")
    assert code == 0
    compared = section(text, "Compare: parallelism")
    assert "**FLAG**: parallelism=3d vs parallelism=fsdp do different effective work" in compared
    assert "effective tokens/step 2,048,000 vs 1,572,864; not compared" in compared
    assert "not compared" in table_rows(compared)[0]
    assert not re.search(r"\d\.\d\dx", compared)  # no ratio printed for unequal work


def test_baseline_regression_is_flagged(tmp_path: Path) -> None:
    run = (*GB200, "data=synthetic")
    write_run(tmp_path / "before" / "a", (*run, "mbs=1"), 4.0, sequences_per_rank=64)
    write_run(tmp_path / "before" / "b", (*run, "mbs=2"), 4.0, sequences_per_rank=64)
    baseline = tmp_path / "baseline.json"
    code, _ = run_report(str(tmp_path / "before"), "--save-baseline", str(baseline))
    assert code == 0 and len(json.loads(baseline.read_text())["configs"]) == 2

    # mbs=1 now takes 4.4 s instead of 4.0: -9.1% throughput; mbs=2 takes 4.1 s: -2.4%.
    write_run(tmp_path / "after" / "a", (*run, "mbs=1"), 4.4, sequences_per_rank=64)
    write_run(tmp_path / "after" / "b", (*run, "mbs=2"), 4.1, sequences_per_rank=64)
    code, text = run_report(str(tmp_path / "after"), "--baseline", str(baseline), "--tolerance", "0.05")
    assert code == report.EXIT_REGRESSED
    gate = section(text, "Gate")
    assert "- GATE FAIL a (mbs=1, steps 3-6): effective tokens/s/GPU 59,578.2" in gate
    assert (
        "vs baseline 65,536.0 [65,536.0-65,536.0]: -9.1% (tolerance -5%, bands apart); same software" in gate
    )
    assert "- gate pass b (mbs=2, steps 3-6): 63,937.6 effective tokens/s/GPU" in gate
    code, _ = run_report(str(tmp_path / "after"), "--baseline", str(baseline), "--tolerance", "0.10")
    assert code == 0


def test_plots_draw_the_table(sweep: Path) -> None:
    table = report_table.load_table([str(sweep)])
    rows = report_table.ranked(table, mock=False)
    varying = ["mbs", "recompute"]
    # 8 ranks x 64 x 3072 real tokens = 1,572,864 / step; / (t x 8 GPUs)
    per_gpu = {t: 1_572_864 / (t * 8) for t in (4.0, 7.0, 5.0, 8.5)}
    throughput = plots.throughput_vs_mbs(rows, varying)
    assert throughput.series == {
        "recompute=full": [(1.0, pytest.approx(per_gpu[5.0])), (2.0, pytest.approx(per_gpu[8.5]))],
        "recompute=none": [(1.0, pytest.approx(per_gpu[4.0])), (2.0, pytest.approx(per_gpu[7.0]))],
    }
    drawn = {str(line.get_label()): ydata(line) for line in throughput.figure.axes[0].get_lines()}
    assert drawn["recompute=none"] == pytest.approx([per_gpu[4.0], per_gpu[7.0]])

    memory = plots.memory_vs_mbs(rows, varying)
    limit = [
        line for line in memory.figure.axes[0].get_lines() if str(line.get_label()).startswith("GPU memory")
    ]
    assert len(limit) == 1 and limit[0].get_label() == "GPU memory 185 GiB (NVIDIA GB200)"
    assert ydata(limit[0]) == [185.0, 185.0]
    # Peak memory is the max over ranks: memory + 0.1 x 7.
    assert memory.series["recompute=none"] == [(1.0, pytest.approx(90.7)), (2.0, pytest.approx(150.7))]

    shares = plots.component_shares(rows, varying)
    assert shares.series["decoder"][0][1] == pytest.approx(2.5 / 3.6)
    bars = [bar for bar in shares.figure.axes[0].patches if isinstance(bar, Rectangle)]
    assert len(bars) == 3 * 4 and bars[0].get_width() == pytest.approx(1.0 / 3.6)  # vision share, config 0

    pareto = plots.throughput_vs_memory(rows, varying)
    # (memory, throughput): full@1 (60.7, 39,322) and none@1 (90.7, 49,152) dominate the MBS-2 points.
    assert pareto.series["pareto_front"] == [
        (pytest.approx(60.7), pytest.approx(per_gpu[5.0])),
        (pytest.approx(90.7), pytest.approx(per_gpu[4.0])),
    ]
    (sweep / "plots_test").mkdir()
    for plot in (throughput, memory, shares, pareto):
        plot.save(sweep / "plots_test" / f"{plot.name}.png")
    assert sorted(p.name for p in (sweep / "plots_test").iterdir()) == [
        "component_shares.png", "memory_vs_mbs.png", "throughput_vs_mbs.png", "throughput_vs_memory.png",
    ]  # fmt: skip


def test_cpu_memory_plot_says_there_is_no_gpu_line(tmp_path: Path) -> None:
    for mbs in (1, 2):
        write_run(
            tmp_path / str(mbs), ("cluster=local", "train_iters=4", "data=synthetic", f"mbs={mbs}"), 0.5
        )
    table = report_table.load_table([str(tmp_path)])
    memory = plots.memory_vs_mbs(report_table.ranked(table, mock=False), ["mbs"])
    assert memory.notes == ["no GPU memory line: cpu run (peak is the process RSS)"]
    labels = [str(line.get_label()) for line in memory.figure.axes[0].get_lines()]
    assert not any(label.startswith("GPU memory") for label in labels)
    assert "no GPU memory line: cpu run (peak is the process RSS)" in labels


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["{empty}"], "no run.json found under"),
        (
            ["{sweep}", "--compare", "bogus"],
            "argument --compare: 'bogus': not one of model, parallelism",
        ),
        (
            ["{sweep}", "--baseline", "{empty}/missing.json"],
            "missing.json': no such file. Fix: e.g. --baseline baseline.json (written by --save-baseline)",
        ),
        (["{sweep}", "--baseline", "{empty}/garbage.json"], "garbage.json': not valid JSON"),
        (["{sweep}", "--baseline", "{empty}"], "argument --baseline: '{empty}': a directory, not a file"),
        (
            ["{sweep}", "--tolerance", "1.5"],
            "argument --tolerance: '1.5': out of range; allowed: from 0 and below 1",
        ),
        (["{sweep}", "--nope"], "unrecognized arguments: --nope"),
        (["{sweep}", "--top", "0"], "argument --top: '0': out of range; allowed: 1 to 1000000"),
        (["{sweep}", "--top", "ten"], "argument --top: 'ten': not a whole number"),
        (
            ["{empty}/nowhere"],
            "argument PATH: '{empty}/nowhere': no such file or directory. Fix: e.g. multirun/DATE/TIME",
        ),
        (["{sweep}", "{empty}/nowhere"], "argument PATH: '{empty}/nowhere': no such file or directory"),
        (["{empty}/run*"], "PATH '{empty}/run*': the pattern matches nothing; pass run directories"),
        (
            ["{sweep}", "--out", "{empty}/garbage.json"],
            "garbage.json': a file, not a directory. Fix: e.g. --out reports/today",
        ),
        (
            ["{sweep}", "--save-baseline", "{empty}"],
            "argument --save-baseline: '{empty}': a directory, not a file",
        ),
    ],
)
def test_bad_input_is_one_line_exit_2(
    sweep: Path, tmp_path: Path, argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    before = sorted(p.name for p in sweep.iterdir())
    (tmp_path / "garbage.json").write_text("not json")
    args = [a.format(empty=tmp_path, sweep=sweep) for a in argv]
    try:
        code = report_cli.main(args)
    except SystemExit as exit_:  # argparse's own errors
        code = int(exit_.code or 0)
    captured = capsys.readouterr()
    assert code == 2
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("moe-vlm report: error: ")
    assert message.format(empty=tmp_path) in lines[0]
    assert sorted(p.name for p in sweep.iterdir()) == before  # nothing written
    assert sorted(p.name for p in tmp_path.iterdir()) == ["garbage.json"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--top", "0"],
            "argument --top: '0': out of range; allowed: 1 to 1000000. Fix: e.g. --top 50",
        ),
        (["--top", "-3"], "argument --top: '-3': out of range; allowed: 1 to 1000000"),
        (
            ["{tmp}/gone"],
            "argument PATH: '{tmp}/gone': no such file or directory. Fix: e.g. multirun/DATE/TIME",
        ),
        (
            ["--baseline", "{tmp}/gone.json"],
            "argument --baseline: '{tmp}/gone.json': no such file. Fix: e.g. --baseline baseline.json",
        ),
    ],
)
def test_impossible_values_exit_2_from_the_console_script(
    sweep: Path, tmp_path: Path, argv: list[str], message: str
) -> None:
    """The installed command, in a fresh process: one line on stderr, nothing on stdout, status 2."""
    args = [a.format(tmp=tmp_path) for a in argv]
    done = subprocess.run(
        [str(REPO / ".venv" / "bin" / "moe-vlm"), "report", str(sweep), *args],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert (done.returncode, done.stdout) == (2, "")
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("moe-vlm report: error: "), done.stderr
    assert message.format(tmp=tmp_path) in lines[0]
    assert list(tmp_path.iterdir()) == []


def test_console_script_reaches_report(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "moe_vlm.cli.main", "report", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert done.returncode == 2 and "no run.json found under" in done.stderr


def test_forced_balance_runs_are_labelled_and_never_ranked_with_real_routing(tmp_path: Path) -> None:
    # Bridge's perf recipes' random routing (router=forced_balance) is faster here: perfectly balanced
    # experts. It gets its own labelled table, like mock data, and the ranking keeps real routing.
    run = (*GB200, "data=synthetic", "recompute=none")
    work: dict[str, Any] = {"sequences_per_rank": 64, "real_len": 3072}
    write_run(tmp_path / "real1", (*run, "mbs=1"), 4.0, **work)
    write_run(tmp_path / "real2", (*run, "mbs=2"), 5.0, **work)
    write_run(tmp_path / "forced", (*run, "mbs=1", "router=forced_balance"), 3.0, **work)
    write_run(
        tmp_path / "mock_forced", (*GB200, "data=mock", "router=forced_balance"), 2.0, sequences_per_rank=64
    )
    record = json.loads((tmp_path / "forced" / RUN_JSON).read_text())
    router = record["spec"]["router"]
    assert (router["name"], router["force_load_balancing"]) == ("forced_balance", True)
    assert record["data"]["routing"] == "forced_balance"
    code, text = run_report(str(tmp_path))
    assert code == 0
    ranked_runs = {row[1] for row in table_rows(section(text, "Ranked"))}
    assert ranked_runs == {"real1", "real2"}
    assert {row[1] for row in table_rows(section(text, "FORCED-BALANCE routing"))} == {"forced"}
    assert {row[1] for row in table_rows(section(text, "MOCK data"))} == {"mock_forced"}  # mock first
    assert "router" in section(text, "Ranked").splitlines()[2]  # the varying knob is a column
    table = report_table.load_table([str(tmp_path)])
    assert list(report_table.ranked(table, mock=False)["run"]) == ["real1", "real2"]


def test_precision_runs_show_mfu_against_their_own_peak(tmp_path: Path) -> None:
    """Same work and step time at bf16 and fp8mx: MFU against the BF16 peak stays, the second
    column quotes the format's dense peak (603.1 TFLOP/s / 5 PFLOP/s FP8 = 12.1%)."""
    for index, precision in enumerate(("bf16", "fp8mx")):
        write_run(tmp_path / str(index), (*GB200, f"precision={precision}"), 10.0, sequences_per_rank=64)
    code, text = run_report(str(tmp_path))
    assert code == 0
    ranked = section(text, "Ranked")
    columns = [c.strip() for c in ranked.splitlines()[2].strip("|").split("|")]
    rows = {
        row[columns.index("precision")]: dict(zip(columns, row, strict=True)) for row in table_rows(ranked)
    }
    assert rows["bf16"]["MFU"] == rows["fp8mx"]["MFU"] == "24.1%"
    assert (rows["bf16"]["MFU own peak"], rows["fp8mx"]["MFU own peak"]) == ("24.1%", "12.1%")
    assert (
        "MFU own peak = the same FLOPs / NVIDIA GB200 dense FP8 5000 TFLOP/s for the decoder, dense BF16 "
        "2500 TFLOP/s for the vision encoder and projector (cluster=gb200)"
    ) in text
    # These records carry no step period: the report says what their rates divide by.
    assert "Rates of 2 run(s) over the step time alone (no step period recorded)" in text


def write_steps(run_dir: Path, overrides: tuple[str, ...], step_times_s: list[float]) -> None:
    """A completed run whose steps took `step_times_s` (warm-up steps included)."""
    spec, config = composed((*overrides, f"train_iters={len(step_times_s)}"))
    record = base_record(spec, config, status="completed")
    record["summary"] = summarize(step_records(spec, step_times_s, sequences_per_rank=8), spec)
    write_json_atomic(run_dir / RUN_JSON, record)


def places(text: str) -> dict[str, str]:
    """run -> its '#' cell in the ranked section."""
    return {row[1]: row[0] for row in table_rows(section(text, "Ranked"))}


def test_a_sweep_of_identical_points_is_a_tie(tmp_path: Path) -> None:
    """Six points of one configuration, their steps drawn from one distribution: no order among
    them is real, so the report calls them tied and lists them by name."""
    rng = np.random.default_rng(0)
    for index in range(6):
        times = [float(t) for t in 2.0 + 0.1 * rng.standard_normal(12)]
        write_steps(tmp_path / f"p{index}", (*GB200, "data=synthetic", "mbs=1"), times)
    code, text = run_report(str(tmp_path))
    assert code == 0
    assert places(text) == {f"p{index}": "1=" for index in range(6)}
    assert list(places(text)) == [f"p{index}" for index in range(6)]  # by name, not by noise


def test_points_apart_beyond_the_noise_keep_their_order(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    for name, base in (("slow", 3.0), ("fast", 1.0), ("middle", 2.0)):
        times = [float(t) for t in base + 0.02 * rng.standard_normal(12)]
        write_steps(tmp_path / name, (*GB200, "data=synthetic", "mbs=1"), times)
    code, text = run_report(str(tmp_path))
    assert code == 0 and places(text) == {"fast": "1", "middle": "2", "slow": "3"}


def test_the_order_follows_the_median_step_the_table_prints(tmp_path: Path) -> None:
    """One slow step lowers a run's mean rate, not its median: a run that is faster at p50 (and
    beyond the other's band) ranks first, as the p50 column it prints says."""
    write_steps(tmp_path / "spiky", (*GB200, "data=synthetic", "mbs=1"), [1.0] * 19 + [30.0])
    write_steps(tmp_path / "steady", (*GB200, "data=synthetic", "mbs=1"), [2.4] * 20)
    table = report_table.load_table([str(tmp_path)])
    by_mean = table.sort_values("effective_tokens_per_s_per_gpu", ascending=False)
    assert list(by_mean["run"]) == ["steady", "spiky"]  # the mean alone would put steady first
    code, text = run_report(str(tmp_path))
    assert code == 0 and places(text) == {"spiky": "1", "steady": "2"}


def test_a_packed_run_is_marked_packed_in_its_data_cell(tmp_path: Path) -> None:
    write_steps(tmp_path / "padded", (*GB200, "data=synthetic", "mbs=2"), [2.0] * 8)
    write_steps(tmp_path / "packed", (*GB200, "data=synthetic", "mbs=2", "data.packing=in_batch"), [1.5] * 8)
    code, text = run_report(str(tmp_path))
    cells = {row[1]: row[-2] for row in table_rows(section(text, "Ranked"))}
    assert code == 0 and cells == {"packed": "synthetic, packed (in_batch)", "padded": "synthetic"}
