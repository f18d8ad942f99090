"""Offline holds: building the Bridge config, its tokenizer and the data's processor never try the hub.

Each check runs in a fresh interpreter with an empty Hugging Face cache (HF_HOME in tmp, no
HF_HUB_OFFLINE exported) whose first lines install a socket guard: any DNS lookup or connect to a
non-loopback address is recorded and refused. The child then does what a rank does before and
during setup, for every model on h200 (which has no recipe of its own) and gb200, with seeded
(synthetic) and real (Energon) data: moe_vlm's build_config (recipe + table), Bridge's own
build_tokenizer(cfg.tokenizer) (what setup calls, training/setup.py:293), the engine's pre-flight
`_check_processor`, and for real data Bridge's build_energon_task_encoder, which loads
AutoTokenizer and Qwen3VLProcessor from the processor path (data/builders/energon.py:233-240).

huggingface_hub reads HF_HUB_OFFLINE once, at import (huggingface_hub/constants.py:194), so the
control case exports HF_HUB_OFFLINE=0 (a user's explicit choice, which moe_vlm keeps): the same
code then reaches for the hub and the guard sees it, which is what every rank did while the
engine set the variable after megatron.bridge had imported huggingface_hub.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.conftest import CONF, REPO
from tests.megatron.conftest import needs_stack

pytestmark = needs_stack

MODELS = sorted(p.stem for p in (CONF / "model").glob("*.yaml"))
CLUSTERS = ["h200", "gb200"]  # a cluster without a recipe of its own, and one with

# The control sets this: its first attempt is the finding, and the process ends there (the hub
# client retries each file with backoff: 57 refused attempts and 200 s to the end).
FIRST_ATTEMPT_ENDS = "MOE_VLM_TEST_FIRST_ATTEMPT_ENDS"

GUARD = r"""
import json
import os
import socket
import sys

ATTEMPTS = []
_LOOPBACK = ("localhost", "127.0.0.1", "::1")


def _remote(host):
    return host is not None and str(host) not in _LOOPBACK and not str(host).startswith("127.")


def _refuse(what):
    ATTEMPTS.append(what)
    if os.environ.get("MOE_VLM_TEST_FIRST_ATTEMPT_ENDS") == "1":
        from huggingface_hub import constants

        with open(sys.argv[1], "w") as out:
            json.dump({"offline": constants.is_offline_mode(), "attempts": ATTEMPTS, "results": []}, out)
        os._exit(0)
    raise OSError(f"network access attempted: {what}")


_getaddrinfo, _connect, _connect_ex = socket.getaddrinfo, socket.socket.connect, socket.socket.connect_ex


def getaddrinfo(host, *args, **kwargs):
    if _remote(host):
        _refuse(f"getaddrinfo {host}")
    return _getaddrinfo(host, *args, **kwargs)


def connect(self, address):
    if isinstance(address, tuple) and _remote(address[0]):
        _refuse(f"connect {address[0]}")
    return _connect(self, address)


def connect_ex(self, address):
    if isinstance(address, tuple) and _remote(address[0]):
        _refuse(f"connect {address[0]}")
    return _connect_ex(self, address)


socket.getaddrinfo, socket.socket.connect, socket.socket.connect_ex = getaddrinfo, connect, connect_ex
"""

CHILD = r"""
import json
import sys
import warnings
from pathlib import Path

import moe_vlm  # noqa: F401  (as every entry point: the offline defaults come first)

warnings.simplefilter("ignore")
out, workdir, cases = Path(sys.argv[1]), Path(sys.argv[2]), json.loads(sys.argv[3])

from huggingface_hub import constants
from megatron.bridge.data.builders.energon import build_energon_task_encoder
from megatron.bridge.training.setup import _validate_and_set_vocab_size
from megatron.bridge.training.tokenizers.tokenizer import build_tokenizer

from moe_vlm.base.errors import EngineUnavailable
from moe_vlm.engines.megatron.config import build_config
from moe_vlm.engines.megatron.launch import _check_processor
from tests.conftest import make_spec


def outcome(call):
    try:
        result = call()
    except EngineUnavailable as exc:
        return str(exc)
    except Exception as exc:
        return f"{type(exc).__name__}: {str(exc)[:300]}"
    return "ok" if result is None or not isinstance(result, list) else result


def setup_vocab(cfg):
    # What setup does with the tokenizer (training/setup.py:293-299).
    tokenizer = build_tokenizer(cfg.tokenizer)
    return list(_validate_and_set_vocab_size(
        model_vocab_size=cfg.model.vocab_size,
        tokenizer_vocab_size=tokenizer.vocab_size,
        use_tokenizer_vocab_size=cfg.tokenizer.use_tokenizer_vocab_size,
    ))


results = []
for number, overrides in enumerate(cases):
    spec = make_spec(*overrides)
    built = build_config(spec, workdir / str(number))
    cfg = built.cfg
    encoder = getattr(cfg.dataset, "task_encoder", None)
    results.append({
        "overrides": overrides,
        "hf_model_id": spec.model.hf_model_id,
        "vocab_size": spec.model.vocab_size,
        "hub_ids_requested": built.hub_ids_requested,
        "tokenizer": [cfg.tokenizer.tokenizer_type, cfg.tokenizer.tokenizer_model],
        "setup_vocab": outcome(lambda: setup_vocab(cfg)),
        "dataset": type(cfg.dataset).__name__,
        "processor": getattr(encoder, "hf_processor_path", None),
        "check": outcome(lambda: _check_processor(cfg, workdir)),
        "energon": outcome(lambda: build_energon_task_encoder(cfg.dataset)) if encoder else None,
    })
