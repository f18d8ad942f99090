"""moe_vlm: sweeps for tuning MoE vision-language-model training (see README.md)."""

import os

from moe_vlm.base import noise

# Runs never download from the Hugging Face hub: clusters are often air-gapped, and N ranks
# fetching at once stall or race. huggingface_hub reads the variables once, when it is first
# imported (huggingface_hub/constants.py:194, cached by is_offline_mode()), and megatron.bridge
# -> transformers imports it long before any engine code runs; so they are set here, in the
# module every entry point (train.py, the Hydra plugins, submitit's job unpickling, torchrun's
# ranks, the CLI) imports first. A value the user exported wins, with huggingface_hub's own
# precedence (HF_HUB_OFFLINE, then TRANSFORMERS_OFFLINE): HF_HUB_OFFLINE=0 keeps the hub.
_OFFLINE = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or "1"
os.environ.setdefault("HF_HUB_OFFLINE", _OFFLINE)
os.environ.setdefault("TRANSFORMERS_OFFLINE", _OFFLINE)

# Library warnings a CPU run cannot act on (moe_vlm/base/noise.py): installed here for the same reason,
# before Transformer Engine imports torch.utils.cpp_extension, which logs one at import.
noise.install()
