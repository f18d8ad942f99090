"""Field-guide warnings rules (W...)."""

from __future__ import annotations

from collections.abc import Iterator

from moe_vlm.config.schema import (
    FlexBackend,
)
from moe_vlm.config.spec import Layout, RunSpec
from moe_vlm.rules.catalogue import (
    Level,
    Violation,
    rule,
)


def etp_replaceable_by_ep(layout: Layout, num_experts: int) -> int | None:
    """The EP that could replace EP x ETP (ETP > 1): it divides the experts and, with TP, stays
    inside the NVLink domain. None when ETP is 1 or EP alone would not fit. The advisor uses it too."""
    wider_ep = layout.ep * layout.etp
    if (
        layout.etp > 1
        and wider_ep > 0
        and num_experts % wider_ep == 0
        and wider_ep * layout.tp <= layout.nvlink_domain_gpus
    ):
        return wider_ep
    return None


@rule("W001", Level.warning, "ETP > 1 where EP alone would fit")
def _etp_not_needed(spec: RunSpec) -> Iterator[Violation]:
    lay = spec.layout
    wider_ep = etp_replaceable_by_ep(lay, spec.model.num_experts)
    if wider_ep is not None:
        yield Violation(
            ("etp", "ep"),
            f"ETP={lay.etp} adds communication and tuning surface, and EP={wider_ep} alone would fit.",
            f"try ep={wider_ep} etp=1.",
        )


@rule("W002", Level.warning, "EP x TP stays inside the NVLink domain")
def _ep_tp_nvlink(spec: RunSpec) -> Iterator[Violation]:
    lay = spec.layout
    if spec.cluster.is_gpu_cluster and not lay.ep_tp_inside_nvlink:
        yield Violation(
            ("ep", "tp", "cluster"),
            f"EP x TP = {lay.ep_tp_group} ranks spans past the {lay.nvlink_domain_gpus}-GPU NVLink domain of "
            f"{spec.cluster.name}: expert all-to-all will cross the scale-out network.",
            f"keep ep x tp <= {lay.nvlink_domain_gpus} (ep=0 sizes it for you).",
        )


@rule("W003", Level.warning, "GB200: HybridEP is the strong default")
def _gb200_dispatcher(spec: RunSpec) -> Iterator[Violation]:
    if spec.cluster.default_dispatcher == "hybridep" and spec.dispatcher.backend is not FlexBackend.hybridep:
        yield Violation(
            ("dispatcher",),
            f"on {spec.cluster.name} HybridEP is the strong default dispatcher; this run uses {spec.dispatcher.name}.",
            "use dispatcher=hybridep, or sweep=dispatcher_ab to compare.",
        )
