"""explorer/view_handlers.py: what follows from a person's move of the controls (issue 24)."""

from __future__ import annotations

import gradio as gr
import pytest

from d3.config import D3Config, GenerationConfig
from explorer.caps import Caps
from explorer.pool import ModelPool
from explorer.session import Session
from explorer.view_handlers import SETTLE_OUTPUTS, check_release, settle_controls, settle_released


@pytest.fixture()
def pool(tiny_engine) -> ModelPool:
    pool = ModelPool(lambda _: tiny_engine, names=("tiny",), caps=Caps(max_new_tokens=64))
    pool.engine("tiny")
    return pool


def _settled(out: tuple) -> dict:
    return dict(zip(SETTLE_OUTPUTS, out))


def test_a_value_typed_out_of_range_runs_nothing_though_the_browser_clamps_it(pool) -> None:
    """Typed 40 into Core head (6 layers, tail 1: the slider ends at 4): said once with the real range; the release
    as the box loses focus carries the clamped 4, which runs nothing and keeps the message; a later release runs."""
    s = Session()
    typed = _settled(settle_controls(pool, s, model="tiny", core_head=40, core_tail=1, drop_order="middle_out"))
    assert "Core head=40 is out of range" in typed["status"] and "[0, 4]" in typed["status"]
    clamped = dict(model="tiny", core_head=4, core_tail=1, drop_order="middle_out")
    assert _settled(settle_released(pool, s, **clamped))["status"] == gr.skip()  # the message stays
    with pytest.raises(gr.Error):
        check_release(pool, s, **clamped)
    assert check_release(pool, s, **clamped) is None  # the next release of the slider runs


def test_a_core_value_typed_past_its_end_bounds_the_other_slider_by_where_the_browser_clamps_it(pool) -> None:
    """6 layers, head 2: the tail's slider ends at 3. Tail typed 40 is said once; the head's maximum follows the
    tail the browser clamps to (3, so head at most 2), both while typing and as the box loses focus, and the head's
    value is never pushed down (a maximum of 1 would have moved it from 2 to 1)."""
    s = Session()
    controls = dict(model="tiny", core_head=2, drop_order="middle_out")
    settle_controls(pool, s, core_tail=1, **controls)
    typed = _settled(settle_controls(pool, s, core_tail=40, **controls))
    assert "Core tail=40" in typed["status"] and "[0, 3]" in typed["status"]
    for out in (typed, _settled(settle_released(pool, s, core_tail=40, **controls)),
                _settled(settle_released(pool, s, core_tail=3, **controls))):
        assert out["core_head"]["maximum"] == 2 and out["core_tail"]["maximum"] == 3
        assert "value" not in out["core_head"] and "value" not in out["core_tail"]


def test_a_calibrated_order_follows_a_core_move_in_one_line(pool) -> None:
    out = _settled(settle_controls(pool, Session(), model="tiny", core_head=2, core_tail=1, drop_order="calibrated",
                                   layer_order="1, 2, 3, 4"))
    assert out["layer_order"] == "2, 3, 4"
    assert "Calibrated order re-fitted to core 2 + 1" in out["status"] and "Cannot" not in out["status"]
    assert out["core_head"]["maximum"] == 4 and out["core_tail"]["maximum"] == 3


def test_a_model_switch_takes_back_the_note_of_an_order_it_reset(pool) -> None:
    """Issue 24, item 10: "Drop order set to the calibrated order ..." stayed after Gemma 3 and back."""
    from explorer.view_handlers import MODEL_OUTPUTS, model_changed

    out = dict(zip(MODEL_OUTPUTS, model_changed(pool, "tiny", Session())))
    assert out["layers_note"] == ""


