"""The node preflight: every node of a Slurm job checked before its run starts, and a node that
fails kept out of the sweep's later jobs.

In every task of a point's job, before the run (hydra_plugins/moe_vlm_sweeper/launcher.py calls
`check_here`), the ranks time GEMMs and collectives (moe_vlm/runtime/node_probe.py) and each
node is held to the rate its cluster preset's hardware description says a healthy node reaches
(`expected_rates`: moe_vlm/predict/hardware.py, the step model's rates, each replaced by a figure in
`hydra.launcher.preflight.*`) and to the job's best node (`relative_fraction`):

- a GPU (CPU rank) below `gemm_fraction` x the expected GEMM rate, or a node whose intra-node
  all-reduce or all-to-all is below `collective_fraction` x the expected bandwidth, fails, named
  with its figures; a job-level inter-node collective (or the EP groups' all-to-all) below it
  stops the job too, but names no single node (with two nodes either could be the slow end) and
  excludes none;
- the verdict goes to the point's `preflight.json` and the sweep's `nodes/` (one verdict file per
  job and point, `passing.txt` and `failing.txt`: each node's latest verdict); a failure goes to
  run.json as class `node` and the job stops (a packed job records its remaining points `node`,
  not run, and ends);
- rerunning the sweep command resubmits those points, and every job of the sweep carries
  `--exclude=<the failing nodes>` (`exclude_failed`, default on).

On cluster=local there is no datasheet: without figures set in the config, a node is held only
to the job's best node. The time the preflight took is printed and recorded (`seconds`, and
run.json `launch.preflight_s`).
"""

from __future__ import annotations

import argparse
import fcntl
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from moe_vlm.base.files import RunPaths, write_atomic, write_json_atomic
from moe_vlm.base.processes import cores_here
from moe_vlm.config.schema import ClusterConfig, Precision
from moe_vlm.config.spec import RunSpec
from moe_vlm.launch.settings import PreflightSettings, SlurmSettings
from moe_vlm.predict.hardware import gpu_hardware
from moe_vlm.runtime import dist_env, points
from moe_vlm.runtime.failures import Diagnosis, base_from_point, launch_info, write_failure

NODES = "nodes"  # in the sweep directory
PASSING, FAILING = "passing.txt", "failing.txt"
EXCLUDE = "exclude"  # sbatch --exclude, in hydra.launcher.additional_parameters
EP_ALL_TO_ALL = "ep:all_to_all"  # node_probe's key for the EP groups' all-to-all
# The line every failing verdict prints; runtime/failures.py's `node` class matches it.
FAILED_LINE = "moe_vlm preflight: FAILED"
GPU_GEMM, CPU_GEMM = 8192, 512
GPU_MESSAGE_MIB, CPU_MESSAGE_MIB = 64.0, 4.0


class NodeCheckFailed(RuntimeError):
    """The preflight failed: the run does not start (its record says why)."""


# --- what a node should reach ---------------------------------------------------------------


@dataclass(frozen=True)
class Expected:
    """The rates a node is held to (None: nothing known, only the job's best node counts)."""

    gemm_flops: dict[str, float | None]  # "bf16", "fp8" -> FLOP/s per GPU
    intra_bytes_per_s: float | None  # bus bandwidth per GPU inside a node
    inter_bytes_per_s: float | None  # ... between nodes
    source: str
    cluster: str = "local"


