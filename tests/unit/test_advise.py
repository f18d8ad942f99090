"""`moe-vlm advise` before any run and on a recorded sweep with known right answers.

tests/fixtures/advise/gb200_30b_sweep holds hand-made run.json records (the record.py format)
of a Qwen3-VL-30B-A3B sweep on 2 GB200 nodes, each with the .hydra/overrides.yaml Hydra writes:

    p01 mock data, full recompute, MBS 1             -> "mock data used as evidence"
    p02-p04 synthetic, full recompute, MBS 1/2/4     -> tokens/s 4000 -> 5200 -> 6100: "MBS still rising";
            peaks 41 / 58 / 92 GiB of 185            -> "full recompute with headroom" (MBS 2 is the
                                                        fastest full run whose selective variant fits)
    p05 synthetic, selective, vision encoder 55%     -> "vision encoder dominates the step"
    p06 3D EP4 x ETP2                                -> "ETP in use where EP alone fits": ep=8 etp=1
    p07 no recompute, MBS 8, failed OOM              -> "out of memory" with the change the estimate fits
    p08 rejected (DeepEP on GB200)                   -> counted, no suggestion
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from moe_vlm.advise import compose_spec, main
from moe_vlm.cli import main as cli_main
from moe_vlm.memory import estimate
from moe_vlm.rules import errors, validate
from tests.conftest import make_spec

SWEEP = Path(__file__).resolve().parent.parent / "fixtures" / "advise" / "gb200_30b_sweep"
BASE = "python train.py model=qwen3_vl_30b_a3b cluster=gb200 nodes=2 dispatcher=hybridep"


def advise(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def commands(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip().startswith("python train.py ")]


def test_sweep_suggestions_are_the_known_right_answers(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = advise(capsys, f"sweep={SWEEP}")
    assert code == 0
    assert "(8 runs: 6 completed, 1 failed, 1 rejected)" in out
    found = commands(out)
    expected = [
        # mock -> the same point on realistic images
        f"{BASE} recompute=full mbs=1 data=synthetic",
        # vision encoder at 55%: freeze it for decoder-focused tuning, or raise MBS carefully
        f"{BASE} data=synthetic recompute=selective mbs=1 vision_freeze=vision",
        f"{BASE} data=synthetic recompute=selective mbs=2",
        # full recompute at 58 GiB of 185 with MBS 2: relax to selective
        f"{BASE} data=synthetic mbs=2 recompute=selective",
        # ETP 2 where EP 8 alone fits
        f"{BASE} data=synthetic recompute=selective mbs=1 parallelism=3d ep=8 etp=1",
        # 4000 -> 5200 -> 6100 tokens/s: MBS still rising, 8 predicted to fit
        f"{BASE} data=synthetic recompute=full mbs=8",
    ]
    for line in expected:
        assert line in found, f"missing suggestion: {line}\n{out}"
    # The mock run is not evidence for relaxing recompute, and MBS 4's selective variant does not fit.
    assert f"{BASE} data=mock mbs=1 recompute=selective" not in found
    assert f"{BASE} data=synthetic mbs=4 recompute=selective" not in found
    assert "[out of memory]" in out and "recompute=none mbs=8` ran out of memory" in out
    topics = [line.split("]")[0] for line in out.splitlines() if line[:1].isdigit()]
    assert topics[0].endswith("[mock data used as evidence"), "mock evidence is flagged first"


def test_every_sweep_suggestion_is_a_valid_fitting_run(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = advise(capsys, f"sweep={SWEEP}")
    for line in commands(out):
        spec = make_spec(*shlex.split(line)[2:])
        assert not errors(validate(spec)), line
        assert estimate(spec).fits, line


def test_bring_up_on_gb200_starts_on_fsdp_with_full_recompute(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = advise(capsys, "model=qwen3_vl_235b_a22b", "cluster=gb200", "nodes=16", "goal=bring-up")
    assert code == 0
    assert "family: FSDP" in out and "get a reliable run on FSDP first" in out
    start = commands(out)[0]
    overrides = shlex.split(start)[2:]
    for expected in ("parallelism=fsdp", "dispatcher=hybridep", "recompute=full", "cuda_graph=none", "mbs=1"):
        assert expected in overrides, start
    spec = compose_spec(overrides)
    assert not errors(validate(spec)) and estimate(spec).fits
    assert spec.layout.ep == 64 and spec.layout.etp == 1
    assert "next, once stable on FSDP (3D candidate)" in out and "sweep=mbs_recompute" in out


def test_peak_throughput_on_b200_uses_selective_and_narrow_graphs(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = advise(capsys, "model=qwen3_vl_30b_a3b", "cluster=b200", "goal=peak-throughput")
    assert code == 0
    assert "B200: FSDP works but is more sensitive to the recompute choice" in out
    overrides = shlex.split(commands(out)[0])[2:]
    for expected in ("dispatcher=alltoall", "recompute=selective", "cuda_graph=te_moe", "data=synthetic"):
        assert expected in overrides
    spec = compose_spec(overrides)
    assert not errors(validate(spec))
    found = estimate(spec)
    assert found.headroom_fraction is not None and found.headroom_fraction >= 0.10


def test_local_cpu_start_uses_the_torch_engine_settings(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = advise(capsys, "goal=bring-up")
    assert code == 0
    overrides = shlex.split(commands(out)[0])[2:]
    assert {"dispatcher=alltoall", "cuda_graph=none", "parallelism=fsdp"} <= set(overrides)
    assert not errors(validate(compose_spec(overrides)))


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["goal=fastest"], "goal=fastest: not one of bring-up, peak-throughput"),
        (["sweep=/nonexistent/moe_vlm_sweep"], "sweep=/nonexistent/moe_vlm_sweep: no such directory"),
        (["model=gpt5"], "model=gpt5: no such option"),
        (["mbs=1,2"], "advise takes one configuration"),
        (["bring-up"], "not a key=value override"),
        ([f"sweep={SWEEP}", "mbs=2"], "with sweep=PATH the configurations come from"),
    ],
)
def test_bad_input_is_one_line_exit_2(
    capsys: pytest.CaptureFixture[str], argv: list[str], fragment: str
) -> None:
    code, out, err = advise(capsys, *argv)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and fragment in err and "Fix:" in err


def test_cli_dispatches_advise(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["advise", "goal=nope"]) == 2
    assert "goal=nope" in capsys.readouterr().err
