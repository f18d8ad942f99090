"""A Slurm dry run shows the jobs exactly as the real submission submits them, on a real Slurm.

For each way points become jobs (one job per point, a job array per group of points with the
same resources, packs of `points_per_job`), the same sweep command is run twice: with
`dry_run=true`, which prints one sbatch script per job naming its points, then for real, with
every job held (`--hold`: nothing runs, the scripts stay on disk). Every script the dry run
printed must be, byte for byte, the script sbatch received for the same points (the canary's
job id and a pack's folder token are drawn at submission: they are the only substitutions),
and the dry run must print exactly as many jobs as were submitted.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from moe_vlm.runtime import points
from tests.integration.test_slurm_sweeps import REPO, slurm  # noqa: F401  (slurm is a fixture)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
RUN = [
    "model=tiny_moe_vlm",
    "data=synthetic",
    "train_iters=4",
    "warmup_steps=1",
    "hydra.launcher.timeout_min=5",
]
HOLD = "+hydra.launcher.additional_parameters.hold=true"  # queued, never started
JOB_HEADER = re.compile(r"^===== job (\d+)/(\d+): (.*) =====$")


def sweep(sweep_dir: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "train.py", "-m", "hydra/launcher=slurm", f"hydra.sweep.dir={sweep_dir}"]
    env = {**os.environ, "MOE_VLM_SITE_FILE": "none"}
    return subprocess.run(
        [*command, *RUN, HOLD, *overrides], cwd=REPO, env=env, capture_output=True, text=True, timeout=180
    )


def dry_jobs(stdout: str) -> dict[frozenset[str], str]:
    """The dry run's jobs: the point ids each names -> its sbatch script."""
    jobs: dict[frozenset[str], str] = {}
    sections = re.split(r"\n(?=\={5} )", stdout)
    totals = set()
    for section in sections:
        header, _, body = section.partition("\n")
        found = JOB_HEADER.match(header)
        if not found:
            continue
        totals.add(int(found.group(2)))
        ids = frozenset(re.findall(r"\(id ([0-9a-f]{16})\)", found.group(3)))
        script = body.split("-- sbatch script --\n", 1)[1].split("\n\n-- srun command --", 1)[0]
        jobs[ids] = script.rstrip()
    assert len(totals) == 1 and totals == {len(jobs)}, stdout[-3000:]
    return jobs


def submitted_jobs(sweep_dir: Path) -> dict[frozenset[str], str]:
    """What sbatch received: each point's last submission names its script; placeholders for the
    values drawn at submission (the canary's job id, a pack's folder token)."""
    by_script: dict[str, set[str]] = {}
    texts: dict[str, str] = {}
    for point_dir in points.iter_points(sweep_dir):
        point = points.read_point(point_dir)
        assert point is not None, point_dir
        submission = point["submissions"][-1]
        text = Path(submission["script"]).read_text()
        if "canary" in submission:
            text = text.replace(f"afterok:{submission['canary']['job_id']}", "afterok:CANARY_JOB_ID")
        if "pack" in submission:
            token = Path(submission["pack"]["dir"]).name.removeprefix("pack-")
            text = text.replace(f"/pack-{token}/", "/pack-TOKEN/")
        by_script.setdefault(submission["script"], set()).add(point_dir.name)
        texts[submission["script"]] = text.rstrip()
    return {frozenset(ids): texts[script] for script, ids in by_script.items()}


@pytest.fixture
def sweep_dir(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "sweep"
    yield path
    jobs = [
        str(p["job_id"]) for d in points.iter_points(path) if (p := points.read_point(d)) and p.get("job_id")
    ]
    jobs += [str(c["job_id"]) for c in points.iter_canaries(path)]
    if jobs:
        subprocess.run(["scancel", *{j.split("_")[0] for j in jobs}], capture_output=True)


@pytest.mark.parametrize(
    ("axes", "kinds"),
    [
        (["nproc=1"], ["one job of one point"]),
        (["nproc=1,2", "seed=1,2"], ["a job array of 2 tasks"] * 2),
        (
            ["nproc=1", "seed=1,2,3", "hydra.launcher.points_per_job=2"],
            ["a packed job of 2", "a packed job of 1"],
        ),
    ],
    ids=["job", "arrays", "packs"],
)
def test_the_dry_run_prints_every_job_as_sbatch_receives_it(
    slurm: None,  # noqa: F811
    sweep_dir: Path,
    axes: list[str],
    kinds: list[str],
) -> None:
    dry = sweep(sweep_dir, *axes, "dry_run=true")
    assert dry.returncode == 0, dry.stderr[-3000:]
    # Nothing submitted: the dry run wrote each point's plan.json (issue 21) and point.json (planned,
    # not submitted: issue 33) and nothing else.
    written = sorted(p.relative_to(sweep_dir).parts for p in sweep_dir.rglob("*") if p.is_file())
    assert written and all(
        parts[-1] in ("plan.json", "point.json") and len(parts) == 2 for parts in written
    ), written
    headers = [m.group(3) for line in dry.stdout.splitlines() if (m := JOB_HEADER.match(line))]
    assert len(headers) == len(kinds) and all(h.startswith(k) for h, k in zip(headers, kinds, strict=True)), (
        headers
    )
    printed = dry_jobs(dry.stdout)

    real = sweep(sweep_dir, *axes)
    assert real.returncode == 0, real.stderr[-3000:]
    assert f"submitted in {len(kinds)} sbatch call(s)" in real.stdout, real.stdout
    received = submitted_jobs(sweep_dir)
    assert set(printed) == set(received)
    for ids, script in received.items():
        assert printed[ids] == script, f"points {sorted(ids)}: the dry run's script differs"
