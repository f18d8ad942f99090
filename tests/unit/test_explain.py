"""`moe-vlm explain A B`: the terms that differ between two points, and whether it is a tie."""

from __future__ import annotations

import subprocess
import sys

from moe_vlm.cli import explain
from moe_vlm.predict.model import predict
from tests.conftest import REPO, make_spec

SHARED = ["cluster=h100", "model=qwen3_vl_30b_a3b", "nodes=2", "parallelism=3d", "ep=16", "data=mock"]


def test_it_names_the_terms_that_differ_with_their_seconds(capsys) -> None:
    code = explain.main(["dispatcher=hybridep", "dispatcher=alltoall", *SHARED])
    out = capsys.readouterr().out
    assert code == 0
    a = predict(make_spec(*SHARED, "dispatcher=hybridep"))
    b = predict(make_spec(*SHARED, "dispatcher=alltoall"))
    assert a.step_time_s and b.step_time_s and a.step_time_s < b.step_time_s
    assert f"A {a.step_time_s:.4g} s   B {b.step_time_s:.4g} s" in out and "A is" in out
    # The two exchanges are the largest difference, each on its own side.
    rows = [line.split() for line in out.splitlines() if line.startswith(("ep_hybridep ", "ep_alltoall "))]
    assert {row[0] for row in rows} == {"ep_hybridep", "ep_alltoall"}
    assert "dispatcher.name: hybridep -> alltoall" in out
    assert "verdict     A first" in out


def test_a_difference_inside_the_bands_is_called_a_tie(capsys) -> None:
    explain.main(["mbs=1", "mbs=1 seed=2", *SHARED])
    out = capsys.readouterr().out
    assert "verdict     a tie: 1.00x is inside the +/-" in out


def test_bad_input_is_one_line_and_exit_2() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "moe_vlm.cli.main", "explain", "dispatcher=nope", "dispatcher=alltoall"],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    assert "dispatcher" in done.stderr
