"""The metrics contract on steps.jsonl records built by hand, following moe_vlm/record/records.py."""

from __future__ import annotations

from functools import cache
from typing import Any

import pytest

from moe_vlm.config.spec import RunSpec
from moe_vlm.perf.flops import Workload, step_flops
from moe_vlm.perf.metrics import summarize
from tests.conftest import make_spec


@cache
def spec(*overrides: str) -> RunSpec:
    return make_spec(*overrides)


def step_records(
    spec: RunSpec,
    step_times_s: list[float],
    *,
    sequences_per_rank: int = 1,
    real_len: int | None = None,
    images_per_rank: int = 0,
    patches_per_image: int = 0,
    peak_memory_gib: float = 10.0,
    components_s: dict[str, float] | None = None,
) -> list[dict[str, Any]]:
    """One record per step per data-parallel rank, as rank 0 writes them to steps.jsonl."""
    padded_len = spec.seq_length
    real_len = padded_len if real_len is None else real_len
    image_tokens = images_per_rank * patches_per_image // spec.model.vision_spatial_merge_size**2
    records = []
    for index, step_time in enumerate(step_times_s):
        step = index + 1
        for rank in range(spec.layout.dp):
            records.append({
                "step": step,
                "rank": rank,
                "warmup": step <= spec.warmup_steps,
                "time_unix_s": 1_700_000_000.0 + step,
                "step_time_s": step_time,
                "loss": 5.0,
                "grad_norm": 1.0,
                "lr": 3e-4,
                "micro_batches": 1,
                "tokens": {
                    "padded": sequences_per_rank * padded_len,
                    "real": sequences_per_rank * real_len,
                    "text": sequences_per_rank * real_len - image_tokens,
                    "image": image_tokens,
                    "loss": sequences_per_rank * real_len - image_tokens,
                },
                "sequences": sequences_per_rank,
                "images": images_per_rank,
                "vision_patches": images_per_rank * patches_per_image,
                "sum_seq_len_squared": sequences_per_rank * real_len**2,
                "sum_patches_squared": images_per_rank * patches_per_image**2,
                "peak_memory_gib": peak_memory_gib + 0.1 * rank,
                "memory_kind": "cuda_max_allocated",
                "components_s": components_s or {"vision_encoder": 0.0, "projector": 0.0, "decoder": 0.0},
            })  # fmt: skip
    return records


GB200_30B = ("model=qwen3_vl_30b_a3b", "cluster=gb200", "nodes=2", "train_iters=8")


def test_steady_window_excludes_warmup_and_marked_steps() -> None:
    s = spec(*GB200_30B)
    times = [9.0, 8.0, 1.0, 1.2, 1.1, 5.0, 1.3, 1.4]  # warm-up 1-2; step 6 was profiled
    records = step_records(s, times)
    for record in records:
        if record["step"] == 6:
            record["exclude"] = "profiler"
    summary = summarize(records, s)
    assert s.warmup_steps == 2
    assert summary["steady_steps"] == [3, 8]
    assert summary["steady_window"]["steps"] == 5
    assert summary["steady_window"]["excluded"] == {"warm-up": [1, 2], "profiler": [6]}
    assert summary["steady_window"]["text"] == "steps 3-8 (5 steps); excluded warm-up: 1-2; profiler: 6"
    # Window [1.0, 1.1, 1.2, 1.3, 1.4]: p50 1.2; p10 = 1.0 + 0.4 x 0.1 = 1.04; p90 = 1.3 + 0.6 x 0.1 = 1.36
    assert summary["step_time_s"]["p50"] == pytest.approx(1.2)
    assert summary["step_time_s"]["p10"] == pytest.approx(1.04)
    assert summary["step_time_s"]["p90"] == pytest.approx(1.36)


