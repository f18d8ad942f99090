"""The shape check's engine half: one real micro-batch, and Transformer Engine's own verdict on it.

`shape_evidence(spec)` builds the first micro-batch of a point through the dataset and the collate
the Megatron engine runs (moe_vlm/engines/megatron/data.py: the seeded mock / synthetic source,
padded rows, Bridge's in-batch packer build_mcore_thd_sequence_batch_from_rows with the multiple
ConfigContainer.validate hands it, training/config.py:1213-1220, 1239, or with data.packing=buffer the
packer's rows, PackedRows), derives each rank's GEMM
operands (moe_vlm/perf/rank_shapes.py) and runs TE's checks on them:

- assert_dim_for_fp8_exec (transformer_engine/pytorch/utils.py:704-714), which every quantized TE
  linear runs on its local input and weight (module/linear.py:472, layernorm_linear.py:184,
  layernorm_mlp.py:356);
- the block quantizer's is_quantizable for MXFP8 (tensor/mxfp8_tensor.py:125-133, blocks of
  MXFP8_BLOCK_SCALING_SIZE = 32, constants.py:185) and NVFP4 (tensor/nvfp4_tensor.py:261-271,
  NVFP4_BLOCK_SCALING_SIZE = 16, constants.py:187): a tensor it cannot quantize is not run in the format.

The operands are meta tensors: TE's checks read shapes only, so nothing is allocated. Results are
cached per process by perf.rank_shapes.shape_key, so a sweep builds one batch per distinct shape.
The rules that turn the evidence into findings are moe_vlm/rules/shapes.py (S...).
"""

from __future__ import annotations

from typing import Any

from moe_vlm.config.precision import quantized
from moe_vlm.config.schema import DataKind, Packing, Precision
from moe_vlm.config.spec import RunSpec
from moe_vlm.engines.megatron.stack import transformer_engine_problem
from moe_vlm.perf.rank_shapes import (
    BLOCK_CHECK,
    DIMENSION_ASSERT,
    USERBUFFER_FILL,
    Operand,
    RankShapes,
    ShapeEvidence,
    Verdict,
    rank_shapes,
    shape_key,
)

_CACHE: dict[tuple[object, ...], ShapeEvidence] = {}
_SEEDED = (DataKind.mock, DataKind.synthetic)


def micro_batch_rows(spec: RunSpec) -> tuple[tuple[int, ...], bool, str]:
    """The first micro-batch's row lengths (token positions, padding included), built for real where
    its shape depends on the data: in-batch packing, on the engine's own collate path."""
    if spec.data.packing is Packing.buffer:
        return _buffer_rows(spec)
    packed = spec.data.packing is Packing.in_batch
    if not packed:
        # Every padded collate (ours, data/sequence.py; Bridge's Qwen-VL collate and its mock, which
        # pad to seq_length) gives MBS rows of seq_length whatever the samples: nothing to build.
        return (spec.seq_length,) * spec.mbs, False, f"data={spec.data.kind.value}, padded to seq_length"
    if spec.data.kind not in (*_SEEDED, DataKind.bridge_mock):
        raise LookupError(
            f"data={spec.data.kind.value} with data.packing=in_batch: the shape check builds packed rows from "
            "data=mock, synthetic or bridge_mock only"
        )
    from moe_vlm.engines.megatron.data import SeededSamples, dataset_config  # imports megatron.bridge

    config = dataset_config(spec)
    config.enable_in_batch_packing = True
    config.in_batch_packing_pad_to_multiple_of = spec.collate_padding_multiple  # what validate hands it
    dataset = SeededSamples(config, spec.mbs)
    batch = dataset.collate_fn([dataset[index] for index in range(spec.mbs)])
    length = int(batch["input_ids"].shape[1])
    # bridge_mock: Bridge's MockVLMSFTDataset needs its HF processor; its draw is replayed instead
    # (data/bridge_mock.py, the lengths tests/megatron/test_bridge_mock.py checks against the class).
    replayed = (
        " (Bridge's mock replayed, data/bridge_mock.py)" if spec.data.kind is DataKind.bridge_mock else ""
    )
    return (
        (length,),
        True,
        f"data={spec.data.kind.value}{replayed}, Bridge's in-batch packer, samples 0..{spec.mbs - 1}",
    )


def _buffer_rows(spec: RunSpec) -> tuple[tuple[int, ...], bool, str]:
    """data.packing=buffer: the first micro-batch of DP rank 0 as the engine's PackedRows and its
    collate build it, MBS packed rows laid end to end in one THD row."""
    if spec.data.kind not in (*_SEEDED, DataKind.bridge_mock):
        # Energon's rows (engines/megatron/energon_packing.py) have the same fixed shape, whatever
        # the samples: nothing to build (the shards and the processor may not be on this machine).
        return (
            (spec.mbs * spec.packed_row_length,),
            True,
            f"data={spec.data.kind.value}, buffer-packed by Energon: {spec.mbs} row(s) of {spec.packed_row_length}",
        )
    from moe_vlm.engines.megatron.data import PackedRows, dataset_config  # imports megatron.bridge

    dataset = PackedRows(dataset_config(spec), spec.mbs)
    batch = dataset.collate_fn([dataset[index] for index in range(spec.mbs)])
    samples = int(batch["cu_seqlens_q"].numel()) - 1
    return (
        (int(batch["input_ids"].shape[1]),),
        True,
        f"data={spec.data.kind.value}, buffer-packed: {spec.mbs} row(s) of {spec.packed_row_length} "
        f"holding {samples} samples",
    )


