"""``pdmesh bench serve --compare --rounds N``: rounds taken as pairs, their geometric mean
and Student-t interval, and what the report does with a round that has no figure."""

from __future__ import annotations

import math

import pytest

from pdmesh.bench.serve import report
from pdmesh.bench.serve.paired import paired, t_quantile


def test_each_round_is_a_ratio_and_the_mean_is_geometric() -> None:
    p = paired([100.0, 200.0, 400.0], [110.0, 180.0, 440.0])
    assert p.ratios == pytest.approx((1.1, 0.9, 1.1))
    assert p.geomean == pytest.approx((1.1 * 0.9 * 1.1) ** (1 / 3))
    assert p.below_one == 1
    assert p.low < min(p.ratios) <= p.geomean <= max(p.ratios) < p.high  # three rounds: t is wide


def test_the_interval_narrows_with_agreeing_rounds_and_is_reproducible() -> None:
    same = paired([100.0] * 6, [105.0] * 6)
    assert same.low == pytest.approx(1.05) and same.high == pytest.approx(1.05)
    noisy_a = [100.0, 95.0, 110.0, 90.0, 105.0, 100.0]
    noisy_b = [104.0, 92.0, 120.0, 101.0, 99.0, 108.0]
    first, again = paired(noisy_a, noisy_b), paired(noisy_a, noisy_b)
    assert (first.low, first.high) == (again.low, again.high)  # JSON can be checked
    assert first.high - first.low > 0.02
    assert first.low < 1.0 < first.high  # one round at 0.94x and a mean of ~1.03x: not settled
    assert paired(noisy_a * 4, noisy_b * 4).high - paired(noisy_a * 4, noisy_b * 4).low < first.high - first.low


@pytest.mark.parametrize("p, df, want", [(0.975, 1, 12.7062), (0.975, 4, 2.7764), (0.975, 15, 2.1314),
                                         (0.975, 60, 2.0003), (0.95, 7, 1.8946)])
def test_the_t_quantiles_are_the_tables(p: float, df: int, want: float) -> None:
    assert t_quantile(p, df) == pytest.approx(want, abs=1e-4)


def test_the_interval_is_students_t_on_the_log_ratios() -> None:
    a, b = [100.0, 100.0, 100.0, 100.0], [90.0, 100.0, 110.0, 120.0]
    logs = [math.log(y / x) for x, y in zip(a, b)]
    mean, se = sum(logs) / 4, (sum((v - sum(logs) / 4) ** 2 for v in logs) / 3) ** 0.5 / 2
    p = paired(a, b)
    assert p.low == pytest.approx(math.exp(mean - 3.1824 * se), rel=1e-4)
    assert p.high == pytest.approx(math.exp(mean + 3.1824 * se), rel=1e-4)


def test_too_few_rounds_give_no_interval_and_say_so() -> None:
    p = paired([100.0, 100.0], [90.0, 120.0])
    assert math.isnan(p.low) and math.isnan(p.high)
    assert "no interval under 3 rounds" in p.describe()


@pytest.mark.parametrize("a, b", [([], []), ([1.0], [1.0, 2.0]), ([1.0, 0.0, 1.0], [1.0, 1.0, 1.0])])
def test_pairs_that_are_not_pairs_of_figures_are_refused(a: list[float], b: list[float]) -> None:
    with pytest.raises(ValueError):
        paired(a, b)


def _row(side: str, rnd: int, tok_s: float, ttft: float = 100.0, tpot: float = 10.0) -> dict[str, object]:
    return {"target": "x" if side == "target" else "y", "side": side, "rate": float("inf"), "round": rnd,
            "output_tok_s": tok_s, "ttft_p50_ms": ttft, "tpot_p50_ms": tpot}


def test_the_report_pairs_rounds_by_side_and_leaves_out_a_figure_some_round_lacks() -> None:
    rows = [_row("target", 0, 100.0), _row("compare", 0, 110.0), _row("target", 1, 100.0),
            _row("compare", 1, 90.0), _row("target", 2, 100.0), _row("compare", 2, 120.0, ttft=float("nan"))]
    figures = report.paired_by_rate(rows)[float("inf")]
    assert figures["output_tok_s"].ratios == pytest.approx((1.1, 0.9, 1.2))
    assert "ttft_p50_ms" not in figures  # a round where every request failed has no TTFT
    assert figures["tpot_p50_ms"].geomean == pytest.approx(1.0)
    lines = report.ratios(rows, "x", "y")
    assert lines[0].startswith("rate inf: y / x: tok/s 1.07x")
    assert any("tok/s, rounds as pairs: geometric mean" in line and "1 of 3 rounds below 1.0x" in line
               for line in lines)


def test_a_target_against_itself_is_paired_by_side_not_by_name() -> None:
    rows = [_row("target", 0, 100.0), _row("compare", 0, 98.0), _row("target", 1, 100.0), _row("compare", 1, 103.0)]
    for r in rows:
        r["target"] = "pdmesh:0+1" if r["side"] == "target" else "pdmesh:0+1 (again)"
    assert report.paired_by_rate(rows)[float("inf")]["output_tok_s"].ratios == pytest.approx((0.98, 1.03))
