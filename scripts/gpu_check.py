#!/usr/bin/env python
"""GPU check for one H200 with no network: the torch engine measured, the Megatron stack tried.

What it does, in order, within a time budget (8 minutes on the GPU machine):

1. the torch engine (`python train.py engine=torch cluster=h200 nproc=1`, as a user runs it) on two
   points, 20 steps each: the tiny model, and a mid-size one (Qwen3-VL-30B-A3B widths, 5 of its 48
   decoder layers, about 4.3B parameters) that fills most of the 141 GB. Per point: step time,
   effective tokens/s, MFU against the H200's dense BF16 peak (conf/cluster/h200.yaml), and the
   memory estimate (moe_vlm.perf.memory) against the measured torch.cuda.max_memory_allocated: the
   estimate's first GPU calibration point (scripts/calibrate_memory.py runs each point);
2. the component timer's cost on the mid-size model (scripts/bench_hooks.py: hooks on/off A/B and
   the time spent inside the hooks, timed with CUDA events on a GPU);
3. the calibration probe on the mid-size point (`moe-vlm calibrate --probe ... --dry-run`): the
   step model's rates measured here (bf16 GEMMs at its shapes, attention, a copy, eager ops, the
   data loader; one GPU: no link), the GEMMs as % of the H200's dense peak, what the Slurm canary
   prints on a GPU cluster;
4. the Megatron stack that travelled as wheels (no Transformer Engine: its wheel cannot travel),
   imported against this machine's torch, in a subprocess: what imports and what does not, with
   the library file:line that fails; then, for every model on cluster=h200, the plan (dry_run) and
   the Bridge ConfigContainer where Bridge imports;
5. one summary, JSON and text: <out>/gpu_check_summary.{json,txt}.

    bash scripts/gpu_check.sh                      # installs wheels/ if present, then this
    python scripts/gpu_check.py --out DIR          # the same, in this interpreter
    python scripts/gpu_check.py --cpu-smoke --out DIR   # 2 steps of small points on CPU (tests)

Exit status: 0 when the torch engine points ran as expected, 1 otherwise. What the Megatron stack
cannot do here is a finding of the summary, not a failure of the check.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "scripts")]
# The GPU machine runs the project from this checkout, not installed: its subprocesses too.
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))

import calibrate_memory  # noqa: E402  (runs train.py and reads steps.jsonl: one way to run a point)

SUMMARY = "gpu_check_summary"
BUDGET_S = 480
COMMON = ("engine=torch", "cluster=h200", "nproc=1")
# bench_hooks' defaults keep images small; these are the mid-size point's sizes on the GPU.
GPU_IMAGES = ("data.min_long_side_px=672", "data.max_long_side_px=1344", "data.max_pixels=1003520")
CPU_SMALL = ("seq_length=512", "data.max_long_side_px=448", "data.max_pixels=200704")
POINTS = {
    "gpu": {
        "tiny": ("model=tiny_moe_vlm", "data=synthetic", "gbs=2"),
        "mid": ("model=qwen3_vl_30b_a3b", "model.num_layers=5", "seq_length=4096", "data=synthetic",
                "recompute=selective", "gbs=2", *GPU_IMAGES),
    },
    "cpu-smoke": {
        "tiny": ("model=tiny_moe_vlm", "data=synthetic", "gbs=1", *CPU_SMALL),
        "mid": ("model=tiny_moe_vlm", "data=synthetic", "recompute=selective", "gbs=1", *CPU_SMALL),
    },
}  # fmt: skip
MODELS = sorted(p.stem for p in (REPO / "conf" / "model").glob("*.yaml"))
# Megatron Core modules the engine's run path loads, beyond stack.required(): where version drift
# against this machine's torch would show without Transformer Engine.
CORE_MODULES = (
    "megatron.core.models.gpt:GPTModel",
    "megatron.core.transformer.moe.token_dispatcher:MoEFlexTokenDispatcher",
    "megatron.core.distributed:DistributedDataParallel",
    "megatron.core.optimizer:get_megatron_optimizer",
    "megatron.core.dist_checkpointing.strategies.torch",
    "megatron.core.ssm.gated_delta_net.common",
)


def _run_point(name: str, overrides: list[str], workdir: Path, timeout_s: int, gpu: bool) -> dict[str, Any]:
    started = time.perf_counter()
    result: dict[str, Any] = {"name": name, "overrides": overrides}
    try:
        measured = calibrate_memory.run_point(overrides, workdir, timeout_s)
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        result.update(status="failed", error=" ".join(str(exc).split())[-1500:])
        result["wall_s"] = time.perf_counter() - started
        return result
    record = json.loads((workdir / "run.json").read_text())
    steps = [json.loads(line) for line in (workdir / "steps.jsonl").read_text().splitlines() if line.strip()]
    summary, engine = record.get("summary") or {}, record.get("torch_engine") or {}
    predicted = calibrate_memory.estimate_for(overrides, measured)
    comparable = predicted.comparable_gib(measured.memory_kind)
    result.update(
        status=record.get("status"),
        wall_s=time.perf_counter() - started,
        steps=len(steps),
        steady=(summary.get("steady_window") or {}).get("text"),
        step_time_s=summary.get("step_time_s"),
        effective_tokens_per_s_per_gpu=summary.get("effective_tokens_per_s_per_gpu"),
        tflops_per_gpu=summary.get("tflops_per_gpu"),
        mfu=summary.get("mfu"),
        peak=(summary.get("peak") or {}).get("name"),
        components=summary.get("components"),
        component_coverage=summary.get("component_coverage"),
        memory={
            "kind": measured.memory_kind,
            "measured_gib": measured.peak_gib,
            "predicted_gib": comparable,
            "predicted_total_gib": predicted.total_gib,
            "error": comparable / measured.peak_gib - 1 if measured.peak_gib else None,
            "patches_per_micro_batch": measured.patches_per_micro_batch,
        },
        engine={k: engine.get(k) for k in ("device", "backend", "precision", "attention", "parameters")},
        loss_first_last=[steps[0].get("loss"), steps[-1].get("loss")] if steps else None,
    )
    problems = []
    if record.get("status") != "completed":
        problems.append(f"status {record.get('status')}: {record.get('failure')}")
    if gpu and (
        not str(engine.get("device", "")).startswith("cuda")
        or engine.get("backend") != "nccl"
        or not str(engine.get("precision", "")).startswith("bf16")
    ):
        problems.append(f"not a bf16 NCCL GPU run: {result['engine']}")
    if gpu and measured.memory_kind != "cuda_max_allocated":
        problems.append(f"peak memory is {measured.memory_kind}, not CUDA max allocated")
    if any(min((s.get("components_s") or {"none": 0.0}).values()) <= 0 for s in steps):
        problems.append("a component (vision encoder / projector / decoder) has no time")
    result["problems"] = problems
    return result


def _hook_overhead(overrides: list[str], reps: int, steps: int, timeout_s: int) -> dict[str, Any]:
    """scripts/bench_hooks.py as it is: its printed ratios, parsed."""
    command = [sys.executable, str(REPO / "scripts" / "bench_hooks.py"), "--reps", str(reps), "--steps",
               str(steps), "--warmup", "1", "--batches", "2", "--", *overrides]  # fmt: skip
    started = time.perf_counter()
    try:
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"status": "failed", "error": f"timed out after {timeout_s} s", "command": command}
    out = done.stdout
    result: dict[str, Any] = {"command": command[1:], "wall_s": time.perf_counter() - started}
    ratio = re.search(r"wall time per step: ([\d.]+) \(median ([\d.]+) s vs ([\d.]+) s\)", out)
    inside = re.search(r"time inside the hooks: ([\d.]+) ms per step = ([\d.]+)% of the median step", out)
    device = re.search(r" on (\S+) \(", out)
    if done.returncode != 0 or not ratio or not inside:
        tail = (out + done.stderr).strip().splitlines()[-8:]
        return {**result, "status": "failed", "error": " | ".join(tail)}
    on_s, off_s = float(ratio.group(2)), float(ratio.group(3))
    return {
        **result,
        "status": "completed",
        "device": device.group(1) if device else None,
        "clock": "CUDA events" if device and device.group(1).startswith("cuda") else "host perf_counter",
        "on_off_wall_ratio": float(ratio.group(1)),
        "median_step_s": {"hooks_on": on_s, "hooks_off": off_s},
        "inside_hooks_ms_per_step": float(inside.group(1)),
        "inside_hooks_share": float(inside.group(2)) / 100,
    }


def megatron_probe() -> dict[str, Any]:
    """The Megatron part, in this (sub)process: imports, then plan and ConfigContainer per model."""
    from moe_vlm.config.compose import compose_config
    from moe_vlm.config.spec import RunSpec
    from moe_vlm.engines.megatron import stack
    from moe_vlm.knobs.bridge_fields import QWEN3_VL_STEP, VLM_STEP
    from moe_vlm.rules import errors, validate
    from moe_vlm.run.plan import render

    found: dict[str, Any] = {"versions": {"torch": stack.distribution_version("torch"), **stack.versions()}}
    core = [
        stack.StackModule(target, (target,), "megatron-core", "the engine's run path", stack.INSTALL_HINT)
        for target in CORE_MODULES
    ]
    steps = [stack.forward_step_module(path) for path in (QWEN3_VL_STEP, VLM_STEP)]  # padded, packed
    library = [*stack.LIBRARY, stack.RESILIENCY, stack.PRETRAIN, *steps, stack.FLA, *core]
    found["imports"] = [_probe_dict(stack.probe_module(module)) for module in library]
    found["findings"] = _findings(found["imports"], found["versions"])
    bridge_ok = next(p for p in found["imports"] if p["label"] == "Megatron Bridge")["ok"]
    found["models"] = []
    with tempfile.TemporaryDirectory(prefix="moe_vlm_gpu_check_") as tmp:
        for model in MODELS:
            entry: dict[str, Any] = {"model": model}
            spec = RunSpec.from_config(compose_config(["engine=megatron", "cluster=h200", f"model={model}"]))
            findings = validate(spec)
            bad = errors(findings)
            text = render(spec, findings)
            entry["plan"] = {
                "valid": not bad,
                "errors": [f.code for f in bad],
                "world_size": spec.layout.world_size,
                "stack_missing": [p.module.label for p in stack.probe(spec) if not p.ok],
                "lines": len(text.splitlines()),
            }
            entry["config"] = _build(spec, Path(tmp) / model) if bridge_ok else {
                "built": False, "reason": "megatron.bridge does not import here (see imports)"}  # fmt: skip
            found["models"].append(entry)
    return found


def _findings(imports: list[dict[str, Any]], versions: dict[str, Any]) -> list[str]:
    """What the imports mean, in sentences."""
    by_label = {p["label"]: p for p in imports}
    te, bridge, core = by_label["Transformer Engine"], by_label["Megatron Bridge"], by_label["Megatron Core"]
    core_modules = [p for p in imports if p["label"] in CORE_MODULES]
    lines = []
    if core["ok"]:
        broken = [p["import"] for p in core_modules if not p["ok"]]
        lines.append(
            f"Megatron Core {versions.get('megatron-core')} imports against torch {versions.get('torch')}; "
            + (f"of its run-path modules these fail: {broken}" if broken else "so do its run-path modules")
        )
    else:
        lines.append(f"Megatron Core does not import against torch {versions.get('torch')}: {core['error']}")
    if not te["ok"] and not bridge["ok"]:
        where = f" at {bridge['where']}" if bridge["where"] else ""
        lines.append(
            f"without Transformer Engine ({te['error']}) `import megatron.bridge` fails{where}: "
            "no Bridge recipe, ConfigContainer or pretrain here, so the Megatron engine cannot train on this machine"
        )
    elif not bridge["ok"]:
        lines.append(f"megatron.bridge does not import: {bridge['error']}")
    for label in ("NVIDIA Resiliency Extension", "flash-linear-attention"):
        probe = by_label[label]
        lines.append(f"{label}: " + ("imports" if probe["ok"] else f"fails: {probe['error']}"))
    return lines


def _probe_dict(found: Any) -> dict[str, Any]:
    return {"label": found.module.label, "import": found.module.statement(), "ok": found.ok,
            "version": found.version, "error": found.error, "where": found.where.removeprefix(" at ")}  # fmt: skip


def _build(spec: Any, workdir: Path) -> dict[str, Any]:
    from moe_vlm.engines.megatron.config import build_config, check_overrides
    from moe_vlm.engines.megatron.stack import where_raised

    started = time.perf_counter()
    try:
        built = build_config(spec, workdir)
        problems = check_overrides(built.cfg, spec)
    except Exception as exc:
        return {"built": False, "reason": f"{type(exc).__name__}: {' '.join(str(exc).split())[:400]}",
                "where": where_raised(exc).removeprefix(" at ")}  # fmt: skip
    return {
        "built": True,
        "recipe": built.recipe.name,
        "fields_applied": len(built.applied),
        "fields_not_held": problems,
        "seconds": time.perf_counter() - started,
    }


def _megatron(timeout_s: int) -> dict[str, Any]:
    """megatron_probe() in a fresh interpreter: imports that fail (or crash) cannot take the check down."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        command = [sys.executable, __file__, "--megatron-probe", out.name]
        started = time.perf_counter()
        try:
            done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return {"status": "failed", "error": f"timed out after {timeout_s} s"}
        wall_s = time.perf_counter() - started
        text = Path(out.name).read_text()
    if done.returncode != 0 or not text:
        tail = " | ".join((done.stdout + done.stderr).strip().splitlines()[-8:])
        return {"status": "failed", "error": f"exit {done.returncode}: {tail}", "wall_s": wall_s}
    return {"status": "completed", "wall_s": wall_s, **json.loads(text)}