def test_a_scenario_sets_the_example_picker_to_its_prompt(pool) -> None:
    """Issue 24: "Example prompt" kept "Explain" after a scenario had put the arithmetic question in the prompt."""
    from explorer.view_handlers import SCENARIO_OUTPUTS, SCENARIO_QUESTION, apply_scenario

    arithmetic = dict(zip(SCENARIO_OUTPUTS, apply_scenario(pool, "full_vs_d3", 0, None, "tiny")))
    assert arithmetic["example"]["value"] == SCENARIO_QUESTION  # issue 35: named, not blank
    fill = dict(zip(SCENARIO_OUTPUTS, apply_scenario(pool, "fill", 0, None, "tiny")))
    assert fill["example"]["value"] == "Explain"  # the sky question is the first example


def test_a_slider_value_out_of_its_range_is_said_and_the_fix_takes_it_back(tiny_engine) -> None:
    import gradio as gr

    from explorer.caps import Caps
    from explorer.live import generate
    from explorer.page import build_demo
    from explorer.session import Session
    from explorer.view_handlers import SETTLE_OUTPUTS, settle_controls

    def check_controls(*args, **kwargs):  # the status line `settle_controls` sets
        return settle_controls(*args, **kwargs)[SETTLE_OUTPUTS.index("status")]

    demo = build_demo(lambda name: tiny_engine, model_names=("tiny",), public=False, caps=Caps(max_new_tokens=64))
    pool, s = demo.pool, Session()
    pool.engine("tiny")
    assert "α (decay rate)=0.5 is out of range: α (decay rate) must be a number in [0.8, 1]" in check_controls(
        pool, s, model="tiny", alpha=0.5)
    assert "Ready" in check_controls(pool, s, model="tiny", alpha=0.8)  # fixed: the message goes at once
    assert check_controls(pool, s, model="tiny", alpha=0.9) == gr.skip()  # nothing to take back: the run's line stays
    with pytest.raises(gr.Error):
        list(generate(pool, s, prompt="hi", model="tiny", max_new_tokens=2.5))
    assert "Ready" in check_controls(pool, s, model="tiny", max_new_tokens=6)  # Generate's message goes too


def test_a_model_switch_forgets_the_other_models_run_and_sizes_both_core_sliders_together(tiny_engine) -> None:
    from explorer.caps import Caps
    from explorer.page import build_demo
    from explorer.runs import side_by_side
    from explorer.session import Session
    from explorer.view_handlers import MODEL_OUTPUTS, model_changed

    demo = build_demo(lambda name: tiny_engine, model_names=("tiny",), public=False, caps=Caps(max_new_tokens=64))
    pool, s = demo.pool, Session()
    pool.engine("tiny")
    *_, last = side_by_side(tiny_engine, "hi", D3Config(alpha=0.9, core_head=1, core_tail=1),
                            GenerationConfig(max_new_tokens=3))
    s.finish(last, "D3")
    out = dict(zip(MODEL_OUTPUTS, model_changed(pool, "tiny", s)))
    assert s.d3 is None and s.full is None and len(s.history) == 1  # forgotten, but kept in the history
    assert "press Generate" in out["status"] and "press Generate" in out["d3_tokens"]
    layers = tiny_engine.num_layers
    head, tail = out["core_head"], out["core_tail"]
    assert head["maximum"] == layers - 1 - tail["value"] and tail["maximum"] == layers - 1 - head["value"]

@pytest.mark.parametrize("field, value, label", [("core_head", 99, "Core head"), ("max_new_tokens", 0, "New tokens"),
                                                 ("drop_order", "bogus", "Drop order")])
def test_a_schedule_that_cannot_be_drawn_names_the_control_as_the_page_labels_it(pool, field, value, label) -> None:
    """The decay curve and the planned grid say why they are empty in the page's words, never a code field
    (issue 24: `max_new_tokens` etc. on the page)."""
    from explorer.view_handlers import redraw_schedule
    from tests.apphelpers import DEFAULTS
    from tests.figures import message

    for fig in redraw_schedule(pool, Session(), **{**DEFAULTS, field: value}):
        text = message(fig)
        assert text.startswith("Cannot draw this schedule") and label in text and field not in text, text

