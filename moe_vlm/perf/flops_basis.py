"""The vendor's TFLOP/s, decomposed: Bridge's logged FLOPs basis beside ours, term by term.

Bridge's perf recipes log TFLOP/s/GPU from ``num_floating_point_operations`` (moe_vlm.perf.flops.
bridge_count): every padded position of GBS whole rows, the vocabulary padded to 128 x TP, every
module x3 as if it trained, the ViT on the step's patches spread over the rows with one merger.
On the recipes' own mock workload (4,096 positions per sample of which about 232 are real, a
frozen decoder and ViT on Qwen3-VL) that count is many times the useful work. Ours
(``StepFlops.model``) counts real tokens and frozen modules by what their backward really runs.

The difference is split into four terms, each computed by changing ONE assumption of Bridge's
count, in this order (so the terms add up exactly):

    padding            decoder on real tokens (attention on real lengths) instead of padded positions
    vocabulary padding logits over the real vocabulary instead of the one padded to 128 x TP
    vision accounting  ViT attention per image and every merger (deepstack included), as we count
                       it, instead of patches spread evenly over rows and one merger
    frozen parts       frozen-aware multipliers (moe_vlm/perf/flops.py) instead of x3 everywhere

Bridge's count - the four terms = ours. The plan shows it for the expected step (``expected``),
run.json ``summary.flops_basis`` for the steady window's mean step, ``moe-vlm report --diff``
side by side for two runs.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, replace
from typing import Any

from moe_vlm.config.schema import DataKind, Packing
from moe_vlm.config.spec import RunSpec
from moe_vlm.config.vendor import (
    BRIDGE_MOCK_IMAGES,
    BRIDGE_MOCK_PATCHES,
    BRIDGE_MOCK_REAL_TOKENS,
    is_bridge_mock,
)
from moe_vlm.data.bridge_mock import bridge_mock
from moe_vlm.perf.flops import (
    Workload,
    bridge_count,
    bridge_rows,
    bridge_statistics,
    bridge_vision_forward,
    decoder_forward,
    padded_vocab_size,
    projector_forward,
    step_flops,
    vision_encoder_forward,
)
from moe_vlm.perf.memory.images import resized_pixels

PETA = 1e15


@dataclass(frozen=True)
class SampleShape:
    """One sample as the step sees it, on average."""

    positions: float  # positions the decoder computes per sample (padding included)
    real_tokens: float  # text + image placeholders
    real_tokens_squared: float  # E[real length^2] (attention)
    images: float
    patches: float  # ViT patches per sample
    patches_squared: float  # E[sum over the sample's images of patches^2]
    source: str

    def step(self, rows: int) -> Workload:
        return Workload(
            sequences=rows,
            padded_tokens=round(self.positions * rows),
            real_tokens=round(self.real_tokens * rows),
            sum_seq_len_squared=round(self.real_tokens_squared * rows),
            vision_patches=round(self.patches * rows),
            sum_patches_squared=round(self.patches_squared * rows),
        )


def _uniform_moments(low: int, high: int) -> tuple[float, float]:
    """Mean and variance of an integer drawn uniformly from [low, high]."""
    n = high - low + 1
    return (low + high) / 2, (n * n - 1) / 12


def _image_hw(long_side: int, aspect_ratio: float) -> tuple[int, int]:
    """moe_vlm/data/synthetic.py image_hw (importing the data package costs seconds: torch and the
    processor); tests/unit/test_flops_basis.py checks the two agree."""
    if aspect_ratio >= 1.0:
        return max(1, round(long_side / aspect_ratio)), long_side
    return long_side, max(1, round(long_side * aspect_ratio))


def _synthetic_shape(spec: RunSpec) -> SampleShape:
    """The synthetic distribution's expectation (moe_vlm/data/synthetic.py: uniform image count,
    long side and text length, aspect ratio from the list), through the processor's resize."""
    data, model = spec.data, spec.model
    return _synthetic_moments(
        (model.vision_patch_size, model.vision_spatial_merge_size),
        (data.min_pixels, data.max_pixels, data.min_long_side_px, data.max_long_side_px),
        tuple(data.aspect_ratios) or (1.0,),
        (data.min_images, data.max_images, data.min_text_tokens, data.max_text_tokens),
        spec.seq_length,
    )


