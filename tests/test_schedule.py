"""The pure schedules: budgets follow each strategy's formula, core layers always run."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from d3.config import D3Config, EarlyExitConfig, FullConfig, SkipDecodeConfig, UnifiedConfig
from d3.schedule import (
    alpha_for_mean_depth,
    budgets,
    d3_budget,
    flex_drop_order,
    plan,
    planned_grid,
    planned_mean_layers,
    theoretical_speedup,
    unified_layers,
)

d3_configs = st.builds(
    D3Config,
    alpha=st.floats(0.5, 1.0, exclude_min=True),
    core_head=st.integers(0, 6),
    core_tail=st.integers(0, 6),
    start=st.integers(0, 20),
    drop_order=st.sampled_from(["middle_out", "top_down", "bottom_up", "strided"]),
)


@settings(max_examples=300, deadline=None)
@given(cfg=d3_configs, num_layers=st.integers(12, 48), step=st.integers(1, 600))
def test_d3_runs_formula_budget_and_keeps_core(cfg, num_layers, step):
    head, tail = cfg.core(num_layers)
    run = plan(cfg, num_layers, step).run
    expected = max(math.floor(num_layers * cfg.alpha ** max(0, step - cfg.start) + 1e-9), head + tail, 1)
    assert len(run) == min(num_layers, expected)
    assert set(range(head)) <= set(run)
    assert set(range(num_layers - tail, num_layers)) <= set(run)
    assert list(run) == sorted(set(run)) and all(0 <= x < num_layers for x in run)


@settings(max_examples=200, deadline=None)
@given(cfg=d3_configs.filter(lambda c: c.drop_order != "strided"), num_layers=st.integers(12, 40), step=st.integers(1, 300))
def test_nested_orders_only_shrink(cfg, num_layers, step):
    assert set(plan(cfg, num_layers, step + 1).run) <= set(plan(cfg, num_layers, step).run)


def test_first_token_comes_from_full_depth_prefill():
    for cfg in (D3Config(alpha=0.5), SkipDecodeConfig(), UnifiedConfig(ratio=3), EarlyExitConfig()):
        assert plan(cfg, 30, 0).run == tuple(range(30))


def test_start_delays_the_decay():
    cfg = D3Config(alpha=0.9, start=10)
    assert [len(plan(cfg, 30, i).run) for i in range(1, 11)] == [30] * 10
    assert len(plan(cfg, 30, 11).run) == 27


def test_middle_out_drops_a_contiguous_middle_block():
    cfg = D3Config(alpha=0.95, core_head=3, core_tail=3)
    run = plan(cfg, 30, 8).run
    dropped = sorted(set(range(30)) - set(run))
    assert dropped == list(range(dropped[0], dropped[-1] + 1))
    centre = (3 + 26) / 2
    assert abs((dropped[0] + dropped[-1]) / 2 - centre) <= 1


def test_drop_orders():
    assert flex_drop_order(10, 2, 2, "top_down") == (7, 6, 5, 4, 3, 2)
    assert flex_drop_order(10, 2, 2, "bottom_up") == (2, 3, 4, 5, 6, 7)
    strided = plan(D3Config(alpha=0.9, core_head=1, core_tail=1, drop_order="strided"), 20, 5).run
    assert len(strided) == d3_budget(D3Config(alpha=0.9, core_head=1, core_tail=1), 20, 5)


@settings(max_examples=200, deadline=None)
@given(num_layers=st.integers(8, 48), hi_frac=st.floats(0.4, 1.0), lo_frac=st.floats(0.1, 0.4),
       warmup=st.integers(0, 2), horizon=st.integers(2, 300), step=st.integers(1, 400))
def test_skipdecode_linear_budget_bottom_warmup_plus_top(num_layers, hi_frac, lo_frac, warmup, horizon, step):
    hi = max(3, round(num_layers * hi_frac))
    lo = max(warmup, 1, round(num_layers * lo_frac))
    lo = min(lo, hi)
    cfg = SkipDecodeConfig(max_layers=hi, min_layers=lo, warmup=warmup, horizon=horizon)
    run = plan(cfg, num_layers, step).run
    budget = max(lo, min(hi, round(hi - (hi - lo) * min(1.0, step / (horizon - 1)))))
    assert len(run) == budget
    assert set(range(warmup)) <= set(run)
    top = budget - warmup
    assert set(range(num_layers - top, num_layers)) <= set(run)
    assert len(plan(cfg, num_layers, step + 1).run) <= len(run)


def test_skipdecode_paper_setting_for_32_layers():
    cfg = SkipDecodeConfig(max_layers=22, min_layers=11, warmup=1, horizon=101)
    assert plan(cfg, 32, 1).budget == 22 and plan(cfg, 32, 100).budget == 11
    assert plan(cfg, 32, 1).run == (0, *range(11, 32))


@pytest.mark.parametrize("num_layers,ratio,expected", [
    (32, 2.0, (*range(0, 29, 2), 31)),
    (30, 1.5, (*range(19), 29)),
    (30, 3.0, (0, 3, 6, 9, 12, 15, 18, 21, 24, 29)),
])
def test_unified_integer_spacing_is_the_papers_literal_rule(num_layers, ratio, expected):
    layers = unified_layers(num_layers, ratio, "integer")
    assert layers == expected
    assert len(layers) == math.floor(num_layers / ratio)
    assert plan(UnifiedConfig(ratio=ratio, spacing="integer"), num_layers, 7).run == expected


@pytest.mark.parametrize("num_layers,ratio,expected", [
    (30, 1.5, (0, 2, 3, 5, 6, 8, 9, 11, 12, 14, 15, 17, 18, 20, 21, 23, 24, 26, 27, 29)),
    (30, 3.0, (0, 3, 6, 10, 13, 16, 19, 23, 26, 29)),
    (18, 1.5, (0, 2, 3, 5, 6, 8, 9, 11, 12, 14, 15, 17)),
])
def test_unified_even_spacing_skips_in_a_balanced_manner(num_layers, ratio, expected):
    """The default: at r=1.5 every third layer is skipped, instead of the block 19..28 the integer rule drops."""
    assert UnifiedConfig(ratio=ratio).spacing == "even"
    assert plan(UnifiedConfig(ratio=ratio), num_layers, 7).run == expected == unified_layers(num_layers, ratio)


@settings(max_examples=400, deadline=None)
@given(num_layers=st.integers(2, 128), keep=st.integers(2, 128))
def test_unified_even_spacing_properties(num_layers, keep):
    keep = min(keep, num_layers)
    ratio = num_layers / keep
    layers = unified_layers(num_layers, ratio)
    n = math.floor(num_layers / ratio)  # keep, up to float rounding of num_layers / (num_layers / keep)
    assert len(layers) == len(set(layers)) == n
    assert layers[0] == 0 and layers[-1] == num_layers - 1 and list(layers) == sorted(layers)
    gaps = [b - a for a, b in zip(layers, layers[1:])]
    assert max(gaps) - min(gaps) <= 1


@settings(max_examples=200, deadline=None)
@given(num_layers=st.integers(2, 128), ratio=st.floats(1.0, 64.0))
def test_unified_even_spacing_keeps_floor_l_over_r_for_any_ratio(num_layers, ratio):
    n = max(1, math.floor(num_layers / ratio))
    layers = unified_layers(num_layers, ratio)
    assert len(set(layers)) == n and layers[-1] == num_layers - 1
    if n >= 2:
        assert layers[0] == 0


def test_full_and_early_exit_plans():
    assert plan(FullConfig(), 30, 50).run == tuple(range(30))
    p = plan(EarlyExitConfig(min_layers=6), 30, 5)
    assert p.dynamic and p.min_exit == 6 and p.run == tuple(range(30))


def test_budgets_grid_and_speedup():
    cfg = D3Config(alpha=0.97)
    b = budgets(cfg, 30, 64)
    grid = planned_grid(cfg, 30, 64)
    assert [sum(r) for r in grid] == b
    assert theoretical_speedup([30, 15], 30) == pytest.approx(30 / 22.5)
    assert theoretical_speedup([30, 15], 30, fixed_cost_layers=8) == pytest.approx(38 / 30.5)


def test_alpha_for_mean_depth_hits_target():
    alpha = alpha_for_mean_depth(2 / 3, 30, 128)
    mean = sum(budgets(D3Config(alpha=alpha), 30, 128)) / 128
    assert abs(mean / 30 - 2 / 3) < 0.02


def test_negative_step_rejected():
    with pytest.raises(ValueError, match="step"):
        plan(FullConfig(), 30, -1)


def test_alpha_for_a_depth_just_below_full_keeps_skipping():
    # floor(L * alpha**i) < L for any alpha < 1, so the lightest D3 schedule runs L-1 layers per decoded token;
    # 0.97 of 30 layers over 40 tokens is closest to it, and the rounded alpha must not snap back to 1.0
    alpha = alpha_for_mean_depth(0.97, 30, 40)
    assert alpha < 1.0
    assert budgets(D3Config(alpha=alpha), 30, 40) == [30] + [29] * 39
    assert alpha_for_mean_depth(0.999, 30, 40) == 1.0  # nearer to full depth than to any skipping schedule


def test_planned_mean_counts_the_prefill_token_at_full_depth() -> None:
    assert planned_mean_layers(UnifiedConfig(ratio=2.0), 10, 4) == (10 + 3 * 5) / 4
    assert planned_mean_layers(FullConfig(), 10, 4) == 10
    assert math.isnan(planned_mean_layers(EarlyExitConfig(), 10, 4))
    d3 = D3Config(alpha=0.9, core_head=1, core_tail=1)
    assert planned_mean_layers(d3, 10, 6) == sum(budgets(d3, 10, 6)) / 6
