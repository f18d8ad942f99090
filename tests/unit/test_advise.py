"""`moe-vlm advise` before any run and on a recorded sweep with known right answers.

tests/fixtures/advise/gb200_30b_sweep holds hand-made run.json records (the record/records.py format)
of a Qwen3-VL-30B-A3B sweep on 2 GB200 nodes submitted through hydra/launcher=slurm_gb200, each
with the .hydra/overrides.yaml Hydra writes and the point.json the sweeper writes (its
`launcher_overrides` name the launcher):

    p01 mock data, full recompute, MBS 1             -> "mock data used as evidence": its realistic twin
                                                        p02 was measured: compare them (report --diff)
    p02-p04 synthetic, full recompute, MBS 1/2/4     -> tokens/s 4000 -> 5200 -> 6100: "MBS still rising";
            peaks 41 / 58 / 92 GiB of 185            -> "full recompute with headroom" (MBS 2 is the
                                                        fastest full run whose selective variant fits)
    p05 synthetic, selective, vision encoder 55%     -> "vision encoder dominates the step"
    p06 3D EP4 x ETP2                                -> "ETP in use where EP alone fits": ep=8 etp=1
    p07 no recompute, MBS 8, failed OOM              -> "out of memory" with the change the estimate fits
    p08 rejected (DeepEP on GB200)                   -> counted, no suggestion
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from moe_vlm.cli.advise import compose_spec, main
from moe_vlm.cli.main import main as cli_main
from moe_vlm.config.compose import compose_point
from moe_vlm.perf.memory import estimate
from moe_vlm.predict.model import predict
from moe_vlm.rules import errors, validate

SWEEP = Path(__file__).resolve().parent.parent / "fixtures" / "advise" / "gb200_30b_sweep"
# Where the sweep ran: its launcher, cluster, model, nodes and train_iters stay in every suggestion.
RUN_WHERE = "model=qwen3_vl_30b_a3b cluster=gb200 nodes=2 train_iters=50 dispatcher=hybridep"
BASE = f"python train.py -m hydra/launcher=slurm_gb200 {RUN_WHERE}"


def advise(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def commands(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip().startswith("python train.py ")]


def test_sweep_suggestions_are_the_known_right_answers(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = advise(capsys, f"sweep={SWEEP}")
    assert code == 0
    assert "(8 runs: 6 completed, 1 failed, 1 rejected)" in out
    found = commands(out)
    expected = [
        # vision encoder at 55%: freeze it for decoder-focused tuning, or raise MBS carefully
        f"{BASE} data=synthetic recompute=selective mbs=1 vision_freeze=vision",
        f"{BASE} data=synthetic recompute=selective mbs=2",
        # full recompute at 58 GiB of 185 with MBS 2: relax to selective
        f"{BASE} data=synthetic mbs=2 recompute=selective",
        # ETP 2 where EP 8 alone fits
        f"{BASE} data=synthetic recompute=selective mbs=1 parallelism=3d ep=8 etp=1",
        # 4000 -> 5200 -> 6100 tokens/s: MBS still rising, 8 predicted to fit
        f"{BASE} data=synthetic recompute=full mbs=8",
    ]
    for line in expected:
        assert line in found, f"missing suggestion: {line}\n{out}"
    # mock -> the same point on realistic images was measured (p02): compare, never rerun it.
    assert f"moe-vlm report --diff {SWEEP / 'p02_full_mbs1'} {SWEEP / 'p01_mock_full_mbs1'}" in out
    assert f"{BASE} recompute=full mbs=1 data=synthetic" not in found
    # The mock run is not evidence for relaxing recompute, and MBS 4's selective variant does not fit.
    assert f"{BASE} data=mock mbs=1 recompute=selective" not in found
    assert f"{BASE} data=synthetic mbs=4 recompute=selective" not in found
    assert "[out of memory]" in out and "recompute=none mbs=8` ran out of memory" in out
    topics = [line.split("]")[0] for line in out.splitlines() if line[:1].isdigit()]
    assert topics[0].endswith("[mock data used as evidence"), "mock evidence is flagged first"


def test_every_sweep_suggestion_is_a_valid_fitting_run(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = advise(capsys, f"sweep={SWEEP}")
    for line in commands(out):
        for point in sweep_points(line):
            spec = compose_spec(point)
            assert not errors(validate(spec)), line
            assert estimate(spec).fits, line


def test_an_in_process_sweep_gets_in_process_commands(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # No launcher recorded (no point.json, no .hydra/hydra.yaml): the sweep ran in this process.
    sweep = tmp_path / "sweep"
    shutil.copytree(SWEEP, sweep)
    for point in sweep.glob("*/point.json"):
        point.unlink()
    _, out, _ = advise(capsys, f"sweep={sweep}")
    found = commands(out)
    assert f"python train.py {RUN_WHERE} data=synthetic recompute=full mbs=8" in found
    assert not any(" -m " in line or "hydra/launcher" in line for line in found)


def test_the_launcher_is_read_from_hydras_saved_config_without_a_point_json(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    sweep = tmp_path / "sweep"
    shutil.copytree(SWEEP, sweep)
    for point in sweep.glob("*/point.json"):
        point.unlink()
        hydra_overrides = [
            "hydra/launcher=slurm_gb200",
            "hydra.launcher.partition=gb200",
            f"hydra.sweep.dir={sweep}",
            f"hydra.sweep.subdir={point.parent.name}",
            "hydra.mode=MULTIRUN",
        ]
        (point.parent / ".hydra" / "hydra.yaml").write_text(
            json.dumps({"hydra": {"overrides": {"hydra": hydra_overrides, "task": []}}})
        )
    _, out, _ = advise(capsys, f"sweep={sweep}")
    launcher = "python train.py -m hydra/launcher=slurm_gb200 hydra.launcher.partition=gb200 "
    assert commands(out) and all(line.startswith(launcher + RUN_WHERE) for line in commands(out))
    assert "hydra.sweep" not in out


def write_point(sweep: Path, name: str, overrides: list[str], tokens_per_s: float) -> None:
    """A completed point as a Slurm sweep leaves it: run.json, .hydra/overrides.yaml, point.json."""
    point = sweep / name
    (point / ".hydra").mkdir(parents=True)
    (point / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    record = {
        "schema_version": 1,
        "status": "completed",
        "point_id": name,
        "config": compose_point(overrides).config,
        "data": {"kind": "synthetic"},
        "summary": {"effective_tokens_per_s_per_gpu": tokens_per_s, "peak_memory_gib": 1.0},
    }
    (point / "run.json").write_text(json.dumps(record))
    launcher = {
        "overrides": overrides,
        "launcher_overrides": ["hydra/launcher=slurm", "hydra.launcher.qos=high"],
    }
    (point / "point.json").write_text(json.dumps(launcher))


def test_a_rising_mbs_axis_is_extended_as_a_sweep_on_the_sweeps_launcher(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    sweep = tmp_path / "sweep"
    common = ["cluster=local", "train_iters=20", "recompute=selective"]
    for mbs, rate in ((1, 100.0), (2, 150.0), (4, 210.0)):
        write_point(sweep, f"p{mbs}", [*common, f"mbs={mbs}"], rate)
    _, out, _ = advise(capsys, f"sweep={sweep}")
    assert "[MBS still rising]" in out and "MBS 8 and 16 predicted to fit" in out
    expected = (
        "python train.py -m hydra/launcher=slurm hydra.launcher.qos=high model=tiny_moe_vlm nodes=1 "
        "cluster=local train_iters=20 recompute=selective mbs=8,16"
    )
    assert expected in commands(out), out


def test_bring_up_on_gb200_starts_on_fsdp_with_full_recompute(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = advise(capsys, "model=qwen3_vl_235b_a22b", "cluster=gb200", "nodes=16", "goal=bring-up")
    assert code == 0
    assert "family: FSDP" in out and "get a reliable run on FSDP first" in out
    start = commands(out)[0]
    overrides = shlex.split(start)[2:]
    for expected in ("parallelism=fsdp", "dispatcher=hybridep", "recompute=full", "cuda_graph=none", "mbs=1"):
        assert expected in overrides, start
    spec = compose_spec(overrides)
    assert not errors(validate(spec)) and estimate(spec).fits
    assert spec.layout.ep == 64 and spec.layout.etp == 1
    assert "next, once stable on FSDP (3D candidate)" in out and "sweep=mbs_recompute" in out


def test_advise_quotes_the_plans_own_prediction(capsys: pytest.CaptureFixture[str]) -> None:
    """advise's words come from the numbers the plan shows: the start's predicted MFU is the
    plan's, and no utilisation is promised beside it ("high-teens % MFU" against a 6 % plan)."""
    code, out, _ = advise(capsys, "model=qwen3_vl_30b_a3b", "cluster=gb200", "nodes=2")
    assert code == 0 and "teens" not in out
    found = predict(compose_spec(shlex.split(commands(out)[0])[2:]))
    assert found.mfu is not None and f"predicted step {found.step_time_s:.3g} s, MFU {found.mfu:.1%}" in out


