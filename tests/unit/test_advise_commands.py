"""Every command `moe-vlm advise` prints plans without errors, and its start explains its warnings.

For four set-ups, each printed `python train.py ...` line is planned the way `dry_run=true`
plans it: train.py's pre-flight on the whole command line, then every point of the sweep
(command-line axes and a preset's axes, expanded by Hydra's own sweeper grammar) composed and
validated by the rule catalogue. No point may carry an error finding.
"""

from __future__ import annotations

import shlex

import pytest
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser

from moe_vlm.cli.advise import main
from moe_vlm.config.compose import compose_point, compose_spec, override_key
from moe_vlm.config.preflight import preflight
from moe_vlm.rules import errors, validate

SETUPS = [
    ("cluster=gb200", "model=qwen3_vl_235b_a22b", "nodes=64"),
    ("cluster=gb200", "model=qwen35_vl_35b_a3b", "nodes=2", "goal=peak-throughput"),
    ("cluster=b200", "model=qwen3_vl_30b_a3b", "goal=peak-throughput"),
    ("cluster=h200", "model=qwen3_vl_30b_a3b", "nodes=2"),
]


def printed_commands(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[str, list[list[str]]]:
    assert main(list(argv)) == 0
    out = capsys.readouterr().out
    lines = [line.split("    # ", 1)[0].strip() for line in out.splitlines()]
    return out, [shlex.split(line)[2:] for line in lines if line.startswith("python train.py ")]


def points(argv: list[str]) -> list[list[str]]:
    """The points `python train.py ARGV dry_run=true` plans (one, or a sweep's grid)."""
    overrides = [a for a in argv if a != "-m"]
    preflight([*argv, "dry_run=true"])
    fixed = [o for o in overrides if "," not in o.partition("=")[2]]
    given = {override_key(o) for o in overrides}
    preset = compose_point(fixed).hydra_value("hydra.sweeper.params") or {}
    lines = [f"{k}={v}" for k, v in preset.items() if k not in given] + overrides
    parsed = OverridesParser.create().parse_overrides(lines)
    return BasicSweeper.split_arguments(parsed, None)[0] if "-m" in argv else [overrides]


@pytest.mark.parametrize("setup", SETUPS, ids=lambda s: "-".join(a.split("=")[1] for a in s))
def test_every_printed_command_plans_without_errors(
    capsys: pytest.CaptureFixture[str], setup: tuple[str, ...]
) -> None:
    out, commands = printed_commands(capsys, *setup)
    assert len(commands) >= 3, out
    for argv in commands:
        for point in points(argv):
            found = errors(validate(compose_spec(point)))
            assert not found, (shlex.join(argv), point, [f.line() for f in found])


def test_the_start_applies_o007s_fix_or_says_why_each_warning_stays(
    capsys: pytest.CaptureFixture[str],
) -> None:
    out, commands = printed_commands(capsys, *SETUPS[0])
    start = out.split("start:\n", 1)[1].split("\n\n", 1)[0]
    assert "parallelism.dp_outer=0" in commands[0]
    # With the corrected memory estimate selective fits too (R003): bring-up keeps full on purpose,
    # and the start says so on its own line (checked for every warning below).
    assert "validation: 0 errors, " in start and "the fix of O007" in start
    # Every warning a printed start still has is on its own line with why it stays (or its fix).
    for block in out.split("\n\n"):
        if "validation: 0 errors, " in block and "0 errors, 0 warning(s)" not in block:
            warned = block.split(" warning(s) (", 1)[1].split(")", 1)[0].split(", ")
            for code in warned:
                assert f"  ! {code} " in block, block


def test_qwen35_candidates_follow_its_playbook_no_graphs(capsys: pytest.CaptureFixture[str]) -> None:
    out, commands = printed_commands(capsys, *SETUPS[1])
    assert all("cuda_graph=te_moe" not in shlex.join(argv) for argv in commands), out
    assert "as Bridge's Qwen3-VL recipes use" not in out
    assert "cuda_graph=none: Qwen3.5-VL: Bridge's perf recipes run without CUDA graphs" in out


def test_precision_advice_is_a_runnable_ab_sweep(capsys: pytest.CaptureFixture[str]) -> None:
    out, commands = printed_commands(capsys, *SETUPS[2])
    assert any("precision=bf16,fp8mx" in argv for argv in commands), out
    out, commands = printed_commands(capsys, *SETUPS[3])
    assert any("precision=bf16,fp8cs" in argv for argv in commands), out
    assert "no knob selects" not in out and "this tool runs the recipe's BF16" not in out
