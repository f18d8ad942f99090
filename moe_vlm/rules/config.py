"""Config values rules (C...)."""

from __future__ import annotations

from collections.abc import Iterator

from moe_vlm.config.spec import RunSpec
from moe_vlm.rules.catalogue import (
    Level,
    Violation,
    rule,
)


@rule("C001", Level.error, "sizes must be positive", blocking=True)
def _positive_sizes(spec: RunSpec) -> Iterator[Violation]:
    layout = spec.layout
    sizes = {
        "mbs": spec.mbs,
        "gbs": spec.gbs,
        "seq_length": spec.seq_length,
        "nodes": layout.nodes,
        "nproc": layout.ranks_per_node,
        "train_iters": spec.train_iters,
        "tp": layout.tp,
        "pp": layout.pp,
        "vp": layout.vp,
        "cp": layout.cp,
        "etp": layout.etp,
    }
    for key, value in sizes.items():
        if value < 1:
            yield Violation((key,), f"{key}={value} must be a positive integer.", f"set {key} to 1 or more.")
    if layout.ep < 0:
        yield Violation(
            ("ep",), f"ep={layout.ep} must be >= 0.", "set ep=0 (sized to the experts) or a positive EP."
        )
    if spec.warmup_steps < 0:
        yield Violation(("warmup_steps",), "warmup_steps must be >= 0.", "set warmup_steps=0 or more.")


# C002 (parallelism.family must be fsdp or 3d) is gone: the family is an enum in the schema, so
# Hydra rejects any other value at composition (one line, exit 2: moe_vlm/config/compose.py).


@rule("C003", Level.error, "warm-up must leave a steady window")
def _steady_window(spec: RunSpec) -> Iterator[Violation]:
    if spec.train_iters >= 1 and spec.warmup_steps >= spec.train_iters:
        yield Violation(
            ("warmup_steps", "train_iters"),
            f"warmup_steps={spec.warmup_steps} leaves no steady-state steps out of train_iters={spec.train_iters}.",
            f"raise train_iters above {spec.warmup_steps} or lower warmup_steps.",
        )


@rule("C004", Level.error, "at least one module must train")
def _something_trains(spec: RunSpec) -> Iterator[Violation]:
    f = spec.freeze
    if f.vision and f.projector and f.language:
        yield Violation(
            ("vision_freeze.language",),
            "vision, projector and language model are all frozen: nothing would train.",
            "set vision_freeze.language=false or choose a lighter vision_freeze.",
        )


@rule("C005", Level.error, "weight decay must be >= 0")
def _weight_decay(spec: RunSpec) -> Iterator[Violation]:
    # Both engines refuse it only when the optimizer is built: torch's Adam/AdamW raise ValueError
    # (torch/optim/adam.py:66-67), Megatron Core's scheduler asserts start_wd >= 0
    # (megatron/core/optimizer_param_scheduler.py:168).
    if spec.weight_decay < 0:
        yield Violation(
            ("weight_decay",),
            f"weight_decay={spec.weight_decay} is negative: both engines refuse it once the optimizer is built.",
            "set weight_decay=0 or more (the perf recipes run 0.033).",
        )
