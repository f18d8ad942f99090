"""Shape rules (S...): a real micro-batch's per-rank shapes against the library's own checks.

Not in CATALOGUE: a catalogue rule reads the RunSpec alone, and these read what the shape check
found (moe_vlm/perf/rank_shapes.ShapeEvidence, built by moe_vlm/engines/megatron/shape_check.py
from one micro-batch of the configured dataset and collate, with TE's checks run on it). The plan
(moe_vlm/run/plan.py shape_findings), every sweep point and the canary turn it into findings here.
docs/shapes.md says what it covers and what needs a GPU.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from moe_vlm.config.schema import Engine
from moe_vlm.config.spec import RunSpec
from moe_vlm.perf.rank_shapes import BLOCK_CHECK, DIMENSION_ASSERT, USERBUFFER_FILL, ShapeEvidence
from moe_vlm.rules.catalogue import Finding, Level, Violation

ShapeCheck = Callable[[RunSpec, ShapeEvidence], Iterator[Violation]]


@dataclass(frozen=True)
class ShapeRule:
    code: str
    level: Level
    title: str
    check: ShapeCheck


SHAPE_RULES: list[ShapeRule] = []


def shape_rule(code: str, level: Level, title: str) -> Callable[[ShapeCheck], ShapeCheck]:
    def register(check: ShapeCheck) -> ShapeCheck:
        assert all(existing.code != code for existing in SHAPE_RULES), f"duplicate rule code {code}"
        SHAPE_RULES.append(ShapeRule(code, level, title, check))
        return check

    return register


NOT_RUN = "S000"


@shape_rule(NOT_RUN, Level.warning, "the shape check did not run here")
def _not_run(spec: RunSpec, found: ShapeEvidence) -> Iterator[Violation]:
    if found.not_run:
        yield Violation(
            ("engine", "data"),
            f"the shape check did not build or check this point's micro-batch: {found.not_run}.",
            "plan on a machine with the Megatron stack; a Slurm sweep's canary runs it on the cluster's stack for "
            "every point (one micro-batch per distinct shape) and holds a point it refuses.",
        )


@shape_rule("S001", Level.error, "a split of the micro-batch does not divide (MCore CP / SP)")
def _uneven(spec: RunSpec, found: ShapeEvidence) -> Iterator[Violation]:
    # CP hands each rank 2 of 2 x CP chunks of a row (megatron/core/utils.py get_batch_on_this_cp_rank,
    # a view of seq // (2 x CP)); SP scatters the tokens over TP and asserts the division
    # (megatron/core/tensor_parallel/mappings.py _split_along_first_dim).
    if found.shapes is None:
        return
    for what, length, divisor in found.shapes.uneven:
        yield Violation(
            ("seq_length", "cp", "tp"),
            f"the micro-batch built here ({found.shapes.text()}) has {what} of {length}, not a multiple "
            f"of {divisor}: Megatron Core's split needs it.",
            f"round seq_length to a multiple of {spec.collate_padding_multiple}, or lower cp / tp.",
        )


def _refusals(found: ShapeEvidence, check: str) -> list[str]:
    return [f"{v.operand.text()} ({v.check}: {v.error})" for v in found.refused if v.check.endswith(check)]


@shape_rule("S002", Level.error, "TE's FP8 GEMM dimension assert refuses a rank's operand (TE utils.py)")
def _fp8_dims(spec: RunSpec, found: ShapeEvidence) -> Iterator[Violation]:
    # transformer_engine/pytorch/utils.py:704-714, run on each linear's local input and weight
    # (module/linear.py:472, layernorm_linear.py:184, layernorm_mlp.py:356) under FP8/FP4 autocast.
    refused = _refusals(found, DIMENSION_ASSERT)
    if refused and found.shapes is not None:
        yield Violation(
            ("precision", "seq_length", "mbs", "tp", "cp"),
            f"precision={spec.precision.format.value} on the micro-batch built here ({found.shapes.text()}): "
            f"Transformer Engine refuses {len(refused)} operand(s) at the first GEMM: {'; '.join(refused[:3])}.",
            "make the tokens per rank a multiple of 8 (seq_length x mbs / (cp x tp under SP)), or precision=bf16.",
        )


@shape_rule("S003", Level.error, "TE's MXFP8/NVFP4 quantizer cannot block a rank's operand (TE tensor/)")
def _blocks(spec: RunSpec, found: ShapeEvidence) -> Iterator[Violation]:
    # MXFP8Quantizer.is_quantizable (tensor/mxfp8_tensor.py:125-133, blocks of 32) and
    # NVFP4Quantizer.is_quantizable (tensor/nvfp4_tensor.py:261-271, blocks of 16).
    refused = _refusals(found, BLOCK_CHECK)
    if refused and found.shapes is not None:
        yield Violation(
            ("precision", "seq_length", "mbs", "tp", "cp"),
            f"precision={spec.precision.format.value} on the micro-batch built here ({found.shapes.text()}): "
            f"the quantizer cannot split {len(refused)} operand(s) into its blocks: {'; '.join(refused[:3])}.",
            "make the tokens per rank a multiple of the block (32 MXFP8, 16 NVFP4), or precision=fp8cs / bf16.",
        )


@shape_rule("S004", Level.error, "TE's userbuffer all-gather refuses the MXFP8 shard (TE module/base.py)")
def _userbuffer_rows(spec: RunSpec, found: ShapeEvidence) -> Iterator[Violation]:
    # TP overlap all-gathers each sequence-parallel column-parallel GEMM's input through userbuffers
    # (transformer_engine/pytorch/module/layernorm_linear.py:301-307, layernorm_mlp.py:474-482), and
    # fill_userbuffers_buffer_for_all_gather's MXFP8 branch needs the shard's rows a multiple of 128
    # (module/base.py:709-713), beyond the quantizer's 32.
    refused = _refusals(found, USERBUFFER_FILL)
    if refused and found.shapes is not None:
        step = math.lcm(128 * spec.layout.cp * spec.layout.tp, spec.mbs) // spec.mbs
        why = (
            "overlap.tp_comm=true"
            if spec.overlap.tp_comm
            else "the recipe's TP overlap (overlap.tp_comm=null)"
        )
        yield Violation(
            ("precision", "seq_length", "overlap.tp_comm", "tp", "cp"),
            f"precision=fp8mx with {why} on the micro-batch built here ({found.shapes.text()}): Transformer "
            f"Engine's userbuffer all-gather needs each rank's shard a multiple of 128 rows and refuses it at the "
            f"first forward: {refused[0]}.",
            f"use seq_length={-(-spec.seq_length // step) * step} (a multiple of {step} at mbs={spec.mbs}, "
            f"TP={spec.layout.tp}, CP={spec.layout.cp}), or overlap.tp_comm=false, or precision=fp8cs.",
        )


def applies(spec: RunSpec) -> bool:
    """The shape rules judge the Megatron engine's TE GEMMs; the torch engine runs no quantized GEMM."""
    return spec.engine == Engine.megatron


def shape_findings(spec: RunSpec, found: ShapeEvidence) -> list[Finding]:
    """The evidence as findings, errors first (the plan's, every sweep point's and the canary's)."""
    findings = [
        Finding(r.code, r.level, v.keys, v.message, v.fix, r.title)
        for r in SHAPE_RULES
        for v in r.check(spec, found)
    ]
    return sorted(findings, key=lambda f: f.level is not Level.error)
