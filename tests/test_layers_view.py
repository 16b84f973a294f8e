"""explorer/views/layers.py: the page's "Which layers matter" view and the calibrated drop-order control, handlers
called on the tiny model."""

from __future__ import annotations

import gradio as gr
import pytest

from d3.config import D3Config
from d3.schedule import flex_drop_order, plan
from explorer.caps import Caps
from explorer.controls import DEFAULTS, parse_strategy
from explorer.views import layers as view
from tests.apphelpers import NEEDS_CONTROLS as CONTROLS  # the same controls as test_needs
from tests.figures import message, role

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

OUT = {n: i for i, n in enumerate(view.LAYERS_OUTPUTS)}
USE = {n: i for i, n in enumerate(view.USE_OUTPUTS)}


@pytest.fixture(scope="module")
def measured(pool):
    return view.measure_layers(pool, None, **CONTROLS)


def test_measure_draws_single_drops_and_both_removal_curves(measured):
    state, fig = measured[OUT["layers_state"]], measured[OUT["layers"]]
    cal = state.calibration
    assert sorted(cal.order) == [1, 2, 3, 4] and set(cal.single) == {1, 2, 3, 4}
    bars = role(fig, "single")
    assert list(bars.x) == [1, 2, 3, 4] and [round(y, 6) for y in bars.y] == [round(100 * cal.single[x], 6) for x in (1, 2, 3, 4)]
    assert list(bars.text) == [f"#{cal.order.index(x) + 1}" for x in (1, 2, 3, 4)]  # the calibrated rank on each bar
    curve = role(fig, "curve")
    assert list(curve.y)[0] == 100 * cal.full and len(curve.y) == len(cal.curve) + 1
    in_use = role(fig, "in-use-curve")  # middle-out's removal curve beside it
    assert state.in_use == flex_drop_order(6, 1, 1, "middle_out") and len(in_use.y) == len(cal.curve) + 1
    assert max(cal.curve[0], 0) >= state.in_use_curve[0] - 1e-9  # greedy's first drop is the best single drop
    assert "spares best" in measured[OUT["layers_note"]]
    assert cal.steps == 4 and "time limit" not in measured[OUT["layers_note"]]  # all 4 flex layers greedily, in time


def test_a_measurement_fits_its_greedy_steps_to_the_time_limit_and_says_so(pool, monkeypatch):
    """On a slow model 8 greedy steps outlast the server's limit: the view runs as many as fit (here none but the
    first: a budget of 0 s) and says so, instead of stopping with nothing drawn."""
    monkeypatch.setattr(view, "LAYERS_BUDGET", 0.0)
    out = view.measure_layers(pool, None, **CONTROLS)
    cal = out[OUT["layers_state"]].calibration
    assert cal.steps == 1 and len(cal.curve) == 1 and sorted(cal.order) == [1, 2, 3, 4]  # the rest by single drop
    assert "1 greedy step of 4 fit the server" in out[OUT["layers_note"]]


def test_use_this_order_sets_the_calibrated_order_and_the_schedule_follows(pool, measured):
    state = measured[OUT["layers_state"]]
    out = view.use_this_order(pool, state, **CONTROLS)
    assert out[USE["drop_order"]] == "calibrated"
    text = out[USE["layer_order"]]
    assert tuple(int(x) for x in text.split(",")) == state.calibration.order
    cfg = parse_strategy(DEFAULTS.with_(**{**CONTROLS, "drop_order": "calibrated", "layer_order": text}), 6, pool.caps)
    assert isinstance(cfg, D3Config) and cfg.layer_order == state.calibration.order
    first_dropped = state.calibration.order[0]
    budget_5 = next(i for i in range(1, 20) if len(plan(cfg, 6, i).run) == 5)
    assert first_dropped not in plan(cfg, 6, budget_5).run  # the planned grid drops the calibrated layer first
    redrawn = view.redraw_layers(pool, state, **{**CONTROLS, "drop_order": "calibrated", "layer_order": text})
    assert tuple(redrawn.data[0].x) == (1, 2, 3, 4)


