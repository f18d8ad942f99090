#!/usr/bin/env bash
# GPU smoke test of engine=megatron on ONE cluster node: a few steps of Qwen3-VL-30B-A3B with each
# MoE dispatcher, so users can check their install (Megatron Bridge + Megatron Core + Transformer
# Engine + DeepEP/HybridEP) before submitting sweeps.
#
#   bash scripts/megatron_smoke.sh b200                 # on a B200 node (8 GPUs)
#   srun -N1 --gpus-per-node=4 --pty bash scripts/megatron_smoke.sh gb200
#   HF_MODEL_DIR=/models/Qwen3-VL-30B-A3B-Instruct bash scripts/megatron_smoke.sh b200 data=synthetic
#
# Arguments: the cluster profile (conf/cluster: gb200, b200, h100, h200), then any extra Hydra
# overrides for every run. Environment: HF_MODEL_DIR (a local checkpoint dir: config, tokenizer,
# processor; otherwise the Hugging Face cache must hold Qwen/Qwen3-VL-30B-A3B-Instruct's processor
# files), PYTHON (default .venv/bin/python, else python), SMOKE_DIR (output root), STEPS (6),
# GPUS (GPUs on this node; default: what `nvidia-smi -L` lists).
#
# Each dispatcher is planned first (dry_run): one the rule catalogue rejects on this cluster (DeepEP
# on GB200, say) is reported as SKIP with the reason and never started. A run passes when run.json
# says completed and steps.jsonl has every step. Exit status: 0 when a run passed and none failed,
# 1 when a run failed, 3 when every dispatcher was skipped (nothing was checked).
set -uo pipefail
cd "$(dirname "$0")/.."

cluster=${1:-b200}
shift || true
if [ -x .venv/bin/python ]; then PY=${PYTHON:-.venv/bin/python}; else PY=${PYTHON:-python}; fi
steps=${STEPS:-6}
out=${SMOKE_DIR:-outputs/megatron_smoke/$(date +%Y%m%d-%H%M%S)}
gpus=${GPUS:-$(nvidia-smi -L 2>/dev/null | wc -l)}
if [ "$gpus" -lt 1 ]; then
  echo "megatron_smoke: no GPU visible (nvidia-smi -L lists none); run this on a cluster node." >&2
  exit 2
fi
export HF_HUB_OFFLINE=1
common=(engine=megatron model=qwen3_vl_30b_a3b "cluster=$cluster" nodes=1 "nproc=$gpus"
        "train_iters=$steps" warmup_steps=2 mbs=1 "gbs=$((gpus * 2))")
if [ -n "${HF_MODEL_DIR:-}" ]; then common+=("model.hf_model_id=$HF_MODEL_DIR"); fi
mkdir -p "$out"
echo "megatron_smoke: $gpus GPU(s), cluster=$cluster, $steps steps per dispatcher, output in $out"

failed=0
ran=0
summary=()
for dispatcher in alltoall allgather deepep hybridep; do
  dir="$out/$dispatcher"
  if ! "$PY" train.py "${common[@]}" "dispatcher=$dispatcher" dry_run=true "$@" >"$dir.plan.txt" 2>&1; then
    reason=$(grep -m1 -E '^ *ERROR' "$dir.plan.txt" | sed 's/^ *//' || tail -n1 "$dir.plan.txt")
    summary+=("SKIP  $dispatcher: $reason")
    continue
  fi
  ran=$((ran + 1))
  echo "== $dispatcher: torchrun --nproc-per-node=$gpus (log: $dir.log)"
  "$PY" -m torch.distributed.run --standalone "--nproc-per-node=$gpus" train.py "${common[@]}" \
    "dispatcher=$dispatcher" "hydra.run.dir=$dir" "$@" >"$dir.log" 2>&1
  status=$?
  verdict=$("$PY" - "$dir" "$steps" "$status" <<'EOF'
import json, sys
from pathlib import Path

run_dir, steps, status = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
run_json = run_dir / "run.json"
if not run_json.exists():
    log = Path(f"{run_dir}.log")
    # The pre-flight's one line (a module the run imports is missing, say) says why.
    why = [l for l in log.read_text(errors="replace").splitlines() if l.startswith("moe_vlm: error:")] \
        if log.exists() else []
    print(f"FAIL  exit {status}, no run.json: {why[0] if why else f'see {log}'}")
    sys.exit()
record = json.loads(run_json.read_text())
lines = [json.loads(l) for l in (run_dir / "steps.jsonl").read_text().splitlines() if l.strip()] \
    if (run_dir / "steps.jsonl").exists() else []
seen = sorted({line["step"] for line in lines})
summary = record.get("summary") or {}
p50 = (summary.get("step_time_s") or {}).get("p50")
bridge = (record.get("bridge") or {}).get("tflops_per_gpu")
ok = record.get("status") == "completed" and seen == list(range(1, steps + 1))
figures = f"step p50 {p50:.3f} s" if isinstance(p50, float) else "no steady step time"
if isinstance(bridge, float):
    figures += f", Bridge {bridge:.0f} TFLOP/s/GPU"
failure = (record.get("failure") or {}).get("class", "")
print(("OK    " if ok else "FAIL  ") + f"status={record.get('status')} {failure} steps {len(seen)}/{steps}, {figures}")
EOF
)
  summary+=("${verdict:0:6}$dispatcher: ${verdict:6}")
  case "$verdict" in OK*) ;; *) failed=1 ;; esac
done

echo
echo "megatron_smoke summary (cluster=$cluster, $gpus GPU(s), Qwen3-VL-30B-A3B, $steps steps):"
printf '  %s\n' "${summary[@]}"
if [ "$ran" -eq 0 ]; then
  echo "megatron_smoke: every dispatcher was skipped (reasons above): nothing ran, so nothing was checked." >&2
  exit 3
fi
exit $failed
