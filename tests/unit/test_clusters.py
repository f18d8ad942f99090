"""cluster=gb300 and cluster=b300 (Blackwell Ultra), with their launcher presets.

The presets are read through Hydra as `hydra/launcher=slurm_gb300` selects them, and turned into
Slurm job parameters by the code the launcher runs (moe_vlm/launch/slurm.py). tests/megatron
runs Bridge's own flex-dispatcher check and the GB300/B300 perf recipes on these clusters.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from moe_vlm.base.errors import BadInput
from moe_vlm.config.compose import compose_config
from moe_vlm.config.spec import hybridep_topology
from moe_vlm.launch import slurm
from moe_vlm.perf.metrics import mfu_of
from moe_vlm.perf.peaks import peak_of
from moe_vlm.rules import validate
from tests.conftest import make_spec


@pytest.fixture(autouse=True)
def no_site(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("MOE_VLM_SITE_FILE", "none")
    for key in ("ACCOUNT", "PARTITION", "QOS", "CONTAINER_IMAGE", "CONTAINER_MOUNTS"):
        monkeypatch.delenv(f"MOE_VLM_{key}", raising=False)


def preset(name: str) -> slurm.SlurmSettings:
    cfg = compose_config([f"hydra/launcher={name}"], hydra_node=True)
    params = OmegaConf.to_container(cfg.hydra.launcher, resolve=True)
    assert isinstance(params, dict)
    return slurm.settings_from({str(k): v for k, v in params.items()})


def job(name: str, *overrides: str) -> dict[str, Any]:
    spec = make_spec(*overrides)
    return slurm.job_parameters(slurm.checked(preset(name), spec), spec)


def test_gb300_jobs_use_four_gpu_trays_inside_nvl72_segments() -> None:
    p = job("slurm_gb300", "cluster=gb300", "model=qwen3_vl_30b_a3b", "nodes=4")
    assert (p["nodes"], p["ntasks_per_node"], p["gpus_per_node"], p["cpus_per_task"]) == (4, 4, 4, 36)
    assert p["exclusive"] is True and p["additional_parameters"]["segment"] == 4
    # 36 trays = 144 GPUs = two NVL72 domains: segments of 18 nodes.
    big = job("slurm_gb300", "cluster=gb300", "model=qwen3_vl_235b_a22b", "nodes=36")
    assert big["additional_parameters"]["segment"] == 18


def test_b300_jobs_use_eight_gpu_nodes_without_segment() -> None:
    p = job("slurm_b300", "cluster=b300", "model=qwen3_vl_30b_a3b", "nodes=2")
    assert (p["nodes"], p["ntasks_per_node"], p["gpus_per_node"], p["cpus_per_task"]) == (2, 8, 8, 16)
    assert "segment" not in p["additional_parameters"]


@pytest.mark.parametrize(("name", "other"), [("slurm_gb300", "gb200"), ("slurm_b300", "b200")])
def test_a_blackwell_ultra_preset_refuses_the_previous_generation(name: str, other: str) -> None:
    with pytest.raises(BadInput, match=rf"cluster={name.removeprefix('slurm_')}.*cluster={other}"):
        job(name, f"cluster={other}", "model=qwen3_vl_30b_a3b")


def test_deepep_is_rejected_on_gb300_and_allowed_on_b300() -> None:
    """Bridge matches the device name: "NVIDIA GB300" is not a B200/B300, "NVIDIA B300 ..." is."""
    gb300 = {f.code for f in validate(make_spec("cluster=gb300", "model=qwen3_vl_30b_a3b", "nodes=2",
                                                 "dispatcher=deepep"))}  # fmt: skip
    assert "D001" in gb300
    for gpu in ("NVIDIA B300", "NVIDIA B300 SXM6 AC"):
        b300 = make_spec("cluster=b300", "model=qwen3_vl_30b_a3b", "dispatcher=deepep", f"cluster.gpu={gpu}")
        assert not {"D001", "D002"} & {f.code for f in validate(b300)}
    for cluster in ("gb300", "b300"):  # compute capability 10.3: major 10, HybridEP allowed
        spec = make_spec(f"cluster={cluster}", "model=qwen3_vl_30b_a3b", "dispatcher=hybridep")
        assert "D002" not in {f.code for f in validate(spec)}


def test_hybridep_topology_matches_bridge_s_recipes_for_each_system() -> None:
    # perf_recipes/qwen_vl/gb300/qwen3_vl.py: 64 ranks of an NVL72 domain with MNNVL (EP64);
    # b300/qwen35_vl.py: the 8-GPU node without MNNVL. tests/megatron reads the recipes themselves.
    gb300 = make_spec("cluster=gb300", "model=qwen3_vl_235b_a22b", "nodes=16", "dispatcher=hybridep")
    assert hybridep_topology(gb300) == {
        "NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN": 64,
        "NVLINK_DOMAIN_SIZE": 72,
        "USE_MNNVL": 1,
    }
    b300 = make_spec("cluster=b300", "model=qwen35_vl_35b_a3b", "dispatcher=hybridep")
    assert hybridep_topology(b300) == {
        "NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN": 8,
        "NVLINK_DOMAIN_SIZE": 8,
        "USE_MNNVL": 0,
    }


def test_mfu_names_the_blackwell_ultra_peak() -> None:
    gb300 = make_spec("cluster=gb300", "model=qwen3_vl_30b_a3b", "nodes=2")
    assert peak_of(gb300)["name"] == "NVIDIA GB300 dense BF16 2500 TFLOP/s (cluster=gb300)"
    b300 = make_spec("cluster=b300", "model=qwen3_vl_30b_a3b")
    assert peak_of(b300)["name"] == "NVIDIA B300 dense BF16 2250 TFLOP/s (cluster=b300)"
    assert mfu_of(450e12, b300) == (pytest.approx(0.2), None)
