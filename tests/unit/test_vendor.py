"""A Bridge perf recipe run as written that our estimate says will not fit: a warning naming the
terms (the vendor runs it; our GPU terms are uncalibrated), never a rejection."""

from __future__ import annotations

import pytest

from moe_vlm.config.vendor import vendor_recipe
from moe_vlm.rules import memory as memory_rules
from moe_vlm.rules import validate
from tests.conftest import make_spec

# Qwen3.5-35B-A3B's 8-GPU GB200 BF16 recipe's layout (EP 8, nothing frozen, forced routing, no graphs,
# HybridEP) at MBS 5, GBS 520: 223.1 GiB of 185, past the estimate's 10 % (the recipe's own MBS 4 is
# 197.8 GiB since issue 32's GDN table, within it); image-free data is the closest of ours to its mock.
QWEN35_GB200 = (
    "model=qwen35_vl_35b_a3b", "cluster=gb200", "nodes=2", "nproc=4", "parallelism=3d", "ep=8", "mbs=5",
    "gbs=520", "dispatcher=hybridep", "router=forced_balance", "cuda_graph=none", "data=mock",
)  # fmt: skip
RECIPE = "qwen35_vl_35b_a3b_pretrain_8gpu_gb200_bf16"


def test_our_estimate_rejects_it_without_the_recipe() -> None:
    findings = {f.code: f for f in validate(make_spec(*QWEN35_GB200))}
    assert findings["M001"].is_error


def test_a_vendor_recipe_over_memory_is_a_warning_naming_the_terms(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory_rules, "vendor_recipe", lambda spec: RECIPE)
    findings = {f.code: f for f in validate(make_spec(*QWEN35_GB200))}
    assert "M001" not in findings
    warning = findings["M003"]
    assert not warning.is_error
    assert RECIPE in warning.message and "decoder_activations 114.3" in warning.message
    assert "logits 18.9" in warning.message and "docs/memory-and-advisor.md" in warning.message


def test_a_vendor_recipe_that_fits_says_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory_rules, "vendor_recipe", lambda spec: RECIPE)
    fits = validate(make_spec(*QWEN35_GB200[:-6], "mbs=1", "dispatcher=hybridep", "data=mock"))
    assert not {"M001", "M003"} & {f.code for f in fits}


def test_the_hook_reads_the_recipe_field() -> None:
    """recipe=<name> records its name in RunSpec.recipe.name; the default option is "none"."""
    assert vendor_recipe(make_spec()) is None
    assert vendor_recipe(make_spec(f"recipe={RECIPE}")) == RECIPE
