"""base/distributions.py reads versions from metadata directories' names; importlib.metadata, which
parses each METADATA file, is the reference it must agree with. Both read the import path as it is
now: not installed_versions' cache, filled before another test imported setuptools, which puts its
vendored distributions on sys.path."""

from __future__ import annotations

import importlib.metadata

import pytest

from moe_vlm.base.distributions import metadata_dirs, versions_of


@pytest.mark.parametrize("name", ["torch", "hydra-core", "omegaconf", "antlr4-python3-runtime", "submitit"])
def test_each_version_is_the_one_importlib_metadata_reads(name: str) -> None:
    assert versions_of(metadata_dirs())[name] == importlib.metadata.version(name)


def test_every_installed_distribution_is_found_under_its_normalised_name() -> None:
    found = versions_of(metadata_dirs())
    for distribution in importlib.metadata.distributions():
        name = distribution.metadata["Name"]
        if name:
            normalised = name.replace("_", "-").replace(".", "-").lower()
            assert normalised in found, name
