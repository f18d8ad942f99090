"""The canary: one short job that proves the job environment can run the sweep's points.

    python -m moe_vlm.launch.canary <the first point's task overrides>

Submitted by the Slurm launcher once per (cluster, container image) before the points, through
the same sbatch/srun lines (partition, container image and mounts, setup lines, interpreter);
the points wait on it with `--dependency=afterok`. In about a minute it:

1. imports what every point's job imports (submitit, Hydra, the launcher plugin, moe_vlm);
2. composes the point's config and checks its data can be read here;
3. imports the point's engine: torch and transformers for engine=torch; for engine=megatron the
   Megatron stack the run needs, then builds the Bridge ConfigContainer (moe_vlm.engines.megatron
   .config.build_config) in a scratch directory;
4. for engine=megatron, runs the plan's shape check (moe_vlm/rules/shapes.py) on one real
   micro-batch with this stack's Transformer Engine (docs/shapes.md), for this point alone when no
   points file is given (with one, step 6 checks every point's shape);
5. on a GPU cluster, checks that CUDA sees the job's GPUs (driver and container agree);
6. with --points FILE (the launcher writes it: every point behind this canary), runs the library's
   own checks (LIB-*, moe_vlm/engines/megatron/library_checks.py, the same as a dry run's, through
   the plan cache: identical inputs once) and the shape check (S..., one micro-batch per distinct
   shape) on each engine=megatron point on the cluster's own stack: a login node without Transformer
   Engine plans them with S000, and this is where each is checked.
   A point they refuse gets a `rejected` run.json with the finding and its point.json's `refused`
   list, so it never starts (moe_vlm/run/task.py reads it first) and `moe-vlm status` says why;
   the others start as usual;
7. with --probe (hydra.launcher.canary_probe, the default), measures the step model's rates on the
   node (moe_vlm/predict/probe.py, seconds: GEMMs at the point's shapes, attention, a copy, eager
   ops, the data loader, all-gathers between the node's ranks) and prints them; where no published
   rates apply (cluster=local, a site preset without them) it stores them in the calibration file,
   beside a fit on runs if one exists (the fit's scales stay). A probe that fails is said in the log
   and does not fail the canary: the points launch their ranks their own way, and the probe is a
   forecast, not a check.

It exits 0, or prints the traceback and then one last line starting `moe_vlm canary: FAILED`,
which `moe-vlm status` shows as the evidence of the held points. A container that cannot even
start Python still fails the canary (its exit status is written by the batch script).

Only the standard library is imported at module level: a missing package is the finding.
"""

from __future__ import annotations

import importlib
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from moe_vlm.config.spec import RunSpec
    from moe_vlm.rules import Finding

FAILED_PREFIX = "moe_vlm canary: FAILED"
OK_PREFIX = "moe_vlm canary: ok"
PROBE_PREFIX = "moe_vlm canary probe:"
REFUSED_PREFIX = "moe_vlm canary: refused"


class CanaryFailed(RuntimeError):
    """A check failed for a reason the message says in one line."""


def compose_spec(overrides: list[str]) -> RunSpec:
    import submitit  # noqa: F401  (the points run submitit's job runner)

    # What the points' jobs unpickle. Imported by name: the canary proves the job can import the
    # plugin and uses nothing of it (the plugin sits above launch/, see docs/layout.md).
    importlib.import_module("hydra_plugins.moe_vlm_sweeper.launcher")
    import moe_vlm.config.schema  # noqa: F401  (registers the config schema)
    from moe_vlm.config.compose import compose_config
    from moe_vlm.config.spec import RunSpec

    return RunSpec.from_config(compose_config(overrides))


def check_engine(spec: RunSpec, workdir: Path) -> str:
    """Import what the point's engine imports; for Megatron, build its ConfigContainer."""
    from moe_vlm.config.schema import Engine  # not at module level: a missing Hydra is a finding

    if spec.engine == Engine.megatron:
        from moe_vlm.engines.megatron.config import build_config, check_overrides
        from moe_vlm.engines.megatron.stack import stack_problem, versions

        problem = stack_problem(spec)  # every module this run imports: pretrain, TE, deep_ep, fla...
        if problem:
            raise CanaryFailed(f"engine=megatron: {problem}")
        built = build_config(spec, workdir)
        mismatched = check_overrides(built.cfg, spec)
        if mismatched:
            raise CanaryFailed("the Bridge config does not hold the table's values: " + "; ".join(mismatched))
        found = ", ".join(f"{name} {version}" for name, version in versions().items() if version)
        return f"Megatron stack imports ({found}); ConfigContainer built from {built.recipe.name}"
    import torch
    import transformers

    import moe_vlm.engines.torch_engine  # noqa: F401  (transformers' Qwen3-VL-MoE, FSDP2, the data path)

    return f"torch {torch.__version__} and transformers {transformers.__version__} import"


def check_shapes(spec: RunSpec) -> str:
    """The plan's shape check (docs/shapes.md) again, on this stack's TE: an error holds the points."""
    from moe_vlm.engines.megatron.shape_check import shape_evidence
    from moe_vlm.rules.shapes import applies, shape_findings

    if not applies(spec):
        return ""
    findings = shape_findings(spec, shape_evidence(spec))
    bad = [f for f in findings if f.is_error]
    if bad:
        raise CanaryFailed(f"shape check: {bad[0].line()}")
    skipped = [f for f in findings if f.code == "S000"]
    return f"; shape check not run: {skipped[0].message}" if skipped else "; shape check passed"


