#!/usr/bin/env bash
# GPU check on one machine with one H200 and no network (docs/megatron.md, "GPU smoke test"): the
# torch engine measured on the GPU (tiny + mid-size model, 20 steps each: step time, tokens/s,
# MFU, component-timer overhead, predicted vs measured peak memory), then the Megatron stack that
# travelled as wheels imported against this machine's torch, with the plan and the Bridge
# ConfigContainer for every model on cluster=h200. Writes $OUT/gpu_check_summary.{json,txt}.
#
#   bash scripts/pack_gpu_wheels.sh            # here, with network: fills wheels/ (git-ignored)
#   bash scripts/gpu_check.sh                  # there: installs wheels/ if present, then checks
#   bash scripts/gpu_check.sh --cpu-smoke      # 2 steps of small points on a CPU (what the tests run)
#
# Environment: PYTHON (default .venv/bin/python, else python3), OUT (default /tmp/moe_vlm_gpu_check),
# WHEELS (default wheels), SITE (where the wheels are unpacked; default /tmp/moe_vlm_gpu_site,
# outside $OUT so that they do not travel back). Needs torch and transformers; nothing downloads.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
export OUT=${OUT:-/tmp/moe_vlm_gpu_check}
WHEELS=${WHEELS:-wheels}
SITE=${SITE:-/tmp/moe_vlm_gpu_site}
mkdir -p "$OUT"

if compgen -G "$WHEELS/*.whl" >/dev/null; then
  # Pure-Python pieces the image lacks, and Megatron: into a directory of their own, first on
  # the path. The platform override lets the manylinux_2_39 nvidia-resiliency-ext wheel in on an
  # older glibc (its compiled part is loaded only by the straggler detector).
  pyver=$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
  target=(--only-binary=:all: --python-version "$pyver" --implementation cp)
  for level in manylinux_2_39 manylinux_2_28 manylinux_2_24 manylinux_2_17 manylinux2014 manylinux_2_12 manylinux2010; do
    target+=(--platform "${level}_$(uname -m)")  # pip matches these tags exactly
  done
  install() {
    "$PY" -m pip install --quiet --no-index --find-links "$WHEELS" --no-deps "${target[@]}" \
      --upgrade --target "$SITE" "$@"
  }
  names=()
  for wheel in "$WHEELS"/*.whl; do
    name=$(basename "$wheel" | cut -d- -f1)
    # torchvision pairs with one torch: only where the image has none.
    [ "$name" = torchvision ] || names+=("$name")
  done
  install "${names[@]}"
  if ! "$PY" -c 'import torchvision' 2>/dev/null && compgen -G "$WHEELS/torchvision-*.whl" >/dev/null; then
    install torchvision
  fi
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
  echo "gpu_check: installed ${#names[@]} wheel(s) from $WHEELS into $SITE"
fi

command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
exec "$PY" scripts/gpu_check.py --out "$OUT" "$@"
