"""The torch engine's model: a real transformers Qwen3-VL-MoE built from the `model` group.

Random init from `engines.hf_config.transformers_config` (the same config the Megatron engine
writes as config.json), no download. The rest applies the knobs that change the module graph:
which parameters train (vision_freeze) and what is recomputed in backward (recompute).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.distributed._composable import checkpoint as composable_checkpoint
from torch.utils.checkpoint import checkpoint as checkpoint_function
from transformers import Qwen3VLMoeForConditionalGeneration
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.qwen3_vl_moe.modeling_qwen3_vl_moe import (
    Qwen3VLMoeTextMLP,
    Qwen3VLMoeTextSparseMoeBlock,
)

from moe_vlm.config.schema import (
    Engine,
    ModelConfig,
    RecomputeConfig,
    RecomputeGranularity,
    RecomputeMethod,
    VisionFreezeConfig,
)
from moe_vlm.data.batch import Batch, SampleSpans
from moe_vlm.engines.hf_config import transformers_config
from moe_vlm.knobs.support import accepted

# The text model's attention: SDPA, per sample on packed rows. Registered with transformers' own
# AttentionInterface, so the QKV/output projections around it are untouched.
VARLEN_SDPA = "moe_vlm_varlen_sdpa"
# The same with its core (softmax(QK^T)V) recomputed in backward, inside torch's non-reentrant
# checkpoint, like Megatron's core_attn recompute.
RECOMPUTED_SDPA = "moe_vlm_recomputed_sdpa"


def _varlen_sdpa(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    sample_spans: SampleSpans | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Causal SDPA over each sample of a packed row alone, what Megatron's THD attention computes.

    transformers' own path for packed rows (masking_utils.find_packed_sequence_indices) gives the
    same result through a dense block-diagonal mask, at the cost of the whole row squared: a row of
    2,048 positions holding seven samples of 300 tokens paid 7x the attention of the samples. Here
    the cost is the sum of the samples' squares, as on the Megatron engine (per-sample FLOPs,
    perf/flops.py). The spans come from the host (Batch.sample_spans, passed through the model's
    keyword arguments), so no layer waits on the device to find them; a packed row carries no
    padding mask (Batch.model_inputs), so causal within a span is the whole mask. Unpacked rows
    (no spans) keep transformers' own mask.
    """
    if sample_spans is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    rows = []
    for index, row in enumerate(sample_spans):
        pieces = [
            sdpa_attention_forward(
                module,
                query[index : index + 1, :, start:end],
                key[index : index + 1, :, start:end],
                value[index : index + 1, :, start:end],
                None,
                **{**kwargs, "is_causal": True},
            )[0]
            for start, end in row
        ]
        rows.append(torch.cat(pieces, dim=1))  # [1, T, heads, head_dim], transformers' layout
    return torch.cat(rows, dim=0), None


def _sdpa_mask_unless_packed(**kwargs: Any) -> Any:
    """transformers' SDPA mask for padded rows; none for packed ones. A packed micro-batch comes
    without a padding mask (Batch.model_inputs) and _varlen_sdpa needs none, where transformers
    would build a [rows, 1, T, T] block-diagonal mask from the restarting positions and never use it."""
    if kwargs.get("attention_mask") is None:  # create_causal_mask passes every argument by name
        return None
    return sdpa_mask(**kwargs)


def _recomputed_sdpa(module: nn.Module, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, None]:
    output, _ = checkpoint_function(_varlen_sdpa, module, *args, use_reentrant=False, **kwargs)
    return output, None


for _name, _function in ((VARLEN_SDPA, _varlen_sdpa), (RECOMPUTED_SDPA, _recomputed_sdpa)):
    ALL_ATTENTION_FUNCTIONS.register(_name, _function)
    ALL_MASK_ATTENTION_FUNCTIONS.register(_name, _sdpa_mask_unless_packed)


def build_model(
    model: ModelConfig, recompute: RecomputeConfig, device: torch.device, seed: int
) -> Qwen3VLMoeForConditionalGeneration:
    """Random-init model on `device`; every rank gets the same weights from the seed."""
    core_attn = recompute.granularity is RecomputeGranularity.selective and "core_attn" in recompute.modules
    config = transformers_config(model)
    config._attn_implementation = {
        "text_config": RECOMPUTED_SDPA if core_attn else VARLEN_SDPA,
        "vision_config": "sdpa",
    }
    config.text_config.use_cache = False
    torch.manual_seed(seed)
    with torch.device(device):
        built = Qwen3VLMoeForConditionalGeneration(config)
    built.train()
    return built


@dataclass(frozen=True)
class ModelParts:
    """The three parts vision_freeze and the component timers speak about."""

    vision: list[nn.Module]  # ViT: patch embed, position embedding, blocks
    projector: list[nn.Module]  # patch merger + deepstack mergers
    language: list[nn.Module]  # decoder (embeddings, layers, norm) + lm_head

    def parameters(self, part: str) -> Iterator[nn.Parameter]:
        for module in getattr(self, part):
            yield from module.parameters()


