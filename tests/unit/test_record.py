"""The typed records of moe_vlm/record/records.py: a steps.jsonl line is a StepRecord, a run.json a RunRecord.

Real parts: RunSpecs and configs composed by Hydra, the rule catalogue's findings, the advise
fixtures (run.json as an older version wrote them, before the spec held the layout), the report's
row reader, Hydra composition of the overrides a record rebuilds. The engines' own lines are
checked where their runs are made: the torch engine's from a real CPU step
(tests/unit/test_torch_engine.py) and a real 2-rank run (tests/integration/test_train_torch.py),
the Megatron engine's from its recorder driven as Bridge drives it (tests/megatron/test_recording.py).
"""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from moe_vlm.base.files import RUN_JSON, STEPS_JSONL
from moe_vlm.config.compose import compose_spec
from moe_vlm.config.schema import TrainConfig
from moe_vlm.config.spec import RunSpec
from moe_vlm.data.batch import BatchStats
from moe_vlm.engines.megatron.recording import StepStats
from moe_vlm.perf.metrics import summarize
from moe_vlm.record.columns import GROUPS, KNOBS, choices, identity_field
from moe_vlm.record.records import (
    TOKEN_KINDS,
    Failure,
    RunRecord,
    RunStatus,
    StepRecord,
    StepWriter,
    read_steps,
)
from moe_vlm.report.table import row_of
from moe_vlm.rules import errors, validate
from moe_vlm.run.task import resolved_config
from tests.conftest import REPO, compose_cfg
from tests.unit.test_metrics import step_records

FIXTURES = sorted((REPO / "tests" / "fixtures" / "advise").rglob(RUN_JSON))
GB200 = ("model=qwen3_vl_30b_a3b", "cluster=gb200", "nodes=2", "train_iters=8")


def counts() -> BatchStats:
    return BatchStats(
        sequences=2, padded_tokens=256, real_tokens=200, text_tokens=150, image_tokens=50,
        loss_tokens=140, images=3, vision_patches=200, sum_seq_len_squared=20000,
        sum_patches_squared=14000, skipped_samples=1, samples=4, vision_marker_tokens=6,
    )  # fmt: skip


def full_line() -> StepRecord:
    """Every field set, as neither engine alone sets them."""
    return StepRecord.measured(
        counts(),
        step=3, rank=1, warmup=False, time_unix_s=1.7e9, step_time_s=2.5, loss=4.0, grad_norm=1.5,
        lr=3e-4, micro_batches=2, peak_memory_gib=10.5, memory_kind="cuda_max_allocated",
        components_s={"vision_encoder": 0.3, "projector": 0.01, "decoder": 1.2}, data_wait_s=0.02,
        host="node-a", exclude="profiler", components_forward_s={"decoder": 0.4},
        components_backward_s={"decoder": 0.8}, optimizer_s=0.1, reserved_gib=12.0,
        device_used_gib=15.5, bridge_step_flops=1e15, bridge_tflops_per_gpu=400.0,
    )  # fmt: skip


def test_a_step_line_round_trips_with_batch_stats_names_and_the_tokens_block(tmp_path: Path) -> None:
    line = full_line()
    written = line.to_json()
    # On disk: the token counts under "tokens"; BatchStats counts no line carries stay out.
    assert written["tokens"] == {"padded": 256, "real": 200, "text": 150, "image": 50, "loss": 140}
    assert set(written["tokens"]) == set(TOKEN_KINDS)
    assert not {"padded_tokens", "vision_marker_tokens", "extra"} & set(written)
    assert written["samples"] == line.samples  # packed rows hold several (data.packing=in_batch)
    with StepWriter(tmp_path / STEPS_JSONL) as writer:
        writer.write(line)
        writer.write(written)  # a JSON line is written as it is
    assert read_steps(tmp_path / STEPS_JSONL) == [line, line]
    assert StepRecord.from_json(json.loads(json.dumps(written)), strict=True) == line


def test_optional_figures_are_left_out_when_not_measured() -> None:
    line = StepRecord.measured(
        counts(), step=1, rank=0, warmup=True, time_unix_s=1.0, step_time_s=1.0, loss=None,
        grad_norm=None, lr=None, micro_batches=1, peak_memory_gib=None, memory_kind=None,
        components_s=None, data_wait_s=None,
    )  # fmt: skip
    written = line.to_json()
    # Always written (None when the engine has no figure), as before the types.
    assert {"loss", "components_s", "data_wait_s", "peak_memory_gib"} <= set(written)
    assert not {"host", "exclude", "reserved_gib", "bridge_step_flops", "optimizer_s"} & set(written)
    assert written["skipped_samples"] == 1  # a count from BatchStats, not a missing figure
    assert StepRecord.from_json(written, strict=True) == line


