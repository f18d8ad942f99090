"""The stack a run imports (moe_vlm/engines/megatron/stack.py), against the installed library:
`pretrain` imports for real, the modules we declare for DeepEP/HybridEP and flash-linear-attention
are the ones Megatron Core imports, and a run that needs a module missing here stops in one line
with exit status 2 before anything starts."""

from __future__ import annotations

import importlib.util
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

from moe_vlm.engines.megatron import stack
from moe_vlm.knobs.bridge_recipe import select_recipe
from tests.conftest import REPO, make_spec
from tests.megatron.conftest import needs_stack

MEG = ("engine=megatron", "model=qwen3_vl_30b_a3b")


def labels(*overrides: str) -> list[str]:
    return [module.label for module in stack.required(make_spec(*MEG, *overrides))]


def test_the_options_decide_the_modules() -> None:
    base = labels("cluster=b200")
    assert base[:7] == [
        "Megatron Core", "Transformer Engine", "Megatron Bridge", "NVIDIA Resiliency Extension",
        "Bridge pretrain", "forward step", "Bridge recipe",
    ]  # fmt: skip
    assert "HF processor" in base
    assert not {"DeepEP", "HybridEP (DeepEP)", "flash-linear-attention", "Megatron Energon"} & set(base)
    assert "DeepEP" in labels("cluster=b200", "dispatcher=deepep")
    assert "HybridEP (DeepEP)" in labels("cluster=gb200", "nodes=2", "dispatcher=hybridep")
    assert "flash-linear-attention" in labels("cluster=b200", "model=qwen35_vl_35b_a3b")
    spec = make_spec(*MEG, "cluster=gb200", "nodes=2")
    recipe = select_recipe(spec)
    assert recipe is not None
    recipe_module = next(m for m in stack.required(spec) if m.label == "Bridge recipe")
    assert recipe_module.imports == (f"{recipe.module}:{recipe.function}",)


@needs_stack
def test_pretrain_imports_for_real() -> None:
    from megatron.bridge.training.pretrain import pretrain

    assert callable(pretrain)
    # Everything a default run imports, tried here: none missing on the installed stack.
    probes = stack.probe(make_spec(*MEG, "cluster=b200"))
    assert [p.module.label for p in probes if not p.ok] == [], [p.problem() for p in probes if not p.ok]
    resiliency = next(p for p in probes if p.module is stack.RESILIENCY)
    assert resiliency.version is not None
    from packaging.version import Version

    assert Version(resiliency.version) >= Version(stack.NVRX_MIN_VERSION)


@needs_stack
def test_declared_imports_are_what_megatron_core_imports() -> None:
    """Our DeepEP / HybridEP / fla entries name the library's own import statements, and our probe
    agrees with the library's own flags (HAVE_DEEP_EP, HAVE_HYBRIDEP, HAVE_FLA) on this machine."""
    from megatron.core.dist_checkpointing.strategies import nvrx
    from megatron.core.ssm.gated_delta_net import common as gdn
    from megatron.core.transformer.moe import fused_a2a

    a2a_source, gdn_source = inspect.getsource(fused_a2a), inspect.getsource(gdn)
    for module, flag, source in (
        (stack.DEEP_EP, fused_a2a.HAVE_DEEP_EP, a2a_source),
        (stack.HYBRID_EP, fused_a2a.HAVE_HYBRIDEP, a2a_source),
        (stack.FLA, gdn.HAVE_FLA, gdn_source),
    ):
        for statement in module.statement().split("; "):
            assert statement in source, statement
        assert stack.probe_module(module).ok == flag, module.label
    assert nvrx.NVRX_MIN_VERSION == stack.NVRX_MIN_VERSION
    pretrain_source = Path(inspect.getfile(sys.modules["megatron.bridge"])).parent / "training/pretrain.py"
    assert stack.RESILIENCY.statement() in pretrain_source.read_text().splitlines()[18]  # pretrain.py:19


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("deep_ep") is not None, reason="deep_ep imports here")
def test_a_run_needing_a_missing_module_stops_in_one_line(tmp_path: Path) -> None:
    """dispatcher=deepep on a machine without DeepEP: exit 2 and one line naming `deep_ep` and the
    fix, before the GPU check, distributed init or any record."""
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "train.py", *MEG, "cluster=h200", "dispatcher=deepep", "train_iters=3",
         "warmup_steps=1", f"hydra.run.dir={run_dir}"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("moe_vlm: error:")]
    assert len(errors) == 1, done.stderr[-2000:]
    line = errors[0]
    assert "from deep_ep import Buffer fails here (No module named 'deep_ep')" in line
    assert "fix: no wheel installs it from PyPI" in line and "dispatcher=alltoall" in line
    assert "needs GPUs" not in done.stderr and "Traceback" not in done.stderr
    assert not (run_dir / "steps.jsonl").exists()


@pytest.mark.slow
@needs_stack
def test_megatron_probe_builds_every_model_on_h200() -> None:
    """scripts/gpu_check.py's Megatron part where Bridge imports (here): it builds and reads back
    each model's ConfigContainer (tests/unit/test_gpu_check.py runs it where Bridge cannot)."""
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import gpu_check
    finally:
        sys.path.remove(str(REPO / "scripts"))
    found = gpu_check.megatron_probe()
    assert [p["import"] for p in found["imports"] if not p["ok"]] == []
    for entry in found["models"]:
        config = entry["config"]
        assert config["built"], entry
        assert config["fields_not_held"] == [] and config["fields_applied"] > 0
        assert "megatron.bridge" in config["recipe"]
