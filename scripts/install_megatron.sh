#!/usr/bin/env bash
# Install the `megatron` extra (Megatron Core + Megatron Bridge + Transformer Engine) into .venv
# on a CPU-only machine, so tests/megatron can build real ConfigContainers and run the engine's
# own checks. Idempotent: a quick no-op once `import megatron.bridge, transformer_engine.pytorch`
# works. On a GPU cluster prefer NVIDIA's NeMo container, where these come preinstalled.
#
# Why not `pip install -e '.[megatron]'`: the resolver then picks megatron-core 0.12.3 and
# megatron-bridge's hard dependencies (flashinfer, mlflow, wandb, ...) pull in hundreds of MB we
# never import; transformer-engine-torch is source-only on PyPI and needs the CUDA headers of
# the pip-installed nvidia packages on the compiler paths. So the order below is pinned by hand.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${MOE_VLM_PYTHON:-.venv/bin/python}
MCORE_VERSION=0.19.2
BRIDGE_VERSION=0.6.2
TE_VERSION=2.20.2

check_imports() {
  HF_HUB_OFFLINE=1 "$PY" - <<'EOF' 2>/dev/null
import megatron.core, megatron.bridge, transformer_engine.pytorch  # noqa: F401
from importlib.metadata import version
assert version("megatron-core") == "0.19.2", version("megatron-core")
assert version("megatron-bridge") == "0.6.2", version("megatron-bridge")
EOF
}

if check_imports; then
  echo "install_megatron: megatron-core ${MCORE_VERSION}, megatron-bridge ${BRIDGE_VERSION}, transformer-engine already importable"
  exit 0
fi

# Keep the versions the rest of the project runs on: every pip call below is constrained.
constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
"$PY" - >"$constraints" <<'EOF'
from importlib.metadata import version
for name in ("torch", "torchvision", "transformers", "hydra-core", "omegaconf", "numpy"):
    print(f"{name}=={version(name)}")
EOF
pip_install() { "$PY" -m pip install --quiet -c "$constraints" "$@"; }

echo "install_megatron: constraints: $(tr '\n' ' ' <"$constraints")"
pip_install "megatron-core==${MCORE_VERSION}"
pip_install --no-deps "megatron-bridge==${BRIDGE_VERSION}"
# megatron-bridge's pure-Python needs that its import path and the Qwen3-VL recipes touch.
pip_install "transformers>=5.8,<=5.12.1" "hydra-core>=1.3.4,<1.4" "omegaconf>=2.3" einops pyyaml regex tqdm \
  rich six datasets pillow qwen-vl-utils accelerate "peft>=0.18.1" "diffusers>=0.36" tensorboard \
  "megatron-energon~=7.0" nvidia-modelopt typing-extensions
pip_install "transformer-engine-cu13==${TE_VERSION}" "transformer-engine==${TE_VERSION}" --no-deps
pip_install ninja pybind11 setuptools wheel packaging onnxscript onnx

# transformer-engine-torch: built from source against the pip nvidia packages (pip caches the
# wheel, so a second install on the same machine takes seconds).
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
  HF_HUB_OFFLINE=1 "$PY" -c 'import megatron.bridge, transformer_engine.pytorch' >&2 || true
  exit 1
fi
"$PY" - <<'EOF'
from importlib.metadata import version
names = ("torch", "torchvision", "transformers", "hydra-core", "megatron-core", "megatron-bridge",
         "transformer-engine-torch")
print("install_megatron: ok: " + ", ".join(f"{n} {version(n)}" for n in names))
EOF