def expected_rates(cluster: ClusterConfig, settings: PreflightSettings) -> Expected:
    """What a healthy node reaches, from the hardware description the step model reads
    (moe_vlm/predict/hardware.py: a large GEMM's share of the dense peak, NCCL's achieved NVLink
    and NIC bandwidths, per direction as a collective's bus bandwidth is); each replaced by the
    figure `hydra.launcher.preflight.*` sets. The one place the preflight reads what a node
    should reach. A cluster without a description (cluster=local) holds a node to the config's
    figures and to the job's best node."""
    hw = gpu_hardware(cluster)
    if hw is not None:
        bf16_rate: float | None = hw.peak(Precision.bf16) * hw.gemm_efficiency[Precision.bf16]
        fp8_rate: float | None = hw.peak(Precision.fp8cs) * hw.gemm_efficiency[Precision.fp8cs]
        intra_rate: float | None = hw.nvlink.bytes_per_s
        inter_rate: float | None = hw.scale_out.bytes_per_s
        described = "the step model's rates (a large GEMM's share of the dense peak, NCCL's NVLink and NIC)"
    else:
        bf16_rate = fp8_rate = intra_rate = inter_rate = None
        described = "no hardware description (only what the config sets)"
    bf16 = settings.gemm_tflops * 1e12 if settings.gemm_tflops else bf16_rate
    # A BF16 figure set in the config carries the description's FP8/BF16 ratio to FP8.
    fp8 = bf16 * fp8_rate / bf16_rate if bf16 and bf16_rate and fp8_rate else None
    intra = settings.intra_gbps * 1e9 if settings.intra_gbps else intra_rate
    inter = settings.inter_gbps * 1e9 if settings.inter_gbps else inter_rate
    given = [k for k in ("gemm_tflops", "intra_gbps", "inter_gbps") if getattr(settings, k)]
    source = f"cluster={cluster.name}: {described}"
    if given:
        source += "; set in hydra.launcher.preflight: " + ", ".join(given)
    return Expected({"bf16": bf16, "fp8": fp8}, intra, inter, source, cluster.name)


def gemm_dtypes(spec: RunSpec, gpu: bool, fp8_capable: bool) -> tuple[list[str], dict[str, str]]:
    """The GEMMs to time: BF16, and the run's precision where torch has a GEMM for it here."""
    dtypes, skipped = ["bf16"], {}
    fmt = spec.precision.format
    if fmt in (Precision.fp8cs, Precision.fp8mx):
        if gpu and fp8_capable:
            dtypes.append("fp8")  # MXFP8 runs at the FP8 rate; timed with per-tensor scales
        else:
            skipped["fp8"] = "no FP8 GEMM on this device"
    elif fmt is Precision.nvfp4:
        skipped["fp4"] = "no NVFP4 GEMM in torch outside Transformer Engine"
    return dtypes, skipped


# --- the verdict ------------------------------------------------------------------------------


@dataclass
class NodeVerdict:
    node: str
    passed: bool
    figures: dict[str, float]  # "gemm bf16 TFLOP/s", "intra all_reduce GB/s", ...
    problems: list[str] = field(default_factory=list)


@dataclass
class Verdict:
    job_id: str | None
    point_id: str
    checked_unix_s: float
    seconds: float
    ranks: int
    nodes: list[NodeVerdict]
    job_figures: dict[str, float]  # the inter-node collectives, GB/s
    job_problems: list[str]  # inter-node figures below threshold: not pinned to one node
    expected: dict[str, Any]
    not_measured: dict[str, str]

    @property
    def passed(self) -> bool:
        return all(n.passed for n in self.nodes) and not self.job_problems

    @property
    def failing(self) -> list[str]:
        return [n.node for n in self.nodes if not n.passed]

    def to_json(self) -> dict[str, Any]:
        # "verdict" at the top level: the packed job's batch script greps for it (launch/pack.py).
        return {"verdict": "passed" if self.passed else "failed", **asdict(self)}

    def lines(self) -> list[str]:
        out = [
            f"moe_vlm preflight: node {n.node}: FAILED: {'; '.join(n.problems)}"
            if n.problems
            else f"moe_vlm preflight: node {n.node}: passed ({', '.join(f'{k} {_figure(v)}' for k, v in n.figures.items())})"
            for n in self.nodes
        ]
        if self.job_figures and not self.job_problems:
            out.append(
                "moe_vlm preflight: inter-node: passed ("
                + ", ".join(f"{k} {_figure(v)}" for k, v in self.job_figures.items())
                + ")"
            )
        out += [f"moe_vlm preflight: inter-node: FAILED: {p}" for p in self.job_problems]
        out += [
            f"moe_vlm preflight: {dtype} GEMM not timed: {why}" for dtype, why in self.not_measured.items()
        ]
        tally = "passed" if self.passed else "FAILED"
        out.append(
            f"moe_vlm preflight: {len(self.nodes)} node(s), {self.ranks} rank(s) checked in "
            f"{self.seconds:.2f} s: {tally}"
        )
        return out