def test_tokens_and_throughput_per_gpu() -> None:
    """8 GB200 GPUs (FSDP, DP 8), GBS 512 x seq 4096, each rank 64 sequences of 3072 real tokens, 2 s/step.

    nominal / step = 512 x 4096 = 2,097,152 -> / (2 s x 8 GPUs) = 131,072 tokens/s/GPU
    real / step = 8 x 64 x 3072 = 1,572,864 -> / 16 = 98,304 tokens/s/GPU (the ranking metric)
    padded / step = 8 x 64 x 4096 = 2,097,152 (every sequence padded to seq_length)
    """
    s = spec(*GB200_30B)
    assert (s.layout.world_size, s.layout.dp, s.gbs, s.seq_length) == (8, 8, 512, 4096)
    summary = summarize(step_records(s, [2.0] * 8, sequences_per_rank=64, real_len=3072), s)
    assert summary["tokens_per_step"]["nominal"] == 2_097_152
    assert summary["tokens_per_step"]["real"] == 1_572_864
    assert summary["tokens_per_step"]["padded"] == 2_097_152
    assert summary["nominal_tokens_per_s_per_gpu"] == 131_072
    assert summary["effective_tokens_per_s_per_gpu"] == 98_304
    assert summary["peak_memory_gib"] == pytest.approx(10.7)  # max over ranks: 10 + 0.1 x 7


def test_mfu_against_the_named_gb200_peak() -> None:
    """30B on 8 GB200, each rank 64 full 4096-token sequences (no padding), 10 s/step.

    model FLOPs / step = 512 sequences x 94,233,729,957,888 (tests/unit/test_flops.py)
                       = 48,247,669,738,438,656
    per GPU = 48,247,669,738,438,656 / (10 s x 8) = 603,095,871,730,483 FLOP/s = 603.1 TFLOP/s
    MFU = 603.1e12 / 2.5e15 (GB200 dense BF16) = 24.12%
    """
    s = spec(*GB200_30B)
    summary = summarize(step_records(s, [10.0] * 8, sequences_per_rank=64), s)
    assert summary["flops_per_step"]["model"] == 512 * 94_233_729_957_888
    assert summary["tflops_per_gpu"] == pytest.approx(603.0958717, rel=1e-9)
    assert summary["mfu"] == pytest.approx(0.2412383487, rel=1e-9)
    assert summary["peak"]["name"] == "NVIDIA GB200 dense BF16 2500 TFLOP/s (cluster=gb200)"
    assert summary["peak"]["flops"] == 2.5e15
    assert summary["mfu_note"] is None and summary["errors"] == []


def test_mfu_over_100_percent_is_an_error_not_a_number() -> None:
    """Same work in 1 s/step: 6,031 TFLOP/s/GPU = 241% of the GB200 peak: impossible, so flagged."""
    s = spec(*GB200_30B)
    summary = summarize(step_records(s, [1.0] * 8, sequences_per_rank=64), s)
    assert summary["mfu"] is None
    assert summary["mfu_note"].startswith("ERROR: MFU 241% exceeds 100%")
    assert summary["errors"] == [summary["mfu_note"]]


def test_cpu_cluster_has_no_mfu_and_says_why() -> None:
    s = spec("cluster=local", "train_iters=6")
    summary = summarize(step_records(s, [0.5] * 6), s)
    assert summary["mfu"] is None
    assert summary["peak"] == {"name": None, "flops": None}
    assert "cluster=local" in summary["mfu_note"] and "no dense BF16 peak" in summary["mfu_note"]
    assert summary["tflops_per_gpu"] > 0  # the throughput is still reported