def test_the_same_controls_settled_or_released_again_send_nothing_and_run_nothing(pool) -> None:
    """Issue 24's hang: the browser fired core-head's input about 7 times a second with nothing changed (each answer
    updated the slider, which fired it again), and a slider's release as often, each starting a run. An identical
    repeat is answered with no update and runs nothing; a real move, or controls set anew by a model switch, are
    answered in full."""
    from explorer.view_handlers import model_changed

    s = Session()
    controls = dict(model="tiny", core_head=2, core_tail=1, drop_order="middle_out")
    assert _settled(settle_controls(pool, s, **controls))["core_head"] != gr.skip()
    assert all(out == gr.skip() for out in settle_controls(pool, s, **controls))
    assert all(out == gr.skip() for out in settle_released(pool, s, **controls))
    assert check_release(pool, s, **controls) is None
    with pytest.raises(gr.Error, match="nothing changed"):
        check_release(pool, s, **controls)
    assert _settled(settle_controls(pool, s, **{**controls, "core_tail": 2}))["core_head"]["maximum"] == 3
    model_changed(pool, "tiny", s)
    assert _settled(settle_controls(pool, s, **{**controls, "core_tail": 2}))["core_head"]["maximum"] == 3
    assert check_release(pool, s, **controls) is None


def test_only_the_open_view_is_drawn_and_a_hidden_one_when_its_tab_opens(pool) -> None:
    """Issue 24's hang: every heavy view was sent to the browser at every run end, scenario and model switch, into
    hidden tabs too. On the page's session a run draws the open view; the others are drawn when their tab opens,
    once (an API client's session, with no tab, still gets every view)."""
    import plotly.graph_objects as go

    from explorer.live import GENERATE_OUTPUTS, generate
    from explorer.view_handlers import new_session, open_view

    run = dict(prompt="hello", model="tiny", max_new_tokens=3, drop_order="middle_out", attention_layer=2)
    page = new_session()
    last = dict(zip(GENERATE_OUTPUTS, list(generate(pool, page, **run))[-1]))
    assert isinstance(last["usage"], go.Figure)
    assert all(last[k] == gr.skip() for k in ("stack", "heads", "flow", "errors"))
    stack = open_view(pool, "stack", page, **run)
    assert isinstance(stack, go.Figure) and stack.data
    assert open_view(pool, "stack", page, **run) == gr.skip()  # drawn already: not sent again
    from explorer.view_handlers import redraw_schedule

    decay, planned = redraw_schedule(pool, page, **run)  # the controls moved: the curve, and the grid once shown
    assert isinstance(decay, go.Figure) and planned == gr.skip()
    assert isinstance(open_view(pool, "planned", page, **run), go.Figure)
    api = dict(zip(GENERATE_OUTPUTS, list(generate(pool, Session(), **run))[-1]))
    assert all(isinstance(api[k], go.Figure) for k in ("usage", "stack", "heads", "flow", "errors"))


def test_the_planned_grid_names_the_fill_sources_the_engine_uses_on_gemma3(tiny_gemma) -> None:
    """Issue 35 (code review): the planned grid assumed every layer is full attention; on Gemma 3 a skipped global
    layer copies a global one, so the grid named other sources than the engine. Drawn with the loaded model's layer
    types, its cells and copy sources are the ones a real run records."""
    import re

    import numpy as np

    from explorer.view_handlers import redraw_schedule

    pool = ModelPool(lambda _: tiny_gemma, names=("tiny-gemma",), caps=Caps(max_new_tokens=64))
    pool.engine("tiny-gemma")
    controls = dict(model="tiny-gemma", alpha=0.8, core_head=0, core_tail=1, start=0, drop_order="strided",
                    fill="copy", max_new_tokens=10)
    _, planned = redraw_schedule(pool, None, **controls)
    grid = next(t for t in planned.data if (t.meta or {}).get("role") == "grid")
    hover = np.asarray(grid.text, dtype=object)
    drawn = np.vectorize(lambda h: int(m.group(1)) if (m := re.search(r"copying layer (\d+)", h)) else -1)(hover)
    cfg = D3Config(alpha=0.8, core_head=0, core_tail=1, drop_order="strided", fill="copy")
    trace = tiny_gemma.generate("hello there", cfg, GenerationConfig(max_new_tokens=10, stop_at_eos=False))
    recorded = trace.fill_sources()
    assert (recorded >= 0).any() and len({tuple(r) for r in recorded}) > 1  # real copies, more than one row kind
    np.testing.assert_array_equal(np.asarray(grid.z)[: len(recorded)], trace.grid())
    np.testing.assert_array_equal(drawn[: len(recorded)], recorded)


