"""`moe-vlm report PATH...`: every run.json under run dirs, sweep dirs or globs -> ranked tables and plots.

    moe-vlm report multirun/2026-08-30/12-00-00
    moe-vlm report 'sweeps/*' --out reports/today --compare parallelism
    moe-vlm report SWEEP --save-baseline baseline.json       # after a good sweep
    moe-vlm report SWEEP --baseline baseline.json --tolerance 0.05   # the gate: exit 1 on a failure
    moe-vlm report SWEEP --best                               # best.yaml: the winner and its rerun
    moe-vlm report BIG_SWEEP --top 20                         # the best 20 rows per ranked table
    moe-vlm report --diff RUN_A RUN_B                         # why is A faster than B?

Reads completed, failed and rejected runs alike into one pandas table (results.csv and
results.parquet), writes report.md and the plots next to them in the first PATH (or --out), and
prints the Markdown report. Completed synthetic/real runs with real routing are ranked by
effective (real) tokens/s/GPU; mock-data runs and forced-balance runs (router=forced_balance) go
to separate, labelled tables and never into that ranking.
A ranked table shows the best --top rows (see --help) and one summary line for the rest; each
plot names at most plots.PLOT_TOP configs and draws the rest as one "+ K more, median X" entry.

Exit status: 0 fine; 1 a run failed the --baseline gate (report/gate.py: throughput below the
baseline by more than --tolerance with the noise bands apart, peak memory above it by more than
--memory-tolerance, a NaN loss or a skipped iteration in the window, a config that no longer
completes), one `GATE FAIL` line per failing figure; 2 bad input (a missing PATH, no run.json
found, unknown --compare knob, missing or unreadable baseline, --top below 1, a bad --window),
with a one-line error naming the option, what it allows and a fix.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from moe_vlm.base import inputs
from moe_vlm.base.errors import BadInput
from moe_vlm.base.files import write_atomic
from moe_vlm.base.inputs import json_has
from moe_vlm.record.columns import KNOBS
from moe_vlm.report import best as report_best
from moe_vlm.report import diff as report_diff
from moe_vlm.report import gate, plots
from moe_vlm.report.build import (
    DEFAULT_TOLERANCE,
    EXIT_BAD_INPUT,
    EXIT_OK,
    EXIT_REGRESSED,
    _png,
    build_report,
    check_outputs,
    output_dir,
    write_table,
)
from moe_vlm.report.markdown import DEFAULT_TOP
from moe_vlm.report.table import load_table


def parser() -> argparse.ArgumentParser:
    p = inputs.Parser(
        prog="moe-vlm report", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "paths",
        nargs="+",
        metavar="PATH",
        type=inputs.ReadPath("multirun/DATE/TIME", globs=True),
        help="run dirs, sweep dirs, run.json files or globs",
    )
    p.add_argument(
        "--out",
        type=inputs.WriteDir("--out reports/today"),
        help="where report.md, results.csv/.parquet and plots go (default: first PATH)",
    )
    p.add_argument(
        "--compare",
        metavar="KNOB",
        type=inputs.Choice(KNOBS),
        help=f"side-by-side by one knob: {', '.join(KNOBS)}",
    )
    p.add_argument(
        "--baseline",
        metavar="FILE",
        type=inputs.ReadJson("--baseline baseline.json (written by --save-baseline)"),
        help="flag configs slower than this saved baseline",
    )
    p.add_argument(
        "--tolerance",
        type=inputs.Number(0.0, 1.0, "--tolerance 0.05", open_high=True),
        default=DEFAULT_TOLERANCE,
        help=f"allowed drop vs --baseline, as a fraction (default {DEFAULT_TOLERANCE})",
    )
    p.add_argument(
        "--memory-tolerance",
        type=inputs.Number(0.0, 10.0, "--memory-tolerance 0.10"),
        default=gate.DEFAULT_MEMORY_TOLERANCE,
        help=f"allowed rise in peak memory vs --baseline, as a fraction (default {gate.DEFAULT_MEMORY_TOLERANCE})",
    )
    p.add_argument(
        "--window",
        metavar="FIRST-LAST",
        type=inputs.StepRange("--window 5-20"),
        help="the steps the gate (and --save-baseline) judge every run over, e.g. 5-20 (default: the "
        "baseline's; --save-baseline: the steps every run has in its steady window)",
    )
    p.add_argument(
        "--best",
        action="store_true",
        help=f"write {report_best.BEST_YAML}: the winning point's overrides, figures, software and the "
        "one command that reruns it (mock and forced-balance runs never win against real ones)",
    )
    p.add_argument(
        "--save-baseline",
        metavar="FILE",
        type=inputs.WriteFile("--save-baseline baseline.json"),
        help="save this report's throughput as a baseline",
    )
    p.add_argument(
        "--diff",
        action="store_true",
        help="the two PATHs are runs A and B: their time per component and every configuration difference "
        "(knobs, Bridge's effective config) side by side; why is A faster than B?",
    )
    p.add_argument(
        "--top",
        type=inputs.Count(1, f"--top {DEFAULT_TOP}"),
        default=DEFAULT_TOP,
        metavar="N",
        help=f"rows per ranked table (default {DEFAULT_TOP}: every row of a sweep up to that size, the "
        f"best {DEFAULT_TOP} beyond it); plots name at most {plots.PLOT_TOP} configs and summarise the rest",
    )
    return p


def _diff(paths: list[str]) -> int:
    try:
        if len(paths) != 2:
            raise BadInput(f"--diff takes two runs, RUN_A RUN_B; got {len(paths)} PATH(s)")
        text = report_diff.render(*paths)
    except BadInput as exc:
        print(f"moe-vlm report: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(text, end="")
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.diff:
        return _diff(args.paths)
    try:
        if args.save_baseline:  # never over a file this tool did not write (base/inputs.py)
            inputs.output_file("--save-baseline", args.save_baseline, json_has("metric", "configs"))
        baseline = gate.load(Path(args.baseline)) if args.baseline else None
        window = gate.Window(*args.window) if args.window else None
        table = load_table(args.paths)
        out = output_dir(args.paths, str(args.out) if args.out else None)
        check_outputs(out)
    except BadInput as exc:
        print(f"moe-vlm report: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT

    text, made = build_report(table, out, args.compare, args.top)
    status = EXIT_OK
    if baseline is not None:
        judged = gate.judge(table, baseline, args.tolerance, args.memory_tolerance, window)
        text += (
            "\n## Gate\n\n"
            + gate.markdown(judged, Path(args.baseline), args.tolerance, args.memory_tolerance)
            + "\n"
        )
        failed = [j for j in judged if j.verdict == "FAIL"]
        if failed:
            status = EXIT_REGRESSED
            text += f"\n**{len(failed)} run(s) failed the gate** (exit status {EXIT_REGRESSED}).\n"
    if args.best:
        text += "\n" + report_best.write(table, out) + "\n"

    write_table(table, out)
    for plot in made:
        write_atomic(out / f"{plot.name}.png", _png(plot))
    write_atomic(out / "report.md", text)
    if args.save_baseline:
        saved, over, left_out = gate.save(table, Path(args.save_baseline), window)
        steps = f" over steps {over.text()}" if over else " (no steady window common to the runs: none saved)"
        text += f"\nSaved a baseline of {saved} completed config(s){steps} to {args.save_baseline}.\n"
        text += "".join(f"- left out of it: {line}\n" for line in left_out)
    print(text, end="")
    return status
