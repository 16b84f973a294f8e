"""Paired differences (d3.research.stats): the exact McNemar interval against a hand computation, the bootstrap,
and a zero-width difference for two strategies that answer alike on a tiny model."""

from __future__ import annotations

import math

import numpy as np
import pytest

from d3.config import D3Config, FullConfig
from d3.research.answers import PrefilledQuestions
from d3.research.gentasks import get_generation_task
from d3.research.stats import bootstrap_difference, clopper_pearson, exact_difference


def _tail(k: int, m: int, p: float, upper: bool) -> float:
    ks = range(k, m + 1) if upper else range(0, k + 1)
    return sum(math.comb(m, j) * p ** j * (1 - p) ** (m - j) for j in ks)


def test_clopper_pearson_matches_the_published_values_and_its_definition() -> None:
    low, high = clopper_pearson(2, 10)
    assert low == pytest.approx(0.02521, abs=5e-5) and high == pytest.approx(0.55610, abs=5e-5)  # standard tables
    assert _tail(2, 10, low, upper=True) == pytest.approx(0.025, abs=1e-9)
    assert _tail(2, 10, high, upper=False) == pytest.approx(0.025, abs=1e-9)
    assert clopper_pearson(0, 5)[0] == 0.0 and clopper_pearson(5, 5)[1] == 1.0
    with pytest.raises(ValueError, match="successes"):
        clopper_pearson(3, 2)


def test_exact_difference_is_read_from_the_discordant_pairs_by_hand() -> None:
    # 100 questions: 80 right under both, 8 right under the first only, 2 under the second only, 10 wrong under both
    first = [1] * 80 + [1] * 8 + [0] * 2 + [0] * 10
    second = [1] * 80 + [0] * 8 + [1] * 2 + [0] * 10
    d = exact_difference(first, second)
    assert (d.won, d.lost, d.n) == (2, 8, 100) and d.diff == pytest.approx(-0.06)
    # by hand: b = 2 of m = 10 discordant pairs; p in [0.02521, 0.55610]; difference = m (2p - 1) / n
    assert d.low == pytest.approx(10 * (2 * 0.0252107 - 1) / 100, abs=1e-6)
    assert d.high == pytest.approx(10 * (2 * 0.5560955 - 1) / 100, abs=1e-6)
    assert d.low < d.diff < d.high
    swapped = exact_difference(second, first)
    assert swapped.diff == pytest.approx(0.06) and (swapped.low, swapped.high) == pytest.approx((-d.high, -d.low))


def test_concordant_questions_do_not_widen_the_exact_interval_but_shrink_it_in_points() -> None:
    small = exact_difference([1, 0] * 5, [0, 1] * 5)
    large = exact_difference([1, 0] * 5 + [1] * 90, [0, 1] * 5 + [1] * 90)
    assert small.diff == large.diff == 0.0
    assert large.high - large.low == pytest.approx((small.high - small.low) / 10)


def test_bootstrap_is_seeded_and_brackets_the_mean_difference() -> None:
    rng = np.random.default_rng(1)
    a = rng.random(200)
    b = a - 0.05 + rng.normal(0, 0.02, 200)
    one, two = bootstrap_difference(a, b, seed=3), bootstrap_difference(a, b, seed=3)
    assert one == two and one.low < one.diff < one.high and one.high < 0
    assert one.diff == pytest.approx(float(np.mean(b - a)))
    with pytest.raises(ValueError, match="same length"):
        bootstrap_difference([1, 0], [1])


def test_identical_answers_give_a_zero_width_difference() -> None:
    same = [1, 0, 1, 1, 0]
    for d in (exact_difference(same, same), bootstrap_difference(same, same)):
        assert (d.diff, d.low, d.high) == (0.0, 0.0, 0.0)


def test_two_strategies_that_answer_alike_on_a_tiny_model_differ_by_exactly_zero(tiny_engine) -> None:
    task = get_generation_task("gen_1_digit_addition")
    questions = PrefilledQuestions(tiny_engine, task, task.split("test")[:6], batch=4)
    full, same = questions.answer(FullConfig()), questions.answer(D3Config(alpha=1.0))
    shallow = questions.answer(D3Config(alpha=0.5, core_head=1, core_tail=1))
    assert full.texts == same.texts and shallow.texts != full.texts  # the shallow run really differs
    agree = [float(a == b) for a, b in zip(full.texts, same.texts)]
    for d in (exact_difference(full.correct, same.correct), bootstrap_difference([1.0] * 6, agree)):
        assert (d.low, d.diff, d.high) == (0.0, 0.0, 0.0)


class _Parity:
    """A checkable task for a random tiny model: right when the reply's characters sum to an even code (each strategy's
    right/wrong bits then differ question by question, as a real model's do)."""

    name, max_new_tokens = "parity", 6

    def __init__(self, task):
        self.task = task

    def prompt(self, ex):
        return self.task.prompt(ex)

    def score(self, ex, text):
        return sum(map(ord, text)) % 2 == 0


def test_a_tiny_models_paired_interval_matches_a_hand_computation(tiny_engine) -> None:
    """Full depth against a shallow D3 on 24 questions: the discordant pairs counted by hand, and the interval's
    ends are where the binomial tails of those counts are 2.5% each (summed here with math.comb)."""
    base = get_generation_task("gen_1_digit_addition")
    questions = PrefilledQuestions(tiny_engine, _Parity(base), base.split("test")[:24], batch=8)
    full = questions.answer(FullConfig()).correct
    shallow = questions.answer(D3Config(alpha=0.5, core_head=1, core_tail=1)).correct
    won = sum(1 for a, b in zip(full, shallow) if b and not a)
    lost = sum(1 for a, b in zip(full, shallow) if a and not b)
    m, n = won + lost, len(full)
    assert m >= 3  # the two strategies really disagree on several questions
    d = exact_difference(full, shallow)
    assert (d.won, d.lost, d.n) == (won, lost, n) and d.diff == pytest.approx((won - lost) / n)
    p_low, p_high = (d.low * n / m + 1) / 2, (d.high * n / m + 1) / 2  # back from points to Binomial(m, p)
    if won > 0:
        assert _tail(won, m, p_low, upper=True) == pytest.approx(0.025, abs=1e-6)
    if won < m:
        assert _tail(won, m, p_high, upper=False) == pytest.approx(0.025, abs=1e-6)


def test_the_same_answer_rate_has_an_exact_interval() -> None:
    from d3.research.stats import clopper_pearson, exact_rate

    r = exact_rate([True] * 45 + [False] * 5)
    assert (r.k, r.n, r.rate) == (45, 50, 0.9) and (r.low, r.high) == clopper_pearson(45, 50)
    assert exact_rate([True] * 10).high == 1.0 and exact_rate([True] * 10).low == pytest.approx(0.025 ** 0.1)
    with pytest.raises(ValueError, match="at least one question"):
        exact_rate([])


def test_a_medians_interval_comes_from_order_statistics_with_at_least_95_percent_coverage() -> None:
    from d3.research.stats import median_interval

    assert median_interval(range(1, 9)) == (4.5, 1.0, 8.0, pytest.approx(1 - 2 / 256))  # 8 pairs: min and max
    med, low, high, cov = median_interval(list(range(12, 0, -1)))  # order does not matter
    assert (med, low, high) == (6.5, 3.0, 10.0) and cov == pytest.approx(0.9614, abs=1e-4) and cov >= 0.95
    with pytest.raises(ValueError, match="at least 6 values"):
        median_interval([1.0, 2.0])