@pytest.mark.parametrize("kind", ["chat", "arithmetic"])
def test_a_core_reset_gives_back_the_pages_own_order_for_that_kind_of_text(kind) -> None:
    """Issue 35, M2: on a fresh page (the chat prompt, its chat order), Core tail dragged to 7 re-fits the order;
    ↺ (back to 3) gave the arithmetic order, and the default prompt then diverged at token 16 instead of 35. A reset
    gives back the page's own order for the model, the core and the kind of text (the scenarios' arithmetic question
    keeps its own)."""
    from explorer.controls import model_defaults
    from explorer.pool import KNOWN_FACTS
    from explorer.scenarios import ARITHMETIC, EXPLAIN_PROMPT

    pool = ModelPool(lambda _: None, names=("smollm2-135m",), facts=KNOWN_FACTS, caps=Caps(max_new_tokens=64))
    page = model_defaults("smollm2-135m", kind)
    start = dict(prompt=EXPLAIN_PROMPT if kind == "chat" else ARITHMETIC, model="smollm2-135m", core_head=3,
                 core_tail=3, alpha=page.alpha, drop_order="calibrated", layer_order=page.layer_order)
    s = Session()
    settle_controls(pool, s, **start)
    moved = _settled(settle_controls(pool, s, **{**start, "core_tail": 7}))
    assert moved["layer_order"] != page.layer_order
    reset = _settled(settle_controls(pool, s, **{**start, "core_tail": 3, "layer_order": moved["layer_order"]}))
    assert reset["layer_order"] == page.layer_order, reset["status"]
    assert f"{kind} text" in reset["status"]


@pytest.mark.parametrize("key", ["full_vs_d3", "core", "fill", "aggressive"])
def test_the_example_menu_names_the_prompt_a_scenario_set(pool, key) -> None:
    """Issue 35 (ugly list): the Example prompt menu went blank after a scenario (its arithmetic question is no
    example). It names the scenario's prompt, one of its own choices, and picking that gives the prompt back."""
    from explorer.scenarios import SCENARIOS
    from explorer.view_handlers import SCENARIO_OUTPUTS, apply_scenario, prompt_titles, use_example

    if key not in SCENARIOS:
        pytest.skip(f"no scenario {key!r}")
    out = dict(zip(SCENARIO_OUTPUTS, apply_scenario(pool, key, 0, None, "tiny")))
    title = out["example"]["value"]
    assert title in prompt_titles() and use_example(title) == out["prompt"]