@functools.lru_cache(maxsize=64)
def _synthetic_moments(
    vision: tuple[int, int],
    pixels: tuple[int, int, int, int],
    ratios: tuple[float, ...],
    counts: tuple[int, ...],
    seq: int,
) -> SampleShape:
    """Cached: a big dry run plans many points of one distribution."""
    (patch, merge), (min_pixels, max_pixels, low, high) = vision, pixels
    factor = patch * merge
    patches = []
    for side in range(low, high + 1):
        for ratio in ratios:
            h_bar, w_bar = resized_pixels(*_image_hw(side, ratio), factor, min_pixels, max_pixels)
            patches.append((h_bar // patch) * (w_bar // patch))
    mean_p = sum(patches) / len(patches)
    mean_p2 = sum(p * p for p in patches) / len(patches)
    span = [p / merge**2 + 2 for p in patches]  # image tokens + vision start/end markers
    mean_s = sum(span) / len(span)
    var_s = sum(s * s for s in span) / len(span) - mean_s**2
    mean_n, var_n = _uniform_moments(counts[0], counts[1])
    mean_t, var_t = _uniform_moments(counts[2], counts[3])
    real = min(mean_n * mean_s + mean_t, seq)
    var_real = mean_n * var_s + var_n * mean_s**2 + var_t
    return SampleShape(
        positions=seq,
        real_tokens=real,
        real_tokens_squared=var_real + real**2,
        images=mean_n,
        patches=mean_n * mean_p,
        patches_squared=mean_n * mean_p2,
        source="expected from the synthetic distribution (data.* ranges)",
    )


def _bridge_mock_packed_shape() -> SampleShape:
    """Bridge's mock with in-batch packing: its 1,000 base examples' own lengths (10-99 answer words,
    mock_vlm_sft.py:110, replayed by moe_vlm/data/bridge_mock.py), not the padded mock's 232. Each
    sample is packed unpadded (in_batch_packing_pad_to_multiple_of 1, mock_vlm_sft.py:59); CP/SP
    alignment padding is not counted here."""
    mock = bridge_mock(Packing.in_batch)
    lengths = [mock.real_tokens(i) for i in range(mock.base_examples)]
    mean = sum(lengths) / len(lengths)
    squares = sum(n * n for n in lengths) / len(lengths)
    patches = BRIDGE_MOCK_PATCHES
    return SampleShape(
        mean, mean, squares, BRIDGE_MOCK_IMAGES, patches, patches**2, "Bridge's mock VLM SFT sample, packed"
    )


def expected_shape(spec: RunSpec) -> SampleShape | str:
    """The average sample this run will see, or why it is not known before the run."""
    seq = spec.seq_length
    if spec.data.packing is not Packing.none:
        if is_bridge_mock(spec):
            return _bridge_mock_packed_shape()
        return "packed rows: per-row real tokens are the packing accounting's (known after the run)"
    if is_bridge_mock(spec):  # the hook until data=bridge_mock states its shape (moe_vlm/config/vendor.py)
        real, patches = BRIDGE_MOCK_REAL_TOKENS, BRIDGE_MOCK_PATCHES
        return SampleShape(
            seq, real, real**2, BRIDGE_MOCK_IMAGES, patches, patches**2, "Bridge's mock VLM SFT sample"
        )
    if spec.data.kind is DataKind.mock:
        mean, var = _uniform_moments(seq // 2, seq)  # moe_vlm/data/mock.py: seq/2 .. seq text tokens
        return SampleShape(seq, mean, var + mean**2, 0, 0, 0, "image-free mock text (seq/2 .. seq tokens)")
    if spec.data.kind is DataKind.synthetic:
        return _synthetic_shape(spec)
    return "data=real: known after the run (run.json summary.flops_basis)"


@dataclass(frozen=True)
class BasisTerm:
    name: str
    flops: float  # per step: what this term takes off Bridge's count (negative: it adds)
    why: str


@dataclass(frozen=True)
class FlopsBasis:
    """One step counted Bridge's way and ours, and the terms between them."""

    source: str
    rows: int  # GBS: the rows Bridge's count is over
    positions_per_sample: float
    real_tokens_per_sample: float
    images_per_sample: float | None  # None: the record does not say
    patches_per_sample: float
    bridge_flops: float
    model_flops: float
    terms: tuple[BasisTerm, ...]
    # What recomputes both counts' attention by hand (records before issue 32 lack them): the step's
    # positions, the sum of squares Bridge's attention term uses (whole rows: row^2 each; packed: each
    # sample's real length^2) and ours (each sample's real length^2), and whether rows were packed.
    packed: bool = False
    positions_per_step: float = 0.0
    bridge_sum_squares: float = 0.0
    real_sum_squares: float = 0.0

    @property
    def real_fraction(self) -> float:
        return self.real_tokens_per_sample / self.positions_per_sample if self.positions_per_sample else 0.0

    @property
    def useful_fraction(self) -> float:
        return self.model_flops / self.bridge_flops if self.bridge_flops else 0.0

    def headline(self) -> str:
        packed = (
            "packed rows (Bridge: batch = GBS samples, attention over each sample's length^2): "
            if self.packed
            else ""
        )
        return packed + (
            f"{self.positions_per_sample:,.0f} positions/sample, {self.real_tokens_per_sample:,.0f} real "
            f"({self.real_fraction:.1%}); useful model FLOPs = {self.useful_fraction:.1%} of Bridge's count"
        )

    def lines(self) -> list[str]:
        images = "-" if self.images_per_sample is None else f"{self.images_per_sample:g}"
        out = [
            f"  {self.headline()}",
            f"  {self.source}; {images} image(s), {self.patches_per_sample:,.0f} ViT patches per sample; "
            f"GBS {self.rows} rows",
            f"  {'Bridge counts':<22} {self.bridge_flops / PETA:12.3f} PFLOP/step  (what its TFLOP/s/GPU divides)",
        ]
        for term in self.terms:
            out.append(f"  {'- ' + term.name:<22} {term.flops / PETA:12.3f} PFLOP/step  {term.why}")
        out.append(
            f"  {'= ours (useful)':<22} {self.model_flops / PETA:12.3f} PFLOP/step  = "
            f"{self.useful_fraction:.1%}: Bridge logging T TFLOP/s/GPU means T x {self.useful_fraction:.3f} useful"
        )
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON's own shapes (lists, not tuples), so a record reads back equal."""
        return asdict(self) | {
            "terms": [asdict(t) for t in self.terms],
            "real_fraction": self.real_fraction,
            "useful_fraction": self.useful_fraction,
        }


def _frozen_why(spec: RunSpec) -> str:
    frozen = [name for name, on in vars(spec.freeze).items() if on is True]
    if not frozen:
        return "nothing frozen: both count x3"
    return f"frozen {'+'.join(frozen)}: no weight gradient (and no backward at all before the first trained module)"


def flops_basis(
    spec: RunSpec, workload: Workload, source: str, images_per_sample: float | None = None
) -> FlopsBasis:
    """Bridge's count of `workload`, ours, and the four terms between them (module docstring)."""
    model, rows = spec.model, bridge_rows(workload)
    padded_vocab = padded_vocab_size(model.vocab_size, spec.layout.tp)
    bridge = bridge_count(spec, workload)
    bridge_vision = 3.0 * bridge_vision_forward(model, workload, rows)
    real_decoder = 3.0 * decoder_forward(model, workload, padded_vocab).as_forward().total
    unpadded_vocab = 3.0 * decoder_forward(model, workload, model.vocab_size).as_forward().total
    our_vision = 3.0 * (
        vision_encoder_forward(model, workload).total + projector_forward(model, workload).total
    )
    ours = step_flops(spec, workload).model
    after_padding = real_decoder + bridge_vision
    after_vocab = unpadded_vocab + bridge_vision
    after_vision = unpadded_vocab + our_vision
    sequences = max(rows, 1)
    terms = (
        BasisTerm(
            "padding",
            bridge - after_padding,
            f"decoder on {workload.real_tokens:,} real tokens, not {workload.padded_tokens:,} padded positions",
        ),
        BasisTerm(
            "vocabulary padding",
            after_padding - after_vocab,
            f"logits over {model.vocab_size:,}, not {padded_vocab:,}",
        ),
        BasisTerm(
            "vision accounting",
            after_vocab - after_vision,
            f"ViT attention per image, {1 + len(model.vision_deepstack_layers)} merger(s) (Bridge: patches "
            "per row, 1 merger)",
        ),
        BasisTerm("frozen parts", after_vision - ours, _frozen_why(spec)),
    )
    return FlopsBasis(
        source=source,
        rows=rows,
        positions_per_sample=workload.padded_tokens / sequences,
        real_tokens_per_sample=workload.real_tokens / sequences,
        images_per_sample=images_per_sample,
        patches_per_sample=workload.vision_patches / sequences,
        bridge_flops=bridge,
        model_flops=ours,
        terms=terms,
        packed=workload.packed,
        positions_per_step=float(workload.padded_tokens),
        bridge_sum_squares=float(bridge_statistics(workload).sum_seq_len_squared),
        real_sum_squares=float(workload.sum_seq_len_squared),
    )


def expected_basis(spec: RunSpec) -> FlopsBasis | str:
    """The plan's basis: the expected sample, GBS of them, or why it is not known yet (or cannot be
    computed: a configuration the rules reject, e.g. unordered data ranges)."""
    try:
        return _expected_basis(spec)
    except (ArithmeticError, ValueError, IndexError) as exc:
        return f"not computable for this configuration ({type(exc).__name__}: {exc}; see the findings)"


def _expected_basis(spec: RunSpec) -> FlopsBasis | str:
    shape = expected_shape(spec)
    if isinstance(shape, str):
        return shape
    if spec.gbs <= 0:
        return "no batch (GBS 0)"
    step = shape.step(spec.gbs)
    if spec.data.packing is not Packing.none:
        # MBS samples a row: GBS samples in GBS / MBS rows, attention within each sample.
        step = replace(step, sequences=max(spec.gbs // max(spec.mbs, 1), 1), samples=spec.gbs)
    return flops_basis(spec, step, shape.source, shape.images)


def basis_lines(spec: RunSpec, basis: FlopsBasis | str | None = None) -> list[str]:
    found = expected_basis(spec) if basis is None else basis
    head = "-- FLOPs basis: Bridge's logged TFLOP/s vs ours, per step (moe_vlm/perf/flops_basis.py) --"
    if isinstance(found, str):
        return [head, f"  not computed before the run: {found}"]
    return [head, *found.lines()]