def test_an_older_line_reads_with_zero_counts_and_strict_names_what_it_lacks() -> None:
    old = {"step": 2, "rank": 1, "step_time_s": 2.0, "tokens": {"real": 10}, "future_key": [1, 2]}
    line = StepRecord.from_json(old)
    assert (line.real_tokens, line.padded_tokens, line.sequences, line.warmup) == (10, 0, 0, False)
    assert (line.host, line.loss, line.data_wait_s) == (None, None, None)
    assert line.extra == {"future_key": [1, 2]} and line.to_json()["future_key"] == [1, 2]
    with pytest.raises(ValueError, match=r"missing warmup.*unknown key future_key.*tokens must be"):
        StepRecord.from_json(old, strict=True)
    with pytest.raises(ValueError, match="without step_time_s"):
        StepRecord.from_json({"step": 1})


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        ("step_time_s", "2.5", "step_time_s is str"),
        ("rank", True, "rank is bool"),
        ("warmup", 1, "warmup is int"),
        ("components_s", [0.1], "components_s is list"),
    ],
)
def test_strict_names_a_value_of_the_wrong_type(key: str, value: Any, says: str) -> None:
    line = full_line().to_json() | {key: value}
    with pytest.raises(ValueError, match=says):
        StepRecord.from_json(line, strict=True)
    StepRecord.from_json(full_line().to_json(), strict=True)  # the same line, well typed, passes


def test_the_megatron_counts_are_batch_stats_and_make_the_same_line() -> None:
    stats: BatchStats = StepStats(micro_batches=2, data_wait_s=0.25)
    stats += counts()  # BatchStats.__iadd__ returns self, typed BatchStats
    line = StepRecord.measured(
        stats, step=1, rank=0, warmup=False, time_unix_s=1.0, step_time_s=1.0, loss=1.0,
        grad_norm=1.0, lr=1e-4, peak_memory_gib=1.0, memory_kind="cuda_max_allocated",
        components_s=None,
    )  # fmt: skip
    # micro_batches and data_wait_s come with StepStats; the counts under BatchStats' names.
    assert (line.micro_batches, line.data_wait_s) == (2, 0.25)
    carried = {f.name for f in fields(StepRecord)}
    shared = [f.name for f in fields(BatchStats) if f.name in carried]
    assert len(shared) == 12  # all but vision_marker_tokens, truncated_text_tokens
    assert {name: getattr(line, name) for name in shared} == {
        name: getattr(counts(), name) for name in shared
    }


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.parent.name)
def test_fixture_records_read_through_run_record_and_write_back_unchanged(path: Path) -> None:
    raw = json.loads(path.read_text())
    record = RunRecord.read(path)
    assert record.to_json() == raw  # the old top-level layout kept: these records have no spec
    assert record.status == raw["status"]
    assert (
        record.knob("tp") == raw["layout"]["tp"] and record.knob("world_size") == raw["layout"]["world_size"]
    )
    assert record.knob("model") == raw["config"]["model"]["name"] == "qwen3_vl_30b_a3b"
    assert record.knob("data") == raw["data"]["kind"] and record.knob("engine") == raw["engine"]
    assert record.knob("mbs") == raw["config"]["mbs"] and record.knob("precision") is None
    assert row_of(path, record)["model"] == raw["config"]["model"]["name"]
    if raw["status"] == "failed":
        assert record.failure == Failure("oom", raw["failure"]["message"], None, raw["failure"]["log_tail"])
        assert record.reason() == f"oom: {raw['failure']['message']}"
    if raw["status"] == "rejected":
        assert record.error_codes() == [f["code"] for f in raw["findings"] if f["level"] == "error"] != []