def test_a_run_records_every_layer_and_a_click_on_an_overview_cell_opens_that_head(pool) -> None:
    """Issue 35, item 4: every layer's attention is recorded without choosing one before generating (the chosen
    layer is 2); the overview is layers x heads; a click on a cell ("layer,head@stamp") sets the per-head view's
    layer and head, opens its tab and draws it for that layer and head."""
    import numpy as np
    import plotly.graph_objects as go

    from explorer.live import GENERATE_OUTPUTS, generate
    from explorer.views.heads import CELL_OUTPUTS, open_head
    from tests.figures import by_role

    run = dict(prompt="hello", model="tiny", max_new_tokens=5, attention_layer=2)
    session = Session()
    last = dict(zip(GENERATE_OUTPUTS, list(generate(pool, session, **run))[-1]))
    layers, heads = pool.engine("tiny").num_layers, pool.engine("tiny").adapter.num_heads
    assert {k for s in session.full.steps for k in s.attention} == set(range(layers))
    cells = np.asarray(by_role(last["heads"], "attention-divergence")[0].z, dtype=float)
    assert cells.shape == (heads, layers) and np.isfinite(cells[:, 0]).all()
    out = dict(zip(CELL_OUTPUTS, open_head(session, f"4,1@{123}", **run)))
    assert out["attention_layer"] == 4 and out["attention_head"] == 1
    assert out["view_tabs"].selected == "attention"
    assert isinstance(out["attention"], go.Figure) and "layer 4" in str(out["attention"].layout.title.text)
    assert "head 1" in str(out["attention"].layout.title.text)
    with pytest.raises(gr.Error, match="heads_cell"):
        open_head(session, "no cell", **run)


def test_attention_is_recorded_for_every_layer_only_within_its_memory_budget() -> None:
    from explorer.runs import ATTENTION_BUDGET_BYTES, attention_bytes, recorded_attention_layers

    # SmolLM2-135M: 30 layers x 9 heads; 256 tokens after a 1,024-token prompt keep 159 MB, the prefill computes 1.13 GB
    assert attention_bytes(30, 9, 1024, 256) == max(30 * 9 * sum(1024 + t for t in range(256)) * 2, 30 * 9 * 1024**2 * 4)
    assert recorded_attention_layers(30, 9, 64, 256, chosen=7) == tuple(range(30))
    assert recorded_attention_layers(30, 9, 1024, 256, chosen=7) == (7,)
    assert attention_bytes(30, 9, 498, 256) <= ATTENTION_BUDGET_BYTES < attention_bytes(30, 9, 499, 256)


def test_a_release_back_to_the_last_runs_controls_runs_and_the_same_release_again_does_not(pool) -> None:
    """Issue 35, M5 is stopped in the browser (assets/page.js: a click into a slider's box, or in and out, sends no
    release; tests/test_browser_sequences.py). On the server a release that brings the sliders back to the last
    run's controls (a core reset after a value typed past the slider's end) runs them: refusing it left the curve
    drawn for the typed value (the seeded random walk, moves 8-9). The same release twice runs once."""
    from tests.apphelpers import DEFAULTS, run

    s = Session()
    controls = {**DEFAULTS, "model": "tiny", "core_head": 1, "core_tail": 1, "max_new_tokens": 2}
    run(pool, s, **controls)
    assert check_release(pool, s, **controls) is None
    with pytest.raises(gr.Error, match="nothing changed"):
        check_release(pool, s, **controls)
    assert check_release(pool, s, **{**controls, "alpha": 0.95}) is None


def test_choosing_a_model_sets_its_measured_default_new_tokens_within_the_servers_cap() -> None:
    """Each known model starts with its own default new tokens (explorer.controls.PAGE_TOKENS, measured by
    scripts/default_tokens.py), never more than the server allows; a model of no table keeps the page's default."""
    from explorer.caps import Caps
    from explorer.controls import DEFAULTS, PAGE_TOKENS, model_defaults
    from explorer.pool import ModelPool
    from explorer.view_handlers import MODEL_OUTPUTS, model_changed

    assert set(PAGE_TOKENS) == {"smollm2-135m", "gemma3-270m", "qwen2.5-coder-1.5b"}
    assert all(8 <= n <= 64 and n % 8 == 0 for n in PAGE_TOKENS.values())
    assert model_defaults("somewhere/else").max_new_tokens == DEFAULTS.max_new_tokens
    for cap in (256, 16):
        pool = ModelPool(caps=Caps(max_new_tokens=cap))  # the real table of facts: answers without loading
        for model, tokens in PAGE_TOKENS.items():
            assert model_defaults(model).max_new_tokens == tokens
            out = dict(zip(MODEL_OUTPUTS, model_changed(pool, model, Session())))
            assert out["max_new_tokens"] == min(tokens, cap)
