"""absl's logging handler, imported with the Megatron stack, must not close pytest's capture file
when a later logging.config.dictConfig shuts the handlers down while sys.stderr is another stream
(tests/conftest.py _absl_writes_to_the_real_stderr). Without that, pytest fails reading what it
captured ("I/O operation on closed file") after the second test below, and so does every later
test of the process."""

from __future__ import annotations

import logging.config
import sys

import pytest

# Without absl nothing here can fail: every test skips, loudly.
absl_logging = pytest.importorskip("absl.logging", reason="absl comes with the Megatron stack")


def test_absls_handler_writes_to_the_real_stderr() -> None:
    assert absl_logging.get_absl_handler().python_handler.stream is sys.__stderr__


def test_a_later_logging_configuration_under_capsys_leaves_the_capture_open(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # As submitit's logger module does at import, and Hydra's job logging for every in-process run.
    logging.config.dictConfig({"version": 1, "disable_existing_loggers": False})
    print("captured", file=sys.stderr)
    assert capsys.readouterr().err == "captured\n"


def test_the_next_test_is_still_captured(capsys: pytest.CaptureFixture[str]) -> None:
    print("still captured", file=sys.stderr)
    assert capsys.readouterr().err == "still captured\n"
