"""router.assumed_load is a routing load or refused in one line (issue 32)."""

from __future__ import annotations

import pytest

from moe_vlm.base.errors import BadInput
from moe_vlm.config.preflight import preflight


@pytest.mark.parametrize("value", ["0.5", "0", "-2", "inf", "nan"])
def test_a_load_below_one_is_refused_naming_the_key_the_values_and_a_fix(value: str) -> None:
    with pytest.raises(BadInput) as refused:
        preflight([f"router.assumed_load={value}", "dry_run=true"])
    message = str(refused.value)
    assert "\n" not in message and message.startswith("router.assumed_load=")
    assert ">= 1" in message and "Fix:" in message and "router.load_factor" in message


@pytest.mark.parametrize("value", ["1", "1.0", "2.35", "null"])
def test_a_load_of_at_least_one_or_null_passes(value: str) -> None:
    preflight([f"router.assumed_load={value}", "dry_run=true"])
