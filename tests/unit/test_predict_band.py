"""Bands measured out of sample (one definition everywhere a band is shown) and the routing load
under real routing."""

from __future__ import annotations

import pytest

from moe_vlm.predict import calibration as cal
from moe_vlm.predict.band import COVERAGE, UNCALIBRATED_BAND, conformal_width, score, score_of_error
from moe_vlm.predict.families import band_for, families_of
from moe_vlm.predict.model import predict, record_section
from moe_vlm.predict.published import band_from, covered_results, family_bands, published_rows, row_results
from moe_vlm.predict.terms import ROUTING_NOT_MODELLED, Term, ep_term, routing_load
from tests.conftest import make_spec

GB200_30B = ("model=qwen3_vl_30b_a3b", "cluster=gb200", "nodes=2", "ep=8")


def test_the_conformal_width_is_the_rank_ceil_n_plus_1_times_coverage_and_none_when_too_few() -> None:
    scores = [0.09, 0.01, 0.05, 0.03, 0.07, 0.02, 0.08, 0.04, 0.06]  # n = 9: rank ceil(10 x 0.8) = 8
    assert conformal_width(scores) == 0.08
    assert conformal_width([0.1, 0.2, 0.3]) is None  # rank 4 of 3: no band can be measured
    assert score(10.0, 13.0) == pytest.approx(0.3) and score_of_error(-0.25) == pytest.approx(1 / 3)


def test_every_row_is_judged_by_the_band_the_other_rows_give_its_families() -> None:
    rows = published_rows()
    results = row_results(rows)
    for r in results:
        others = {
            o.row.name: (o.row.families, o.score)
            for o in results
            if o.row.name != r.row.name and not o.row.excluded
        }
        widest = max(score for families, score in others.values() if families["model"] != "Qwen3.5 35B")
        # Its band is what the other rows alone give its families: its own score is not in it.
        assert (r.band, r.band_basis) == band_from(family_bands(others), r.row.families, widest)
    covered = covered_results(results)
    assert all(families_of(r.row.spec())["model"] != "Qwen3.5 35B" and not r.row.excluded for r in covered)
    assert sum(r.inside for r in covered) / len(covered) >= COVERAGE


def test_the_plan_run_json_and_report_show_the_one_band_the_family_gives() -> None:
    spec = make_spec(*GB200_30B, "router=forced_balance", "data=mock")
    band = band_for(spec)
    found = predict(spec)
    assert found.sigma == band.width and found.band_basis == band.basis
    text = "\n".join(found.lines())
    assert f"band           {band.basis}" in text
    record = record_section(spec, {"step_period_s": {"p50": (found.step_time_s or 0) * 1.1}})["predicted"]
    assert record["sigma"] == band.width and record["band_coverage"] == COVERAGE
    assert record["band_basis"] == found.band_basis


def test_a_calibration_on_runs_bands_by_its_leave_one_out_errors_quantile_or_says_uncalibrated() -> None:
    samples = [
        cal.Sample(str(i), {Term.dense: 1.0 + i, Term.overhead: 1.0}, 2.0 + i * (1.05 + 0.02 * (-1) ** i))
        for i in range(6)
    ]
    fitted = cal.calibrate("local", "torch x", samples, "six runs")
    expected = conformal_width(score_of_error(e) for e in fitted.residuals.values())
    assert (
        expected is not None
        and fitted.band == expected
        and "6 runs' leave-one-out errors" in fitted.band_text
    )
    few = cal.calibrate("local", "torch x", samples[:3], "three runs")
    assert few.band == UNCALIBRATED_BAND and "too few" in few.band_text


def _terms(*overrides: str) -> dict[str, float]:
    found = predict(make_spec(*GB200_30B, *overrides), lookup=False)
    return {t.term: t.seconds for t in found.terms}