def _figure(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def _check(
    problems: list[str], what: str, value: float, expected: float | None, fraction: float, where: str
) -> None:
    if expected and value < fraction * expected:
        problems.append(f"{what} {_figure(value)} < {fraction:g} x {_figure(expected)} expected ({where})")


def judge(
    figures: Sequence[Any], expected: Expected, settings: PreflightSettings
) -> tuple[list[NodeVerdict], dict[str, float], list[str]]:
    """Per node: its slowest GPU's GEMM rates and its intra-node collectives (the slowest rank's
    time), against the expected rates and the job's best node; the inter-node collectives, for
    the job. `figures`: node_probe.RankFigures of every rank."""
    by_node: dict[str, list[Any]] = {}
    for rank in figures:
        by_node.setdefault(rank.node, []).append(rank)
    values: dict[str, dict[str, float]] = {}
    for node, ranks in by_node.items():
        got: dict[str, float] = {}
        for dtype in ranks[0].gemm_flops:
            got[f"gemm {dtype} TFLOP/s"] = min(r.gemm_flops[dtype] for r in ranks) / 1e12
        for key in sorted({k for r in ranks for k in r.collectives if k.startswith("intra:")}):
            seconds = max(r.collectives[key][0] for r in ranks if key in r.collectives)
            bus = next(r.collectives[key][1] for r in ranks if key in r.collectives)
            got[f"intra {key.split(':')[1]} GB/s"] = bus / seconds / 1e9
        values[node] = got
    best = {k: max(v.get(k, 0.0) for v in values.values()) for got in values.values() for k in got}
    verdicts = []
    for node, got in values.items():
        problems: list[str] = []
        for key, value in got.items():
            if key.startswith("gemm"):
                dtype = key.split()[1]
                rate = expected.gemm_flops.get(dtype)
                _check(
                    problems,
                    key,
                    value,
                    rate / 1e12 if rate else None,
                    settings.gemm_fraction,
                    f"cluster={expected.cluster}",
                )
            else:
                link = expected.intra_bytes_per_s
                _check(
                    problems,
                    key,
                    value,
                    link / 1e9 if link else None,
                    settings.collective_fraction,
                    f"cluster={expected.cluster}",
                )
            if len(values) > 1:
                _check(problems, key, value, best[key], settings.relative_fraction, "the job's best node")
        verdicts.append(NodeVerdict(node, not problems, {k: round(v, 6) for k, v in got.items()}, problems))
    job: list[str] = []
    job_figures: dict[str, float] = {}
    inter = sorted({k for r in figures for k in r.collectives if k.startswith("inter:")})
    for key in inter:
        timed = [r.collectives[key] for r in figures if key in r.collectives]
        rate = timed[0][1] / max(t[0] for t in timed) / 1e9
        job_figures[f"inter {key.split(':')[1]} GB/s"] = round(rate, 6)
        link = expected.inter_bytes_per_s
        found: list[str] = []
        _check(
            found,
            f"inter {key.split(':')[1]} GB/s",
            rate,
            link / 1e9 if link else None,
            settings.collective_fraction,
            f"cluster={expected.cluster}",
        )
        job += [
            f"{p} between nodes {', '.join(by_node)}: not pinned to one node, none excluded" for p in found
        ]
    timed = [(r, r.collectives[EP_ALL_TO_ALL]) for r in figures if EP_ALL_TO_ALL in r.collectives]
    if timed:
        # The run's own dispatch shape: held to NVLink when every EP group sits inside a node.
        rate = timed[0][1][1] / max(t[1][0] for t in timed) / 1e9
        job_figures["ep all_to_all GB/s"] = round(rate, 6)
        inside = len(by_node) == 1 or _ep_inside_nodes(figures)
        link = expected.intra_bytes_per_s if inside else expected.inter_bytes_per_s
        found = []
        where = "inside each node" if inside else "across nodes"
        _check(
            found,
            f"ep all_to_all GB/s ({where})",
            rate,
            link / 1e9 if link else None,
            settings.collective_fraction,
            f"cluster={expected.cluster}",
        )
        job += [f"{p}: the run's EP groups, none excluded" for p in found]
    return verdicts, job_figures, job


def _ep_inside_nodes(figures: Sequence[Any]) -> bool:
    """Whether every EP group's ranks share a node (RankFigures.ep_group: the group's ranks)."""
    node_of = {r.rank: r.node for r in figures}
    return all(len({node_of.get(m) for m in r.ep_group}) == 1 for r in figures if r.ep_group)


# --- the sweep's node lists -----------------------------------------------------------------


@contextmanager
def _locked(directory: Path) -> Iterator[None]:
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def latest_verdicts(sweep_dir: Path) -> dict[str, tuple[float, NodeVerdict]]:
    """Each node's latest verdict in this sweep (from nodes/*.json, one file per job and point)."""
    latest: dict[str, tuple[float, NodeVerdict]] = {}
    directory = sweep_dir / NODES
    if not directory.is_dir():
        return latest
    for path in sorted(directory.glob("*.json")):
        record = points.read_json(path) or {}
        when = float(record.get("checked_unix_s") or 0.0)
        for raw in record.get("nodes") or []:
            if not isinstance(raw, dict) or not raw.get("node"):
                continue
            verdict = NodeVerdict(
                str(raw["node"]),
                bool(raw.get("passed")),
                dict(raw.get("figures") or {}),
                list(raw.get("problems") or []),
            )
            if verdict.node not in latest or latest[verdict.node][0] <= when:
                latest[verdict.node] = (when, verdict)
    return latest


def excluded_nodes(sweep_dir: Path) -> list[str]:
    """The nodes whose latest preflight in this sweep failed: what its later jobs --exclude."""
    return sorted(node for node, (_, v) in latest_verdicts(sweep_dir).items() if not v.passed)


def with_exclusions(settings: SlurmSettings, sweep_dir: Path) -> SlurmSettings:
    """The settings of a job of this sweep: its failing nodes added to `--exclude` (with any the
    user excludes), unless `preflight.exclude_failed` is off."""
    if not settings.preflight.exclude_failed:
        return settings
    nodes = excluded_nodes(sweep_dir)
    if not nodes:
        return settings
    additional = dict(settings.additional_parameters)
    key = next((k for k in additional if k.replace("-", "_") == EXCLUDE), EXCLUDE)
    given = [n for n in str(additional.get(key) or "").split(",") if n]
    additional[key] = ",".join(dict.fromkeys([*given, *nodes]))
    return replace(settings, additional_parameters=additional)


def record_verdict(sweep_dir: Path, verdict: Verdict) -> None:
    """The verdict's file in nodes/, then passing.txt and failing.txt from every verdict there."""
    directory = sweep_dir / NODES
    with _locked(directory):
        name = f"{verdict.job_id or 'local'}-{verdict.point_id}.json"
        write_json_atomic(directory / name, verdict.to_json())
        latest = latest_verdicts(sweep_dir)
        passing = [node for node, (_, v) in sorted(latest.items()) if v.passed]
        failing = [
            f"{node}\t{'; '.join(v.problems)}" for node, (_, v) in sorted(latest.items()) if not v.passed
        ]
        write_atomic(directory / PASSING, "".join(f"{line}\n" for line in passing))
        write_atomic(directory / FAILING, "".join(f"{line}\n" for line in failing))


# --- in the job -------------------------------------------------------------------------------


def _device(spec: RunSpec, local_rank: int, local_world: int) -> Any:
    import torch  # the job side only: the submitting side never times anything

    if spec.cluster.is_gpu_cluster and torch.cuda.is_available():
        count = torch.cuda.device_count()
        device = torch.device("cuda", 0 if count == 1 else local_rank % count)
        torch.cuda.set_device(device)
        return device
    torch.set_num_threads(max(1, cores_here() // max(local_world, 1)))
    return torch.device("cpu")


def check_here(point_dir: Path, settings: PreflightSettings) -> Verdict | None:
    """Run the preflight in this task (every task of the job calls it). Returns the verdict when
    it passed (None when there was nothing to check: no point record); raises NodeCheckFailed,
    after rank 0 has recorded why, when it failed."""
    # torch: the launcher imports this module on the submitting side, which never times anything.
    from moe_vlm.runtime import node_probe

    point = points.read_point(point_dir) or {}
    if not point.get("config"):
        return None
    started = time.monotonic()
    spec = RunSpec.from_recorded(point["config"])
    env = dist_env.DistEnv.from_environ()
    device = _device(spec, env.local_rank if env else 0, env.local_world_size if env else 1)
    gpu = device.type == "cuda"
    fp8_capable = False
    if gpu:
        import torch

        fp8_capable = torch.cuda.get_device_capability(device) >= (8, 9)
    dtypes, skipped = gemm_dtypes(spec, gpu, fp8_capable)
    expected = expected_rates(spec.cluster, settings)
    message_mib = settings.message_mib or (GPU_MESSAGE_MIB if gpu else CPU_MESSAGE_MIB)
    with node_probe.group(env, device):
        figures = node_probe.measure(
            env,
            device,
            dtypes,
            skipped,
            settings.gemm_size or (GPU_GEMM if gpu else CPU_GEMM),
            settings.seconds,
            int(message_mib * 2**20),
            settings.collective_iters,
            node_probe.ep_groups(spec.layout.world_size, spec.layout.ep, spec.layout.etp),
        )
        nodes, job_figures, job = judge(figures, expected, settings)
        verdict = Verdict(
            dist_env.job_id_from_env(),
            point_dir.name,
            points.now(),
            round(time.monotonic() - started, 3),
            len(figures),
            nodes,
            job_figures,
            job,
            asdict(expected),
            skipped,
        )
        if dist_env.global_rank() == 0:
            _record(point_dir, verdict)
        # The others wait for rank 0's records: a task that exits first ends the step (srun
        # --kill-on-bad-exit) before they are written.
        node_probe.barrier(env)
    if not verdict.passed:
        raise NodeCheckFailed("; ".join([*(p for n in nodes for p in n.problems), *job]))
    return verdict


def _record(point_dir: Path, verdict: Verdict) -> None:
    for line in verdict.lines():
        print(line, file=sys.stderr, flush=True)
    write_json_atomic(RunPaths(point_dir).preflight, verdict.to_json())
    record_verdict(point_dir.parent, verdict)
    if verdict.passed:
        return
    failing = verdict.failing
    named = (
        f"node(s) {', '.join(failing)} failed the node preflight"
        if failing
        else "the inter-node collectives failed the node preflight"
    )
    fix = (
        "rerun the sweep command: its jobs exclude the failing node(s) (nodes/failing.txt)"
        if failing
        else "rerun the sweep command, or exclude a node by hand (+hydra.launcher.additional_parameters.exclude=NODE)"
    )
    evidence = next((line for line in verdict.lines() if "FAILED" in line), FAILED_LINE)
    diagnosis = Diagnosis("node", f"{named}; the run did not start. Fix: {fix}", evidence[:300])
    write_failure(point_dir, diagnosis, verdict.lines()[-10:], base_from_point(point_dir), launch_info())


def record_not_run(point_dir: Path, after: Path, job_id: str) -> None:
    """A packed point the job did not start because an earlier point's preflight failed (the
    batch script calls this for each one left, then ends the job)."""
    verdict = points.read_json(after) or {}
    failing = [
        str(n.get("node")) for n in verdict.get("nodes") or [] if isinstance(n, dict) and not n.get("passed")
    ]
    diagnosis = Diagnosis(
        "node",
        f"not run: job {job_id} stopped when point {after.parent.name}'s node preflight failed"
        + (f" on node(s) {', '.join(failing)}" if failing else "")
        + "; rerun the sweep command (it excludes the failing node(s))",
        f"{FAILED_LINE} (point {after.parent.name})",
    )
    launch = {**launch_info(), "slurm_job_id": job_id}
    write_failure(point_dir, diagnosis, [], base_from_point(point_dir), launch)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m moe_vlm.launch.preflight",
        description="record a packed point not run because an earlier point's node preflight failed",
    )
    parser.add_argument("--point-dir", type=Path, required=True)
    parser.add_argument("--after", type=Path, required=True, help="the failed point's preflight.json")
    parser.add_argument("--job-id", required=True)
    args = parser.parse_args(argv)
    record_not_run(args.point_dir, args.after, args.job_id)
    print(
        f"moe_vlm: {args.point_dir.name}: failed (node): not run after the failed preflight", file=sys.stderr
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
