"""A name typed with a non-ASCII look-alike: one line naming the character and what it resembles."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from moe_vlm.base.errors import BadInput
from moe_vlm.config.names import ascii_fold, lookalike_error
from moe_vlm.config.preflight import preflight
from tests.conftest import REPO

CYRILLIC_E = "\u0435"  # е


def refusal(*overrides: str) -> str:
    with pytest.raises(BadInput) as bad:
        preflight(list(overrides))
    line = str(bad.value)
    assert "\n" not in line
    return line


@pytest.mark.parametrize("typed", [f"dispatcher=hybrid{CYRILLIC_E}p", f"dispatcher='hybrid{CYRILLIC_E}p'"])
def test_a_group_option_names_the_character_and_the_option(typed: str) -> None:
    # Unquoted, Hydra's lexer says "token recognition error"; quoted, "no such option".
    line = refusal(typed, "dry_run=true")
    assert "U+0435 CYRILLIC SMALL LETTER IE" in line and "a look-alike of 'e'" in line
    assert "you mean the option hybridep" in line and line.endswith("Fix: retype it: dispatcher=hybridep.")


def test_a_sweep_value_a_key_and_an_enum_value() -> None:
    assert "option hybridep" in refusal(f"dispatcher=alltoall,hybrid{CYRILLIC_E}p")
    assert "you mean the key mbs" in refusal("mb\u0455=2")  # Cyrillic dze
    assert "you mean the key parallelism.tp" in refusal("parallelism.t\u0440=2")  # Cyrillic er
    assert "you mean the value alltoall" in refusal("dispatcher.token_dispatcher=allt\u043eall")
    assert "FULLWIDTH DIGIT TWO" in refusal("mbs=\uff12")
    # U+04CF is not in the look-alike table: the closest spelling finds the option.
    assert "you mean the option slurm_gb200" in refusal("hydra/launcher=s\u04cfurm_gb200", "cluster=gb200")


def test_nothing_resembles_lists_the_options() -> None:
    line = refusal("dispatcher=\u0445\u0443z")
    assert "no option resembles" in line and "Allowed: allgather, alltoall, deepep, hybridep" in line


def test_free_text_may_hold_any_character_when_quoted() -> None:
    preflight(["logger.run_name='Exp\u00e9rience'", "dry_run=true"])
    assert "free text must be quoted" in refusal("logger.run_name=Exp\u00e9rience")


def test_a_text_value_with_a_closed_set_names_the_value_it_resembles() -> None:
    """dry_run (typed Any: true, false, full) and the launcher's executor (text: slurm, local) once got
    "free text must be quoted"; quoting would have planned nothing or been refused a step later."""
    assert refusal("dry_run=f\u0430lse").endswith("you mean the value false. Fix: retype it: dry_run=false.")
    line = refusal("hydra.launcher.executor=slur\u043c", "hydra/launcher=slurm")
    assert "U+043C CYRILLIC SMALL LETTER EM" in line and line.endswith("hydra.launcher.executor=slurm.")
    # Free text of look-alikes: the ASCII it resembles, or the quotes if the text is meant.
    line = refusal(f"logger.run_name=t{CYRILLIC_E}st")
    assert "you mean the value test" in line and "or quote it if the text is meant" in line


def test_ascii_is_left_to_hydra() -> None:
    assert lookalike_error("dispatcher=hybridep", "hybridep", ["hybridep"], "dispatcher={}") is None
    assert ascii_fold("\uff4d\uff42\uff53 \u2014 \u201cx\u201d") == 'mbs - "x"'


def test_train_py_exits_2_with_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "train.py"),
            f"dispatcher=hybrid{CYRILLIC_E}p",
            f"hydra.run.dir={tmp_path}/run",
        ],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO), "MOE_VLM_SITE_FILE": "none"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "U+0435" in done.stderr, done.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("typed", "fix"),
    [
        ("dispatcher=hybrIdep", "dispatcher=hybridep"),  # capital I for i
        ("recompute=fuII", "recompute=full"),  # capital I for l
        ("dispatcher=a11toall", "dispatcher=alltoall"),  # one for l
        ("cluster=gb2OO", "cluster=gb200"),  # capital O for zero
    ],
)
def test_an_ascii_look_alike_gets_the_option_it_resembles(typed: str, fix: str) -> None:
    """The did-you-mean names the option the typed name looks like, not the first one allowed
    (dispatcher=hybrIdep once got "e.g. dispatcher=allgather")."""
    done = subprocess.run(
        [sys.executable, "train.py", typed, "dry_run=true"], capture_output=True, text=True, cwd=REPO
    )
    assert done.returncode == 2 and f"Fix: {fix} " in done.stderr and len(done.stderr.splitlines()) == 1
