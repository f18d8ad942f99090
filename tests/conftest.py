"""Shared test helpers: compose real configs through Hydra's compose API."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig

import moe_vlm.schema  # noqa: F401  (registers the schema)
from moe_vlm.spec import RunSpec

REPO = Path(__file__).resolve().parent.parent
CONF = REPO / "conf"


def compose_cfg(*overrides: str) -> DictConfig:
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        return compose(config_name="train", overrides=list(overrides))


def make_spec(*overrides: str) -> RunSpec:
    return RunSpec.from_config(compose_cfg(*overrides))


@pytest.fixture
def spec_of():
    return make_spec