def check_gpus(spec: RunSpec) -> str:
    if not spec.cluster.is_gpu_cluster:
        return ""
    import torch

    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        raise CanaryFailed(
            f"cluster={spec.cluster.name} but CUDA sees no GPU in the job (torch {torch.__version__}, "
            f"CUDA {torch.version.cuda}): the container's CUDA and the node's driver disagree, or the "
            "job got no GPUs"
        )
    return f"; {torch.cuda.device_count()} GPU(s): {torch.cuda.get_device_name(0)}"


def probe_here(spec: RunSpec) -> str:
    """Time the point here and store the calibration where it is the best there is; what was done."""
    from moe_vlm.predict.calibration import find, store, with_rates
    from moe_vlm.predict.model import has_defaults
    from moe_vlm.predict.probe import probe

    try:
        result = probe(spec, seconds=2.0)
    except Exception as exc:  # a forecast: said, never a reason to hold the points
        print(f"{PROBE_PREFIX} skipped: {type(exc).__name__}: {' '.join(str(exc).split())}", flush=True)
        return "; probe failed (see the log)"
    for line in result.lines():
        print(f"{PROBE_PREFIX} {line}", flush=True)
    if has_defaults(spec):
        return "; probe printed, not stored (this cluster is predicted at its published rates)"
    found = result.calibration()
    existing = find(found.cluster, found.stack)
    return f"; probe rates stored in {store([with_rates(existing, found)])}"


def point_refusals(spec: RunSpec) -> list[Finding]:
    """What refuses one point on this stack: the library's own checks (through the plan cache:
    identical inputs once), then the shape check of its own micro-batch (cached per shape: a sweep
    builds one batch per distinct shape). [] off the Megatron engine."""
    from moe_vlm.config.schema import Engine
    from moe_vlm.engines.megatron.plan_cache import library_checks
    from moe_vlm.engines.megatron.shape_check import shape_evidence
    from moe_vlm.rules import Finding, Level
    from moe_vlm.rules.shapes import applies, shape_findings

    if spec.engine != Engine.megatron:
        return []
    found, _entry = library_checks(spec)
    refusals = [
        Finding(f.check.value, Level.error, ("engine",), f"{f.message}{f.where}", f.fix)
        for f in found
        if f.refuses
    ]
    if applies(spec):
        refusals += [f for f in shape_findings(spec, shape_evidence(spec)) if f.is_error]
    return refusals


def refuse_point(point_dir: Path, overrides: list[str]) -> str | None:
    """point_refusals on one point; a refusal is written where the point's job reads it first (its
    run.json and point.json): the refusing line, or None when the point may start."""
    from moe_vlm.config.compose import compose_config
    from moe_vlm.config.spec import RunSpec
    from moe_vlm.record.records import RunRecord
    from moe_vlm.runtime import points

    composed = compose_config(overrides)
    spec = RunSpec.from_config(composed)
    refusals = point_refusals(spec)
    if not refusals:
        return None
    RunRecord.rejected(spec, points.resolved(composed), refusals).write(point_dir)
    points.update_point(
        point_dir, valid=False, refused=[{"code": f.code, "message": f.message} for f in refusals]
    )
    return f"{refusals[0].code}: {refusals[0].message}"


def check_points(points_file: Path) -> str:
    """refuse_point on every point the file lists; what was found, for the summary."""
    import json

    from moe_vlm.engines.megatron.shape_check import cached_keys

    shapes_before = cached_keys()
    listed = json.loads(points_file.read_text())["points"]
    refused = 0
    for entry in listed:
        point_dir = Path(entry["point_dir"])
        try:
            why = refuse_point(point_dir, [str(o) for o in entry["overrides"]])
        except Exception as exc:  # the point's own job fails with the whole story; the others go on
            print(f"{REFUSED_PREFIX} {point_dir.name}: not checked: {type(exc).__name__}: {exc}", flush=True)
            continue
        if why is not None:
            refused += 1
            print(f"{REFUSED_PREFIX} {point_dir.name}: {' '.join(why.split())}", flush=True)
    return (
        f"; library and shape checks on {len(listed)} point(s) ({cached_keys() - shapes_before} distinct "
        f"shape(s) built): {refused} refused (they never start)"
    )


def run(overrides: list[str], probe: bool = False, points_file: Path | None = None) -> str:
    spec = compose_spec(overrides)
    from moe_vlm.data import check_data

    check_data(spec)
    with tempfile.TemporaryDirectory(prefix="moe_vlm_canary_") as scratch:
        engine = check_engine(spec, Path(scratch))
    # With the points file every point's shape is checked there, this one's among them; a point it
    # refuses is held alone, the others start.
    shapes = check_shapes(spec) if points_file is None else ""
    summary = f"cluster={spec.cluster.name} engine={spec.engine}: {engine}{shapes}{check_gpus(spec)}"
    if points_file is not None:
        summary += check_points(points_file)
    return summary + (probe_here(spec) if probe else "")


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    probe = "--probe" in args
    points_file = None
    if "--points" in args:
        at = args.index("--points")
        points_file = Path(args[at + 1])
        del args[at : at + 2]
    overrides = [a for a in args if a != "--probe"]
    started = time.monotonic()
    try:
        summary = run(overrides, probe, points_file)
    except Exception as exc:  # every failure is the finding; the last line says which
        traceback.print_exc()
        message = " ".join(str(exc).split()) or "no message"
        print(f"{FAILED_PREFIX}: {type(exc).__name__}: {message}", file=sys.stderr)
        return 1
    print(f"{OK_PREFIX} in {time.monotonic() - started:.1f} s: {summary}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
