"""Every rule in the catalogue fires on a config that breaks it and stays quiet on one that does not."""

from __future__ import annotations

import pytest

from moe_vlm.rules import CATALOGUE, validate
from tests.conftest import make_spec

# code -> (overrides that fire it, overrides that do not)
CASES: dict[str, tuple[list[str], list[str]]] = {}


def codes(*overrides: str) -> set[str]:
    return {finding.code for finding in validate(make_spec(*overrides))}


def test_every_rule_has_a_case() -> None:
    missing = sorted(rule.code for rule in CATALOGUE if rule.code not in CASES)
    assert not missing, f"rules without a firing/non-firing case: {missing}"


@pytest.mark.parametrize("code", sorted(CASES))
def test_rule_fires(code: str) -> None:
    fires, _ = CASES[code]
    assert code in codes(*fires), f"{code} did not fire for {fires}"


@pytest.mark.parametrize("code", sorted(CASES))
def test_rule_quiet(code: str) -> None:
    _, quiet = CASES[code]
    assert code not in codes(*quiet), f"{code} fired for {quiet}"
