"""Issue 32, the predictor out of sample: the probe's GEMM rate, the workload each data kind
draws, the hybrid models' own layers, the out-of-sample table and its uncalibrated bands."""

from __future__ import annotations

import time

import torch

from moe_vlm.predict.probe import gemm_shapes, measured_flops, rank_threads
from tests.conftest import make_spec


def _fast_tail_flops(m: int, k: int, n: int, calls: int = 30) -> float:
    a, b = torch.randn(m, k), torch.randn(k, n)
    for _ in range(3):
        a @ b
    times = []
    for _ in range(calls):
        began = time.perf_counter()
        torch.matmul(a, b)
        times.append(time.perf_counter() - began)
    return 2.0 * m * k * n / sorted(times)[calls // 10]


def test_the_probes_gemm_rate_is_what_torch_matmul_does_here() -> None:
    # The canary read 0.386 GFLOP/s: the probe computed with a thread per core while the point's
    # ranks share the cores (one stalled thread holds every GEMM) and averaged the waits in.
    spec = make_spec("cluster=local", "model=tiny_moe_vlm", "data=mock", "nproc=2", "mbs=2")
    threads = torch.get_num_threads()
    torch.set_num_threads(rank_threads(spec))
    try:
        shapes = gemm_shapes(spec)
        reference = sum(2.0 * m * k * n for m, k, n in shapes) / sum(
            2.0 * m * k * n / _fast_tail_flops(m, k, n) for m, k, n in shapes
        )
    finally:
        torch.set_num_threads(threads)
    probed = measured_flops(spec, seconds=1.0)
    assert torch.get_num_threads() == threads  # the probe leaves the process's threads as it found them
    assert reference / 3 < probed < reference * 3, (probed / 1e9, reference / 1e9)


def test_bridge_mock_predictions_use_bridges_own_sample_lengths_not_the_synthetic_images() -> None:
    from moe_vlm.data.bridge_mock import BRIDGE_MOCK, BRIDGE_MOCK_PACKED
    from moe_vlm.predict.workload import expected_workload

    for packing, mock in (("none", BRIDGE_MOCK), ("in_batch", BRIDGE_MOCK_PACKED)):
        spec = make_spec("data=bridge_mock", "model=qwen3_vl_30b_a3b", f"data.packing={packing}")
        work = expected_workload(spec).workload
        # Bridge's base examples, replayed draw for draw (tests/megatron/test_bridge_mock.py checks
        # the replay against mock_vlm_sft.py's own dataset).
        lengths = [mock.real_tokens(i) for i in range(mock.base_examples)]
        assert abs(work.real_tokens / spec.gbs - sum(lengths) / len(lengths)) < 0.5
        assert work.vision_patches == spec.gbs * 784  # one 448x448 image per sample
    padded = make_spec("data=bridge_mock", "model=qwen3_vl_30b_a3b")
    assert 222 <= expected_workload(padded).workload.real_tokens / padded.gbs <= 241


def test_a_hybrid_models_prediction_times_its_gated_deltanet_layers_as_their_own_term() -> None:
    from moe_vlm.perf.flops import decoder_forward, multipliers, padded_vocab_size
    from moe_vlm.predict.model import DEFAULT_COMPUTE_SCALE, predict
    from moe_vlm.predict.workload import expected_workload

    spec = make_spec("card=qwen3_next_35b_gb200")
    found = predict(spec)
    terms = {t.term: t.seconds for t in found.terms}
    work = expected_workload(spec).workload.padded()
    decoder = decoder_forward(spec.model, work, padded_vocab_size(spec.model.vocab_size, spec.layout.tp))
    factor = multipliers(spec.freeze.vision, spec.freeze.projector, spec.freeze.language)["decoder"]
    from moe_vlm.perf.flops import ForwardFlops

    gdn = factor.apply(ForwardFlops(weight=decoder.gdn_weight, activation=decoder.gdn_recurrence))
    expected = gdn / spec.layout.world_size / spec.cluster.peak_bf16_flops * DEFAULT_COMPUTE_SCALE
    assert gdn > 0 and abs(terms["gdn"] / expected - 1) < 1e-9
    # ... and the attention term holds the softmax layers' core only.
    qwen3 = predict(make_spec("model=qwen3_vl_30b_a3b", "cluster=gb200"))
    assert "gdn" not in {t.term for t in qwen3.terms}


def test_the_out_of_sample_table_is_computed_and_the_docs_hold_what_the_code_prints() -> None:
    from moe_vlm.predict.calibration import fit_scales, predicted_s
    from moe_vlm.predict.model import DEFAULT_COMPUTE_SCALE
    from moe_vlm.predict.published import GROUPINGS, default_fit, out_of_sample, published_rows, table
    from tests.conftest import REPO

    rows = published_rows()
    assert len(rows) >= 12 and all(r.source and r.overrides for r in rows)
    results = out_of_sample("model", rows)
    # One row by hand: the fit on the other model families' covered rows predicts it.
    row = next(r for r in results if r.row.name == "Qwen3 30B H100x32 DeepEP")
    train = [r.sample() for r in rows if r.families["model"] != row.family and r.covered]
    by_hand = predicted_s(fit_scales(train, per_term=False), row.row.sample().base)
    assert abs(row.predicted_s / by_hand - 1) < 1e-9 and row.measured_s == row.row.measured_s()
    docs = (REPO / "docs" / "step-time-prediction.md").read_text()
    for grouping in GROUPINGS:
        for line in table(grouping, out_of_sample(grouping, rows)):
            assert line.strip() in docs, line
    fit = default_fit(rows)
    assert abs(fit.scales["dense"] - DEFAULT_COMPUTE_SCALE) < 0.001


def test_a_family_no_published_row_stands_for_gets_its_out_of_sample_band_not_a_tight_one() -> None:
    from moe_vlm.predict import model
    from moe_vlm.predict.published import out_of_sample, published_rows, summaries

    rows = published_rows()
    hybrid = make_spec("card=qwen3_next_35b_gb200")
    found = model.predict(hybrid)
    needed = max(
        s.band_needed
        for g in ("model", "gpu", "data", "precision")
        for s in summaries(g, out_of_sample(g, rows), covered=False)
    )
    assert found.sigma >= needed > 1.0  # truth sits inside: the row measured 2.6x the prediction
    assert any("uncalibrated for this architecture" in line for line in found.lines())
    gpus = max(s.band_needed for s in summaries("gpu", out_of_sample("gpu", rows)))
    assert model.predict(make_spec("model=qwen3_vl_30b_a3b", "cluster=gb300")).sigma >= gpus
    precisions = max(s.band_needed for s in summaries("precision", out_of_sample("precision", rows)))
    assert (
        model.predict(make_spec("model=qwen3_vl_30b_a3b", "cluster=h100", "precision=fp8cs")).sigma
        >= precisions
    )
    covered = model.predict(make_spec("model=qwen3_vl_30b_a3b", "cluster=gb200"))
    assert covered.sigma == model.DEFAULT_BAND and "uncalibrated" not in (covered.note or "")
