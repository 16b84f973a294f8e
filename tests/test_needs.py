"""The page's "What each token needs" view, its handlers called directly on the tiny model (no server)."""

from __future__ import annotations

import gradio as gr
import pytest

from d3.config import D3Config
from d3.research.oracle_fit import schedule_budgets, underserved_fraction
from d3.schedule import budgets
from explorer.views import needs as view
from tests.apphelpers import NEEDS_CONTROLS as CONTROLS
from tests.figures import message, role

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

MEASURE = {n: i for i, n in enumerate(view.NEEDS_OUTPUTS)}
FIT = {n: i for i, n in enumerate(view.FIT_OUTPUTS)}


@pytest.fixture(scope="module")
def measured(pool):
    return view.measure_needs(pool, None, **CONTROLS)


def test_measure_draws_each_tokens_need_over_d3s_budgets(measured):
    state = measured[MEASURE["needs_state"]]
    fig = measured[MEASURE["needs"]]
    assert len(state.oracle_depth) == 10 and all(2 <= n <= 6 for n in state.oracle_depth)
    budget = budgets(D3Config(alpha=0.9, core_head=1, core_tail=1), 6, 10)
    under = [i for i, (n, b) in enumerate(zip(state.oracle_depth, budget)) if n > b]
    assert list(role(fig, "underserved").x) == under
    assert list(role(fig, "schedule").y) == budget
    assert f"{len(under) / 10:.0%} of them fewer than they need" in measured[MEASURE["needs_note"]]


def test_fit_sets_the_alpha_slider_from_the_measured_needs(pool, measured):
    state = measured[MEASURE["needs_state"]]
    out = view.fit_to_prompt(pool, state, **CONTROLS)
    alpha = out[FIT["alpha"]]
    assert 0.8 <= alpha <= 1.0 and round(alpha * 1000) == pytest.approx(alpha * 1000)
    if alpha > 0.8:  # not clamped: the slider's alpha keeps the 10% limit
        cfg = D3Config(alpha=alpha, core_head=1, core_tail=1)
        assert underserved_fraction([state.oracle_depth], cfg, 6) <= view.COVERAGE_K
    assert out[FIT["needs_state"]] is state  # same prompt and settings: nothing is measured again
    assert list(role(out[FIT["needs"]], "schedule").y) == budgets(D3Config(alpha=alpha, core_head=1, core_tail=1), 6, 10)


def test_fit_recovers_a_known_decay_without_running_the_model(pool, measured):
    key = measured[MEASURE["needs_state"]].key
    controls = {**CONTROLS, "core_head": 1, "core_tail": 1}
    need = tuple(int(x) for x in schedule_budgets(D3Config(alpha=0.85, core_head=1, core_tail=1), 6, 10))
    fake = view.Needs(key, 6, need, need, tuple("abcdefghij"))
    out = view.fit_to_prompt(pool, fake, **controls)
    assert out[FIT["alpha"]] <= 0.85 and underserved_fraction([need], D3Config(alpha=out[FIT["alpha"]], core_head=1,
                                                                                core_tail=1), 6) <= 0.1
    assert out[FIT["needs_state"]] is fake


def test_redraw_follows_the_slider_and_asks_to_measure_again(pool, measured):
    state = measured[MEASURE["needs_state"]]
    fig = view.redraw_needs(pool, state, **{**CONTROLS, "alpha": 0.97})
    assert list(role(fig, "schedule").y) == budgets(D3Config(alpha=0.97, core_head=1, core_tail=1), 6, 10)
    empty = view.redraw_needs(pool, None, **CONTROLS)
    assert "Measure what each token needs" in message(empty)
    changed = view.redraw_needs(pool, state, **{**CONTROLS, "prompt": "another prompt"})
    assert "measure again" in message(changed)


def test_bad_controls_are_a_clear_error(pool):
    with pytest.raises(gr.Error, match="Prompt is empty"):
        view.measure_needs(pool, None, **{**CONTROLS, "prompt": "   "})
    with pytest.raises(gr.Error, match="core"):
        view.fit_to_prompt(pool, None, **{**CONTROLS, "core_head": 5, "core_tail": 5})
