"""The router's recorded load: run.json's `router` section (issue 32).

Per MoE layer, the tokens the router sent to each expert over the measured window (the steps
metrics.summarize keeps: after warm-up, without the profiler's excluded steps), summed over the
ranks, and the load factor = the fullest expert's tokens / the mean (the balanced share). The expert
GEMMs and the EP exchange wait on the fullest expert, so a plan can scale them by the factor
(`router.assumed_load`, predict/terms.py routing_load).

What the figure is and is not, labelled on the record itself: `data_kind` (mock data's tokens are
not a workload, so neither is their routing) and `model_init` (the torch engine trains a randomly
initialised model: its routers are not a pretrained checkpoint's, whose load is what a real
fine-tune meets). Pure Python: readers of run.json import it without torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

ROUTER_SECTION = "router"

# Data kinds whose tokens are no real workload (schema.DataKind): their routing is labelled so.
MOCK_KINDS = frozenset({"mock", "bridge_mock"})


@dataclass(frozen=True)
class LayerLoad:
    layer: int  # the decoder layer's index (model.language_model.layers[i])
    tokens_per_expert: list[int]

    @property
    def routed(self) -> int:
        return sum(self.tokens_per_expert)

    @property
    def load_factor(self) -> float | None:
        """max / mean tokens per expert; None when nothing was routed."""
        if self.routed == 0:
            return None
        return max(self.tokens_per_expert) * len(self.tokens_per_expert) / self.routed


@dataclass(frozen=True)
class RouterLoad:
    data_kind: str  # schema.DataKind value: mock routing is not real routing
    routing: str  # the router option (real, forced_balance, drop_and_pad)
    model_init: str  # "random": the torch engine's model is not a pretrained checkpoint
    top_k: int
    num_experts: int
    window_steps: int  # steps counted (the summary's steady window)
    # Padding positions are routed like any token (the MoE block flattens every position, masks
    # none): they load the experts, so they are counted.
    padding_counted: bool
    layers: list[LayerLoad]

    @property
    def load_factors(self) -> list[float]:
        return [f for layer in self.layers if (f := layer.load_factor) is not None]

    @property
    def load_factor(self) -> float | None:
        """The worst layer's: a step waits on its fullest expert in every layer, the worst one most."""
        return max(self.load_factors) if self.load_factors else None

    @property
    def mean_load_factor(self) -> float | None:
        factors = self.load_factors
        return sum(factors) / len(factors) if factors else None

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["load_factor"] = self.load_factor
        out["mean_load_factor"] = self.mean_load_factor
        for layer, row in zip(self.layers, out["layers"], strict=True):
            row["load_factor"] = layer.load_factor
        if self.data_kind in MOCK_KINDS:
            out["note"] = f"data={self.data_kind}: mock tokens, so NOT the routing of a real workload"
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RouterLoad:
        fields = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        fields["layers"] = [
            LayerLoad(int(r["layer"]), [int(n) for n in r["tokens_per_expert"]]) for r in data["layers"]
        ]
        return cls(**fields)
