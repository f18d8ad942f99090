"""Shared test helpers: compose real configs through Hydra's compose API (moe_vlm.config.compose)."""

from __future__ import annotations

import copy
import dataclasses
import os
import sys
import typing
from collections.abc import Generator, Iterator
from enum import Enum
from pathlib import Path
from typing import Any

import pluggy
import pytest
from omegaconf import DictConfig

from moe_vlm.config.compose import CONF_DIR, compose_config, compose_point
from moe_vlm.config.schema import TrainConfig
from moe_vlm.config.spec import RunSpec
from moe_vlm.engines.megatron.plan_cache import CACHE_ENV
from moe_vlm.predict.calibration import CALIBRATION_ENV

REPO = Path(__file__).resolve().parent.parent
CONF = CONF_DIR


def _absl_writes_to_the_real_stderr() -> None:
    """absl's logging handler (absl comes with the Megatron stack) keeps the sys.stderr of the
    moment absl.logging was imported, and closes that stream whenever a later
    logging.config.dictConfig (submitit's logger module, Hydra's job logging) shuts the handlers
    down, unless it is sys.stderr at that moment (absl/logging/__init__.py, PythonHandler.close).
    Under pytest that stream is pytest's capture file, so every later test of the process failed
    with "I/O operation on closed file". Pointing it at the real stderr, which absl never closes,
    before anything imports the stack, ends that; a run outside pytest never had the problem."""
    try:
        from absl import logging as absl_logging
    except ImportError:
        return
    absl_logging.get_absl_handler().python_handler.stream = sys.__stderr__


_absl_writes_to_the_real_stderr()
# A test report's user property that carries tests/megatron's REPORT lines to the controller.
MEGATRON_REPORT = "megatron_report"


# --- running in parallel (scripts/test.sh: the Slurm tests in one process, the rest on pytest-xdist) ---


@pytest.hookimpl(trylast=True)  # after `-m` has deselected: the weights count what runs
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Files with the most `slow` tests first, the rest in collection order.

    xdist's loadfile hands out whole files in the order it gets them (scripts/test.sh turns off its
    own reorder, which puts files with the fewest tests last: the README test and the fast-path
    corpus, minutes each, then ran at the end, where one long file keeps one worker busy after the
    other has finished). Heavy files first let the many quick ones fill in around them. Only on
    xdist's workers: a run in one process (the Slurm tests) keeps its order."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return
    slow: dict[str, int] = {}
    for item in items:
        file = item.nodeid.split("::")[0]
        slow[file] = slow.get(file, 0) + bool(item.get_closest_marker("slow"))
    order = {item.nodeid: i for i, item in enumerate(items)}
    items.sort(key=lambda item: (-slow[item.nodeid.split("::")[0]], order[item.nodeid]))


_REPORT_SENT = 0


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pluggy.Result[pytest.TestReport], None]:
    """A test's new tests/megatron REPORT lines ride on its teardown report (to xdist's controller)."""
    outcome = yield
    report = outcome.get_result()
    global _REPORT_SENT
    lines = _megatron_report()
    if report.when == "teardown" and lines is not None and len(lines) > _REPORT_SENT:
        report.user_properties.append((MEGATRON_REPORT, lines[_REPORT_SENT:]))
        _REPORT_SENT = len(lines)


def _megatron_report() -> list[str] | None:
    import sys

    module = sys.modules.get("tests.megatron.conftest")
    return getattr(module, "REPORT", None)


_RELAYED: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if getattr(report, "node", None) is None:  # not from an xdist worker: REPORT is in this process
        return
    for name, lines in report.user_properties:
        if name == MEGATRON_REPORT and isinstance(lines, list):
            _RELAYED.extend(str(line) for line in lines)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """tests/megatron's summary: a loud line when the real-library checks were skipped, then what
    they checked."""
    from moe_vlm.engines.megatron.stack import stack_problem

    reports = [r for kind in terminalreporter.stats.values() for r in kind if hasattr(r, "nodeid")]
    if not any(r.nodeid.startswith("tests/megatron/") for r in reports):
        return
    problem = stack_problem()
    if problem is not None:
        terminalreporter.write_sep(
            "!", "tests/megatron SKIPPED: the real-library checks did not run", red=True
        )
        terminalreporter.write_line(f"reason: {problem}", red=True)
    lines = _RELAYED or _megatron_report() or []
    if lines:
        terminalreporter.write_sep("-", "Megatron Bridge checks (real library, CPU)")
        for line in lines:
            terminalreporter.write_line(line)