def test_a_new_record_keeps_the_layout_as_a_view_of_the_spec_and_round_trips() -> None:
    cfg = compose_cfg(*GB200, "parallelism=3d", "tp=2", "pp=2")
    spec = RunSpec.from_config(cfg)
    steps = step_records(spec, [2.0] * spec.train_iters, sequences_per_rank=8)
    record = RunRecord.completed(
        spec, resolved_config(cfg), summarize(steps, spec), data_stats={"images": 3}, bridge={"x": 1}
    )
    written = record.to_json()
    assert written["layout"] == {k: getattr(spec.layout, k) for k in written["layout"]}
    assert written["layout"]["tp"] == 2 and written["spec"]["layout"]["tp"] == 2
    assert written["data"] == {"kind": "synthetic", "routing": "real", "stats": {"images": 3}}
    assert written["bridge"] == {"x": 1} and written["summary"]["steady_steps"] == [3, 8]
    again = RunRecord.from_json(json.loads(json.dumps(written)))
    assert again == record and "layout" not in again.sections  # derived, not stored twice
    assert (again.knob("tp"), again.knob("pp"), again.knob("parallelism")) == (2, 2, "3d")


def test_rejected_failed_and_launch_constructors() -> None:
    cfg = compose_cfg(*GB200, "dispatcher=deepep")
    spec = RunSpec.from_config(cfg)
    findings = validate(spec)
    rejected = RunRecord.rejected(spec, resolved_config(cfg), findings)
    assert rejected.status == RunStatus.rejected and rejected.failure is None
    assert rejected.error_codes() == [f.code for f in errors(findings)] != []
    assert rejected.to_json()["findings"] == [f.to_dict() for f in findings]

    invalid = RunRecord.rejected(spec, resolved_config(cfg), invalid="data.path=/x: no shards")
    assert invalid.to_json()["failure"] == {"class": "invalid", "message": "data.path=/x: no shards"}
    assert "findings" not in invalid.to_json()

    failed = RunRecord.failed(spec, resolved_config(cfg)).with_launch({"restarts": 1, "host": "a"})
    assert failed.summary is None and "summary" not in failed.to_json()  # no steps finished
    classified = failed.with_failure(
        Failure("nccl", "the job failed in a collective", "NCCL error"), {"host": "b"}
    )
    assert classified.status == "failed" and classified.launch == {"restarts": 1, "host": "b"}
    assert classified.to_json()["failure"] == {
        "class": "nccl", "message": "the job failed in a collective", "evidence": "NCCL error"
    }  # fmt: skip


def test_every_config_group_has_its_identity_field_and_a_place_on_the_run_spec() -> None:
    hints = {f.name: f.type for f in fields(TrainConfig)}
    assert {"model", "parallelism", "data", "vision_freeze", "router", "precision"} <= set(GROUPS)
    spec = compose_spec([*GB200, "parallelism=3d", "tp=2"])
    picked = choices(spec)
    assert set(picked) == set(GROUPS)
    assert (
        picked["parallelism"] == "3d" and picked["data"] == "synthetic" and picked["vision_freeze"] == "none"
    )
    for group in GROUPS:
        assert group in hints and identity_field(group)  # a TrainConfig group, named by one field
    # Every group knob of the report reads the group's identity field.
    for knob, paths in KNOBS.items():
        if knob in GROUPS and knob != "precision":
            assert paths[-1] == ("config", knob, identity_field(knob))


def test_overrides_rebuild_the_run_from_its_config() -> None:
    """A record without .hydra/overrides.yaml (advise's fallback): its overrides compose to the
    same choices and numbers."""
    given = [
        *GB200, "parallelism=3d", "tp=2", "pp=2", "recompute=selective", "router=forced_balance",
        "precision=fp8mx", "vision_freeze=vision", "data=mock", "mbs=2", "gbs=64", "seq_length=2048",
    ]  # fmt: skip
    cfg = compose_cfg(*given)
    spec = RunSpec.from_config(cfg)
    record = RunRecord.new(spec, resolved_config(cfg), RunStatus.completed)
    rebuilt = compose_spec(record.overrides())
    assert choices(rebuilt) == choices(spec)
    assert (rebuilt.layout, rebuilt.mbs, rebuilt.gbs, rebuilt.seq_length) == (
        spec.layout, spec.mbs, spec.gbs, spec.seq_length
    )  # fmt: skip
    assert "router=forced_balance" in record.overrides() and "engine=auto" not in record.overrides()


def test_overrides_rebuild_a_card_row_with_its_published_figure() -> None:
    cfg = compose_cfg("card=qwen3_next_35b_gb200", "gbs=2048")
    spec = RunSpec.from_config(cfg)
    record = RunRecord.new(spec, resolved_config(cfg), RunStatus.completed)
    assert record.overrides()[0] == "card=qwen3_next_35b_gb200"
    rebuilt = compose_spec(record.overrides())
    assert rebuilt.card == spec.card and (rebuilt.layout, rebuilt.gbs) == (spec.layout, 2048)
