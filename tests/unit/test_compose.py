"""Every config group option composes; bad input fails in one line with exit 2 and writes nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from moe_vlm.rules import errors, validate
from tests.conftest import CONF, REPO, make_spec

GROUPS = ["model", "parallelism", "dispatcher", "recompute", "cuda_graph", "vision_freeze", "data", "cluster"]


def options(group: str) -> list[str]:
    return sorted(path.stem for path in (CONF / group).glob("*.yaml"))


@pytest.mark.parametrize("override", [f"{group}={option}" for group in GROUPS for option in options(group)])
def test_every_group_option_composes(override: str) -> None:
    spec = make_spec(override, "dry_run=true")
    group, option = override.split("=")
    name = {
        "parallelism": spec.family,
        "vision_freeze": spec.freeze.name,
        "data": spec.data.kind.value,
    }.get(group) or getattr(spec, group).name
    assert name == option


def test_every_group_has_its_options() -> None:
    assert options("model") == ["qwen35_vl_35b_a3b", "qwen3_vl_235b_a22b", "qwen3_vl_30b_a3b", "tiny_moe_vlm"]
    assert options("cuda_graph") == ["full_iteration", "none", "te_attn_moe", "te_moe"]
    assert options("cluster") == ["b200", "b300", "gb200", "gb300", "h100", "h200", "local"]
    assert options("dispatcher") == ["allgather", "alltoall", "deepep", "hybridep"]


def test_defaults_are_valid_as_typed() -> None:
    assert not errors(validate(make_spec()))


def test_issue_examples_are_valid_as_typed() -> None:
    fsdp = make_spec(
        "parallelism=fsdp", "dispatcher=hybridep", "cluster=gb200", "model=qwen3_vl_235b_a22b", "nodes=16"
    )
    three_d = make_spec(
        "parallelism=3d", "tp=1", "pp=4", "ep=8", "recompute=selective", "cuda_graph=te_moe",
        "cluster=b200", "nodes=8", "model=qwen3_vl_30b_a3b",
    )  # fmt: skip
    assert not errors(validate(fsdp)) and not errors(validate(three_d))
    assert fsdp.engine == three_d.engine == "megatron"


def test_derived_layout() -> None:
    spec = make_spec("parallelism=3d", "pp=4", "ep=8", "cluster=b200", "nodes=8", "model=qwen3_vl_30b_a3b")
    lay = spec.layout
    assert (lay.world_size, lay.dp, lay.expert_dp) == (64, 16, 2)
    assert spec.gbs == 512 and spec.accumulation_steps == 512 // (1 * 16)
    assert lay.ep_tp_inside_nvlink


def test_auto_ep_stays_inside_the_nvlink_domain() -> None:
    # 128 experts on 64 GB200s: one NVL72 domain holds all 64 ranks, so EP = 64.
    assert make_spec("cluster=gb200", "nodes=16", "model=qwen3_vl_235b_a22b").layout.ep == 64
    # On B200 the domain is one 8-GPU node, so EP stops at 8.
    assert make_spec("cluster=b200", "nodes=16", "model=qwen3_vl_235b_a22b").layout.ep == 8
    # The torch engine has no expert parallelism.
    assert make_spec().layout.ep == 1


def test_default_gbs_rounds_to_a_multiple_of_mbs_times_dp() -> None:
    spec = make_spec("mbs=3")  # tiny: default 4, DP=2 -> next multiple of 6 is 6
    assert spec.gbs == 6 and spec.gbs_is_default
    assert make_spec("gbs=8").gbs == 8


def test_shortcuts_override_the_group() -> None:
    spec = make_spec("parallelism=3d", "tp=2", "cluster=b200", "model=qwen3_vl_30b_a3b")
    assert spec.layout.tp == spec.parallelism.tp == 2


def train(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(REPO / "train.py"), *args], cwd=cwd, capture_output=True, text=True, timeout=120
    )


BAD_INPUT = {
    "unknown option": (["dispatcher=foo"], ["dispatcher=foo", "allgather, alltoall, deepep, hybridep"]),
    "unknown key": (["mbz=2"], ["mbz", "unknown key", "mbs"]),
    "unknown nested key": (["model.hidden=3"], ["model.hidden", "hidden_size"]),
    "wrong type": (["mbs=abc"], ["mbs", "Integer"]),
    "bad enum": (["engine=gpu"], ["engine", "auto, torch, megatron"]),
    "bad family": (["parallelism.family=2d"], ["parallelism.family", "fsdp, 3d"]),  # was rule C002
    "bad sweep value": (["-m", "mbs=1,x"], ["mbs", "Integer"]),
    "added key": (["+foo=1"], ["foo", "unknown key"]),
    "bad dry_run": (["dry_run=maybe"], ["dry_run='maybe'", "false, true, full"]),
    "bad dry_run in a sweep": (["-m", "dry_run=true,sometimes"], ["dry_run='sometimes'"]),
    "a sweep setting without -m": (["hydra.sweeper.search=halving"], ["hydra.sweeper.search", "no -m"]),
    "a routing load below one": (["router.assumed_load=0.5"], ["router.assumed_load=0.5", ">= 1", "Fix:"]),
    "zero size": (["mbs=0"], ["C001", "mbs"]),
    "negative size": (["nodes=-1"], ["C001", "nodes"]),
    # One error, not C001 and A006 (no image fits) for the same value; and returned, never looping.
    "zero seq_length": (["seq_length=0"], ["C001", "seq_length"]),
    "negative seq_length": (["seq_length=-8"], ["C001", "seq_length"]),
    "seq_length below one image": (["seq_length=10"], ["A006", "seq_length"]),
    # Two published configurations at once: the card's knobs silently replaced the recipe's.
    "recipe with card": (
        ["recipe=qwen3_vl_30b_a3b_pretrain_8gpu_gb200_bf16", "card=qwen3_vl_fsdp_gb200", "dry_run=true"],
        [
            "recipe=qwen3_vl_30b_a3b_pretrain_8gpu_gb200_bf16",
            "card=qwen3_vl_fsdp_gb200",
            "exclude each other",
        ],
    ),
    "a card preset with a recipe": (
        [
            "-m",
            "sweep=card_qwen3vl_235b_gb200_fsdp",
            "recipe=qwen3_vl_30b_a3b_pretrain_8gpu_gb200_bf16",
            "dry_run=true",
        ],
        ["card=qwen3_vl_fsdp_gb200", "exclude each other"],
    ),
    # A published fact typed over: the plan and the report showed it as the card's figure.
    "a published figure": (
        ["card=qwen3_vl_fsdp_gb200", "card.published_tflops_per_gpu=900", "dry_run=true"],
        ["card.published_tflops_per_gpu", "read-only", "conf/card/"],
    ),
    "a recipe's fact": (["recipe.module=elsewhere", "dry_run=true"], ["recipe.module", "read-only"]),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(BAD_INPUT))
def test_bad_input_is_one_line_exit_2(case: str, tmp_path: Path) -> None:
    args, needles = BAD_INPUT[case]
    done = train(*args, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    # A composition error is "moe_vlm: error: ..."; a rule's refusal "moe_vlm: rejected, nothing was
    # run: ERROR ...", one line per error (issue 49: A010's refusal took four).
    error_lines = [
        line
        for line in done.stderr.splitlines()
        if line.startswith(("moe_vlm: error", "ERROR", "moe_vlm: rejected"))
    ]
    assert len(error_lines) == 1, done.stderr
    for needle in needles:
        assert needle in error_lines[0]
    assert "Fix:" in error_lines[0]
    if not BAD_INPUT[case][1][0].startswith(("C001", "A006")):  # a rule's finding writes run.json
        # Composition errors are caught before Hydra creates any output directory.
        assert not any(tmp_path.iterdir())


@pytest.mark.slow
@pytest.mark.parametrize(
    "args",
    [
        ["seq_length=0"],
        ["seq_length=-8"],
        ["seq_length=10"],
        ["seq_length=10", "data.packing=in_batch"],
        ["mbs=0"],
    ],
)
def test_a_point_with_no_shape_stops_at_the_verdict(args: list[str], tmp_path: Path) -> None:
    # It looped forever (the micro-batch sampler redrew samples that never fit) or crashed
    # (mbs=0: ZeroDivisionError) while rendering the plan; train's timeout fails it rather than hang.
    done = train(*args, "dry_run=true", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert "not planned: the point has no shape to size" in done.stdout
    assert "micro-batch " not in done.stdout and "-- memory --" not in done.stdout
    assert next(line for line in done.stdout.splitlines() if line.startswith("INVALID: ")).startswith(
        "INVALID: 1 error(s)"
    )


@pytest.mark.slow
@pytest.mark.parametrize("group", ["recipe", "card", "sweep"])
def test_null_is_accepted_where_it_is_the_default(group: str, tmp_path: Path) -> None:
    # conf/train.yaml's defaults say `recipe: null`; typed, it was refused as "not an option name".
    done = train(f"{group}=null", "dry_run=true", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "VALID" in done.stdout
    # Where null is not the default (logger: none), it is still not an option.
    done = train("logger=null", "dry_run=true", cwd=tmp_path)
    assert done.returncode == 2 and "logger=null" in done.stderr and "mlflow, none" in done.stderr


@pytest.mark.slow
def test_dry_run_prints_the_plan(tmp_path: Path) -> None:
    done = train(
        "parallelism=fsdp", "dispatcher=hybridep", "cluster=gb200", "model=qwen3_vl_235b_a22b", "nodes=16",
        "dry_run=full", cwd=tmp_path,  # the whole plan: every Bridge field (dry_run=true: one screen)
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = done.stdout
    for needle in (
        "world size     64 = 16 node(s) x 4 rank(s)/node",
        "EP=64 (auto)",
        "inside the 72-GPU domain",
        "GBS=1024",
        "model.expert_model_parallel_size",
        "model.moe_flex_dispatcher_backend",
        "model.freeze_language_model",
        "ddp.use_megatron_fsdp",
        "VALID",
    ):
        assert needle in out


@pytest.mark.slow
def test_invalid_dry_run_exits_2_with_every_finding(tmp_path: Path) -> None:
    done = train("parallelism=3d", "tp=2", "dispatcher=deepep", "dry_run=true", cwd=tmp_path)
    assert done.returncode == 2
    for code in ("E001", "E002", "E003"):
        assert f"ERROR {code}" in done.stdout
    assert "INVALID: " in done.stdout


@pytest.mark.slow
def test_hydra_cfg_printing_still_works(tmp_path: Path) -> None:
    done = train("--cfg", "job", "model=qwen3_vl_30b_a3b", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "num_experts: 128" in done.stdout


# What Hydra's override grammar rejects, from its lexer (quotes, stray characters) and its parser
# (brackets, empty sweep values, functions), and keys it cannot read.
NASTY = [
    "mbs=[1,2",
    "mbs='a",
    "'=",
    'mbs="a',
    "mbs=1,,2",
    "mbs=1,2,",
    "mbs=}",
    "mbs=a]",
    "mbs=${",
    "a b=1",
    "mbs=range(1",
    "mbs=choice(",
    "=1",
    "~",
    "model=1",
    "model=[a",
]
MODES = {
    "run": ([], {}),
    "multirun": (["-m"], {}),
    # A login node whose site file names a launcher: the bare command becomes a one-point sweep.
    "bare entry": ([], {"MOE_VLM_GPUS_VISIBLE": "0"}),
}


@pytest.mark.slow
@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("override", NASTY)
def test_grammar_errors_are_one_line_exit_2(override: str, mode: str, tmp_path: Path) -> None:
    flags, env = MODES[mode]
    site = tmp_path / "site.yaml"
    site.write_text("cluster: gb200\nlauncher: slurm_gb200\n" if mode == "bare entry" else "")
    run_dir = tmp_path / "cwd"
    run_dir.mkdir()
    done = subprocess.run(
        [sys.executable, str(REPO / "train.py"), *flags, override, "dry_run=true"],
        cwd=run_dir,
        env={**os.environ, "MOE_VLM_SITE_FILE": str(site), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("moe_vlm: error: ") and "Fix:" in done.stderr
    assert not any(run_dir.iterdir())