def compose_cfg(*overrides: str) -> DictConfig:
    return compose_config(overrides)


def make_spec(*overrides: str) -> RunSpec:
    """The RunSpec train.py builds for these overrides: the product's own composition (compose_point,
    each structural override set composed by Hydra once per process; tests/unit/
    test_compose_fastpath.py holds it equal to Hydra's compose), on a copy, so a test that changes
    its spec changes no other test's."""
    return RunSpec.from_config(copy.deepcopy(compose_point(overrides).train))


@pytest.fixture
def spec_of():
    return make_spec


@pytest.fixture(autouse=True, scope="session")
def plan_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Plans in tests (and the commands they start) never read or fill the user's plan cache."""
    path = tmp_path_factory.mktemp("plan_cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(CACHE_ENV, str(path))
        yield path


@pytest.fixture(autouse=True, scope="session")
def calibration_file(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Predictions in tests (and the commands they start) never read the user's step-time
    calibration: none exists unless a test writes one here."""
    path = tmp_path_factory.mktemp("calibration") / "step_time_calibration.json"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(CALIBRATION_ENV, str(path))
        yield path


def _leaves(cls: type, prefix: str = "") -> Iterator[tuple[str, Any]]:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        kind = hints[f.name]
        if isinstance(kind, type) and dataclasses.is_dataclass(kind):
            yield from _leaves(kind, f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", kind


# Every leaf of the schema (dotted key -> its type): the knob coverage test and the fuzzer's space.
SCHEMA_LEAVES: dict[str, Any] = dict(_leaves(TrainConfig))


def knob_override(knob: str, value: Any) -> str:
    """The command-line override that sets schema leaf `knob` to `value`."""
    if value is None:
        return f"{knob}=null"
    if isinstance(value, Enum):
        return f"{knob}={value.name}"
    if isinstance(value, bool):
        return f"{knob}={str(value).lower()}"
    if isinstance(value, list):
        return f"{knob}=[{','.join(str(v) for v in value)}]"
    return f"{knob}={value}"


# A CPU machine's rates as `moe-vlm calibrate --probe` stores them (this machine's, rounded, on
# 2026-12-07): the step model's inputs for cluster=local in tests that check its arithmetic, not
# the probe (tests/unit/test_predict_probe.py runs the probe itself).
CPU_RATES = {
    "threads": 1,
    "gemm_flops_per_s": 1.0e11,
    "conv_flops_per_s": 3.0e10,
    "attention_flops_per_s": 7.0e10,
    "attention_half_length": 20.0,
    "attention_head_dim": 16,
    "attention_backward_ratio": 2.5,
    "attention_masked_factor": 0.7,
    "attention_causal_factor": 0.8,
    "memory_bytes_per_s": 4.0e10,
    "op_s": 2.5e-6,
    "link_bytes_per_s": 7.0e8,
    "link_latency_s": 5.0e-4,
    "data_sample_s": 3.0e-4,
    "data_patch_s": 1.0e-5,
}


@pytest.fixture
def cpu_rates(calibration_file: Path) -> Iterator[Path]:
    """The calibration file holds CPU_RATES for cluster=local (removed after the test)."""
    from moe_vlm.predict import calibration as cal
    from moe_vlm.predict.calibration import stack_of

    stack = stack_of(make_spec().engine)
    cal.store(
        [cal.Calibration("local", stack, {}, None, 0, "test rates", rates={"1": CPU_RATES})], calibration_file
    )
    try:
        yield calibration_file
    finally:
        calibration_file.unlink(missing_ok=True)
