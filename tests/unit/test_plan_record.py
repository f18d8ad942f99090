"""plan.json: written by a dry run (one per point in a sweep's), typed, versioned, read back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from moe_vlm.rules import validate
from moe_vlm.run.plan import gather
from moe_vlm.run.plan_record import PLAN_JSON, PLAN_SCHEMA_VERSION, Plan, PlanError, plan_of, read_plan
from tests.conftest import make_spec

ROOT = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "MOE_VLM_PLAN_SHALLOW": "1"}


def test_round_trip_keeps_every_part(tmp_path: Path) -> None:
    spec = make_spec("model=qwen3_vl_30b_a3b", "cluster=gb200", "nodes=2", "mbs=4", "gbs=512", "ep=8")
    findings = validate(spec)
    plan = plan_of(spec, findings, gather(spec, findings, deep=False))
    path = plan.write(tmp_path, lambda payload: payload)
    back = read_plan(path)
    assert back == plan
    assert back.schema_version == PLAN_SCHEMA_VERSION
    assert back.knobs["model"] == "qwen3_vl_30b_a3b" and back.knobs["mbs"] == 4
    assert back.memory is not None and {t.name for t in back.memory.terms} >= {"parameters", "logits"}
    assert [f.code for f in back.findings] == [f.code for f in findings]
    assert back.flops_basis is not None and back.flops_basis.rows == 512
    assert back.bridge is not None and back.bridge.recipe and back.bridge.fields
    assert back.bridge.effective is None and back.bridge.effective_note  # shallow or invalid: says why


def test_reader_refuses_another_schema_version(tmp_path: Path) -> None:
    spec = make_spec()
    plan = plan_of(spec, [], gather(spec, [], deep=False))
    payload = plan.to_json() | {"schema_version": PLAN_SCHEMA_VERSION + 1}
    (tmp_path / PLAN_JSON).write_text(json.dumps(payload))
    with pytest.raises(PlanError, match="schema version"):
        read_plan(tmp_path / PLAN_JSON)
    (tmp_path / PLAN_JSON).write_text(json.dumps({"schema_version": PLAN_SCHEMA_VERSION}))
    with pytest.raises(PlanError, match="not a plan"):
        read_plan(tmp_path / PLAN_JSON)


def test_dry_run_writes_plan_json_in_the_run_dir(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "train.py", "dry_run=true", "mbs=2", f"hydra.run.dir={run_dir}"],
        cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    plan = read_plan(run_dir / PLAN_JSON)
    assert plan.valid and plan.engine == "torch" and plan.knobs["mbs"] == 2 and plan.bridge is None
    assert plan.flops_basis is not None and plan.flops_basis.headline() in done.stdout


def test_sweep_dry_run_writes_one_plan_per_point(tmp_path: Path) -> None:
    sweep_dir = tmp_path / "sweep"
    done = subprocess.run(
        [sys.executable, "train.py", "-m", "dry_run=true", "mbs=1,2", "dispatcher=alltoall,deepep", f"hydra.sweep.dir={sweep_dir}"],
        cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    plans = sorted(sweep_dir.glob(f"*/{PLAN_JSON}"))
    assert len(plans) == 4, (done.stdout, done.stderr)
    read = [read_plan(p) for p in plans]
    assert sorted(p.verdict for p in read) == ["INVALID", "INVALID", "VALID", "VALID"]
    rejected = next(p for p in read if not p.valid)
    assert any(f.level == "error" and f.code for f in rejected.findings)


def test_plan_is_a_dataclass_all_the_way_down() -> None:
    """Typed: every part a reader gets back is a dataclass or a plain JSON value."""
    spec = make_spec("model=qwen3_vl_30b_a3b", "cluster=gb200", "nodes=2")
    plan = Plan.from_json(plan_of(spec, [], gather(spec, [], deep=False)).to_json())
    assert plan.bridge is not None and type(plan.bridge.fields[0]).__name__ == "PlanField"
    assert plan.memory is not None and type(plan.memory.terms[0]).__name__ == "PlanTerm"
