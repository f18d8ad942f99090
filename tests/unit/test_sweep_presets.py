"""The skill card's rows: `card=<row>` options (conf/card/) and their `sweep=card_*` presets.

Each preset is read the way `python train.py -m sweep=NAME` reads it (Hydra composes the `sweep`
group; the planning sweeper takes `hydra.sweeper.params`), composed into a RunSpec on its own
cluster and validated: no error finding. ROWS restates what the card's row says, independently
of the option, so an option that drifts from its row fails here. Every difference from the row as
written carries a reason, and setting the knob back as written fires the rule the reason names, so
each "cannot run as written" claim is checked, not asserted.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
from omegaconf import OmegaConf

from moe_vlm.config.compose import compose_config
from moe_vlm.config.spec import RunSpec
from moe_vlm.knobs.cards import GIVEN, card_changes, card_row, plan_lines, row_as_run
from moe_vlm.perf.memory import estimate
from moe_vlm.record.columns import identity_field
from moe_vlm.report import card as report_card
from moe_vlm.report.table import load_table
from moe_vlm.rules import errors, validate
from tests.conftest import REPO, make_spec
from tests.unit.test_report import run_report, write_run


@dataclass(frozen=True)
class Row:
    """A card row as the card states it (shared/reference/sister-skills.md section 1)."""

    model: str
    cluster: str
    world_size: int
    family: str
    ep: int
    etp: int
    dp: int
    dispatcher: str
    recompute: str
    mbs: int
    gbs: int
    vision_frozen: bool
    published_tflops: float
    published_mfu: float | None
    # Changed from the row, where it cannot run as written: knob -> (the row's value, the rules that
    # reject it).
    rejected_by: dict[str, tuple[object, frozenset[str]]] | None = None


ROWS = {
    "card_qwen3vl_235b_gb200_fsdp": (
        "qwen3_vl_fsdp_gb200",
        Row("qwen3_vl_235b_a22b", "gb200", 64, "fsdp", 64, 1, 64, "hybridep", "full", 4, 256, False, 470, 0.19),
    ),
    "card_qwen3vl_235b_b200_fsdp": (
        "qwen3_vl_fsdp_b200",
        Row("qwen3_vl_235b_a22b", "b200", 128, "fsdp", 8, 16, 128, "alltoall", "full", 8, 1024, True, 460, 0.18),
    ),
    # DP=8 on 64 GPUs, so TP=8 (assumed, see the option); graph scope `mlp` with full recompute.
    "card_qwen3vl_235b_gb200_3d": (
        "qwen3_vl_3d_gb200",
        Row("qwen3_vl_235b_a22b", "gb200", 64, "3d", 8, 8, 8, "hybridep", "full", 4, 1024, False, 440, 0.18,
            rejected_by={"cuda_graph.name": ("TE scope mlp (no option expresses it)", frozenset({"G006", "G007"}))}),
    ),
    "card_qwen35_35b_gb200": (
        "qwen3_next_35b_gb200",
        Row("qwen35_vl_35b_a3b", "gb200", 32, "fsdp", 8, 1, 32, "hybridep", "none", 16, 4096, False, 260, None,
            rejected_by={"parallelism.vp": (4, frozenset({"L008"})), "cuda_graph.name": ("te_attn_moe", frozenset({"F005"}))}),
    ),
}  # fmt: skip
# The 3D row's graph scope as written has no option; these overrides express it.
MLP_SCOPE = ("cuda_graph=te_moe", "cuda_graph.scope=[mlp]")


def preset_params(name: str) -> dict[str, str]:
    """`sweep=NAME` through Hydra: the axes the planning sweeper reads."""
    cfg = compose_config([f"sweep={name}"], hydra_node=True)
    params = OmegaConf.to_container(cfg.hydra.sweeper.params)
    assert isinstance(params, dict)
    return {str(k): str(v) for k, v in params.items()}


def preset_spec(name: str, *more: str) -> RunSpec:
    params = preset_params(name)
    assert not any("," in value for value in params.values()), "a card row is one point"
    return make_spec(*(f"{key}={value}" for key, value in params.items()), *more)


def override_of(key: str, value: object) -> str:
    """The command-line override that sets a card knob (dotted key as conf/card/ writes it)."""
    group, _, leaf = key.partition(".")
    if leaf == identity_field(group):
        return f"{group}={value}"
    if group == "parallelism" and leaf in ("tp", "pp", "vp", "cp", "ep", "etp"):
        return f"{leaf}={value}"
    return f"{key}={value}"


def test_every_card_preset_has_a_row_and_every_option_a_preset() -> None:
    assert sorted(p.stem for p in (REPO / "sweeps").glob("card_*.yaml")) == sorted(ROWS)
    assert sorted(p.stem for p in (REPO / "conf" / "card").glob("*.yaml")) == sorted(
        r for r, _ in ROWS.values()
    )
    for name, (row_key, _) in ROWS.items():
        assert preset_params(name) == {"card": row_key}


@pytest.mark.parametrize("name", sorted(ROWS))
def test_card_preset_validates_on_its_cluster(name: str) -> None:
    spec = preset_spec(name)
    findings = validate(spec)
    assert not errors(findings), [f.line() for f in errors(findings)]
    # Our estimate may disagree with a row that ran: a warning naming the terms, never a rejection.
    assert estimate(spec).fits or "M003" in {f.code for f in findings}
    assert spec.engine == "megatron" and row_as_run(spec)


@pytest.mark.parametrize("name", sorted(ROWS))
def test_card_option_reproduces_the_row(name: str) -> None:
    row_key, row = ROWS[name]
    spec = preset_spec(name)
    lay = spec.layout
    assert card_row(spec) == row_key
    assert (spec.model.name, spec.cluster.name, lay.world_size) == (row.model, row.cluster, row.world_size)
    assert (spec.family.value, lay.ep, lay.etp, lay.dp) == (row.family, row.ep, row.etp, row.dp)
    assert (spec.dispatcher.name, spec.recompute.name, spec.mbs, spec.gbs) == (
        row.dispatcher,
        row.recompute,
        row.mbs,
        row.gbs,
    )
    assert (spec.freeze.vision and spec.freeze.projector) is row.vision_frozen
    assert (spec.card.published_tflops_per_gpu, spec.card.published_mfu) == (
        row.published_tflops,
        row.published_mfu,
    )
    assert spec.card.validated_on == "2026-04-01"
    # The workload the card's rows ran on, as far as it can be told; the window at steps 41-50.
    assert (spec.data.kind.value, spec.router.name, spec.seq_length) == (
        "bridge_mock",
        "forced_balance",
        4096,
    )
    assert (spec.train_iters, spec.warmup_steps) == (50, 40)
    assert {"data.kind", "router.name", "seq_length", "train_iters"} <= set(spec.card.assumed)
    assert not set(spec.card.assumed) & set(spec.card.as_written)


@pytest.mark.parametrize("name", sorted(ROWS))
def test_each_change_from_the_row_has_the_reason_the_rules_give(name: str) -> None:
    _, row = ROWS[name]
    spec = preset_spec(name)
    found = {c.knob: c for c in card_changes(spec)}
    assert set(found) == set(row.rejected_by or {})
    assert set(spec.card.reasons) == set(found), "a reason for a knob the run does not change"
    for knob, (as_written, codes) in (row.rejected_by or {}).items():
        change = found[knob]
        assert change.as_written == as_written and change.reason != GIVEN, change
        assert all(code in change.reason for code in codes), change
        # Set back as written, the knob is refused by exactly the rules the reason names.
        mlp = isinstance(change.as_written, str) and "mlp" in change.as_written
        back: tuple[str, ...] = MLP_SCOPE if mlp else (override_of(knob, change.as_written),)
        fired = {f.code for f in errors(validate(preset_spec(name, *back)))}
        assert codes <= fired, (knob, fired)


def test_a_knob_changed_by_hand_is_listed_and_loses_the_row_s_memory_pass() -> None:
    name = "card_qwen35_35b_gb200"
    as_run = {f.code for f in validate(preset_spec(name))}
    # The row ran at this size, and packed (the card's data.packing assumption, issue 32) it plans under
    # the GPU's memory: no memory finding at all.
    assert not {"M001", "M003"} & as_run
    spec = preset_spec(name, "mbs=128")
    (given,) = [c for c in card_changes(spec) if c.reason == GIVEN]
    assert (given.knob, given.as_written, given.run) == ("mbs", 16, 128)
    assert not row_as_run(spec) and "M001" in {f.code for f in errors(validate(spec))}


def test_the_plan_prints_the_row_its_figure_and_each_change_with_its_reason() -> None:
    text = "\n".join(plan_lines(preset_spec("card_qwen35_35b_gb200", "gbs=2048", "data=synthetic")))
    assert "card row       qwen3_next_35b_gb200 (moe-vlm-training/card.yaml)" in text
    assert "~260 TFLOP/s/GPU, no MFU given; validated_on 2026-04-01" in text
    assert "this run changes 3 knob(s)" in text and "L008: an interleaved schedule needs PP > 1" in text
    assert "parallelism.vp" in text and "F005" in text
    assert "gbs" in text and GIVEN in text  # gbs=2048 on the command line
    # What the card leaves unsaid, with the value this run has (data=synthetic on the command line).
    assert "not in the card, set here:" in text and "seq_length" in text
    assert [
        line for line in text.splitlines() if line.startswith("  data.kind") and "this run synthetic" in line
    ]
    assert plan_lines(make_spec()) == []


def test_the_report_puts_the_published_figure_beside_the_measured_ones(tmp_path: Path) -> None:
    card = ("card=qwen3_vl_fsdp_gb200", "train_iters=6", "warmup_steps=2")
    write_run(tmp_path / "card", card, 2.0, sequences_per_rank=4, peak_memory_gib=100.0)
    write_run(tmp_path / "plain", ("model=qwen3_vl_30b_a3b", "cluster=gb200", "train_iters=6"), 2.0,
              sequences_per_rank=4)  # fmt: skip
    table = load_table([str(tmp_path)])
    rows = table.set_index(table["run_dir"].map(lambda d: Path(d).name))
    assert (
        rows.loc["card", "card_row"] == "qwen3_vl_fsdp_gb200"
        and rows.loc["card", "published_tflops_per_gpu"] == 470
    )
    assert pd.isna(rows.loc["plain", "card_row"])
    code, out = run_report(str(tmp_path), "--out", str(tmp_path / "out"))
    assert code == 0 and report_card.TITLE in out
    report = (tmp_path / "out" / "report.md").read_text()
    section = report[report.index(report_card.TITLE) :].split("\n## ")[0]
    lines = [line for line in section.splitlines() if line.startswith("| ") and "qwen3_vl_fsdp_gb200" in line]
    measured = float(rows.loc["card", "tflops_per_gpu"])
    assert len(lines) == 1 and "| 470 | 2026-04-01 |" in lines[0] and f"{measured / 470:.2f}x" in lines[0], (
        lines
    )