def test_frozen_vision_and_bridge_figures_in_summary() -> None:
    """Bridge-comparable FLOPs (x3 on the frozen ViT) exceed ours; hardware adds recompute."""
    s = spec(*GB200_30B, "vision_freeze=vision", "recompute=full")
    records = step_records(s, [3.0] * 8, sequences_per_rank=4, images_per_rank=4, patches_per_image=1024)
    summary = summarize(records, s)
    flops = summary["flops_per_step"]
    workload = Workload(
        sequences=32, padded_tokens=32 * 4096, real_tokens=32 * 4096, sum_seq_len_squared=32 * 4096**2,
        vision_patches=32 * 1024, sum_patches_squared=32 * 1024**2,
    )  # fmt: skip
    expected = step_flops(s, workload)
    assert flops["model"] == expected.model
    # ViT forward on 32 images of 1024 patches: 32 x 972,331,941,888; Bridge counts it x3, we x1;
    # Bridge leaves out the 3 deepstack mergers we count x3 (32 x 9 x 15,703,474,176).
    assert flops["bridge"] - flops["model"] == pytest.approx(
        2 * 32 * 972_331_941_888 - 32 * 9 * 15_703_474_176
    )
    # The same difference, term by term, in summary.flops_basis (moe_vlm/perf/flops_basis.py).
    basis = summary["flops_basis"]
    assert basis["bridge_flops"] == pytest.approx(flops["bridge"]) and basis["model_flops"] == flops["model"]
    terms = {t["name"]: t["flops"] for t in basis["terms"]}
    assert terms["padding"] == 0 and terms["frozen parts"] == pytest.approx(2 * 32 * 972_331_941_888)
    assert basis["bridge_flops"] - sum(terms.values()) == pytest.approx(basis["model_flops"])
    assert flops["hardware"] > flops["model"] and flops["recompute"] > 0
    assert flops["multipliers"]["vision_encoder"] == {"weight": 1, "activation": 1}
    assert summary["tokens_per_step"]["image"] == 8 * 4 * 256
    assert summary["image_tokens_per_s_per_gpu"] == pytest.approx(8 * 4 * 256 / (3.0 * 8))


def test_component_shares() -> None:
    s = spec("cluster=local", "train_iters=4")
    components = {"vision_encoder": 0.2, "projector": 0.05, "decoder": 0.55}
    summary = summarize(step_records(s, [1.0] * 4, components_s=components), s)
    expected = {"vision_encoder": 0.25, "projector": 0.0625, "decoder": 0.6875}  # 0.2, 0.05, 0.55 of 0.8
    assert summary["components"] == pytest.approx(expected)
    assert summary["component_coverage"] == pytest.approx(0.8)


def test_no_steady_steps_is_reported_not_divided_by_zero() -> None:
    s = spec("cluster=local", "train_iters=2")
    summary = summarize(step_records(s, [1.0, 1.0]), s)
    assert summary["steady_steps"] is None
    assert "no steady steps" in summary["errors"][0]


SPLIT = (
    "TFLOP/s for the decoder, dense BF16 2500 TFLOP/s for the vision encoder and projector (cluster=gb200)"
)


@pytest.mark.parametrize(
    ("overrides", "own_peak", "own_mfu"),
    [
        (("precision=bf16",), "NVIDIA GB200 dense BF16 2500 TFLOP/s (cluster=gb200)", 0.2412383487),
        (("precision=fp8mx",), f"NVIDIA GB200 dense FP8 5000 {SPLIT}", 0.1206191744),
        (("precision=nvfp4",), f"NVIDIA GB200 dense FP4 10000 {SPLIT}", 0.0603095872),
    ],
)
def test_mfu_against_the_precisions_own_peak_beside_the_bf16_one(
    overrides: tuple[str, ...], own_peak: str, own_mfu: float
) -> None:
    """The run above (603.1 TFLOP/s/GPU): MFU stays against the dense BF16 peak whatever the
    precision; beside it, the same FLOPs against the format's dense peak: 603.1e12 / 5e15 (FP8) =
    12.06%, / 1e16 (FP4) = 6.03% (no images here: all of it is decoder FLOPs)."""
    s = spec(*GB200_30B, *overrides)
    summary = summarize(step_records(s, [10.0] * 8, sequences_per_rank=64), s)
    assert summary["mfu"] == pytest.approx(0.2412383487, rel=1e-9)
    assert summary["peak"]["name"] == "NVIDIA GB200 dense BF16 2500 TFLOP/s (cluster=gb200)"
    assert summary["precision_peak"]["name"] == own_peak
    assert summary["mfu_precision"] == pytest.approx(own_mfu, rel=1e-9)
    assert summary["mfu_precision_note"] is None


