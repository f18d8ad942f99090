"""Hooks for the vendor's baseline (issue 21): what a run reproducing a Bridge perf recipe is.

The facts the FLOPs basis and the memory rules need of `recipe=<name>` and `data=bridge_mock`,
read in one place from the RunSpec:

- `vendor_recipe(spec)`: the perf recipe this run names, or None (moe_vlm/knobs/recipes.py says which
  knobs a run changes from it).
- `is_bridge_mock(spec)`: the run is on Bridge's mock VLM SFT data (`data=bridge_mock`).
- The mock's sample shape (BRIDGE_MOCK_*): measured with Bridge's own collate on CPU
  (tests/megatron/test_bridge_mock.py: 784 patches, 196 image tokens, 222-241 real tokens).

Freeze state and routing need no hook: the recipe options set `vision_freeze` (`.language` for the
decoder) and `router=forced_balance`, which the RunSpec already carries.
"""

from __future__ import annotations

from moe_vlm.config.spec import RunSpec

BRIDGE_MOCK_KIND = "bridge_mock"
# Bridge's MockVLMSFTDatasetConfig as the perf recipes set it (data/builders/mock_vlm_sft.py:43-59,
# 110; collate models/qwen_vl/data/collate_fn.py:41-42, 165-168, 252-255): one 256x256 noise image
# that the collate resizes to 448x448 = 784 ViT patches (196 image tokens), the prompt "Describe
# this image." and 10-29 random words: about 232 real tokens (an estimate: no tokenizer was run).
BRIDGE_MOCK_REAL_TOKENS = 232
BRIDGE_MOCK_PATCHES = 784
BRIDGE_MOCK_IMAGES = 1


def vendor_recipe(spec: RunSpec) -> str | None:
    """The Bridge perf recipe this run names (recipe=<name>), or None."""
    name = spec.recipe.name
    return None if name == "none" else name


def is_bridge_mock(spec: RunSpec) -> bool:
    return bool(spec.data.kind.value == BRIDGE_MOCK_KIND)
