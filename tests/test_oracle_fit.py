"""The decay fit (pure numpy): D3's own budgets, both fits recover a known alpha, under-served and lens depth by hand."""

from __future__ import annotations

import numpy as np
import pytest

from d3.config import D3Config
from d3.research.oracle_fit import (
    budget_grid,
    fit_alpha,
    position_summary,
    prediction_depth,
    schedule_budgets,
    underserved_fraction,
)
from d3.schedule import budgets

L, CORE = 30, (3, 3)


@pytest.mark.parametrize("alpha,start,core", [(0.98, 0, (3, 3)), (0.9, 5, (3, 3)), (0.999999, 0, (0, 0)),
                                              (0.5, 2, (1, 2)), (1.0, 0, (3, 3))])
def test_budget_grid_is_d3s_own_schedule(alpha, start, core):
    cfg = D3Config(alpha=alpha, start=start, core_head=core[0], core_tail=core[1])
    grid = budget_grid(np.array([alpha]), np.array([start]), L, 80, sum(core))
    assert grid[0, 0].tolist() == budgets(cfg, L, 80)


@pytest.mark.parametrize("alpha,start", [(0.98, 0), (0.95, 3), (0.99, 10), (0.9, 0)])
def test_least_squares_recovers_the_alpha_that_made_the_needs(alpha, start):
    needs = schedule_budgets(D3Config(alpha=alpha, start=start), L, 64).tolist()
    fit = fit_alpha([needs, needs[:40]], L, core=CORE)["least_squares"]
    assert (fit.alpha, fit.start) == (alpha, start)
    assert fit.rmse == 0 and fit.underserved == 0


def test_least_squares_with_noise_stays_near_the_true_alpha():
    rng = np.random.default_rng(0)
    clean = schedule_budgets(D3Config(alpha=0.97), L, 64)
    needs = [np.clip(clean + rng.integers(-2, 3, 64), 6, 30).tolist() for _ in range(8)]
    fit = fit_alpha(needs, L, core=CORE, start=0)["least_squares"]
    assert abs(fit.alpha - 0.97) < 0.005 and fit.start == 0


def test_coverage_fit_is_the_smallest_alpha_under_the_limit():
    needs = [schedule_budgets(D3Config(alpha=0.96), L, 50).tolist()]
    exact = fit_alpha(needs, L, core=CORE, k=0.0)["coverage"]
    assert exact.alpha == 0.96 and exact.underserved == 0
    loose = fit_alpha(needs, L, core=CORE, k=0.2)["coverage"]
    assert loose.alpha < 0.96 and loose.underserved <= 0.2 and loose.mean_budget < exact.mean_budget
    # One grid step below the fitted alpha breaks the limit: it is the smallest that keeps it.
    slower = D3Config(alpha=loose.alpha)
    assert underserved_fraction(needs, slower, L) <= 0.2
    below = [a for a in np.linspace(0.5, loose.alpha, 400)[:-1] if underserved_fraction(needs, D3Config(alpha=float(a)), L) <= 0.2]
    assert not below


def test_full_depth_needs_fit_alpha_one():
    fits = fit_alpha([[30] * 20], L, core=CORE)
    assert fits["least_squares"].alpha == 1.0 and fits["least_squares"].start == 0
    assert fits["coverage"].alpha == 1.0 and fits["coverage"].theoretical_speedup == 1.0


def test_underserved_fraction_by_hand():
    cfg = D3Config(alpha=0.5, core_head=1, core_tail=1)  # L = 8: budgets 8, 4, 2, 2, ...
    assert budgets(cfg, 8, 4) == [8, 4, 2, 2]
    # Needs 8 / 5 / 2 / 3: token 1 (5 > 4) and token 3 (3 > 2) are under-served; 2 of 4.
    assert underserved_fraction([[8, 5, 2, 3]], cfg, 8) == 0.5
    # Two prompts: 2 + 0 of 6 tokens.
    assert underserved_fraction([[8, 5, 2, 3], [1, 4]], cfg, 8) == pytest.approx(2 / 6)


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="needs is empty"):
        fit_alpha([[]], L, core=CORE)
    with pytest.raises(ValueError, match="k=1.5"):
        fit_alpha([[30]], L, core=CORE, k=1.5)


def test_prediction_depth_on_a_constructed_lens():
    final = np.array([7, 7, 7, 7])
    lens = np.array([  # [L + 1 = 5, T = 4]: rows are after 0..4 layers
        [7, 1, 7, 1],
        [7, 1, 1, 1],
        [7, 7, 7, 1],
        [7, 7, 7, 1],
        [7, 7, 7, 7],
    ])
    # token 0 is on top from the embedding on; token 2 is on top at 0, lost at 1, back from 2 on; token 3 only at the end.
    assert prediction_depth(lens, final).tolist() == [0, 2, 2, 4]
    assert prediction_depth(lens[:, :1], np.array([3])).tolist() == [5]  # never settles: L + 1


def test_position_summary_sees_a_decay():
    needs = [schedule_budgets(D3Config(alpha=0.95), L, 40).tolist()] * 3
    s = position_summary(needs, L)
    assert s["spearman_need_vs_position"] < -0.9
    assert s["mean_need_first_quarter"] > s["mean_need_last_quarter"]
    assert s["tokens"] == 120
    flat = position_summary([[30] * 10], L)
    assert np.isnan(flat["spearman_need_vs_position"]) and flat["share_needing_full_depth"] == 1.0
