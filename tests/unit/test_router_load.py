"""The torch engine records the router's load in run.json (issue 32): a real one-rank run of the
engine's own loop on the tiny model, counted against the steps it wrote."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from moe_vlm.base.files import RUN_JSON, STEPS_JSONL
from moe_vlm.config.arch import Mlp, layer_kinds
from moe_vlm.engines.torch_engine import Trainer, run_rank
from moe_vlm.record.records import read_steps
from moe_vlm.record.router_load import RouterLoad
from moe_vlm.runtime.dist_env import DistEnv
from tests.conftest import make_spec


def _run(tmp_path: Path, *overrides: str) -> tuple[dict, list]:
    spec = make_spec("nproc=1", "seq_length=64", "data=mock", *overrides)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    run_rank(spec, {"data": {"kind": "mock"}}, tmp_path, DistEnv(0, 1, 0, 1, "127.0.0.1", port, "spawn"))
    return json.loads((tmp_path / RUN_JSON).read_text()), read_steps(tmp_path / STEPS_JSONL)


@pytest.mark.parametrize(
    "overrides",
    [
        ("gbs=2", "mbs=1", "train_iters=4", "warmup_steps=2"),
        # Full recompute runs every router again in backward: still counted once.
        ("gbs=1", "train_iters=3", "warmup_steps=1", "recompute=full"),
    ],
    ids=["accumulation", "recompute"],
)
def test_every_moe_layer_counts_each_measured_position_top_k_times(
    tmp_path: Path, overrides: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    record, steps = _run(tmp_path, *overrides)
    # The end-of-run table shows it, with how a plan takes it.
    factor = f"x{record['router']['load_factor']:.2f} worst MoE layer"
    shown = [line for line in capsys.readouterr().out.splitlines() if "router load (max/mean)" in line]
    assert (
        len(shown) == 1 and factor in shown[0] and "router.assumed_load=" in shown[0] and "MOCK" in shown[0]
    )
    spec = make_spec("nproc=1", "seq_length=64", "data=mock", *overrides)
    load = RouterLoad.from_json(record["router"])
    # The model's own MoE layers (the schema's layer kinds), none missed, none extra.
    moe_layers = [i for i, kind in enumerate(layer_kinds(spec.model)) if kind.mlp is Mlp.moe]
    assert [layer.layer for layer in load.layers] == moe_layers and moe_layers
    assert load.top_k == spec.model.moe_top_k and load.num_experts == spec.model.num_experts
    # The window: the summary's steps (after warm-up); padding positions are routed, so counted.
    window = [s for s in steps if s.step > spec.warmup_steps]
    assert load.window_steps == record["summary"]["steady_window"]["steps"] == len(window)
    assert load.padding_counted and any(s.padded_tokens > s.real_tokens for s in window)
    positions = sum(s.padded_tokens for s in window)
    for layer in load.layers:
        assert layer.routed == positions * spec.model.moe_top_k, layer.layer
        assert len(layer.tokens_per_expert) == spec.model.num_experts
    # max / mean per layer, and the worst and mean layer, as written.
    factors = [max(x.tokens_per_expert) / (sum(x.tokens_per_expert) / load.num_experts) for x in load.layers]
    assert record["router"]["load_factor"] == pytest.approx(max(factors)) and max(factors) >= 1
    assert record["router"]["mean_load_factor"] == pytest.approx(sum(factors) / len(factors))
    assert (
        record["router"]["data_kind"] == "mock"
        and "NOT the routing of a real workload" in record["router"]["note"]
    )
    assert record["router"]["model_init"] == "random"


def test_counting_leaves_the_numerics_unchanged(tmp_path: Path) -> None:
    # The hook reads the router's output and returns nothing: the same seed, the same batches,
    # bit-identical loss and gradient norm with the counter attached and removed.
    spec = make_spec("nproc=1", "seq_length=64", "gbs=1", "data=mock", "warmup_steps=0")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        counted = Trainer(spec, torch.device("cpu"), 0, 1, timing=False)
        bare = Trainer(spec, torch.device("cpu"), 0, 1, timing=False)
        bare.router.remove()
        for step in (1, 2):
            a, b = counted.step(step), bare.step(step)
            assert (a.loss, a.grad_norm) == (b.loss, b.grad_norm)
        assert int(counted.router.counts.sum()) == 2 * spec.seq_length * spec.model.moe_top_k * len(
            counted.router.indices
        )
        assert int(bare.router.counts.sum()) == 0  # removed: really nothing counted on that side
    finally:
        dist.destroy_process_group()