def test_padded_capacity_scales_the_expert_gemms_and_the_exchange_by_the_capacity_factor() -> None:
    forced = _terms("router=forced_balance")
    padded = _terms("router=drop_and_pad", "router.capacity_factor=1.5")
    ep = ep_term(make_spec(*GB200_30B)).value
    assert forced[Term.experts.value] > 0 and forced[ep] > 0
    # The GEMMs at 1.5x the tokens: more work, at a better wave occupancy; the exchange carries 1.5x the bytes.
    assert 1.2 * forced[Term.experts.value] < padded[Term.experts.value] <= 1.5 * forced[Term.experts.value]
    assert padded[ep] == pytest.approx(1.5 * forced[ep], rel=0.1)
    assert padded[Term.dense.value] == pytest.approx(forced[Term.dense.value])


def test_real_routing_says_the_imbalance_is_not_modelled_or_widens_the_band_for_an_assumed_load() -> None:
    forced = predict(make_spec(*GB200_30B, "router=forced_balance"))
    real = predict(make_spec(*GB200_30B, "router=real"))
    assert routing_load(make_spec(*GB200_30B, "router=real")) is None
    assert real.step_time_s == forced.step_time_s and ROUTING_NOT_MODELLED in "\n".join(real.lines())
    assert ROUTING_NOT_MODELLED not in "\n".join(forced.lines())
    capped = predict(make_spec(*GB200_30B, "router=real", "router.capacity_factor=1.5"))
    assert capped.step_time_s and forced.step_time_s and capped.step_time_s > forced.step_time_s
    # The truth lies between balanced load and the bound: the band reaches down to the balanced step.
    low, _ = capped.band(capped.step_time_s) or (0.0, 0.0)
    assert low <= forced.step_time_s * (1 - forced.sigma) + 1e-9
    assert capped.sigma > forced.sigma and "assumed routing load" in "\n".join(capped.lines())


def test_the_drop_and_pad_factor_is_what_megatrons_own_capacity_gives() -> None:
    # moe_utils.py:256: capacity = ceil(tokens x top-k / experts x factor); token_dispatcher.py:511-519
    # pads every expert to it, so the experts carry capacity x experts tokens against top-k x tokens.
    moe_utils = pytest.importorskip("megatron.core.transformer.moe.moe_utils")
    spec = make_spec(*GB200_30B, "router=drop_and_pad", "router.capacity_factor=1.5")
    found = routing_load(spec)
    assert found is not None and not found.assumed
    tokens, top_k, experts = 4096, spec.model.moe_top_k, spec.model.num_experts
    capacity = moe_utils.get_capacity(tokens * top_k, experts, spec.router.capacity_factor)
    assert capacity * experts / (tokens * top_k) == pytest.approx(found.factor, rel=1e-3)


def test_an_assumed_load_scales_the_routed_terms_and_says_where_it_comes_from() -> None:
    # router.assumed_load: a run's measured run.json router.load_factor, fed to the plan.
    balanced = _terms("router=real")
    loaded = _terms("router=real", "router.assumed_load=1.8")
    ep = ep_term(make_spec(*GB200_30B)).value
    assert (
        1.4 * balanced[Term.experts.value] < loaded[Term.experts.value] <= 1.8 * balanced[Term.experts.value]
    )
    assert loaded[ep] == pytest.approx(1.8 * balanced[ep], rel=0.1)
    assert loaded[Term.dense.value] == pytest.approx(balanced[Term.dense.value])
    found = routing_load(make_spec(*GB200_30B, "router.assumed_load=1.8"))
    assert found is not None and found.assumed and found.factor == 1.8
    plan = predict(make_spec(*GB200_30B, "router.assumed_load=1.8"))
    text = "\n".join(plan.lines())
    assert "routing load x1.8 (assumed; measured by a run's run.json router.load_factor)" in text
    assert ROUTING_NOT_MODELLED not in text and plan.sigma > band_for(make_spec(*GB200_30B)).width
    # The library's own figure wins: forced balance and a padded capacity are what Megatron makes them.
    forced = routing_load(make_spec(*GB200_30B, "router=forced_balance", "router.assumed_load=1.8"))
    assert forced is not None and forced.factor == 1.0
