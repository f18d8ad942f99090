"""Slurm jobs derived from a point: resources, pyxis, --segment, site values, polling parsers."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from moe_vlm.base.errors import BadInput
from moe_vlm.config.schema import CONF_DIR
from moe_vlm.launch import slurm
from tests.conftest import make_spec

GB200 = slurm.SlurmSettings(
    expects_cluster="gb200", exclusive=True, mem_gb=0, cpus_per_task=36, segment="auto"
)
B200 = slurm.SlurmSettings(expects_cluster="b200", exclusive=True, mem_gb=0, cpus_per_task=14)


@pytest.fixture(autouse=True)
def no_site(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("MOE_VLM_SITE_FILE", "none")
    for key in ("ACCOUNT", "PARTITION", "QOS", "CONTAINER_IMAGE", "CONTAINER_MOUNTS"):
        monkeypatch.delenv(f"MOE_VLM_{key}", raising=False)


def params(settings: slurm.SlurmSettings, *overrides: str) -> dict:
    spec = make_spec(*overrides)
    return slurm.job_parameters(slurm.checked(settings, spec), spec)


def test_gb200_job_takes_gpus_per_node_from_the_cluster_and_stays_in_one_nvl72() -> None:
    p = params(GB200, "cluster=gb200", "model=qwen3_vl_30b_a3b", "nodes=4")
    assert (p["nodes"], p["ntasks_per_node"], p["gpus_per_node"]) == (4, 4, 4)
    assert p["exclusive"] is True and p["additional_parameters"]["mem"] == "0"
    assert p["additional_parameters"]["segment"] == 4
    # 36 nodes = 144 GPUs = two NVL72 domains: segments of 18 nodes each.
    assert (
        params(GB200, "cluster=gb200", "model=qwen3_vl_235b_a22b", "nodes=36")["additional_parameters"][
            "segment"
        ]
        == 18
    )


def test_b200_job_has_eight_tasks_per_node_and_no_segment() -> None:
    p = params(B200, "cluster=b200", "model=qwen3_vl_30b_a3b", "nodes=2")
    assert (p["nodes"], p["ntasks_per_node"], p["gpus_per_node"], p["cpus_per_task"]) == (2, 8, 8, 14)
    assert "segment" not in p["additional_parameters"]


def test_a_preset_for_another_cluster_is_refused_naming_every_preset() -> None:
    with pytest.raises(BadInput, match=r"cluster=gb200.*cluster=b200") as refused:
        params(GB200, "cluster=b200")
    files = sorted(p.stem for p in (CONF_DIR / "hydra" / "launcher").glob("*.yaml"))
    assert {"slurm_gb300", "slurm_b300", "local"} <= set(files)
    assert f"(presets: {', '.join(files)})" in str(refused.value)
    assert "pick hydra/launcher=slurm_b200 " in str(refused.value)
    with pytest.raises(BadInput, match=r"pick hydra/launcher=slurm \(presets"):
        params(GB200, "cluster=h100")  # no slurm_h100 preset: the generic one


def test_rendered_script_has_pyxis_signal_requeue_and_quoted_paths() -> None:
    settings = slurm.SlurmSettings(
        container_image="nvcr.io#nvidia/nemo:25.09",
        container_mounts=["/lustre:/lustre", "/data:/data:ro"],
        partition="batch",
        setup=["module load nccl"],
    )
    p = slurm.point_parameters(params(settings, "cluster=local"), Path("/sweeps/odd dir/abc"), "python3")
    script = slurm.render_sbatch(p, "/sweeps/odd dir/.submitit/%j", "python3")
    srun = slurm.srun_line(script)
    assert (
        "--container-image=nvcr.io#nvidia/nemo:25.09" in srun
        and "--container-mounts=/lustre:/lustre,/data:/data:ro" in srun
    )
    assert "--kill-on-bad-exit=1" in srun
    assert "#SBATCH --signal=USR2@120" in script and "#SBATCH --requeue" in script
    assert "#SBATCH --partition=batch" in script and "module load nccl" in script
    assert "moe_vlm_point='/sweeps/odd dir/abc'" in script  # quoted, never word-split
    assert 'scontrol requeue "$SLURM_JOB_ID"' in script and "moe_vlm.runtime.failures" in script


def test_site_values_come_from_env_then_file_and_explicit_values_win(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    site = tmp_path / "site.yaml"
    site.write_text(
        "account: file_acct\npartition: any\ngb200:\n  partition: gb200_part\n  container_image: img:1\n"
    )
    monkeypatch.setenv("MOE_VLM_SITE_FILE", str(site))
    monkeypatch.setenv("MOE_VLM_QOS", "env_qos")
    spec = make_spec("cluster=gb200")
    resolved = slurm.checked(slurm.SlurmSettings(account="cli_acct"), spec)
    assert (resolved.account, resolved.partition, resolved.qos, resolved.container_image) == (
        "cli_acct",
        "gb200_part",
        "env_qos",
        "img:1",
    )


def test_unsafe_site_values_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MOE_VLM_ACCOUNT", "acct;touch /tmp/pwned")
    with pytest.raises(BadInput, match=r"hydra\.launcher\.account"):
        params(slurm.SlurmSettings(), "cluster=local")


SCONTROL = """\
JobId=4 ArrayJobId=3 ArrayTaskId=0 JobName=wrap JobState=RUNNING Reason=None Restarts=0 ExitCode=0:0
JobId=3 ArrayJobId=3 ArrayTaskId=1-2%1 JobName=wrap JobState=PENDING Reason=JobArrayTaskLimit ExitCode=0:0
JobId=8 JobName=train JobState=CANCELLED Reason=None Requeue=1 Restarts=1 BatchFlag=1 ExitCode=0:15
JobId=9 JobName=train JobState=PENDING Reason=BeginTime Restarts=2 ExitCode=0:0
"""


def test_parse_scontrol_covers_plain_jobs_and_array_ranges() -> None:
    states = slurm.parse_scontrol(SCONTROL)
    assert states["3_0"].state == "RUNNING" and states["3_2"].reason == "JobArrayTaskLimit"
    assert (states["8"].state, states["8"].signal, states["8"].restarts) == ("CANCELLED", 15, 1)
    assert states["9"].active and not states["8"].active


def test_parse_sacct() -> None:
    states = slurm.parse_sacct("12|TIMEOUT|0:0\n12.batch|CANCELLED|0:15\n13|CANCELLED by 0|0:9\n")
    assert states["12"].state == "TIMEOUT" and states["13"].state == "CANCELLED" and "12.batch" not in states


def test_every_job_runs_offline_and_a_site_setup_line_may_say_otherwise() -> None:
    settings = slurm.SlurmSettings(setup=["export HF_HUB_OFFLINE=0"])
    spec = make_spec("cluster=local")
    resolved = slurm.checked(settings, spec)
    point = slurm.point_parameters(slurm.job_parameters(resolved, spec), Path("/s/p"), "python3")
    canary = slurm.canary_parameters(resolved, spec, Path("/s/canaries/c"))
    for script in (
        slurm.render_sbatch(point, "/s/.submitit/%j", "python3"),
        slurm.render_sbatch(canary, "/s/canaries/c", "python3", slurm.canary_command("python3", [])),
    ):
        lines = script.splitlines()
        srun = next(i for i, line in enumerate(lines) if line.startswith("srun "))
        hub, transformers, site_line = (
            lines.index("export HF_HUB_OFFLINE=1"),
            lines.index("export TRANSFORMERS_OFFLINE=1"),
            lines.index("export HF_HUB_OFFLINE=0"),
        )
        # Exported before srun (the tasks inherit them), and before the site's own lines.
        assert hub < transformers < site_line < srun


def test_points_wait_on_their_canary_and_slurm_cancels_them_when_it_fails() -> None:
    p = params(slurm.SlurmSettings(), "cluster=local")
    script = slurm.render_sbatch(slurm.point_parameters(p, Path("/s/p"), "python3", "42"), "/s/x", "python3")
    assert "#SBATCH --dependency=afterok:42" in script and "#SBATCH --kill-on-invalid-dep=yes" in script
    unguarded = slurm.render_sbatch(slurm.point_parameters(p, Path("/s/p"), "python3"), "/s/x", "python3")
    assert "--dependency" not in unguarded and "--kill-on-invalid-dep" not in unguarded
    # A site that wants held points kept (to re-point their dependency by hand) says so once.
    kept = params(slurm.SlurmSettings(additional_parameters={"kill-on-invalid-dep": "no"}), "cluster=local")
    script = slurm.render_sbatch(
        slurm.point_parameters(kept, Path("/s/p"), "python3", "42"), "/s/x", "python3"
    )
    assert script.count("--kill-on-invalid-dep") == 1 and "#SBATCH --kill-on-invalid-dep=no" in script


def test_the_canary_runs_one_short_task_in_the_points_environment() -> None:
    spec = make_spec("cluster=gb200", "model=qwen3_vl_30b_a3b", "nodes=4")
    settings = slurm.checked(
        dataclasses.replace(
            GB200,
            container_image="nvcr.io#nvidia/nemo:25.09",
            container_mounts=["/lustre:/lustre"],
            partition="batch",
            account="acct",
            setup=["module load nccl"],
            canary_timeout_min=7,
        ),
        spec,
    )
    point = slurm.render_sbatch(
        slurm.point_parameters(slurm.job_parameters(settings, spec), Path("/s/p"), "python"), "/s/x", "python"
    )
    command = slurm.canary_command("python", ["model=qwen3_vl_30b_a3b", "data.path=/a b"])
    canary = slurm.render_sbatch(
        slurm.canary_parameters(settings, spec, Path("/s/canaries/c")), "/s/canaries/c", "python", command
    )
    # Same partition, account, node shape and container as the points ...
    for line in (
        "#SBATCH --partition=batch",
        "#SBATCH --account=acct",
        "#SBATCH --exclusive",
        "#SBATCH --gpus-per-node=4",
        "module load nccl",
    ):
        assert line in point and line in canary, line
    point_srun, canary_srun = slurm.srun_line(point), slurm.srun_line(canary)
    for arg in ("--container-image=nvcr.io#nvidia/nemo:25.09", "--container-mounts=/lustre:/lustre"):
        assert arg in point_srun and arg in canary_srun
    # ... but one node, one task, its own short limit, never requeued, never segmented.
    assert "#SBATCH --nodes=1" in canary and "#SBATCH --ntasks-per-node=1" in canary
    assert "#SBATCH --time=7" in canary and "--requeue" not in canary and "--segment" not in canary
    assert canary_srun.endswith("python -u -m moe_vlm.launch.canary model=qwen3_vl_30b_a3b 'data.path=/a b'")
    probing = slurm.canary_command("python", ["model=qwen3_vl_30b_a3b"], probe=True)
    assert probing == "python -u -m moe_vlm.launch.canary --probe model=qwen3_vl_30b_a3b"
    # The batch script, outside the container, leaves the verdict even if python never starts.
    assert 'echo "$moe_vlm_rc" > /s/canaries/c/"$SLURM_JOB_ID".rc' in canary