def _calibration_probe(overrides: list[str], timeout_s: int) -> dict[str, Any]:
    """`moe-vlm calibrate --probe` on the mid-size point: the step model's rates measured here, the
    GEMMs against the H200's dense peak (one GPU: no link), what the Slurm canary prints on a GPU
    cluster."""
    command = [sys.executable, "-m", "moe_vlm.cli.main", "calibrate", "--probe", *overrides, "--dry-run"]
    try:
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "lines": []}
    lines = [line.strip() for line in done.stdout.splitlines()[1:] if line.strip()]
    if done.returncode != 0:
        return {"status": "failed", "error": done.stderr.strip().splitlines()[-1:], "lines": lines}
    return {"status": "completed", "lines": lines}


def _environment() -> dict[str, Any]:
    import torch
    import transformers

    env: dict[str, Any] = {
        "python": platform.python_version(),
        "glibc": platform.libc_ver()[1],
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "cuda_available": torch.cuda.is_available(),
    }
    if torch.cuda.is_available():
        properties = torch.cuda.get_device_properties(0)
        env.update(gpu=properties.name, gpu_memory_gib=properties.total_memory / 2**30,
                   gpus=torch.cuda.device_count(), capability=f"{properties.major}.{properties.minor}")  # fmt: skip
    return env


