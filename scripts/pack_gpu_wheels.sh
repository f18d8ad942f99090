#!/usr/bin/env bash
# Fill wheels/ (git-ignored) with what scripts/gpu_check.sh installs on the GPU machine, whose image
# has CUDA torch 2.11 and transformers but nothing else of ours and no network: the pure-Python
# pieces the check imports (Hydra, submitit), Megatron Core + Bridge + nvidia-resiliency-ext and
# flash-linear-attention at the versions of constraints.txt, and the torchvision that pairs with
# the image's torch (installed there only if the image has none). CPython 3.12, Linux x86_64.
# Transformer Engine cannot travel (its core wheel alone is about 270 MB): the check says what
# that leaves Megatron able to do. Everything together with the repository must stay under 64 MiB.
#
#   bash scripts/pack_gpu_wheels.sh                  # for torch 2.11.0
#   GPU_TORCH=2.12.0 bash scripts/pack_gpu_wheels.sh
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-.venv/bin/python}
dest=${WHEELS:-wheels}
torch_version=${GPU_TORCH:-2.11.0}
limit=$((64 * 1024 * 1024))
# pip matches --platform tags exactly: name every manylinux level an x86_64 wheel may carry.
target=(--only-binary=:all: --python-version 3.12 --implementation cp)
for level in manylinux_2_39 manylinux_2_34 manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 manylinux2014 manylinux_2_12 manylinux2010 manylinux1; do
  target+=(--platform "${level}_x86_64")
done

rm -rf "$dest"
mkdir -p "$dest"
pip_q() { "$PY" -m pip "$@" 2> >(grep -v '^WARNING: Location' >&2); }
pip_q download --quiet --no-deps "${target[@]}" -c constraints.txt -d "$dest" \
  hydra-core omegaconf hydra-submitit-launcher submitit cloudpickle \
  megatron-core megatron-bridge nvidia-resiliency-ext defusedxml psutil \
  flash-linear-attention fla-core einops
# omegaconf's parser runtime is published as a source archive only: build its (pure) wheel here.
pip_q wheel --quiet --no-deps -c constraints.txt -w "$dest" antlr4-python3-runtime
# The torchvision built for that torch (0.N+15.P for torch 2.N.P since torch 2.0), checked against
# the torch requirement in the wheel's own metadata.
IFS=. read -r _major minor patch <<<"$torch_version"
vision="0.$((minor + 15)).${patch:-0}"
pip_q download --quiet --no-deps "${target[@]}" -d "$dest" "torchvision==${vision}"
if ! "$PY" - "$dest"/torchvision-"${vision}"-*.whl "$torch_version" <<'EOF'; then
import sys, zipfile
from packaging.requirements import Requirement

wheel, torch_version = sys.argv[1:]
with zipfile.ZipFile(wheel) as archive:
    meta = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
    lines = archive.read(meta).decode().splitlines()
torch = [Requirement(l.split(":", 1)[1]) for l in lines if l.startswith("Requires-Dist:") and " torch" in l[:20]]
sys.exit(0 if torch and all(r.specifier.contains(torch_version) for r in torch if r.name == "torch") else 1)
EOF
  echo "pack_gpu_wheels: torchvision ${vision} does not pair with torch ${torch_version}" >&2
  exit 1
fi

wheels_bytes=$(du -cb "$dest"/*.whl | tail -n1 | cut -f1)
repo_bytes=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | awk '/total$/ {sum += $1} END {print sum}')
total=$((wheels_bytes + repo_bytes))
ls -1 "$dest"
echo "pack_gpu_wheels: $(ls "$dest" | wc -l) wheels, $((wheels_bytes / 1024)) KiB (torchvision ${vision} for torch ${torch_version}); with the repository $((total / 1024)) KiB of the 65536 KiB a device call carries"
if [ "$total" -gt "$limit" ]; then
  echo "pack_gpu_wheels: over the 64 MiB limit" >&2
  exit 1
fi
