"""Defaults that need no fixing, and a plan that ends with what is wrong.

Every cluster x model composition with nothing else given is planned here: no default may emit a
warning (the defaults follow the guide per cluster: HybridEP on GB200/GB300 through the cluster's
Hydra defaults list), and the plan's last lines repeat every finding in one short line each.
"""

from __future__ import annotations

import pytest

from moe_vlm.config.compose import CONF_DIR
from moe_vlm.rules import validate
from moe_vlm.run.plan import render
from tests.conftest import make_spec

CLUSTERS = sorted(p.stem for p in (CONF_DIR / "cluster").glob("*.yaml"))
MODELS = sorted(p.stem for p in (CONF_DIR / "model").glob("*.yaml"))
# Findings about size: a default cannot know the node count a model needs (M001 names the fix),
# and Megatron FSDP over more than one NVLink-domain segment (O007: HSDP or not is a trade of memory
# for scale-out traffic at that size; `moe-vlm advise` applies O007's fix when it still fits).
MEMORY_SIZING = {"M001", "M002", "M003"}
SIZING = {*MEMORY_SIZING, "O007"}
# The one default pair that cannot run at all: the torch engine (cluster=local) builds
# Qwen3-VL-MoE only; E005 says so and names engine=megatron on a GPU cluster.
UNBUILDABLE = {("local", "qwen35_vl_35b_a3b"): {"E005"}}
NODES = (1, 4, 16, 64)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("cluster", CLUSTERS)
def test_every_default_composition_plans_without_a_warning(cluster: str, model: str) -> None:
    # At every node count: nothing but the findings of its size.
    expected = UNBUILDABLE.get((cluster, model), set())
    for nodes in NODES:
        found = validate(make_spec(f"cluster={cluster}", f"model={model}", f"nodes={nodes}"))
        assert {f.code for f in found} - SIZING == expected, (nodes, [f.line() for f in found])


@pytest.mark.parametrize(
    ("cluster", "dispatcher"),
    [("gb200", "hybridep"), ("gb300", "hybridep"), ("b200", "alltoall"), ("local", "alltoall")],
)
def test_the_cluster_picks_its_default_dispatcher_and_the_command_line_wins(
    cluster: str, dispatcher: str
) -> None:
    spec = make_spec(f"cluster={cluster}")
    assert spec.dispatcher.name == dispatcher == spec.cluster.default_dispatcher
    assert make_spec(f"cluster={cluster}", "dispatcher=allgather").dispatcher.name == "allgather"


def test_w003_fires_only_when_the_user_leaves_the_clusters_default() -> None:
    chosen = validate(make_spec("cluster=gb200", "model=qwen3_vl_30b_a3b", "nodes=2", "dispatcher=alltoall"))
    assert "W003" in {f.code for f in chosen}


def test_an_invalid_plan_ends_with_every_finding_in_one_short_line() -> None:
    spec = make_spec("cluster=gb200", "model=qwen3_vl_30b_a3b", "nodes=2", "mbs=64", "dispatcher=alltoall")
    findings = validate(spec)
    tail = render(spec, findings, deep=False).splitlines()
    codes = [f.code for f in findings]
    assert {"M001", "W003"} <= set(codes)
    head = len(tail) - len(findings) - 1
    assert tail[head].startswith(f"INVALID: 1 error(s), {len(codes) - 1} warning(s)")
    for line, finding in zip(tail[head + 1 :], findings, strict=True):
        assert line.startswith(f"  {finding.level.value.upper()} {finding.code} ")
        assert line.endswith(f"Fix: {finding.fix}") and len(line) < 300


def test_a_valid_plan_with_warnings_names_them_last() -> None:
    spec = make_spec("cluster=gb200", "model=qwen3_vl_30b_a3b", "nodes=2", "dispatcher=alltoall")
    tail = render(spec, validate(spec), deep=False).splitlines()
    assert tail[-2] == "VALID, with 1 warning(s):" and tail[-1].startswith(
        "  WARNING W003 (rule: GB200: HybridEP"
    )
    clean = make_spec("cluster=gb200", "model=qwen3_vl_30b_a3b", "nodes=2")
    assert render(clean, validate(clean), deep=False).splitlines()[-1] == "VALID"
