#!/usr/bin/env bash
# Install the `megatron` extra (Megatron Core + Megatron Bridge + Transformer Engine) into .venv
# on a CPU-only machine, with everything Bridge's `pretrain` imports (nvidia-resiliency-ext) and
# flash-linear-attention for Qwen3.5's Gated DeltaNet layers, so tests/megatron can build real
# ConfigContainers, import `pretrain` and run the engine's own checks. Idempotent: a quick no-op
# once those imports work. On a GPU cluster prefer NVIDIA's NeMo container, where these come
# preinstalled. DeepEP/HybridEP (`deep_ep`, for dispatcher=deepep|hybridep) has no wheel that
# installs here; `dry_run=true` and the run's pre-flight say so (moe_vlm/engines/megatron/stack.py).
#
# Why not `pip install -e '.[megatron]'`: the resolver then picks megatron-core 0.12.3 and
# megatron-bridge's hard dependencies (flashinfer, mlflow, wandb, ...) pull in hundreds of MB we
# never import; transformer-engine-torch is source-only on PyPI and needs the CUDA headers of
# the pip-installed nvidia packages on the compiler paths. So the order below is pinned by hand,
# and every version comes from constraints.txt.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${MOE_VLM_PYTHON:-.venv/bin/python}
MCORE_VERSION=0.19.2
BRIDGE_VERSION=0.6.2
TE_VERSION=2.20.2

check_imports() {
  HF_HUB_OFFLINE=1 "$PY" - <<'EOF' 2>/dev/null
import megatron.core, megatron.bridge, transformer_engine.pytorch  # noqa: F401
from megatron.bridge.training.pretrain import pretrain  # noqa: F401  (imports nvidia_resiliency_ext)
from fla.ops.gated_delta_rule import chunk_gated_delta_rule  # noqa: F401  (Qwen3.5's GDN layers)
from importlib.metadata import version
assert version("megatron-core") == "0.19.2", version("megatron-core")
assert version("megatron-bridge") == "0.6.2", version("megatron-bridge")
EOF
}

if check_imports; then
  echo "install_megatron: megatron-core ${MCORE_VERSION}, megatron-bridge ${BRIDGE_VERSION}, transformer-engine, pretrain and fla already importable"
  exit 0
fi

# constraints.txt's exact versions, except where this environment already holds one of the
# packages the rest of the project runs on (a container's torch stays): every pip call below is
# constrained.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
constraints="$tmp/constraints.txt"
"$PY" - constraints.txt >"$constraints" <<'EOF'
import re
import sys
from importlib.metadata import PackageNotFoundError, version

def norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()

held = {}
for name in ("torch", "torchvision", "transformers", "hydra-core", "omegaconf", "numpy"):
    try:
        held[name] = version(name)
    except PackageNotFoundError:
        pass
for line in open(sys.argv[1]):
    line = line.strip()
    name = re.split(r"[=<>!~;\[ ]", line, maxsplit=1)[0]
    if name and not line.startswith("#") and norm(name) not in held:
        print(line)
for name, found in held.items():
    print(f"{name}=={found}")
EOF
pip_install() { "$PY" -m pip install --quiet -c "$constraints" "$@"; }

echo "install_megatron: constraints.txt, keeping $(grep -E '^(torch|torchvision|transformers|hydra-core|omegaconf|numpy)==' "$constraints" | tr '\n' ' ')"
pip_install "megatron-core==${MCORE_VERSION}"
pip_install --no-deps "megatron-bridge==${BRIDGE_VERSION}"
# megatron-bridge's pure-Python needs that its import path and the Qwen3-VL recipes touch.
pip_install "transformers>=5.8,<=5.12.1" "hydra-core>=1.3.4,<1.4" "omegaconf>=2.3" einops pyyaml regex tqdm \
  rich six datasets pillow qwen-vl-utils accelerate "peft>=0.18.1" "diffusers>=0.36" tensorboard \
  "megatron-energon~=7.0" nvidia-modelopt typing-extensions

