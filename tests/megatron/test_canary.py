"""The canary's Megatron check on CPU: the real stack probe and the real ConfigContainer."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from moe_vlm.engines.megatron.stack import stack_problem
from moe_vlm.launch.canary import CanaryFailed, check_engine
from tests.conftest import make_spec
from tests.megatron.conftest import needs_stack

pytestmark = needs_stack


def test_the_canary_fails_a_hybridep_point_where_deep_ep_does_not_import(tmp_path: Path) -> None:
    if importlib.util.find_spec("deep_ep") is not None:
        pytest.skip("deep_ep is installed here; the canary's failure needs a machine without it")
    spec = make_spec("cluster=gb200", "model=qwen3_vl_30b_a3b", "dispatcher=hybridep")
    with pytest.raises(CanaryFailed, match=r"from deep_ep import HybridEPBuffer fails here"):
        check_engine(spec, tmp_path)


def test_the_canary_builds_the_points_config_container(tmp_path: Path) -> None:
    spec = make_spec("cluster=gb200", "model=qwen3_vl_30b_a3b", "nodes=2", "dispatcher=alltoall")
    problem = stack_problem(spec)
    if problem is not None:
        pytest.skip(f"the full run stack does not import here: {problem}")
    summary = check_engine(spec, tmp_path)
    assert "ConfigContainer built from" in summary and "megatron-bridge 0.6.2" in summary