def packed_position_ids(model: Qwen3VLMoeForConditionalGeneration, batch: Batch) -> torch.Tensor:
    """[4, rows, T] position ids for packed rows (data.packing=in_batch or buffer): every sample starts again.

    Row 0 is the text position: it restarts at 0 on each sample, transformers' packed format (the
    attention itself keeps to each sample by the spans, forward_inputs). Rows 1-3 are
    each sample's own multimodal RoPE from the model's get_rope_index (its images' grids only), the
    positions that sample gets in a padded row of its own. Under buffer packing a sample's padding
    (to its multiple, or to the row's end) continues its positions: it follows the sample, no later
    sample sees it, and its labels carry no loss.
    """
    assert batch.cu_seqlens is not None, "a padded batch gets its positions from the attention mask"
    rows, row_length = batch.input_ids.shape
    bounds, starts = batch.cu_seqlens.tolist(), batch.padded_bounds()
    input_ids, types = batch.input_ids.reshape(1, -1), batch.mm_token_type_ids.reshape(1, -1)
    grids = batch.image_grid_thw
    first_image = 0
    pieces = []
    for index, (start, end) in enumerate(itertools.pairwise(bounds)):
        images = batch.images_per_sample[index]
        grid = None if grids is None or images == 0 else grids[first_image : first_image + images]
        first_image += images
        real = slice(starts[index], starts[index] + end - start)
        mrope, _ = model.model.get_rope_index(input_ids[:, real], types[:, real], image_grid_thw=grid)
        text = torch.arange(end - start, dtype=mrope.dtype).view(1, 1, -1)
        piece = torch.cat([text, mrope], dim=0)
        padding = starts[index + 1] - starts[index] - (end - start)
        if padding > 0:
            after = piece[:, :, -1:] + torch.arange(1, padding + 1, dtype=mrope.dtype).view(1, 1, -1)
            piece = torch.cat([piece, after], dim=-1)
        pieces.append(piece)
    return torch.cat(pieces, dim=-1).reshape(4, rows, row_length)


def forward_inputs(model: Qwen3VLMoeForConditionalGeneration, batch: Batch) -> dict[str, Any]:
    """The model's keyword arguments for one micro-batch, on the host. A packed one adds its
    per-sample positions and the spans its attention keeps to (_varlen_sdpa): without both, a
    packed row would attend across its samples."""
    inputs: dict[str, Any] = dict(batch.model_inputs())
    if batch.packed:  # data.packing=in_batch or buffer
        inputs["position_ids"] = packed_position_ids(model, batch)
        inputs["sample_spans"] = batch.sample_spans()
    return inputs


def model_parts(model: Qwen3VLMoeForConditionalGeneration) -> ModelParts:
    visual = model.model.visual
    parts = ModelParts(
        vision=[visual.patch_embed, visual.pos_embed, visual.blocks],
        projector=[visual.merger, visual.deepstack_merger_list],
        language=[model.model.language_model, model.lm_head],
    )
    # Every parameter in exactly one part, or freezing would silently miss some.
    owned = [id(p) for part in ("vision", "projector", "language") for p in parts.parameters(part)]
    every = [id(p) for p in model.parameters()]
    if sorted(owned) != sorted(every) or len(set(owned)) != len(owned):
        raise RuntimeError("model_parts: vision/projector/language do not partition the model's parameters")
    return parts


def apply_freeze(model: Qwen3VLMoeForConditionalGeneration, freeze: VisionFreezeConfig) -> dict[str, int]:
    """requires_grad=False on frozen parts; returns parameter counts per part, frozen or not."""
    parts = model_parts(model)
    counts = {}
    for part in ("vision", "projector", "language"):
        frozen = bool(getattr(freeze, part))
        params = list(parts.parameters(part))
        for param in params:
            param.requires_grad_(not frozen)
        counts[part] = sum(p.numel() for p in params)
    return counts


def _checkpoint_module(module: nn.Module) -> None:
    # Composable checkpoint: hooks instead of a wrapper, so names and fully_shard composition stay.
    composable_checkpoint(module)


def apply_recompute(model: Qwen3VLMoeForConditionalGeneration, recompute: RecomputeConfig) -> list[str]:
    """Activation checkpointing as the recompute group says; returns the names of what is recomputed.

    full: whole decoder layers (uniform with num_layers=1: every layer; block with num_layers=N:
    the first N layers). selective: core_attn (through the attention function set at build time),
    layernorm (both norms of each decoder layer), moe (MoE blocks), mlp (dense MLP blocks).
    """
    layers = model.model.language_model.layers
    recomputed: list[str] = []
    if recompute.granularity is RecomputeGranularity.full:
        count = len(layers) if recompute.method is RecomputeMethod.uniform else recompute.num_layers
        for index, layer in enumerate(layers):
            if index < count:
                _checkpoint_module(layer)
                recomputed.append(f"model.language_model.layers.{index}")
    elif recompute.granularity is RecomputeGranularity.selective:
        # core_attn is the attention function set at build time; the rest are checkpointed modules.
        selectors: dict[str, Callable[[Any], list[tuple[str, nn.Module]]]] = {
            "layernorm": lambda layer: [
                ("input_layernorm", layer.input_layernorm),
                ("post_attention_layernorm", layer.post_attention_layernorm),
            ],
            "moe": lambda layer: (
                [("mlp", layer.mlp)] if isinstance(layer.mlp, Qwen3VLMoeTextSparseMoeBlock) else []
            ),
            "mlp": lambda layer: [("mlp", layer.mlp)] if isinstance(layer.mlp, Qwen3VLMoeTextMLP) else [],
        }
        declared = set(accepted(Engine.torch, "recompute.modules") or ())
        assert {"core_attn", *selectors} == declared, f"knobs/support.py declares {sorted(declared)}"
        unknown = [name for name in recompute.modules if name != "core_attn" and name not in selectors]
        if unknown:
            raise ValueError(
                f"recompute.modules {unknown}: the torch engine cannot recompute them (rule E008)"
            )
        for index, layer in enumerate(layers):
            if "core_attn" in recompute.modules:
                recomputed.append(f"model.language_model.layers.{index}.self_attn(core)")
            for name in recompute.modules:
                for attr, module in selectors[name](layer) if name in selectors else []:
                    _checkpoint_module(module)
                    recomputed.append(f"model.language_model.layers.{index}.{attr}")
    return recomputed