def test_use_before_measuring_or_after_a_change_is_a_clear_error(pool, measured):
    with pytest.raises(gr.Error, match="measure first"):
        view.use_this_order(pool, None, **CONTROLS)
    with pytest.raises(gr.Error, match="measure again"):
        view.use_this_order(pool, measured[OUT["layers_state"]], **{**CONTROLS, "prompt": "another"})
    assert "measure again" in message(view.redraw_layers(pool, measured[OUT["layers_state"]], **{**CONTROLS, "core_head": 2}))
    assert "Measure which layers matter" in message(view.redraw_layers(pool, None, **CONTROLS))


@pytest.mark.parametrize("order, words", [("", "type the flex layers"), ("1, 2, x", "type the flex layers"),
                                           ("1, 1, 2, 3, 4", "not a permutation")])
def test_a_typed_order_is_checked_with_a_plain_message(pool, order, words):
    c = DEFAULTS.with_(**{**CONTROLS, "drop_order": "calibrated", "layer_order": order})
    with pytest.raises(ValueError, match=words.replace("[", "\\[").replace("]", "\\]")):
        parse_strategy(c, 6, pool.caps)


@pytest.mark.parametrize("order, fitted", [("1, 2, 3", (1, 2, 3, 4)), ("1, 2, 3, 4, 9", (1, 2, 3, 4)),
                                           ("4, 3", (4, 3, 2, 1))])
def test_an_order_of_distinct_layers_follows_the_core(pool, order, fitted):
    """No dead end (issue 24): an order of distinct layers that is not the core's flex layers (calibrated for another
    core, or typed short) is re-fitted to them, its own layers first in its order, then the others (the page says so
    in one line and shows the order it will run)."""
    c = DEFAULTS.with_(**{**CONTROLS, "drop_order": "calibrated", "layer_order": order})
    assert parse_strategy(c, 6, pool.caps).layer_order == fitted


def test_qwen_runs_its_chat_order_on_chat_text_and_the_studys_order_on_arithmetic():
    """Qwen2.5-Coder's chat order ships (it kept full depth's chat text longer than middle-out, docs/models.md), and
    the drop-order study's calibrated order on arithmetic (it kept 120 of 120 answers at 26 of 28 layers): each kind
    of text gets its own, a permutation of the 22 flex layers of 28 with core 3 + 3."""
    from d3.orders import CHAT_ORDERS, MEASURED
    from explorer.controls import model_defaults, parse_layer_order

    qwen = "qwen2.5-coder-1.5b"
    for kind, orders in (("chat", CHAT_ORDERS), ("arithmetic", MEASURED)):
        page = model_defaults(qwen, kind)
        assert page.drop_order == "calibrated" and page.alpha == 0.99
        assert parse_layer_order(page.layer_order, 28) == orders[qwen][(3, 3)]
        assert sorted(orders[qwen][(3, 3)]) == list(range(3, 25))  # each flex layer of 28 with core 3 + 3, once
    assert CHAT_ORDERS[qwen][(3, 3)] != MEASURED[qwen][(3, 3)]


@pytest.mark.parametrize("model", ["smollm2-135m", "gemma3-270m", "qwen2.5-coder-1.5b"])
def test_each_embedded_model_starts_on_its_measured_order(model):
    """The page's setting for an embedded model parses for that model (its order a permutation of its flex layers),
    and a switch to the model sets it."""
    from d3.models import KNOWN_MODELS
    from explorer import view_handlers
    from explorer.controls import PAGE_MODELS, model_defaults

    facts = KNOWN_MODELS[model].facts
    page = model_defaults(model)
    cfg = parse_strategy(page.with_(model=model), facts.num_layers, Caps())
    assert cfg.drop_order == "calibrated" and cfg.alpha == PAGE_MODELS[model][0] < 1
    sized = view_handlers._sized(facts, model)
    assert (sized["drop_order"], sized["layer_order"], sized["alpha"]) == (page.drop_order, page.layer_order, page.alpha)
    assert model_defaults("some/local-dir").drop_order == DEFAULTS.drop_order == "middle_out"  # others: the engine's


def test_a_measurement_on_fewer_tokens_than_asked_says_why(pool, monkeypatch):
    """Issue 44: on the 28-layer model the view measured 32 tokens where the box said 64, without saying why."""
    monkeypatch.setattr(view, "LAYERS_TOKENS", 2)
    out = view.measure_layers(pool, None, **{**CONTROLS, "max_new_tokens": 4})
    note = out[OUT["layers_note"]]
    assert "the first 2 of the 4 tokens asked" in note and "at most 2 to stay within the server" in note