def _block_quantizer(fmt: Precision) -> Any:
    """The quantizer whose own block check applies (None: per-tensor FP8 has none beyond the assert)."""
    import transformer_engine_torch as tex

    if fmt is Precision.fp8mx:
        from transformer_engine.pytorch.tensor.mxfp8_tensor import MXFP8Quantizer

        return MXFP8Quantizer(fp8_dtype=tex.DType.kFloat8E4M3)
    if fmt is Precision.nvfp4:
        from transformer_engine.pytorch.tensor.nvfp4_tensor import NVFP4Quantizer

        from moe_vlm.engines.megatron.library_checks import cpu_device

        with cpu_device():  # its Hadamard signs go to torch.cuda.current_device() (nvfp4_tensor.py:175-177)
            return NVFP4Quantizer()
    return None


def te_verdicts(spec: RunSpec, shapes: RankShapes) -> tuple[tuple[Verdict, ...], int]:
    """TE's refusals of the operands (none in BF16: no quantized GEMM asserts anything) and how many ran."""
    fmt = spec.precision.format
    if not quantized(fmt):
        return (), 0
    import torch
    from transformer_engine.pytorch.utils import assert_dim_for_fp8_exec

    quantizer = _block_quantizer(fmt)
    refused: list[Verdict] = []
    for op in shapes.operands:
        tensor = torch.empty(op.shape, device="meta")
        try:
            assert_dim_for_fp8_exec(tensor)
        except ValueError as exc:
            refused.append(Verdict(op, DIMENSION_ASSERT, str(exc)))
            continue
        if quantizer is not None and not quantizer.is_quantizable(tensor):
            refused.append(Verdict(op, f"{type(quantizer).__name__}.{BLOCK_CHECK}", "returned False"))
    gathered = _userbuffer_verdict(spec, shapes)
    return (*refused, *gathered), len(shapes.operands) + (spec.tp_comm_overlap and fmt is Precision.fp8mx)


def _userbuffer_verdict(spec: RunSpec, shapes: RankShapes) -> tuple[Verdict, ...]:
    """With TP overlap, each sequence-parallel column-parallel GEMM all-gathers its input through TE's
    userbuffers (layernorm_linear.py:301-307, layernorm_mlp.py:474-482), whose MXFP8 branch wants the
    shard's rows a multiple of 128 (module/base.py:709-713); the other formats' branches check no shape."""
    if not (spec.tp_comm_overlap and spec.precision.format is Precision.fp8mx):
        return ()
    from moe_vlm.engines.megatron.library_checks import mxfp8_userbuffer_fill

    shard = shapes.operands[0]  # attention qkv's input: the SP shard every gathered input has
    try:
        mxfp8_userbuffer_fill(*shard.shape)
    except ValueError as exc:
        return (Verdict(shard, USERBUFFER_FILL, str(exc)),)
    return ()


def _evidence(spec: RunSpec) -> ShapeEvidence:
    try:
        rows, packed, source = micro_batch_rows(spec)
    except (ImportError, LookupError) as exc:
        return ShapeEvidence(None, not_run=f"{type(exc).__name__}: {exc}")
    shapes = rank_shapes(spec, rows, packed, source)
    if quantized(spec.precision.format):
        # TE's import can fail other than with ImportError: a half-installed TE (its Python package
        # without its torch extension) raises FileNotFoundError (transformer_engine/common/__init__.py:154).
        problem = transformer_engine_problem()
        if problem is not None:
            return ShapeEvidence(shapes, not_run=problem)
    try:
        refused, checked = te_verdicts(spec, shapes)
    except RuntimeError as exc:  # a TE build that cannot make the quantizer on this machine
        return ShapeEvidence(shapes, not_run=f"Transformer Engine's quantizer: {type(exc).__name__}: {exc}")
    return ShapeEvidence(shapes, refused, checked)


def shape_evidence(spec: RunSpec) -> ShapeEvidence:
    """The point's evidence, from the cache when a point with the same shape_key was checked."""
    key = shape_key(spec)
    if key not in _CACHE:
        _CACHE[key] = _evidence(spec)
    return _CACHE[key]


def cached_keys() -> int:
    """How many distinct shapes this process built (tests: a sweep builds one per shape)."""
    return len(_CACHE)


__all__ = ["Operand", "cached_keys", "micro_batch_rows", "shape_evidence", "te_verdicts"]
