"""Counts the torch engine's routing: a forward hook on every MoE layer's router (issue 32).

transformers' Qwen3VLMoeTextTopKRouter returns (logits, scores, indices) with indices
[tokens, top_k] (transformers/models/qwen3_vl_moe/modeling_qwen3_vl_moe.py:136-144); the sparse
block routes every flattened position, padding included (lines 153-158). The hook adds a
bincount of the indices to one [layers, experts] tensor on the device: no sync, no change to
the numerics (it reads the output, returns nothing).

Counted only while `counting` is set: the engine sets it around a measured step's forward and
clears it before backward, so a recomputed forward (activation checkpointing runs the router
again in backward) is not counted twice.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.hooks import RemovableHandle
from transformers.models.qwen3_vl_moe.modeling_qwen3_vl_moe import (
    Qwen3VLMoeTextSparseMoeBlock,
    Qwen3VLMoeTextTopKRouter,
)

from moe_vlm.config.spec import RunSpec
from moe_vlm.record.router_load import LayerLoad, RouterLoad


class RouterCounter:
    def __init__(self, layers: nn.ModuleList, device: torch.device) -> None:
        self.counting = False
        self.window_steps = 0
        self.indices: list[int] = []  # the decoder layers that route (dense ones do not)
        gates: list[Qwen3VLMoeTextTopKRouter] = []
        for index, layer in enumerate(layers):
            block = layer.mlp
            if isinstance(block, Qwen3VLMoeTextSparseMoeBlock):
                self.indices.append(index)
                gates.append(block.gate)
        self.top_k = gates[0].top_k if gates else 0
        self.num_experts = gates[0].num_experts if gates else 0
        self.counts = torch.zeros(len(gates), self.num_experts, dtype=torch.int64, device=device)
        self._handles: list[RemovableHandle] = [
            gate.register_forward_hook(self._hook(row)) for row, gate in enumerate(gates)
        ]

    def _hook(self, row: int) -> Callable[[nn.Module, object, tuple[torch.Tensor, ...]], None]:
        def count(_module: nn.Module, _inputs: object, output: tuple[torch.Tensor, ...]) -> None:
            if self.counting:
                indices = output[2].detach().reshape(-1)
                self.counts[row] += torch.bincount(indices, minlength=self.num_experts)

        return count

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def gather(self, spec: RunSpec) -> RouterLoad:
        """Summed over the ranks (a collective: every rank calls it)."""
        total = self.counts.clone()
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(total)
        rows = total.cpu().tolist()
        return RouterLoad(
            data_kind=spec.data.kind.value,
            routing=spec.router.name,
            model_init="random",
            top_k=self.top_k,
            num_experts=self.num_experts,
            window_steps=self.window_steps,
            padding_counted=True,
            layers=[
                LayerLoad(index, [int(n) for n in row]) for index, row in zip(self.indices, rows, strict=True)
            ],
        )
