#!/usr/bin/env python
"""Data loader throughput per CPU core, beside what one tiny-model training rank consumes.

    python scripts/bench_data.py                       # mock, synthetic, real (scikit-image photos)
    python scripts/bench_data.py --batches 6 --json bench_data.json

For each data kind, in this one process and on one thread (torch.set_num_threads(1)):
  loader   samples/s that build_batches produces (image processor included) per core;
  model    samples/s one torch-engine rank consumes: forward + backward of the real tiny
           Qwen3-VL-MoE (moe_vlm.engines.torch_model.build_model) on those same batches.
It prints loader / model (above 1: one loader core keeps a training rank fed) and each
kind's model rate relative to real data, measured in the same run: the mock-vs-real gap
the field guide warns about, on the tiny model. Mock rows are labelled mock.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from itertools import islice
from pathlib import Path

import torch
from omegaconf import OmegaConf

from moe_vlm.config.schema import TrainConfig
from moe_vlm.config.spec import RunSpec
from moe_vlm.data import Batch, build_batches
from moe_vlm.engines.torch_model import build_model

REPO = Path(__file__).resolve().parent.parent
KINDS = ("mock", "synthetic", "real")


@dataclass
class KindResult:
    kind: str
    samples: int
    loader_samples_per_s_per_core: float
    model_samples_per_s: float  # one training rank, forward + backward
    image_tokens_per_sample: float
    vision_patches_per_sample: float
    real_tokens_per_sample: float

    @property
    def model_tokens_per_s(self) -> float:
        return self.model_samples_per_s * self.real_tokens_per_sample

    @property
    def loader_over_model(self) -> float:
        return self.loader_samples_per_s_per_core / self.model_samples_per_s


def compose(*overrides: str) -> RunSpec:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        cfg = hydra_compose(config_name="train", overrides=list(overrides))
    train = OmegaConf.to_object(cfg)
    assert isinstance(train, TrainConfig)
    return RunSpec.from_config(train)


def time_loader(spec: RunSpec, batches: int) -> tuple[list[Batch], float]:
    loader = build_batches(spec, rank=0, world_size=1)
    next(loader)  # first-use costs (processor construction, shard index) are not throughput
    start = time.perf_counter()
    produced = list(islice(loader, batches))
    return produced, time.perf_counter() - start


def time_model(spec: RunSpec, produced: list[Batch]) -> float:
    model = build_model(spec.model, spec.recompute, torch.device("cpu"), spec.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.lr)

    def step(batch: Batch) -> None:
        optimizer.zero_grad(set_to_none=True)
        model(**batch.model_inputs()).loss.backward()
        optimizer.step()

    step(produced[0])  # warm-up: allocator, optimizer state
    start = time.perf_counter()
    for batch in produced:
        step(batch)
    return time.perf_counter() - start


def bench(kind: str, base: list[str], dataset: Path | None, batches: int) -> KindResult:
    overrides = [*base, f"data={kind}"] + ([f"data.path={dataset}"] if kind == "real" else [])
    spec = compose(*overrides)
    produced, loader_s = time_loader(spec, batches)
    model_s = time_model(spec, produced)
    samples = sum(b.stats.samples for b in produced)
    return KindResult(
        kind=kind,
        samples=samples,
        loader_samples_per_s_per_core=samples / loader_s,
        model_samples_per_s=samples / model_s,
        image_tokens_per_sample=sum(b.stats.image_tokens for b in produced) / samples,
        vision_patches_per_sample=sum(b.stats.vision_patches for b in produced) / samples,
        real_tokens_per_sample=sum(b.stats.real_tokens for b in produced) / samples,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="data loader vs tiny-model consumption, per CPU core")
    parser.add_argument("--batches", type=int, default=6, help="timed micro-batches per kind")
    parser.add_argument("--kinds", nargs="+", default=list(KINDS), choices=KINDS)
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("overrides", nargs="*", help="train.py overrides, e.g. mbs=2 seq_length=4096")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    base = ["model=tiny_moe_vlm", *args.overrides]

    results: list[KindResult] = []
    with tempfile.TemporaryDirectory() as tmp:
        dataset = Path(tmp) / "skimage_photos"
        if "real" in args.kinds:
            build = [sys.executable, str(REPO / "scripts" / "build_dataset.py"), "--skimage", str(dataset)]
            subprocess.run(build, check=True, capture_output=True)
        for kind in args.kinds:
            results.append(bench(kind, base, dataset, args.batches))

    spec = compose(*base)
    print(
        f"model={spec.model.name} seq_length={spec.seq_length} mbs={spec.mbs} "
        f"threads=1 batches={args.batches}"
    )
    print(
        f"{'data':<17} {'loader smp/s':>12} {'model smp/s':>11} {'loader/model':>12} {'model tok/s':>11} "
        f"{'tok/s vs real':>13} {'img tok/smp':>11} {'patch/smp':>9} {'tok/smp':>7}"
    )
    reference = next((r for r in results if r.kind == "real"), None)
    for r in results:
        label = "mock (image-free)" if r.kind == "mock" else r.kind
        versus = f"{r.model_tokens_per_s / reference.model_tokens_per_s:.2f}x" if reference else "-"
        print(
            f"{label:<17} {r.loader_samples_per_s_per_core:>12.2f} {r.model_samples_per_s:>11.2f} "
            f"{r.loader_over_model:>11.1f}x {r.model_tokens_per_s:>11.0f} {versus:>13} "
            f"{r.image_tokens_per_sample:>11.0f} {r.vision_patches_per_sample:>9.0f} "
            f"{r.real_tokens_per_sample:>7.0f}"
        )
    print(
        "loader smp/s: samples one loader core produces; model smp/s: samples one training rank\n"
        "consumes (forward + backward + AdamW); loader/model > 1: one loader core keeps a rank fed.\n"
        "model tok/s counts effective (non-padding) tokens; tok/s vs real is the ratio a naive\n"
        "tokens/s comparison would show."
    )
    if args.json:
        payload = [
            asdict(r) | {"loader_over_model": r.loader_over_model, "model_tokens_per_s": r.model_tokens_per_s}
            for r in results
        ]
        args.json.write_text(
            json.dumps({"seq_length": spec.seq_length, "mbs": spec.mbs, "kinds": payload}, indent=2)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