def test_a_cluster_without_the_formats_peak_says_so() -> None:
    # H100 has no FP4 tensor cores (peak_fp4_flops 0): no second MFU, and the reason names the field.
    s = spec("model=qwen3_vl_30b_a3b", "cluster=h100", "nodes=1", "train_iters=8", "precision=nvfp4")
    summary = summarize(step_records(s, [10.0] * 8, sequences_per_rank=64), s)
    assert summary["mfu"] is not None and summary["mfu_precision"] is None
    assert "no dense FP4 peak (cluster.peak_fp4_flops=0)" in summary["mfu_precision_note"]


def test_under_fp8_the_vision_tower_is_held_to_the_bf16_peak() -> None:
    """FP8: the decoder's FLOPs at the FP8 peak, the ViT's and merger's at the BF16 one (Bridge builds
    the vision config without fp8: peaks.BF16_MODULES). MFU = the time each module's FLOPs take at
    its own peak, over the measured time; dividing everything by the FP8 peak understates it."""
    s = spec(*GB200_30B, "precision=fp8mx")
    records = step_records(s, [3.0] * 8, sequences_per_rank=4, images_per_rank=4, patches_per_image=1024)
    summary = summarize(records, s)
    by_module = summary["flops_per_step"]["model_by_module"]
    assert by_module["vision_encoder"] > 0 and by_module["projector"] > 0
    ideal_s = (by_module["vision_encoder"] + by_module["projector"]) / 2.5e15 + by_module["decoder"] / 5e15
    # 3 s per step on each of the world's GPUs
    assert summary["mfu_precision"] == pytest.approx(ideal_s / (3.0 * s.layout.world_size), rel=1e-9)
    everything_at_fp8 = summary["tflops_per_gpu"] * 1e12 / 5e15
    assert summary["mfu_precision"] > everything_at_fp8
    peak = summary["precision_peak"]
    assert peak["by_module"] == {
        "vision_encoder": {"kind": "bf16", "flops": 2.5e15},
        "projector": {"kind": "bf16", "flops": 2.5e15},
        "decoder": {"kind": "fp8", "flops": 5e15},
    }
    assert 2.5e15 < peak["flops"] < 5e15 and peak["kind"] == "fp8"
    assert peak["name"] == f"NVIDIA GB200 dense FP8 5000 {SPLIT}"
    # BF16: one peak for every module, the blend is that peak.
    b = spec(*GB200_30B)
    same = step_records(b, [3.0] * 8, sequences_per_rank=4, images_per_rank=4, patches_per_image=1024)
    bf16 = summarize(same, b)
    assert bf16["precision_peak"]["flops"] == pytest.approx(2.5e15)
    assert bf16["mfu_precision"] == pytest.approx(bf16["mfu"])


def test_rates_divide_by_the_full_step_period_when_recorded() -> None:
    """Each step 2 s of work, then 0.5 s between steps (logging, manual GC): throughput over the
    period (step start to next step start), 2.5 s, not over the 2 s window; the last step has no
    next start, so no period, and is left out of the rates."""
    s = spec(*GB200_30B)
    records = step_records(s, [2.0] * 8, sequences_per_rank=64, real_len=3072)
    for record in records:
        if record["step"] < 8:
            record["step_period_s"] = 2.5 + 0.1 * record["rank"]  # the slowest rank's counts
    summary = summarize(records, s)
    assert summary["time_basis"]["name"] == "step_period" and summary["time_basis"]["steps"] == 5
    assert "1 without a period" in summary["time_basis"]["text"]
    assert summary["step_time_s"]["p50"] == 2.0  # the window alone, as before
    assert summary["step_period_s"]["p50"] == pytest.approx(3.2)  # 2.5 + 0.1 x 7
    assert summary["between_steps_s"]["mean"] == pytest.approx(1.2)
    assert summary["between_steps_s"]["fraction_of_period"] == pytest.approx(1.2 / 3.2)
    assert summary["effective_tokens_per_s_per_gpu"] == pytest.approx(1_572_864 / (3.2 * 8))
    # Without periods (older lines): the window, and the summary says so.
    plain = summarize(step_records(s, [2.0] * 8, sequences_per_rank=64, real_len=3072), s)
    assert plain["time_basis"]["name"] == "step_time" and plain["step_period_s"] is None
    assert plain["between_steps_s"] is None and plain["effective_tokens_per_s_per_gpu"] == 98_304