def test_peak_throughput_on_b200_uses_selective_and_narrow_graphs(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = advise(capsys, "model=qwen3_vl_30b_a3b", "cluster=b200", "goal=peak-throughput")
    assert code == 0
    assert "B200: FSDP works but is more sensitive to the recompute choice" in out
    overrides = shlex.split(commands(out)[0])[2:]
    for expected in ("dispatcher=alltoall", "recompute=selective", "cuda_graph=te_moe", "data=synthetic"):
        assert expected in overrides
    spec = compose_spec(overrides)
    assert not errors(validate(spec))
    found = estimate(spec)
    assert found.headroom_fraction is not None and found.headroom_fraction >= 0.10


def test_local_cpu_start_uses_the_torch_engine_settings(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = advise(capsys, "goal=bring-up")
    assert code == 0
    overrides = shlex.split(commands(out)[0])[2:]
    assert {"dispatcher=alltoall", "cuda_graph=none", "parallelism=fsdp"} <= set(overrides)
    assert not errors(validate(compose_spec(overrides)))


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["goal=fastest"], "goal=fastest: not one of bring-up, peak-throughput"),
        (["sweep=/nonexistent/moe_vlm_sweep"], "sweep=/nonexistent/moe_vlm_sweep: no such directory"),
        (["model=gpt5"], "model=gpt5: no such option"),
        (["mbs=1,2"], "advise takes one configuration"),
        (["sweep="], "sweep=: no path given"),
        (["sweep=/nonexistent/moe_vlm_sweep", "goal=bring-up"], "no such directory"),
        (["model=qwen3_vl_30b_a3b", "cluster=gb200", "nodes=0"], "nodes=0 must be a positive integer"),
        (["cluster=gb200", "mbs=-1"], "mbs=-1 must be a positive integer"),
        (["cluster=gb200", "tp=0"], "tp=0 must be a positive integer"),
        (["cluster=gb200", "ep=-2"], "ep=-2 must be >= 0"),
        (["gbs=0"], "gbs=0 must be a positive integer"),
        (["mbs=[1,2"], "cannot parse this override"),
        (["mbs='a"], "cannot parse this override"),
        (["=1"], "cannot parse this override (no key"),
        (["mbs=abc"], "mbs: Value 'abc'"),
        (["bring-up"], "not a key=value override"),
        ([f"sweep={SWEEP}", "mbs=2"], "with sweep=PATH the configurations come from"),
    ],
)
def test_bad_input_is_one_line_exit_2(
    capsys: pytest.CaptureFixture[str], argv: list[str], fragment: str
) -> None:
    code, out, err = advise(capsys, *argv)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and fragment in err and "Fix:" in err


