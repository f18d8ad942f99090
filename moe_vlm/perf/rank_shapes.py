"""One micro-batch as each rank's GEMMs see it: the pure half of the shape check (docs/shapes.md).

The engine side (moe_vlm/engines/megatron/shape_check.py) builds a real micro-batch through the
configured dataset and collate, measures its rows, and runs Transformer Engine's own checks on
the operands derived here; the shape rules (moe_vlm/rules/shapes.py, S...) read the verdicts.

The split is Megatron's: context parallelism gives each CP rank 2 of the 2 x CP chunks of every
sequence (megatron/core/utils.py get_batch_on_this_cp_rank; THD rows per sample, Bridge's packer
pads each to the CP multiple), so a CP rank holds tokens / CP; sequence parallelism then shards the
token dimension of the layer-norm region over TP (megatron/core/tensor_parallel/mappings.py
_split_along_first_dim, which asserts the division). A TE linear asserts its LOCAL input, before
its own all-gather (transformer_engine/pytorch/module/linear.py:472, layernorm_linear.py:184,
layernorm_mlp.py:356), so a column-parallel GEMM's input is the SP shard and a row-parallel GEMM's
input the whole CP-rank sequence with its hidden dimension split over TP.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from moe_vlm.config.spec import RunSpec


@dataclass(frozen=True)
class Operand:
    """One 2-D GEMM operand on one rank: the input is tokens x features, the weight out x in."""

    gemm: str
    role: str  # input | weight
    shape: tuple[int, int]

    def text(self) -> str:
        return f"{self.gemm} {self.role} {self.shape[0]}x{self.shape[1]}"


@dataclass(frozen=True)
class RankShapes:
    rows: tuple[int, ...]  # token positions of each collated row, padding included
    packed: bool
    source: str  # how the rows were obtained (which dataset and collate)
    cp: int
    sp_tp: int  # TP when sequence parallelism shards the tokens, else 1
    # (what, length, divisor) for every split that does not divide: a row over 2 x CP chunks,
    # a CP rank's tokens over TP under SP
    uneven: tuple[tuple[str, int, int], ...]
    operands: tuple[Operand, ...]

    @property
    def tokens(self) -> int:
        return sum(self.rows)

    @property
    def cp_tokens(self) -> int:
        return self.tokens // self.cp

    @property
    def sp_tokens(self) -> int:
        return self.cp_tokens // self.sp_tp

    def text(self) -> str:
        how = "one packed THD row" if self.packed else f"{len(self.rows)} padded row(s)"
        return (
            f"{how} of {self.tokens} token positions ({self.source}); per rank: {self.cp_tokens} after CP={self.cp}"
            + (f", {self.sp_tokens} in the SP shard (TP={self.sp_tp})" if self.sp_tp > 1 else "")
        )


# The TE function behind a verdict's check (moe_vlm/engines/megatron/shape_check.py runs them).
DIMENSION_ASSERT = "assert_dim_for_fp8_exec"  # transformer_engine/pytorch/utils.py:704-714
BLOCK_CHECK = "is_quantizable"  # MXFP8Quantizer / NVFP4Quantizer .is_quantizable
USERBUFFER_FILL = "fill_userbuffers_buffer_for_all_gather"  # module/base.py:607-754


@dataclass(frozen=True)
class Verdict:
    """Transformer Engine's answer for one operand: check is the TE function that refused it."""

    operand: Operand
    check: str
    error: str


@dataclass(frozen=True)
class ShapeEvidence:
    """What the shape check found for one point: the shapes and TE's refusals, or why it did not run."""

    shapes: RankShapes | None
    refused: tuple[Verdict, ...] = field(default_factory=tuple)
    checked: int = 0  # operands TE's checks ran on
    not_run: str = ""  # why there are no shapes (no stack here, a dataset not on this machine)


def shape_key(spec: RunSpec) -> tuple[object, ...]:
    """Everything the micro-batch's shapes depend on, and nothing else: a sweep over knobs that do not
    change them (dispatcher, recompute, overlap, nodes...) builds one batch."""
    lay, data = spec.layout, spec.data
    return (
        spec.engine,
        spec.seq_length,
        spec.mbs,
        spec.seed,
        repr({k: v for k, v in vars(data).items() if k != "num_workers"}),  # kind, packing, distribution
        spec.precision.format,
        lay.tp,
        lay.cp,
        lay.etp,
        spec.sequence_parallel,
        spec.tp_comm_overlap,  # TE's userbuffer all-gather checks the MXFP8 shard (docs/shapes.md)
        repr(spec.model),
    )


def _split(spec: RunSpec, rows: tuple[int, ...]) -> tuple[int, int, list[tuple[str, int, int]]]:
    cp, sp_tp = spec.layout.cp, spec.layout.tp if spec.sequence_parallel else 1
    uneven = []
    if cp > 1:
        uneven += [("a row over 2 x CP chunks", row, 2 * cp) for row in rows if row % (2 * cp)]
    if sp_tp > 1 and (sum(rows) // cp) % sp_tp:
        uneven.append(("a CP rank's tokens over TP (sequence parallel)", sum(rows) // cp, sp_tp))
    return cp, sp_tp, uneven


def rank_shapes(spec: RunSpec, rows: tuple[int, ...], packed: bool, source: str) -> RankShapes:
    """The per-rank GEMM operands of one transformer layer for a micro-batch of `rows`: attention's
    QKV (column-parallel) and output projection (row-parallel), the dense and shared-expert MLPs
    (gated: fc1 is 2 x FFN wide), and the routed experts' weights over ETP. The experts' token counts
    are the router's, known only at run time (docs/shapes.md says what that leaves out)."""
    m, lay = spec.model, spec.layout
    cp, sp_tp, uneven = _split(spec, rows)
    tp = max(lay.tp, 1)
    full = sum(rows) // cp
    shard = full // sp_tp
    h = m.hidden_size
    q, kv = m.num_attention_heads * m.head_dim, 2 * m.num_query_groups * m.head_dim
    ops = [
        Operand("attention qkv", "input", (shard, h)),
        Operand("attention qkv", "weight", ((q + kv) // tp, h)),
        Operand("attention proj", "input", (full, q // tp)),
        Operand("attention proj", "weight", (h, q // tp)),
    ]
    for name, ffn, split in (
        ("dense mlp", m.dense_ffn_hidden_size if m.num_dense_layers else 0, tp),
        ("shared expert", m.shared_expert_ffn_hidden_size if m.num_shared_experts else 0, tp),
    ):
        if ffn:
            ops += [
                Operand(f"{name} fc1", "input", (shard, h)),
                Operand(f"{name} fc1", "weight", (2 * ffn // split, h)),
                Operand(f"{name} fc2", "input", (full, ffn // split)),
                Operand(f"{name} fc2", "weight", (h, ffn // split)),
            ]
    if m.num_experts:
        etp = max(lay.etp, 1)
        ops += [
            Operand("expert fc1", "weight", (2 * m.moe_ffn_hidden_size // etp, h)),
            Operand("expert fc2", "weight", (h, m.moe_ffn_hidden_size // etp)),
        ]
    return RankShapes(rows, packed, source, cp, sp_tp, tuple(uneven), tuple(ops))
