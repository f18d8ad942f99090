"""The skill card's rows as sweep presets (sweeps/card_*.yaml).

Each preset is read the way `python train.py -m sweep=NAME` reads it (Hydra composes the `sweep`
group; the planning sweeper takes `hydra.sweeper.params`), composed into a RunSpec on its own
cluster and validated: no error finding. The rows that cannot run as written are composed as
written too, and the rules the preset's comment names must reject them, so each "cannot run as
written" claim is checked, not asserted.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from omegaconf import OmegaConf

from moe_vlm.compose import compose_config
from moe_vlm.memory import estimate
from moe_vlm.rules import errors, validate
from moe_vlm.spec import RunSpec
from tests.conftest import REPO, make_spec


@dataclass(frozen=True)
class Row:
    """A card row: the layout and knobs it states, and what the preset must reproduce."""

    model: str
    cluster: str
    world_size: int
    family: str
    ep: int
    etp: int
    dp: int
    dispatcher: str
    recompute: str
    cuda_graph: str
    mbs: int
    gbs: int
    vision_frozen: bool
    published: str  # the figure the preset's comment must state
    # Overrides of the row as written, where it cannot run, and the rules that reject it.
    as_written: tuple[str, ...] = ()
    rejected_by: frozenset[str] = frozenset()


ROWS = {
    "card_qwen3vl_235b_gb200_fsdp": Row(
        "qwen3_vl_235b_a22b", "gb200", 64, "fsdp", 64, 1, 64, "hybridep", "full", "none", 4, 256,
        False, "~470 TFLOP/s/GPU, ~19% MFU",
    ),
    "card_qwen3vl_235b_b200_fsdp": Row(
        "qwen3_vl_235b_a22b", "b200", 128, "fsdp", 8, 16, 128, "alltoall", "full", "none", 8, 1024,
        True, "~460 TFLOP/s/GPU, ~18% MFU",
    ),
    # As written: DP=8 (so TP=8, see the preset), full recompute with a TE graph of scope [mlp].
    "card_qwen3vl_235b_gb200_3d": Row(
        "qwen3_vl_235b_a22b", "gb200", 64, "3d", 8, 8, 8, "hybridep", "full", "none", 4, 1024,
        False, "~440 TFLOP/s/GPU, ~18% MFU",
        as_written=(
            "model=qwen3_vl_235b_a22b", "cluster=gb200", "nodes=16", "parallelism=3d", "tp=8", "ep=8",
            "etp=8", "parallelism.sequence_parallel=true", "dispatcher=hybridep", "recompute=full",
            "cuda_graph=te_moe", "cuda_graph.scope=[mlp]", "mbs=4", "gbs=1024", "seq_length=4096",
        ),
        rejected_by=frozenset({"G006", "G007"}),
    ),
    "card_qwen35_35b_gb200": Row(
        "qwen35_vl_35b_a3b", "gb200", 32, "fsdp", 8, 1, 32, "hybridep", "none", "none", 2, 4096,
        False, "~260 TFLOP/s/GPU",
        as_written=(
            "model=qwen35_vl_35b_a3b", "cluster=gb200", "nodes=8", "parallelism=fsdp", "ep=8", "vp=4",
            "dispatcher=hybridep", "recompute=none", "cuda_graph=te_attn_moe", "mbs=16", "gbs=4096",
            "seq_length=4096",
        ),
        rejected_by=frozenset({"L008", "F005", "M001"}),
    ),
}  # fmt: skip


def preset_params(name: str) -> dict[str, str]:
    """`sweep=NAME` through Hydra: the axes the planning sweeper reads."""
    cfg = compose_config([f"sweep={name}"], hydra_node=True)
    params = OmegaConf.to_container(cfg.hydra.sweeper.params)
    assert isinstance(params, dict)
    return {str(k): str(v) for k, v in params.items()}


def preset_spec(name: str) -> RunSpec:
    params = preset_params(name)
    assert not any("," in value for value in params.values()), "a card row is one point"
    return make_spec(*(f"{key}={value}" for key, value in params.items()))


def test_every_card_preset_has_a_row() -> None:
    found = sorted(path.stem for path in (REPO / "sweeps").glob("card_*.yaml"))
    assert found == sorted(ROWS)


@pytest.mark.parametrize("name", sorted(ROWS))
def test_card_preset_validates_on_its_cluster(name: str) -> None:
    spec = preset_spec(name)
    findings = validate(spec)
    assert not errors(findings), [f.line() for f in errors(findings)]
    assert estimate(spec).fits
    assert spec.engine == "megatron"


@pytest.mark.parametrize("name", sorted(ROWS))
def test_card_preset_reproduces_the_row(name: str) -> None:
    row, spec = ROWS[name], preset_spec(name)
    lay = spec.layout
    assert (spec.model.name, spec.cluster.name, lay.world_size) == (row.model, row.cluster, row.world_size)
    assert (spec.family.value, lay.ep, lay.etp, lay.dp) == (row.family, row.ep, row.etp, row.dp)
    assert (spec.dispatcher.name, spec.recompute.name, spec.cuda_graph.name) == (
        row.dispatcher,
        row.recompute,
        row.cuda_graph,
    )
    assert (spec.mbs, spec.gbs) == (row.mbs, row.gbs)
    assert (spec.freeze.vision and spec.freeze.projector) is row.vision_frozen
    # The acceptance gate's window: steps 41-50.
    assert (spec.train_iters, spec.warmup_steps) == (50, 40)
    text = (REPO / "sweeps" / f"{name}.yaml").read_text()
    assert f"Published: {row.published}" in text


@pytest.mark.parametrize("name", sorted(n for n, row in ROWS.items() if row.as_written))
def test_rows_that_cannot_run_as_written_are_rejected_by_the_named_rules(name: str) -> None:
    row = ROWS[name]
    rejected = {f.code for f in errors(validate(make_spec(*row.as_written)))}
    assert row.rejected_by <= rejected, rejected
    text = (REPO / "sweeps" / f"{name}.yaml").read_text()
    assert "CANNOT RUN AS WRITTEN" in text
    for code in row.rejected_by:
        assert f"rule {code}" in text, f"{name}.yaml does not name rule {code}"


def test_runnable_rows_say_so() -> None:
    for name, row in ROWS.items():
        if not row.as_written:
            assert "Runs as written." in (REPO / "sweeps" / f"{name}.yaml").read_text(), name
