"""scripts/gpu_check.sh without a GPU: the whole check on CPU (`--cpu-smoke`, 2 steps of small
points) in an environment shaped like the GPU machine's image: torch and transformers (with their
own dependencies) and nothing else of ours, no Transformer Engine; what it needs comes from the
wheels scripts/pack_gpu_wheels.sh packs. CI never needs a GPU for it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tests.conftest import REPO

IMAGE = ("torch", "transformers", "pillow", "numpy")  # what the GPU machine's image holds


def image_environment(root: Path) -> Path:
    """A venv that sees only IMAGE and their dependency closure, linked from this interpreter's
    installed packages (the same files, not copies); returns its python."""
    site = root / "site"
    site.mkdir(parents=True)
    seen: set[str] = set()
    todo = list(IMAGE)
    while todo:
        name = re.sub(r"[-_.]+", "-", todo.pop()).lower()
        if name in seen:
            continue
        try:
            dist = distribution(name)
        except PackageNotFoundError:
            continue
        seen.add(name)
        for line in dist.requires or []:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
        for file in dist.files or []:
            top = file.parts[0]
            source = Path(str(dist.locate_file(top)))
            if top != ".." and source.exists() and not (site / top).exists():
                (site / top).symlink_to(source)
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", str(root / "venv")], check=True, timeout=300)
    python = root / "venv" / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    (Path(purelib) / "image.pth").write_text(f"{site}\n")
    return python


@pytest.mark.slow
def test_cpu_smoke_in_an_image_without_transformer_engine(tmp_path: Path) -> None:
    import torch

    python = image_environment(tmp_path / "image")
    probe = subprocess.run([str(python), "-c", "import torch, transformers; import transformer_engine"],
                           capture_output=True, text=True)  # fmt: skip
    assert "No module named 'transformer_engine'" in probe.stderr, probe.stderr[-1000:]
    wheels, out = tmp_path / "wheels", tmp_path / "out"
    torch_version = torch.__version__.split("+")[0]
    env = {**os.environ, "WHEELS": str(wheels), "GPU_TORCH": torch_version}
    packed = subprocess.run(["bash", "scripts/pack_gpu_wheels.sh"], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=600)  # fmt: skip
    assert packed.returncode == 0, packed.stderr[-2000:]
    assert "of the 65536 KiB a device call carries" in packed.stdout

    env.update(PYTHON=str(python), OUT=str(out), SITE=str(tmp_path / "site"))
    env.pop("PYTHONPATH", None)
    done = subprocess.run(["bash", "scripts/gpu_check.sh", "--cpu-smoke"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=900)  # fmt: skip
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    summary = json.loads((out / "gpu_check_summary.json").read_text())
    text = (out / "gpu_check_summary.txt").read_text()
    assert summary["mode"] == "cpu-smoke" and summary["steps"] == 2 and summary["problems"] == []
    assert summary["environment"]["torch"] == torch.__version__

    points = summary["torch_engine"]["points"]
    assert [p["name"] for p in points] == ["tiny", "mid"]
    for point in points:
        assert point["status"] == "completed" and point["steps"] == 2, point
        assert point["step_time_s"]["p50"] > 0 and point["effective_tokens_per_s_per_gpu"] > 0
        assert isinstance(point["mfu"], float) and "H200 dense BF16 989 TFLOP/s" in point["peak"]
        memory = point["memory"]
        assert memory["kind"] == "process_peak_rss"
        assert memory["measured_gib"] > 0 and memory["predicted_gib"] > 0
        assert memory["error"] == pytest.approx(memory["predicted_gib"] / memory["measured_gib"] - 1)
        assert point["engine"]["device"] == "cpu"
    hooks = summary["torch_engine"]["hook_overhead"]
    assert hooks["status"] == "completed" and hooks["clock"] == "host perf_counter"
    assert hooks["on_off_wall_ratio"] > 0 and 0 <= hooks["inside_hooks_share"] < 1

    probe = summary["calibration_probe"]
    assert probe["status"] == "completed", probe
    assert any(line.startswith("GEMMs at the model's shapes (cpu, fp32") and "of the dense peak" in line
               for line in probe["lines"])  # fmt: skip
    assert "link between ranks: not timed" in probe["lines"]

    mega = summary["megatron"]
    assert mega["status"] == "completed"
    imports = {p["label"]: p for p in mega["imports"]}
    assert imports["Megatron Core"]["ok"] and imports["NVIDIA Resiliency Extension"]["ok"]
    assert imports["flash-linear-attention"]["ok"]
    # The library's own import chain, on an image without Transformer Engine.
    assert not imports["Transformer Engine"]["ok"]
    assert imports["Megatron Bridge"]["error"] == "No module named 'transformer_engine'"
    assert imports["Megatron Bridge"]["where"] == "megatron/bridge/peft/lora_layers.py:20"
    assert all(imports[label]["ok"] for label in imports if label.startswith("megatron.core."))
    models = {m["model"]: m for m in mega["models"]}
    assert set(models) == {p.stem for p in (REPO / "conf" / "model").glob("*.yaml")}
    assert all(not m["config"]["built"] for m in models.values())
    assert models["qwen3_vl_30b_a3b"]["plan"]["valid"]
    assert "Transformer Engine" in models["qwen3_vl_30b_a3b"]["plan"]["stack_missing"]
    assert "fails at megatron/bridge/peft/lora_layers.py:20" in text and "problems: none" in text