def _text(summary: dict[str, Any]) -> str:
    env = summary["environment"]
    lines = [
        f"moe_vlm GPU check ({summary['mode']}): {summary['wall_s']:.0f} s of a {summary['budget_s']} s budget",
        f"python {env['python']} (glibc {env['glibc']}), torch {env['torch']} (CUDA {env['torch_cuda']}), "
        f"transformers {env['transformers']}, GPU {env.get('gpu', 'none')} {env.get('gpu_memory_gib', 0):.0f} GiB",
        "",
        "-- torch engine (train.py engine=torch cluster=h200 nproc=1) --",
    ]
    for point in summary["torch_engine"]["points"]:
        if point["status"] != "completed":
            lines.append(f"{point['name']:<5} FAILED: {point.get('error') or point.get('problems')}")
            continue
        memory, step = point["memory"], point["step_time_s"] or {}
        mfu = f"{point['mfu']:.1%}" if isinstance(point["mfu"], float) else "n/a"
        error = f"{memory['error']:+.1%}" if isinstance(memory["error"], float) else "n/a"
        lines.append(
            f"{point['name']:<5} {point['steps']} steps, step p50 {step.get('p50', float('nan')):.3f} s, "
            f"{point['effective_tokens_per_s_per_gpu'] or 0:,.0f} effective tokens/s, MFU {mfu} of {point['peak']}; "
            f"peak memory {memory['measured_gib']:.2f} GiB ({memory['kind']}) vs predicted "
            f"{memory['predicted_gib']:.2f} GiB: {error}"
        )
        lines += [f"      problem: {p}" for p in point["problems"]]
    hooks = summary["torch_engine"]["hook_overhead"]
    if hooks.get("status") == "completed":
        lines.append(
            f"hooks on/off {hooks['on_off_wall_ratio']:.4f} (wall, {hooks['clock']}); inside the hooks "
            f"{hooks['inside_hooks_ms_per_step']:.3f} ms per step = {hooks['inside_hooks_share']:.3%}"
        )
    else:
        lines.append(f"hook overhead: {hooks.get('status')}: {hooks.get('error')}")
    lines += ["", "-- calibration probe (moe-vlm calibrate --probe, the mid point) --"]
    probe = summary["calibration_probe"]
    lines += (
        probe["lines"]
        if probe["status"] == "completed"
        else [f"probe {probe['status']}: {probe.get('error')}"]
    )
    mega = summary["megatron"]
    lines += [
        "",
        "-- Megatron stack against this machine's torch (on the GPU machine: carried wheels, no TE) --",
    ]
    if mega.get("status") != "completed":
        lines.append(f"probe {mega.get('status')}: {mega.get('error')}")
    else:
        lines.append("versions: " + ", ".join(f"{k} {v}" for k, v in mega["versions"].items()))
        lines += [f"finding: {line}" for line in mega["findings"]]
        for found in mega["imports"]:
            state = "ok     " if found["ok"] else "FAILS  "
            where = f" at {found['where']}" if found.get("where") else ""
            lines.append(
                f"  {state}{found['import']}" + ("" if found["ok"] else f": {found['error']}{where}")
            )
        for entry in mega["models"]:
            plan, config = entry["plan"], entry["config"]
            verdict = "VALID" if plan["valid"] else "INVALID " + ",".join(plan["errors"])
            built = (f"ConfigContainer built ({config['fields_applied']} fields, {len(config['fields_not_held'])} "
                     "not held)" if config["built"] else f"no ConfigContainer: {config['reason']}")  # fmt: skip
            lines.append(f"  {entry['model']:<22} plan {verdict}; {built}")
    lines += ["", "problems: " + ("none" if not summary["problems"] else "; ".join(summary["problems"]))]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/moe_vlm_gpu_check")))
    parser.add_argument("--cpu-smoke", action="store_true", help="2 steps of small points on CPU (tests)")
    parser.add_argument("--steps", type=int, help="steps per point (default 20; 2 with --cpu-smoke)")
    parser.add_argument("--budget-s", type=int, default=BUDGET_S)
    parser.add_argument("--megatron-probe", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.megatron_probe:
        args.megatron_probe.write_text(json.dumps(megatron_probe(), default=str))
        return 0

    started = time.perf_counter()
    mode = "cpu-smoke" if args.cpu_smoke else "gpu"
    steps = args.steps or (2 if args.cpu_smoke else 20)
    args.out.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {"schema": 1, "mode": mode, "budget_s": args.budget_s, "steps": steps,
                               "environment": _environment(), "problems": []}  # fmt: skip
    gpu = mode == "gpu"
    if gpu and not summary["environment"]["cuda_available"]:
        summary["problems"].append("torch sees no GPU (use --cpu-smoke on a CPU machine)")

    def left() -> int:
        return max(int(args.budget_s - (time.perf_counter() - started)), 30)

    points = []
    for name, overrides in POINTS[mode].items():
        full = [*COMMON, *overrides, f"train_iters={steps}", f"warmup_steps={min(3, steps - 1)}"]
        points.append(_run_point(name, full, args.out / "runs" / name, left(), gpu))
        summary["problems"] += [f"{name}: {p}" for p in points[-1].get("problems", [])]
        if points[-1]["status"] != "completed":
            summary["problems"].append(f"{name}: {points[-1]['status']}")
    mid = [*COMMON, *POINTS[mode]["mid"]]
    bench = [o for o in mid if not o.startswith("gbs=")] + ["gbs=1"]  # one micro-batch: the hooks' share
    reps, block = (1, 1) if args.cpu_smoke else (4, 2)
    hooks = _hook_overhead(bench, reps, block, left())
    if hooks["status"] != "completed":
        summary["problems"].append(f"hook overhead: {hooks.get('error')}")
    summary["torch_engine"] = {"points": points, "hook_overhead": hooks}
    summary["calibration_probe"] = _calibration_probe(mid, min(left(), 120))
    if summary["calibration_probe"]["status"] != "completed":
        summary["problems"].append(f"calibration probe: {summary['calibration_probe']['status']}")
    summary["megatron"] = _megatron(left())
    summary["wall_s"] = time.perf_counter() - started
    if summary["wall_s"] > args.budget_s:
        summary["problems"].append(f"took {summary['wall_s']:.0f} s, over the {args.budget_s} s budget")

    (args.out / f"{SUMMARY}.json").write_text(json.dumps(summary, indent=1, default=str))
    text = _text(summary)
    (args.out / f"{SUMMARY}.txt").write_text(text)
    print(text, end="")
    return 1 if summary["problems"] else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:
        traceback.print_exc()
        sys.exit(1)
