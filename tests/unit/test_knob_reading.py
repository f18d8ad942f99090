"""The torch half of the knob-reading checker (tests/knob_reading.py), checked by mutation.

test_knob_coverage calls TorchChecker.problem for every knob the torch engine honours. Here the
torch code that reads a representative knob is neutralised (the optimizer's learning rate, the
model's freezing, the loader's packing) and the checker must report it; and the observation it
compares must be the same for the same spec, or any knob would look read.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
import torch

from moe_vlm import data
from moe_vlm.config.schema import Packing, VisionFreezeConfig
from moe_vlm.config.spec import RunSpec
from moe_vlm.engines import torch_engine
from tests.knob_reading import TORCH_BASE, TORCH_DATA_BASE, Level, TorchChecker, cached_spec, observe


@pytest.mark.parametrize("at", [Level.loader, Level.steps])
def test_the_observation_is_deterministic(at: Level) -> None:
    spec = cached_spec(TORCH_DATA_BASE if at is Level.loader else TORCH_BASE)
    first = observe(spec, at)
    assert "refused" not in first, first
    assert observe(spec, at) == first


def _adamw_without_lr(real: Callable[..., Any]) -> Callable[..., Any]:
    def make(params: Any, lr: float = 0.0, **kwargs: Any) -> Any:
        return real(params, **kwargs)  # the learning rate the spec asked for is dropped

    return make


def _freeze_nothing(real: Callable[..., Any]) -> Callable[..., Any]:
    return lambda model, _freeze: real(model, VisionFreezeConfig())


def _never_pack(real: Callable[..., Any]) -> Callable[..., Any]:
    def batches(spec: RunSpec, rank: int, world_size: int) -> Any:
        unpacked = dataclasses.replace(spec, data=dataclasses.replace(spec.data, packing=Packing.none))
        return real(unpacked, rank, world_size)

    return batches


# knob -> (the object and name of the torch code that reads it, what neutralises it)
MUTATIONS: dict[str, tuple[Any, str, Callable[[Any], Any]]] = {
    "lr": (torch.optim, "AdamW", _adamw_without_lr),
    "vision_freeze.vision": (torch_engine, "apply_freeze", _freeze_nothing),
    "data.packing": (data, "build_batches", _never_pack),
}


@pytest.mark.parametrize("knob", list(MUTATIONS))
def test_neutralising_the_code_that_reads_a_knob_turns_the_checker_red(
    monkeypatch: pytest.MonkeyPatch, knob: str
) -> None:
    assert TorchChecker().problem(knob) is None
    owner, name, neutralise = MUTATIONS[knob]
    monkeypatch.setattr(owner, name, neutralise(getattr(owner, name)))
    problem = TorchChecker().problem(knob)  # a fresh checker: nothing observed before the mutation
    assert problem is not None and "no torch code reads it" in problem, problem
