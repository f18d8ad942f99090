"""Memory and FLOPs follow the real micro-batch when samples are packed (data.packing=in_batch)."""

from __future__ import annotations

import signal
from itertools import islice
from types import FrameType

from moe_vlm.data import build_batches
from moe_vlm.perf.flops import Workload, step_flops
from moe_vlm.perf.memory import estimate
from moe_vlm.perf.memory.micro_batch import micro_batch_positions, micro_batch_shape
from tests.conftest import make_spec

# Every synthetic sample alike: one 448 x 448 image (28 x 28 = 784 patches, 196 tokens + 2
# markers) and 100 text tokens = 298 tokens. The percentile of a fixed shape is the exact size.
FIXED = (
    "data=synthetic", "data.min_images=1", "data.max_images=1", "data.min_long_side_px=448",
    "data.max_long_side_px=448", "data.aspect_ratios=[1.0]", "data.min_text_tokens=100",
    "data.max_text_tokens=100", "mbs=3",
)  # fmt: skip


def test_a_fixed_shape_source_is_sized_exactly() -> None:
    packed = make_spec(*FIXED, "data.packing=in_batch")
    shape = micro_batch_shape(packed)
    assert (shape.positions, shape.patches, shape.mean_tokens) == (3 * 298, 3 * 784, 3 * 298)
    batch = next(islice(build_batches(packed, 0, 1), 1))
    assert batch.stats.padded_tokens == batch.stats.real_tokens == shape.positions
    assert batch.stats.vision_patches == shape.patches
    padded = make_spec(*FIXED)
    assert micro_batch_positions(padded) == 3 * padded.seq_length
    assert micro_batch_shape(padded).padding_fraction == 1 - 298 / padded.seq_length


def test_packed_activations_are_sized_on_the_data_not_on_seq_length() -> None:
    padded, packed = make_spec(*FIXED), make_spec(*FIXED, "data.packing=in_batch")
    terms = {spec.data.packing: {t.name: t for t in estimate(spec).terms} for spec in (padded, packed)}
    low, high = terms[packed.data.packing], terms[padded.data.packing]
    assert low["logits"].bytes < high["logits"].bytes
    assert "p99" in low["decoder_activations"].detail and "MBS 3 x seq" in high["decoder_activations"].detail
    # Megatron: the decoder's activations shrink, HybridEP's static buffers stay sized on MBS x seq.
    meg = ("engine=megatron", "cluster=gb200", "model=qwen3_vl_30b_a3b", "nodes=2", "dispatcher=hybridep")
    big = {t.name: t.bytes for t in estimate(make_spec(*meg, *FIXED)).terms}
    small = {t.name: t.bytes for t in estimate(make_spec(*meg, *FIXED, "data.packing=in_batch")).terms}
    assert small["decoder_activations"] < big["decoder_activations"]
    assert small["dispatcher_buffers"] == big["dispatcher_buffers"] > 0


def test_flops_count_real_tokens_and_each_sample_s_attention() -> None:
    spec = make_spec(*FIXED)
    # Three samples of 298 tokens: padded to 3 rows of seq_length, or packed into one row.
    padded = Workload(3, 3 * spec.seq_length, 894, 3 * 298**2, 3 * 784, 3 * 784**2, samples=3)
    packed = Workload(1, 894, 894, 3 * 298**2, 3 * 784, 3 * 784**2, samples=3)
    assert step_flops(spec, padded).model == step_flops(spec, packed).model  # useful work is the same
    assert step_flops(spec, packed).hardware < step_flops(spec, padded).hardware
    # CP/SP alignment padding in a packed row grows each sample, not one row-long sequence.
    aligned = Workload(1, 900, 894, 3 * 298**2, 3 * 784, 3 * 784**2, samples=3).padded()
    assert aligned.sum_seq_len_squared == round(3 * 298**2 * (900 / 894) ** 2)


def test_a_distribution_that_never_fits_gives_up_after_a_bounded_number_of_draws() -> None:
    # seq_length=40 holds no image (A006): the sampler redrew forever. An alarm fails it rather than hang.
    def hung(signum: int, frame: FrameType | None) -> None:
        raise TimeoutError("micro_batch_shape did not return in 60 s: its redraws are unbounded")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(60)
    try:
        shape = micro_batch_shape(make_spec("data=synthetic", "seq_length=40", "data.packing=in_batch"))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert (shape.positions, shape.mean_tokens) == (shape.padded_positions, None)
    assert "no sample" in shape.source and "A006" in shape.source
