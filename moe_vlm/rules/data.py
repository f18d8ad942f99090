"""Data rules (A...)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

from moe_vlm.config.precision import profile, quantized
from moe_vlm.config.schema import (
    DataKind,
    Engine,
    Packing,
    TokenDispatcher,
)
from moe_vlm.config.spec import RunSpec
from moe_vlm.data.errors import DataError
from moe_vlm.data.lengths import Lengths, dataset_lengths
from moe_vlm.data.stats import MOCK_SPEEDUP_NOTE
from moe_vlm.data.workers import data_workers
from moe_vlm.rules.catalogue import (
    Level,
    Violation,
    rule,
)


@rule("A001", Level.error, "real data needs a path")
def _real_path(spec: RunSpec) -> Iterator[Violation]:
    if spec.data.kind is DataKind.real and not spec.data.path:
        yield Violation(
            ("data.path",),
            "data=real needs the directory of WebDataset shards.",
            "add data.path=DIR (build one with scripts/build_dataset.py).",
        )


@rule("A002", Level.error, "synthetic ranges are ordered")
def _synthetic_ranges(spec: RunSpec) -> Iterator[Violation]:
    d = spec.data
    pairs = {
        "images": (d.min_images, d.max_images),
        "long_side_px": (d.min_long_side_px, d.max_long_side_px),
        "text_tokens": (d.min_text_tokens, d.max_text_tokens),
        "pixels": (d.min_pixels, d.max_pixels),
    }
    for name, (low, high) in pairs.items():
        if low < 0 or high < low:
            yield Violation(
                (f"data.min_{name}", f"data.max_{name}"),
                f"data.min_{name}={low} / data.max_{name}={high} is not a valid range.",
                f"use 0 <= data.min_{name} <= data.max_{name}.",
            )


@rule("A003", Level.error, "in-batch packing needs MBS >= 2 (MB ConfigContainer)")
def _packing_mbs(spec: RunSpec) -> Iterator[Violation]:
    # Bridge packs the sequences of one micro-batch together (enable_in_batch_packing), and
    # ConfigContainer.validate rejects it with one sequence per micro-batch (training/config.py:
    # 1480-1485) whatever the dataset: Energon's config and ours both carry the field.
    if spec.engine == Engine.megatron and spec.data.packing is Packing.in_batch and spec.mbs < 2:
        yield Violation(
            ("data.packing", "mbs"),
            f"data.packing=in_batch packs the samples of one micro-batch; mbs={spec.mbs} has nothing to pack "
            "and Bridge's ConfigContainer.validate refuses it.",
            "set mbs=2 or more, or data.packing=none.",
        )


@rule("A004", Level.warning, "mock data is not a performance proxy")
def _mock_data(spec: RunSpec) -> Iterator[Violation]:
    if spec.data.kind is DataKind.mock:
        yield Violation(
            ("data",),
            f"{MOCK_SPEEDUP_NOTE}; its throughput is labelled mock and never ranked with real results.",
            "use data=synthetic or data=real before drawing throughput conclusions.",
        )
    elif spec.data.kind is DataKind.bridge_mock:
        yield Violation(
            ("data",),
            "data=bridge_mock is Bridge's perf-recipe workload: one 256x256 noise image and a few dozen text "
            f"tokens per sample (222-241 real tokens), padded to seq_length={spec.seq_length}; it reproduces "
            "the vendor's number, and is labelled mock and never ranked with real results.",
            "switch to data=synthetic or data=real (and router=real) before drawing throughput conclusions.",
        )


@rule("A005", Level.error, "real data path is an Energon-prepared WebDataset")
def _real_dataset_dir(spec: RunSpec) -> Iterator[Violation]:
    # Only what a directory listing shows; shards are opened and checked by data.check_data.
    path = spec.data.path
    if spec.data.kind is not DataKind.real or not path:
        return
    meta = Path(path).expanduser() / ".nv-meta"
    has_info = (meta / ".info.yaml").is_file() or (meta / ".info.json").is_file()
    if not Path(path).expanduser().is_dir():
        yield Violation(
            ("data.path",),
            f"data.path={path} does not exist.",
            "build a dataset with `python scripts/build_dataset.py --skimage DIR` and set data.path=DIR.",
        )
    elif not (has_info and (meta / "split.yaml").is_file()):
        yield Violation(
            ("data.path",),
            f"data.path={path} is not an Energon-prepared WebDataset (no .nv-meta/.info.yaml, split.yaml).",
            "build it with scripts/build_dataset.py (or run `energon prepare` on the shards).",
        )


def _image_tokens_bounds(spec: RunSpec) -> tuple[int, int]:
    """Fewest and most placeholder tokens one image can become.

    The Qwen-VL resize keeps height x width within [min_pixels, max_pixels] in multiples of
    patch x merge, so tokens = pixels / (patch x merge)^2 lies within these bounds.
    """
    factor = spec.model.vision_patch_size * spec.model.vision_spatial_merge_size
    return math.ceil(spec.data.min_pixels / factor**2), max(spec.data.max_pixels // factor**2, 1)


@rule("A006", Level.error, "the smallest image sample fits seq_length", blocking=True)
def _smallest_sample_fits(spec: RunSpec) -> Iterator[Violation]:
    if spec.data.kind is DataKind.mock or spec.seq_length < 1:  # < 1: C001 says it, once
        return
    images = spec.data.min_images if spec.data.kind is DataKind.synthetic else 1
    fewest, _ = _image_tokens_bounds(spec)
    needed = images * (fewest + 2) + 1  # vision_start/end per image, and one text token
    if images > 0 and needed > spec.seq_length:
        yield Violation(
            ("seq_length", "data.min_pixels"),
            f"even the smallest sample ({images} image(s) of >= {fewest} tokens at data.min_pixels="
            f"{spec.data.min_pixels}) needs {needed} tokens, more than seq_length={spec.seq_length}: "
            "every sample would be skipped (image tokens are never cut).",
            f"raise seq_length to {needed} or more, or lower data.min_pixels.",
        )


@rule("A007", Level.warning, "the largest synthetic images fit seq_length")
def _largest_sample_fits(spec: RunSpec) -> Iterator[Violation]:
    if spec.data.kind is not DataKind.synthetic or spec.seq_length < 1:  # < 1: C001 says it, once
        return
    _, most = _image_tokens_bounds(spec)
    needed = spec.data.max_images * (most + 2) + 1
    if spec.data.max_images > 0 and needed > spec.seq_length:
        yield Violation(
            ("seq_length", "data.max_images", "data.max_pixels"),
            f"{spec.data.max_images} image(s) at data.max_pixels={spec.data.max_pixels} need up to {needed} "
            f"tokens, more than seq_length={spec.seq_length}: such samples are skipped (counted in "
            "run.json data.stats.skipped_samples), which skews the image-size distribution.",
            f"raise seq_length to {needed}, or lower data.max_images / data.max_pixels.",
        )


@rule("A008", Level.warning, "Megatron packing runs vlm_step, not the Qwen3-VL step")
def _packing_changes_the_step(spec: RunSpec) -> Iterator[Violation]:
    # qwen3_vl_step refuses a batch the collate packed (models/qwen_vl/qwen3_vl_step.py:61-65) and
    # its own packing gives every padded row one segment (:192-197), saving nothing; Bridge's generic
    # vlm_step consumes collate-time packing (training/vlm_step.py:129-131, 262-297). So packing
    # also changes the forward step (bridge_fields.forward_step_path): say so beside the figure.
    if spec.engine == Engine.megatron and spec.packed_micro_batches:
        yield Violation(
            ("data.packing",),
            f"data.packing={spec.data.packing.value} runs Bridge's vlm_step.forward_step (qwen3_vl_step refuses collate-time "
            "packing, models/qwen_vl/qwen3_vl_step.py:61-65): a packed vs padded comparison also compares "
            "the two forward steps.",
            "compare at equal effective tokens; keep data.packing=none to stay on the Qwen3-VL step.",
        )


@rule("A010", Level.error, "the allgather dispatcher does not take variable sequence lengths (MLM)")
def _packing_allgather(spec: RunSpec) -> Iterator[Violation]:
    # Megatron Core refuses variable_seq_lengths with the allgather dispatcher (core/transformer/
    # transformer_config.py:2644-2649), which both packings set (our table, bridge_fields.py
    # model.variable_seq_lengths; Bridge itself sets it with PP > 1 only AFTER that check,
    # bridge/models/transformer_config.py:183-189, so nothing stops it there): an in-batch packed
    # micro-batch has its own length, a buffer-packed one is one [1, MBS x row] THD row.
    if (
        spec.engine == Engine.megatron
        and spec.packed_micro_batches
        and spec.dispatcher.token_dispatcher is TokenDispatcher.allgather
    ):
        yield Violation(
            ("data.packing", "dispatcher"),
            f"data.packing={spec.data.packing.value} runs with variable sequence lengths (a packed micro-batch is one THD row), and Megatron Core's allgather "
            "dispatcher does not support variable sequence lengths (transformer_config.py:2644-2649).",
            "use dispatcher=alltoall (or deepep/hybridep), or data.packing=none.",
        )


@rule("A011", Level.warning, "packing pads each sample to the CP/SP multiple")
def _packing_alignment(spec: RunSpec) -> Iterator[Violation]:
    # Bridge hands the packer the collate padding multiple, lcm(2 x CP, CP x TP with SP)
    # (training/config.py:1213-1220, 1236-1239), and the packing collate pads EVERY sample to it
    # (data/packing/in_batch.py:172-175, 196-205): the padding packing removed comes back, up to
    # multiple - 1 positions per sample.
    # Buffer packing pads each sample to the same multiple (engines/megatron/data.py sample_multiple).
    multiple = spec.collate_padding_multiple
    if spec.engine == Engine.megatron and spec.packed_micro_batches and multiple > 1:
        yield Violation(
            ("data.packing", "cp", "tp"),
            f"with cp={spec.layout.cp}, tp={spec.layout.tp}, sequence parallel={spec.sequence_parallel}, "
            f"Bridge pads each packed sample to a multiple of {multiple} (up to {multiple - 1} padded positions "
            "per sample, counted as padding in the record).",
            "expected with CP/SP; lower cp or tp if short samples make the padding large.",
        )


def packed_shard_multiple(spec: RunSpec) -> int:
    """What one rank's share of a packed row is guaranteed a multiple of: the row is the packed
    samples, each padded to the collate padding multiple (data/packing/in_batch.py:161-166), split
    over CP and, under sequence parallelism, over TP."""
    return max(
        spec.collate_padding_multiple // (spec.layout.cp * (spec.layout.tp if spec.sequence_parallel else 1)),
        1,
    )


@rule(
    "A012",
    Level.error,
    "in-batch packing with FP8/FP4: TE's quantized GEMMs need a token multiple (TE utils)",
)
def _packing_quantized(spec: RunSpec) -> Iterator[Violation]:
    # A packed row is as long as its samples, padded only to the CP/SP multiple (Bridge,
    # training/config.py:1213-1220, 1239; data/packing/in_batch.py:161-166); TE quantizes a GEMM
    # input only if its token count is a multiple of 8 (assert_dim_for_fp8_exec, transformer_engine/
    # pytorch/utils.py:704-714, raised from module/linear.py:472, layernorm_linear.py:184,
    # layernorm_mlp.py:356), for MXFP8 of 32 and NVFP4 of 16 (their quantizers' blocks:
    # precision.py token_multiple). Nothing pads the row to it, so most micro-batches fail at the
    # first GEMM (tests/megatron/test_packing.py runs Bridge's packer into TE's checks).
    fmt = spec.precision.format
    if spec.engine != Engine.megatron or spec.data.packing is not Packing.in_batch or not quantized(fmt):
        return
    needed, shard = profile(fmt).token_multiple, packed_shard_multiple(spec)
    if shard % needed:
        yield Violation(
            ("data.packing", "precision"),
            f"data.packing=in_batch pads each packed sample only to {spec.collate_padding_multiple} (Bridge's "
            f"CP/SP multiple, training/config.py:1213-1220), so one rank's packed row is a multiple of {shard} "
            f"tokens; precision={fmt.value} needs a multiple of {needed} in every quantized GEMM and Transformer "
            "Engine raises 'FP8 execution requires the product of all dimensions except the last to be divisible "
            "by 8' (transformer_engine/pytorch/utils.py:704-714) or cannot quantize the blocks "
            "(tensor/mxfp8_tensor.py:125-133, nvfp4_tensor.py:261-271) on the first micro-batch that misses it.",
            f"use data.packing=none with precision={fmt.value}, or precision=bf16 with data.packing=in_batch.",
        )


@rule(
    "A013",
    Level.error,
    "packing with TE userbuffer TP overlap: buffers are seq_length x MBS (MB, TE)",
)
def _packing_userbuffers(spec: RunSpec) -> Iterator[Violation]:
    # Bridge allocates TE's userbuffers once, for (seq_length x MBS / CP) x hidden tokens
    # (training/initialize.py:236-237, 355-358); TE copies each all-gather input into them and asserts
    # the size is exactly that ('Tried to copy an invalid tensor into a local chunk of a Userbuffers
    # buffer', input_size * _tp_size == ubuf_size, common/comm_gemm_overlap/comm_gemm_overlap.cpp,
    # reached from module/base.py:652, 668, 706). A packed row holds its samples' own tokens, fewer unless
    # every sample fills seq_length.
    # A buffer-packed micro-batch is always MBS x packed_row_length tokens: it fills the buffers
    # exactly when the row is seq_length long, and overflows them when the precision's or the split's
    # multiple rounds the row up (RunSpec.packed_row_length).
    if spec.engine != Engine.megatron or not spec.tp_comm_overlap:
        return
    packing = spec.data.packing
    if packing is Packing.none or (packing is Packing.buffer and spec.packed_row_length == spec.seq_length):
        return
    why = "overlap.tp_comm=true" if spec.overlap.tp_comm else "the recipe's TP overlap (overlap.tp_comm=null)"
    row = (
        "a packed row is shorter"
        if packing is Packing.in_batch
        else f"a buffer-packed row is {spec.packed_row_length} positions (seq_length rounded up to the precision's "
        "and the split's multiple)"
    )
    yield Violation(
        ("data.packing", "overlap.tp_comm", "tp"),
        f"data.packing={packing.value} with {why} at TP={spec.layout.tp}: Bridge sizes TE's userbuffers for "
        f"seq_length x MBS = {spec.seq_length} x {spec.mbs} tokens (training/initialize.py:355-358), and TE "
        "asserts every all-gather input fills them exactly ('Tried to copy an invalid tensor into a local chunk "
        f"of a Userbuffers buffer', from transformer_engine/pytorch/module/base.py:652): {row}.",
        f"add overlap.tp_comm=false (or overlap=none) with data.packing={packing.value}, or data.packing=none.",
    )


@rule("A009", Level.warning, "Megatron data loading runs outside the timed step")
def _loader_on_training_thread(spec: RunSpec) -> Iterator[Violation]:
    # Bridge's DataLoader with num_workers=0 builds each batch inside next(data_iterator), which
    # qwen3_vl_step calls inside the step (models/qwen_vl/qwen3_vl_step.py:60, 240-250).
    if spec.engine == Engine.megatron and spec.data.num_workers == 0:
        yield Violation(
            ("data.num_workers",),
            "data.num_workers=0: the Qwen image processor and the collate run on the training thread inside "
            "every step, so step times measure data preparation too (data_wait_s records how much).",
            "leave data.num_workers unset (null: from the CPUs per rank) or set it to 1 or more.",
        )


@rule("A020", Level.error, "the packing buffer holds at least one sample")
def _packing_buffer_size(spec: RunSpec) -> Iterator[Violation]:
    if spec.data.packing is Packing.buffer and spec.data.packing_buffer < 1:
        yield Violation(
            ("data.packing_buffer",),
            f"data.packing_buffer={spec.data.packing_buffer}: the packer fills rows from a buffer of that "
            "many samples, so it needs 1 or more.",
            "set data.packing_buffer=64 (or any N >= 1; larger packs tighter).",
        )


@rule("A021", Level.warning, "buffer packing of real data on Megatron: one packing buffer per loader worker")
def _packing_buffer_megatron(spec: RunSpec) -> Iterator[Violation]:
    # data=real packs through Energon's packing API with the engine's Qwen-VL task encoder
    # (engines/megatron/energon_packing.py). Energon's PackingDataset runs inside each loader worker
    # and fills its buffer from that worker's samples only (megatron/energon/wrappers/
    # packing_dataset.py:197-200, the len_worker() buffers), so a rank holds workers x N encoded
    # samples, pixels included, and its rows are packed from each worker's share of its stream;
    # the torch engine, and mock / synthetic / bridge_mock on Megatron (PackedRows), pack one buffer
    # per rank.
    if (
        spec.engine != Engine.megatron
        or spec.data.packing is not Packing.buffer
        or spec.data.kind is not DataKind.real
    ):
        return
    workers = data_workers(spec)
    if workers.count > 1:
        yield Violation(
            ("data.packing_buffer", "data.num_workers"),
            f"data=real with data.packing=buffer on engine=megatron: each of the {workers.count} Energon loader "
            f"workers per rank ({workers.source}) packs its own buffer of data.packing_buffer="
            f"{spec.data.packing_buffer} samples, so a rank holds {workers.count * spec.data.packing_buffer} "
            "encoded samples and packs within each worker's share of its samples (the torch engine: one "
            "buffer per rank).",
            "accept it, or set data.num_workers=1 for one buffer per rank (the image processor then runs in "
            "one worker), or lower data.packing_buffer if host memory is short.",
        )


def _real_lengths(spec: RunSpec) -> Lengths | None:
    """The real dataset's length counts, or None: not data=real, or a dataset A005 / the data check
    already refuse (nothing to count)."""
    path = spec.data.path
    if spec.data.kind is not DataKind.real or not path or spec.seq_length < 1:
        return None
    if not (Path(path).expanduser() / ".nv-meta" / "split.yaml").is_file():
        return None
    try:
        return dataset_lengths(spec.model, spec.data, spec.seq_length)
    except DataError:
        return None  # unreadable shards: check_data refuses the run with its own line


def _packs_whole_samples(spec: RunSpec) -> bool:
    return spec.engine == Engine.megatron and spec.data.packing is Packing.in_batch


@rule("A014", Level.warning, "real samples longer than seq_length: text cut to fit, images never (counted)")
def _real_over_length(spec: RunSpec) -> Iterator[Violation]:
    # The policy, decided here before the queue: a sample longer than seq_length keeps its image
    # tokens and loses the text that does not fit; one whose images alone do not fit is skipped
    # (data/sequence.py SampleEncoder.encode), both counted in run.json (truncated_text_tokens,
    # skipped_samples). A015 refuses the one path that cannot apply it.
    found = _real_lengths(spec)
    if found is not None and found.over and not _packs_whole_samples(spec):
        yield Violation(
            ("data.path", "seq_length"),
            f"{found.text(spec.seq_length)}; counted in run.json data.stats (truncated_text_tokens, "
            "skipped_samples).",
            f"raise seq_length to {found.longest} to keep every sample whole, or accept the cut.",
        )


@rule(
    "A015",
    Level.error,
    "Megatron packing of real samples longer than seq_length: Bridge's packer raises (MB)",
)
def _real_over_length_packed(spec: RunSpec) -> Iterator[Violation]:
    # Bridge's Qwen-VL collate packs each Energon sample whole (models/qwen_vl/data/collate_fn.py:
    # 153-230) and its packer raises on a row longer than sequence_length (data/packing/in_batch.py:
    # 137-140): the first micro-batch holding such a sample stops the run, where the padded path and
    # the torch engine cut the text (A014).
    found = _real_lengths(spec)
    if found is not None and found.over and _packs_whole_samples(spec):
        yield Violation(
            ("data.packing", "data.path", "seq_length"),
            f"{found.text(spec.seq_length)}; with data.packing=in_batch Bridge's packer raises 'Packed sequence "
            "row length ... exceeds configured sequence_length' on the first one "
            "(megatron/bridge/data/packing/in_batch.py:137-140).",
            f"raise seq_length to {found.longest}, or use data.packing=none (text is then cut to fit, A014).",
        )