def test_cli_dispatches_advise(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["advise", "goal=nope"]) == 2
    assert "goal=nope" in capsys.readouterr().err


# --- the per-platform playbooks (moe_vlm/cli/advise/playbook.py) -------------------------------------


def playbook_section(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    code, out, _ = advise(capsys, *argv)
    assert code == 0
    return out.split("platform playbook:", 1)[1]


def sweep_points(line: str) -> list[list[str]]:
    """Every point of a printed command (`-m` with `key=a,b` axes, or one run)."""
    args = shlex.split(line)[2:]
    points: list[list[str]] = [[]]
    for arg in args:
        if arg == "-m":
            continue
        key, value = arg.split("=", 1)
        values = value.split(",") if "," in value and not value.startswith("[") else [value]
        points = [[*p, f"{key}={v}"] for p in points for v in values]
    return points


@pytest.mark.parametrize(
    ("cluster", "model", "goal"),
    [
        ("gb300", "qwen3_vl_235b_a22b", "bring-up"),
        ("gb200", "qwen35_vl_35b_a3b", "bring-up"),
        ("b300", "qwen3_vl_30b_a3b", "peak-throughput"),
        ("b200", "qwen3_vl_30b_a3b", "bring-up"),
        ("h100", "qwen3_vl_30b_a3b", "bring-up"),
        ("h200", "qwen35_vl_35b_a3b", "peak-throughput"),
    ],
)
def test_playbook_commands_compose_and_validate(
    capsys: pytest.CaptureFixture[str], cluster: str, model: str, goal: str
) -> None:
    nodes = "16" if model == "qwen3_vl_235b_a22b" else "2"
    section = playbook_section(
        capsys, f"model={model}", f"cluster={cluster}", f"nodes={nodes}", f"goal={goal}"
    )
    lines = [line.strip() for line in section.splitlines()]
    found = [line for line in lines if line.startswith("python train.py ")]
    assert found, section
    for line in found:
        for point in sweep_points(line):
            spec = compose_spec(point)
            assert spec.cluster.name == cluster
            assert not errors(validate(spec)), (point, [f.line() for f in errors(validate(spec))])
    # Every piece of advice and every variable names its source.
    advice = [line for line in section.splitlines() if line.startswith("  [")]
    topics = {a.split("]")[0] + "]" for a in advice}
    assert {"  [dispatcher]", "  [precision]", "  [CUDA graphs]", "  [environment]"} <= topics
    for line in advice:
        assert line.rstrip().endswith((")", ":")), line
    for line in section.splitlines():
        if line.startswith("    ") and "=" in line.split()[0] and not line.strip().startswith("python"):
            assert line.rstrip().endswith(")"), f"a variable without its source: {line}"


def test_gb300_playbook_never_offers_deepep_and_b300_does(capsys: pytest.CaptureFixture[str]) -> None:
    gb300 = playbook_section(capsys, "model=qwen3_vl_30b_a3b", "cluster=gb300", "nodes=2", "goal=bring-up")
    assert "DeepEP cannot run on GB200/GB300" in gb300 and "rule D001" in gb300
    assert not any("deepep" in line for line in commands(gb300))
    assert "set by Bridge's perf recipe qwen3_vl_30b_a3b_pretrain_8gpu_gb300_bf16_config" in gb300
    assert "NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN=8 " in gb300 and "NVLINK_DOMAIN_SIZE=72 " in gb300
    b300 = playbook_section(capsys, "model=qwen3_vl_30b_a3b", "cluster=b300", "nodes=2", "goal=bring-up")
    assert "B300: no playbook of its own" in b300
    ab = [line for line in commands(b300) if "dispatcher=alltoall,deepep,hybridep" in line]
    assert ab and ab[0].startswith("python train.py -m ")
    # Qwen3-VL on B300 runs B200's perf recipe (B300 has none): B300's own affinity setting is the user's.
    recommended = b300.split("[environment] recommended", 1)[1]
    assert "not set by qwen3_vl_30b_a3b_pretrain_8gpu_b200_bf16_config" in recommended
    assert "NCCL_IGNORE_CPU_AFFINITY=1" in recommended
    assert "CUDA_DEVICE_MAX_CONNECTIONS=32" not in recommended
    qwen35 = playbook_section(capsys, "model=qwen35_vl_35b_a3b", "cluster=b300", "nodes=2", "goal=bring-up")
    assert "NCCL_IGNORE_CPU_AFFINITY=1" not in qwen35.split("[environment] recommended", 1)[1]


def test_graph_advice_on_fsdp_names_the_rule_or_uses_the_3d_candidate(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Megatron FSDP and TE graphs do not mix (F005). With a 3D candidate the advice is its own:
    section = playbook_section(
        capsys, "model=qwen3_vl_235b_a22b", "cluster=gb300", "nodes=16", "goal=bring-up"
    )
    graphs = section.split("[CUDA graphs] Qwen3-VL", 1)[1].splitlines()[1].strip()
    assert graphs == "(the 3D candidate already has cuda_graph=te_moe recompute=selective)", graphs
    # On 16 GB200 nodes the 3D candidate fits only with full recompute and no graphs: the rules that
    # block the advice on each base are named.
    section = playbook_section(
        capsys, "model=qwen3_vl_235b_a22b", "cluster=gb200", "nodes=16", "goal=bring-up"
    )
    graphs = section.split("[CUDA graphs] Qwen3-VL", 1)[1].splitlines()[1].strip()
    assert graphs.startswith("not runnable from the start above: F005:"), graphs
    assert "; nor from the 3D candidate: M001:" in graphs, graphs


def test_no_playbook_on_the_local_cpu(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = advise(capsys, "goal=bring-up")
    assert code == 0 and "platform playbook" not in out


@pytest.mark.slow
@pytest.mark.parametrize("argv", [["nodes=0"], ["mbs=[1,2"], ["sweep="], ["seq_length=-5", "cluster=b200"]])
def test_bad_input_through_the_command_is_one_line_exit_2(argv: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "moe_vlm.cli.main", "advise", *argv],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2 and done.stdout == "", done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith("moe-vlm advise: error: ") and "Fix:" in done.stderr


def test_a_measured_point_is_never_suggested_again(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # MBS 1, 2, 4 rising; MBS 8 (what the advisor would propose next) is already in the sweep but
    # slower; the axis keeps only MBS 16, the one point not measured.
    sweep = tmp_path / "sweep"
    common = ["cluster=local", "train_iters=20", "recompute=selective"]
    for mbs, rate in ((1, 100.0), (2, 150.0), (4, 210.0)):
        write_point(sweep, f"p{mbs}", [*common, f"mbs={mbs}"], rate)
    write_point(sweep, "p8", [*common, "mbs=8"], 0.0)
    record = json.loads((sweep / "p8" / "run.json").read_text())
    (sweep / "p8" / "run.json").write_text(json.dumps({**record, "status": "failed", "summary": None}))
    _, out, _ = advise(capsys, f"sweep={sweep}")
    found = commands(out)
    assert not any(line.endswith(("mbs=8", "mbs=8,16")) for line in found), out
    assert any(line.endswith("recompute=selective mbs=16") for line in found), out
    for line in found:
        for point in sweep_points(line):
            assert point[-1] not in ("mbs=1", "mbs=2", "mbs=4", "mbs=8") or "recompute=selective" not in point


def test_differences_inside_the_runs_own_noise_are_said_and_not_chased(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    sweep = tmp_path / "sweep"
    common = ["cluster=local", "train_iters=20", "recompute=selective"]
    for mbs, rate in ((1, 100.0), (2, 104.0)):
        write_point(sweep, f"p{mbs}", [*common, f"mbs={mbs}"], rate)
        path = sweep / f"p{mbs}" / "run.json"
        record = json.loads(path.read_text())
        record["summary"]["step_time_s"] = {"p10": 0.9, "p50": 1.0, "p90": 1.2}  # a wide CPU spread
        path.write_text(json.dumps(record))
    _, out, _ = advise(capsys, f"sweep={sweep}")
    assert "inside the noise: the fastest run `" in out and "mbs=2` 104 (87-116)" in out
    assert "[MBS still rising]" not in out