# Qwen3.5's Gated DeltaNet layers (megatron/core/ssm/gated_delta_net/common.py:43-55): pure Python.
pip_install flash-linear-attention fla-core

# Bridge's `pretrain` imports nvidia_resiliency_ext (megatron/bridge/training/pretrain.py:19), and
# Megatron Core asserts >= 0.6.0 as its checkpoint strategies load (strategies/nvrx.py:15, 45-46;
# strategies/torch.py:64). Its PyPI wheels are tagged manylinux_2_39 (glibc 2.39): on an older
# glibc pip finds none. The wheel's one compiled module (nvrx_cupti_module, loaded only by the
# straggler detector's CUPTI path) needs GLIBC_2.32 at most (objdump -T) and `pretrain`'s import
# chain is pure Python, so there the same wheel goes in with pip's platform override.
pip_install defusedxml grpcio grpcio-tools httpx nvidia-ml-py packaging protobuf psutil pyyaml
if ! pip_install --no-deps nvidia-resiliency-ext 2>"$tmp/nvrx.err"; then
  arch=$(uname -m)
  pyver=$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
  echo "install_megatron: no nvidia-resiliency-ext wheel for glibc $(ldd --version | head -n1 | awk '{print $NF}'); installing its manylinux_2_39_${arch} wheel with pip's platform override"
  "$PY" -m pip install --quiet --no-deps -c "$constraints" --only-binary=:all: \
    --platform "manylinux_2_39_${arch}" --python-version "$pyver" --implementation cp \
    --target "$tmp/nvrx" nvidia-resiliency-ext
  site=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  for item in "$tmp/nvrx"/*; do
    name=$(basename "$item")
    [ "$name" = bin ] && continue  # its console scripts (ft_launcher, ...): the engine never calls them
    rm -rf "${site:?}/$name"
    mv "$item" "$site/"
  done
fi

pip_install "transformer-engine-cu13==${TE_VERSION}" "transformer-engine==${TE_VERSION}" --no-deps
pip_install ninja pybind11 setuptools wheel packaging onnxscript onnx

# transformer-engine-torch: built from source against the pip nvidia packages (a no-op once
# installed; the build takes about 10 minutes on 2 idle cores).
site=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
NV="$site/nvidia"
export CPATH="$NV/cu13/include:$NV/nccl/include:$NV/cudnn/include${CPATH:+:$CPATH}"
export LIBRARY_PATH="$NV/cu13/lib:$NV/nccl/lib:$NV/cudnn/lib${LIBRARY_PATH:+:$LIBRARY_PATH}"
export CUDNN_PATH="$NV/cudnn"
if [ -z "${CUDA_HOME:-}" ]; then
  if [ -d /usr/local/cuda ]; then CUDA_HOME=/usr/local/cuda
  else CUDA_HOME=$(dirname "$(dirname "$(command -v nvcc)")"); fi
fi
export CUDA_HOME NVTE_FRAMEWORK=pytorch MAX_JOBS=${MAX_JOBS:-2} NVTE_CUDA_ARCHS=${NVTE_CUDA_ARCHS:-100}
pip_install --no-build-isolation --no-deps "transformer-engine-torch==${TE_VERSION}"

if ! check_imports; then
  echo "install_megatron: install finished but the imports still fail:" >&2
  HF_HUB_OFFLINE=1 "$PY" -c 'import megatron.bridge, transformer_engine.pytorch
from megatron.bridge.training.pretrain import pretrain
from fla.ops.gated_delta_rule import chunk_gated_delta_rule' >&2 || true
  exit 1
fi
"$PY" - <<'EOF'
from importlib.metadata import version
names = ("torch", "torchvision", "transformers", "hydra-core", "megatron-core", "megatron-bridge",
         "transformer-engine-torch", "nvidia-resiliency-ext", "flash-linear-attention")
print("install_megatron: ok: " + ", ".join(f"{n} {version(n)}" for n in names))
EOF