out.write_text(json.dumps({"offline": constants.is_offline_mode(), "attempts": ATTEMPTS, "results": results}))
"""


def in_fresh_process(tmp_path: Path, cases: list[list[str]], **env: str) -> dict[str, Any]:
    """Run CHILD for `cases` in a new interpreter, behind the socket guard, HF cache in tmp_path."""
    hf_home = tmp_path / "hf_home"
    hf_home.mkdir(exist_ok=True)
    keep = {
        k: v
        for k, v in os.environ.items()
        if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE")
        and not k.startswith(("TRANSFORMERS_CACHE", "HF_DATASETS"))
    }
    script = tmp_path / "child.py"
    script.write_text(GUARD + CHILD)
    out = tmp_path / "out.json"
    done = subprocess.run(
        [sys.executable, str(script), str(out), str(tmp_path / "work"), json.dumps(cases)],
        cwd=REPO,
        env={**keep, "HF_HOME": str(hf_home), "PYTHONPATH": str(REPO), **env},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(out.read_text())


def cases(tmp_path: Path, models: list[str], clusters: list[str]) -> list[list[str]]:
    shards = tmp_path / "shards"  # Energon's config needs a path; nothing here reads the shards
    shards.mkdir(exist_ok=True)
    data = [["data=synthetic"], ["data=real", f"data.path={shards}"]]
    return [
        [f"model={m}", f"cluster={c}", "engine=megatron", *d] for m in models for c in clusters for d in data
    ]


def test_every_model_builds_and_loads_offline_without_touching_the_network(tmp_path: Path) -> None:
    report = in_fresh_process(tmp_path, cases(tmp_path, MODELS, CLUSTERS))

    assert report["offline"] is True
    assert report["attempts"] == []
    assert len(report["results"]) == len(MODELS) * len(CLUSTERS) * 2
    for r in report["results"]:
        where = " ".join(r["overrides"])
        # The recipe's AutoBridge call read the materialised config, whatever hub id it names.
        assert r["hub_ids_requested"], where
        # No recipe keeps a hub tokenizer id: Bridge builds the model-sized NullTokenizer, here...
        assert r["tokenizer"] == ["NullTokenizer", None], where
        # setup keeps the model's vocabulary, unpadded (the general recipe took the tokenizer's).
        assert r["setup_vocab"] == [r["vocab_size"], False], where
        if "data=real" in r["overrides"]:
            assert r["processor"] == r["hf_model_id"], where
            # No processor files here: a clear local refusal naming the path and the fix...
            assert r["check"].startswith("engine=megatron: the data pipeline needs the processor files"), (
                where
            )
            assert r["hf_model_id"] in r["check"] and "model.hf_model_id=" in r["check"], where
            # ...and Bridge's own Energon encoder builder fails the same way, locally.
            assert r["energon"].startswith("OSError"), (where, r["energon"])
        else:
            # The seeded data loads nothing from Hugging Face.
            assert (r["dataset"], r["check"]) == ("MoeVlmDatasetConfig", "ok"), where


def test_an_explicit_hub_choice_is_kept_and_the_guard_sees_it(tmp_path: Path) -> None:
    # The control: without offline mode at import time, the same path goes to the hub.
    report = in_fresh_process(
        tmp_path,
        cases(tmp_path, ["qwen3_vl_30b_a3b"], ["h200"])[1:],
        HF_HUB_OFFLINE="0",
        **{FIRST_ATTEMPT_ENDS: "1"},
    )

    assert report["offline"] is False
    assert any("huggingface.co" in attempt for attempt in report["attempts"])


def tiny_processor(directory: Path) -> Path:
    """Qwen3-VL processor files (byte-level BPE tokenizer, image and video processors), built here."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import (
        PreTrainedTokenizerFast,
        Qwen2VLImageProcessor,
        Qwen3VLProcessor,
        Qwen3VLVideoProcessor,
    )

    bpe = Tokenizer(models.BPE(vocab={chr(i): i - 32 for i in range(32, 127)}, merges=[]))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    specials = ["<|im_start|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=specials,
    )
    processor = Qwen3VLProcessor(
        image_processor=Qwen2VLImageProcessor(),
        tokenizer=tokenizer,
        video_processor=Qwen3VLVideoProcessor(),
        chat_template="{% for m in messages %}{{ m['content'] }}{% endfor %}",
    )
    processor.save_pretrained(directory)
    return directory


def test_the_processor_loads_offline_from_a_local_dir_and_from_the_cache(tmp_path: Path) -> None:
    from moe_vlm.engines.hf_config import write_hf_config
    from tests.conftest import make_spec

    files = tiny_processor(tmp_path / "files")
    # A local checkpoint directory: config.json and the processor files, as a user would give it.
    local = write_hf_config(make_spec("model=qwen3_vl_30b_a3b").model, tmp_path / "checkpoint")
    for f in files.iterdir():
        shutil.copy(f, local)
    # The same files as the hub id's snapshot in the Hugging Face cache (the layout hf download makes).
    repo = tmp_path / "hf_home" / "hub" / "models--Qwen--Qwen3-VL-30B-A3B-Instruct"
    revision = "0" * 40
    shutil.copytree(local, repo / "snapshots" / revision)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)

    [from_cache] = cases(tmp_path, ["qwen3_vl_30b_a3b"], ["h200"])[1:]
    from_dir = [*from_cache, f"model.hf_model_id={local}"]
    report = in_fresh_process(tmp_path, [from_dir, from_cache])

    assert report["attempts"] == []
    local_dir, cached = report["results"]
    assert (local_dir["processor"], cached["processor"]) == (str(local), "Qwen/Qwen3-VL-30B-A3B-Instruct")
    for r in (local_dir, cached):
        assert (r["check"], r["energon"]) == ("ok", "ok"), r
