#!/usr/bin/env bash
# GPU check of the embedded torch engine, in one call: the real `python train.py` path on the
# local GPU(s) with bf16 + NCCL, on a mid-sized Qwen3-VL-MoE (Qwen3-VL-30B-A3B widths: all 128
# experts, the full 27-block vision tower, 4 of the 48 decoder layers; 3.65B parameters, about
# 60 GiB of fp32 weights, gradients and AdamW state on one GPU), synthetic images, then the
# hook-overhead benchmark on the same model. Checks run.json and exits non-zero on a problem.
#
#   bash scripts/gpu_check.sh                 # writes under $OUT (default /tmp/moe_vlm_gpu_check)
#   PYTHON=python3 bash scripts/gpu_check.sh  # another interpreter than .venv/bin/python
#
# Needs torch with CUDA and transformers with Qwen3-VL-MoE; no network, no Megatron.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
OUT=${OUT:-/tmp/moe_vlm_gpu_check}
mkdir -p "$OUT"

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
"$PY" - <<'EOF'
import sys, torch, transformers
print(f"python {sys.version.split()[0]} torch {torch.__version__} (CUDA {torch.version.cuda}) transformers {transformers.__version__}")
if not torch.cuda.is_available():
    sys.exit("gpu_check: torch sees no GPU")
EOF
GPUS=$("$PY" -c "import torch; print(torch.cuda.device_count())")

# Mid-sized model; GBS = 2 x GPUs so every step accumulates two micro-batches per rank.
MODEL=(model=qwen3_vl_30b_a3b model.num_layers=4 seq_length=4096 data=synthetic)
RUN="$OUT/run"
rm -rf "$RUN"
"$PY" train.py "hydra.run.dir=$RUN" "${MODEL[@]}" engine=torch nproc="$GPUS" gbs=$((2 * GPUS)) \
    train_iters=8 warmup_steps=3 recompute=selective

"$PY" - "$RUN" <<'EOF'
import json, sys
from pathlib import Path

run = Path(sys.argv[1])
record = json.loads((run / "run.json").read_text())
steps = [json.loads(line) for line in (run / "steps.jsonl").read_text().splitlines()]
engine = record["torch_engine"]
problems = []
if record["status"] != "completed":
    problems.append(f"status {record['status']}: {record.get('failure')}")
if not engine["device"].startswith("cuda") or engine["backend"] != "nccl" or not engine["precision"].startswith("bf16"):
    problems.append(f"not a bf16 NCCL GPU run: {engine}")
if any(s["memory_kind"] != "cuda_max_allocated" for s in steps):
    problems.append("peak memory is not CUDA max allocated")
if any(min(s["components_s"].values()) <= 0 for s in steps):
    problems.append("a component (vision encoder / projector / decoder) has no time")
if any(s["images"] == 0 for s in steps):
    problems.append("a step without images")
summary = record["summary"]
print(json.dumps({
    "status": record["status"],
    "engine": engine,
    "step_time_s": summary.get("step_time_s"),
    "effective_tokens_per_s_per_gpu": summary.get("effective_tokens_per_s_per_gpu"),
    "peak_memory_gib": summary.get("peak_memory_gib"),
    "components": summary.get("components"),
    "loss_first_last": [steps[0]["loss"], steps[-1]["loss"]],
}, indent=2, default=str))
if problems:
    sys.exit("gpu_check: " + "; ".join(problems))
print("gpu_check: torch engine OK on GPU")
EOF

# Hook overhead on the same model, one GPU: hooks on / off ratio and time inside the hooks.
"$PY" scripts/bench_hooks.py --reps 4 --steps 2 --batches 2 -- "${MODEL[@]}" gbs=1 \
    data.min_long_side_px=672 data.max_long_side_px=1344 data.max_pixels=1003520
