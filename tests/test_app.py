"""The page's handlers called directly (no server): streaming, validation, stop, sessions, views, export."""

from __future__ import annotations

import json
import re
from pathlib import Path

import gradio as gr
import numpy as np
import pandas as pd
import pytest

import app
from d3.config import D3Config
from d3.models import ModelFacts
from d3.schedule import budgets, planned_grid
from d3.trace import Trace
from explorer import export, live, page, view_handlers
from explorer.caps import Caps
from explorer.controls import REDRAW_NAMES
from explorer.pool import ModelPool
from explorer.session import Session
from tests.apphelpers import DEFAULTS, OUT, is_skip, last_value, run, tiny_factory
from tests.figures import message

pytestmark = [pytest.mark.usefixtures("exports_in_tmp"), pytest.mark.filterwarnings("ignore::DeprecationWarning")]



def token_spans(pane: str) -> int:
    """Token <span>s in a pane's HTML (class "d3-tok", plus " d3-diff" where it differs)."""
    return len(re.findall(r'class="d3-tok[ "]', str(pane)))


def schedule_args(**overrides) -> dict:
    names = REDRAW_NAMES
    return {k: v for k, v in {**DEFAULTS, **overrides}.items() if k in names}


# ---------------------------------------------------------------- generation


def test_generate_streams_both_panes_then_fills_every_view(pool, unpaced) -> None:
    session = Session()
    outputs = run(pool, session)
    counts = [token_spans(o[OUT["d3_tokens"]]) for o in outputs if token_spans(o[OUT["d3_tokens"]])]
    assert len(counts) >= 5  # the pane grows token by token
    assert counts == sorted(counts) and counts[-1] == len(session.d3.steps)
    assert token_spans(last_value(outputs, "full_tokens")) == len(session.full.steps)
    assert "Done." in last_value(outputs, "status")
    usage = last_value(outputs, "usage")
    assert np.array_equal(np.asarray(usage.data[0].z), session.d3.grid())
    decay = last_value(outputs, "decay")
    used = [t for t in decay.data if (t.meta or {}).get("role") == "actual"][0]
    assert list(used.y) == list(session.d3.layers_used)
    errors = last_value(outputs, "errors")
    kl = [t for t in errors.data if t.name and "KL teacher" in t.name][0]
    assert np.allclose(np.asarray(kl.y, dtype=float), session.comparison.kl_teacher)
    flow = last_value(outputs, "flow")
    assert any((t.meta or {}).get("role") == "flow" for t in flow.data)
    attention = last_value(outputs, "attention")
    assert any((t.meta or {}).get("role") == "attention" for t in attention.data)
    history = last_value(outputs, "history")
    assert isinstance(history, pd.DataFrame) and len(history) == 1


def test_generate_throttles_heavy_figures(pool, unpaced) -> None:
    outputs = run(pool, max_new_tokens=17)
    streaming = outputs[2:-2]
    drawn = [o for o in streaming if not is_skip(o[OUT["usage"]])]
    assert 0 < len(drawn) < len(streaming) / 4  # every few tokens, not every token
    assert all(not is_skip(o[OUT["d3_counters"]]) for o in streaming)


@pytest.mark.parametrize("overrides, message", [
    ({"prompt": ""}, "prompt is empty"),
    ({"prompt": " \n\t\x00"}, "prompt is empty"),
    ({"prompt": "a" * 9000}, "limit is 8,000 characters"),
    ({"alpha": 0}, r"alpha must be a number in \(0, 1\]"),
    ({"alpha": "fast"}, "alpha='fast' is not a number"),
    ({"core_head": 5, "core_tail": 4}, "at most 5: the model's 6 layers less one flex layer"),
    ({"max_new_tokens": -3}, r"max_new_tokens must be an integer in \[1, 64\]"),
    ({"max_new_tokens": 10**9}, "max_new_tokens"),
    ({"max_new_tokens": None}, "max_new_tokens is missing"),
    ({"strategy": "magic"}, "strategy must be one of"),
    ({"fill": "glue"}, "fill must be one of default, copy, propagate, none"),
    ({"model": "no-such-model"}, "unknown model|not allowed"),
    ({"attention_layer": 6}, r"attention_layer must be an integer in \[0, 5\]"),
])
def test_bad_input_is_a_clear_gr_error(pool, overrides, message) -> None:
    with pytest.raises(gr.Error, match=message):
        run(pool, **overrides)


def test_the_app_keeps_working_after_bad_input(pool) -> None:
    session = Session()
    for bad in ({"prompt": ""}, {"alpha": 9}, {"model": "nope"}):
        with pytest.raises(gr.Error):
            run(pool, session, **bad)
    assert "Done." in last_value(run(pool, session, max_new_tokens=3), "status")


def test_unknown_model_reaches_neither_loader_nor_file_system_when_public(tiny_engine) -> None:
    calls = []
    pool = ModelPool(lambda name: calls.append(name) or tiny_engine, names=("tiny",), public=True)
    calls.clear()
    with pytest.raises(gr.Error, match="not allowed here"):
        run(pool, model="/etc/passwd")
    assert calls == []


def test_first_use_says_the_model_is_loading_and_mistakes_never_load_it(tiny_engine) -> None:
    calls = []
    factory = tiny_factory(tiny_engine)
    pool = ModelPool(lambda name: calls.append(name) or factory(name), names=("tiny",),
                     facts={"tiny": ModelFacts(num_layers=6, num_heads=4, chat_template=True)})
    with pytest.raises(gr.Error, match="alpha"):
        run(pool, alpha=2)
    assert calls == []
    stream = live.generate(pool, Session(), **{**DEFAULTS, "max_new_tokens": 2})
    assert "Loading the model" in next(stream)[OUT["status"]] and calls == []
    rest = list(stream)
    assert calls == ["tiny"] and "Done." in rest[-1][OUT["status"]]


def test_a_crash_inside_is_a_plain_message_not_a_stack_trace(pool, monkeypatch) -> None:
    monkeypatch.setattr(live, "side_by_side", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("boom")))
    with pytest.raises(gr.Error) as err:
        run(pool)
    assert "Something went wrong" in str(err.value) and "boom" not in str(err.value)


def test_stop_ends_the_run_within_one_token(pool, unpaced) -> None:
    session = Session()
    stream = live.generate(pool, session, **{**DEFAULTS, "max_new_tokens": 30})
    outputs = []
    for out in stream:
        outputs.append(out)
        if session.d3 is not None and len(session.d3.steps) == 3:
            live.stop(session)
    assert "Stopped." in last_value(outputs, "status")
    assert len(session.d3.steps) <= 4 and session.comparison is None
    assert len(session.history) == 1  # a stopped run is still in the history


def test_a_new_run_supersedes_the_running_one(pool) -> None:
    session = Session()
    first = live.generate(pool, session, **{**DEFAULTS, "max_new_tokens": 30})
    for _ in range(4):
        next(first)
    second = live.generate(pool, session, **{**DEFAULTS, "prompt": "second", "max_new_tokens": 3})
    next(second)
    assert list(first) == []  # the first run returns quietly ...
    rest = list(second)
    assert "Done." in rest[-1][OUT["status"]]
    assert session.d3.prompt == "second"  # ... and never overwrote the second run's traces


def test_two_sessions_never_see_each_others_runs(pool) -> None:
    a, b = Session(), Session()
    stream_a = live.generate(pool, a, **{**DEFAULTS, "prompt": "apples"})
    stream_b = live.generate(pool, b, **{**DEFAULTS, "prompt": "bananas", "alpha": 0.95})
    outputs_a, outputs_b = [], []
    for out_a, out_b in zip(stream_a, stream_b):  # interleaved, as two people generating at once
        outputs_a.append(out_a)
        outputs_b.append(out_b)
    outputs_a += list(stream_a)
    outputs_b += list(stream_b)
    assert a.d3.prompt == "apples" and b.d3.prompt == "bananas"
    assert a.d3.strategy["alpha"] == 0.9 and b.d3.strategy["alpha"] == 0.95
    assert len(a.history) == len(b.history) == 1
    assert all(o[OUT["session"]] is a for o in outputs_a if not is_skip(o[OUT["session"]]))


def test_every_strategy_runs_against_full_depth(pool) -> None:
    for strategy in ("skipdecode", "unified", "early_exit"):
        session = Session()
        run(pool, session, strategy=strategy, max_new_tokens=4)
        assert session.d3.strategy_name == strategy and session.comparison is not None


# ---------------------------------------------------------------- views without the model


def test_redraw_schedule_draws_the_plan_without_running_the_model(pool, tiny_engine, monkeypatch) -> None:
    monkeypatch.setattr(type(tiny_engine), "run", lambda *a, **k: pytest.fail("the model must not run"))
    decay, planned = view_handlers.redraw_schedule(pool, None, **schedule_args(alpha=0.8, max_new_tokens=32))
    cfg = D3Config(alpha=0.8, core_head=1, core_tail=1)
    line = [t for t in decay.data if (t.meta or {}).get("role") == "planned"][0]
    assert list(line.y) == budgets(cfg, 6, 32)
    assert np.array_equal(np.asarray(planned.data[0].z) == 1, np.array(planned_grid(cfg, 6, 32)))


def test_redraw_schedule_shows_a_bad_combination_instead_of_failing(pool) -> None:
    pool.engine("tiny")  # loaded, as after a first run: the schedule is drawn for its layers
    decay, planned = view_handlers.redraw_schedule(pool, None, **schedule_args(core_head=4, core_tail=4))
    assert "Core head + Core tail" in message(decay) and not decay.data and "core_head" not in message(decay)


def attention(session, **controls):
    """The one-head attention view render_attention draws (it draws the all-heads view beside it)."""
    return view_handlers.render_attention(session, **controls)[view_handlers.ATTENTION_OUTPUTS.index("attention")]


def test_attention_view_follows_the_recorded_layer(finished) -> None:
    fig = attention(finished, attention_layer=3, attention_head=1)  # layer 3 was recorded
    heat = [t for t in fig.data if (t.meta or {}).get("role") == "attention"]
    assert len(heat) == 2  # full depth and D3 side by side
    other = attention(finished, attention_layer=4, attention_head=0)  # the page records every layer that fits
    assert len([t for t in other.data if (t.meta or {}).get("role") == "attention"]) == 2


def test_view_settings_that_make_no_sense_are_explained_not_raised(finished) -> None:
    fig = attention(finished, attention_layer=3, attention_head=99)
    assert not fig.data and "Head 99 does not exist" in message(fig)
    junk = attention(finished, attention_layer=float("inf"), attention_head="x")  # junk falls back to layer 0, head 0 ...
    assert any("head 0 of layer 0" in (t.hovertemplate or "") for t in junk.data)
    from explorer.views.flow import render_flow

    assert render_flow(finished, metric="nonsense", presentation=None).data  # ... or to the default measure


def test_presentation_mode_enlarges_fonts_and_hides_explanations(finished) -> None:
    small = view_handlers.set_presentation(finished, attention_layer=3, presentation=False)
    big = view_handlers.set_presentation(finished, attention_layer=3, presentation=True)
    index = {name: i for i, name in enumerate(view_handlers.VIEW_OUTPUTS)}
    assert big[index["usage"]].layout.font.size > small[index["usage"]].layout.font.size
    assert big[index["explain_usage"]]["visible"] is False and "d3-present" in big[index["root"]]["elem_classes"]


def test_compare_fills_yields_one_comparison_per_fill(pool) -> None:
    session = Session()
    args = {k: v for k, v in DEFAULTS.items() if k not in ("attention_head", "metric", "log_kl")}
    outputs = list(live.compare_fills(pool, session, **{**args, "drop_order": "strided", "max_new_tokens": 4}))
    assert list(session.fills) == ["copy", "propagate", "none"]
    fig = outputs[-1][2]
    agreement = [t for t in fig.data if (t.meta or {}).get("role") == "agreement"]
    assert [t.x[0] for t in agreement] == ["copy", "propagate", "none"]
    assert "done" in outputs[-1][1]


def test_scenarios_set_the_controls(pool) -> None:
    index = {name: i for i, name in enumerate(view_handlers.SCENARIO_OUTPUTS)}
    session = Session()
    view_handlers.apply_scenario(pool, "core", 0, session, "tiny")
    session.end(session.begin())  # its first run, then its second run's controls
    values = view_handlers.apply_scenario(pool, "core", 1, session, "tiny")
    head, tail = values[index["core_head"]], values[index["core_tail"]]
    assert (head["value"], tail["value"]) == (0, 0) and head["maximum"] == tail["maximum"] == 5  # both bounds set
    assert "Run 2 of 2" in values[index["scenario_text"]]
    fill = view_handlers.apply_scenario(pool, "fill", 0, None, "tiny")
    assert (fill[index["drop_order"]], fill[index["fill"]]) == ("strided", "none")


def test_model_change_resizes_the_layer_controls(pool) -> None:
    pool.engine("tiny")  # loaded: sized at once (else the change says it is loading and leaves that to load_model)
    head, tail, layer, attention_head, chat = view_handlers.model_changed(pool, "tiny")[:5]
    assert head["maximum"] + tail["value"] == 5 and tail["maximum"] + head["value"] == 5  # head + tail < 6 layers
    assert layer["maximum"] == 5 and attention_head["maximum"] == 3 and chat["value"]
    refused = view_handlers.model_changed(ModelPool(public=True), "../../etc")  # said in the status, not a 500
    status = refused[view_handlers.MODEL_OUTPUTS.index("status")]
    assert "not allowed" in status and "Cannot run" in status


def test_a_persons_core_move_bounds_the_other_slider_from_the_one_state(pool) -> None:
    """The core sliders' maxima follow from the controls (head + tail below the 6 layers), set by
    `settle_controls` on a person's move, and a head typed past its own maximum is said with the real range."""
    pool.engine("tiny")
    out = dict(zip(view_handlers.SETTLE_OUTPUTS, view_handlers.settle_controls(
        pool, None, model="tiny", core_head=2, core_tail=1, drop_order="middle_out")))
    assert out["core_head"]["maximum"] == 4 and out["core_tail"]["maximum"] == 3
    out = dict(zip(view_handlers.SETTLE_OUTPUTS, view_handlers.settle_controls(
        pool, None, model="tiny", core_head=40, core_tail=1, drop_order="middle_out")))
    assert out["core_tail"]["maximum"] == 1  # 40 counts as 5, the top layer
    assert "Core head=40 is out of range" in out["status"] and "[0, 4]" in out["status"]


def _applied(update: dict) -> gr.Slider:
    """A slider after `update`, built the way Gradio applies an update (it raises for a range it refuses)."""
    slider = gr.Slider(**{k: v for k, v in update.items() if k not in ("__type__", "value")}, render=False)
    assert 0 <= update["value"] <= slider.maximum
    return slider


SMALL_MODELS = {"one-head": dict(num_layers=3, num_attention_heads=1, num_key_value_heads=1),
                "one-layer": dict(num_layers=1), "two-layers": dict(num_layers=2, num_key_value_heads=1)}


@pytest.mark.parametrize("name", SMALL_MODELS)
def test_every_slider_takes_a_model_with_one_head_or_one_or_two_layers(name, tiny_tok) -> None:
    """A slider whose only value is 0 would need maximum 0, which Gradio refuses: it goes to 1 and cannot move.
    The model change, the core sliders bounding each other, a link sized to the model, a page built for it and
    a run all take such a model."""
    from d3.engine import Engine
    from explorer import share
    from tests.tiny import tiny_llama

    spec = SMALL_MODELS[name]
    engine = Engine(tiny_llama(**spec), tiny_tok, name=name)
    small = ModelPool(lambda _: engine, names=(name,), caps=Caps(max_new_tokens=8))
    layers, heads = spec["num_layers"], spec.get("num_attention_heads", 4)
    head, tail, layer, attention_head = view_handlers.load_model(small, name)[:4]
    sliders = {n: _applied(u) for n, u in zip(("head", "tail", "layer", "attention_head"),
                                             (head, tail, layer, attention_head))}
    assert sliders["attention_head"].interactive is (heads > 1) and sliders["layer"].interactive is (layers > 1)
    assert head["value"] + tail["value"] < layers  # the default core leaves a layer to skip
    assert all(u["maximum"] >= 1 for u in (head, tail, layer, attention_head))
    settled = dict(zip(view_handlers.SETTLE_OUTPUTS, view_handlers.settle_controls(
        small, None, model=name, core_head=head["value"], core_tail=tail["value"], drop_order="middle_out")))
    for key in ("core_head", "core_tail"):  # each bounds the other
        _applied({**settled[key], "value": 0})
    linked = share.sized_to_model(small, {"model": name})
    for key in ("core_head", "core_tail", "attention_layer", "attention_head"):
        _applied(linked[key])
    page.build_demo(lambda _: engine, model_names=(name,), public=False, caps=Caps(max_new_tokens=8))
    controls = {**DEFAULTS, "model": name, "core_head": head["value"], "core_tail": tail["value"],
                "attention_layer": layer["value"], "max_new_tokens": 4}
    assert "Done." in last_value(run(small, Session(), **controls), "status")


def test_the_server_log_shows_each_warning_once(monkeypatch) -> None:
    """A library's deprecation warning inside every decoding step, with filters changed between steps (as
    libraries on the page's path do): Python's "default" shows it each time; the server shows it once."""
    import warnings

    shown: list[str] = []
    monkeypatch.setattr(warnings, "showwarning", lambda message, category, *args, **kwargs: shown.append(str(message)))
    with warnings.catch_warnings():
        warnings.simplefilter("default")  # Python's own action, outside pytest
        page.show_warnings_once()
        page.show_warnings_once()  # launching twice does not wrap twice
        for _ in range(3):
            warnings.warn("`past_key_values` is deprecated (a test)", FutureWarning, stacklevel=1)
            with warnings.catch_warnings():
                pass
        warnings.warn("another warning (a test)", UserWarning, stacklevel=1)
    assert shown == ["`past_key_values` is deprecated (a test)", "another warning (a test)"]


def test_use_example_fills_the_prompt() -> None:
    assert view_handlers.use_example("Fact").startswith("What is the capital of France")
    with pytest.raises(gr.Error, match="example"):
        view_handlers.use_example("rm -rf /")


# ---------------------------------------------------------------- export


def test_export_trace_writes_json_and_csv_under_server_chosen_names(finished) -> None:
    session = finished
    paths = [Path(p) for p in export.export_trace(session)]
    assert [p.name for p in paths] == ["d3_trace.json", "full_trace.json", "comparison.json", "traces.csv"]
    assert all(export.EXPORT_ROOT in p.parents for p in paths)
    again = Trace.from_json(paths[0].read_text())
    assert again.token_ids == session.d3.token_ids and list(again.layers_used) == list(session.d3.layers_used)
    assert json.loads(paths[2].read_text())["summary"]["tokens"] == len(session.d3.steps)
    table = pd.read_csv(paths[3])
    assert len(table) == 6 * (len(session.d3.steps) + len(session.full.steps))
    assert set(table["run"]) == {"d3", "full"}
    with pytest.raises(gr.Error, match="Nothing to export"):
        export.export_trace(Session())


def measured(pool, figure: str, args: dict) -> dict:
    """The state argument of a view that draws its own measurement (needs, layers), measured on the tiny model."""
    from explorer.views import layers as layers_view
    from explorer.views import needs

    if figure == "needs":
        return {"needs_state": needs.measure_needs(pool, None, prompt=DEFAULTS["prompt"], **args)[0]}
    if figure == "layers":
        return {"layers_state": layers_view.measure_layers(pool, None, prompt=DEFAULTS["prompt"], **args)[0]}
    return {}


def test_export_refuses_a_figure_that_is_no_view(pool, finished) -> None:
    """Export answers for the views the page has (each one: the parametrized test below) and refuses any other name
    in one line naming what is allowed."""
    with pytest.raises(gr.Error, match=r"figure='nope' is not allowed: figure must be one of decay, "):
        export.export_figure(pool, finished, "nope", **{k: v for k, v in DEFAULTS.items() if k != "prompt"})


@pytest.mark.parametrize("figure", export.FIGURES)
def test_export_figure_is_a_standalone_html_page(pool, finished, figure, monkeypatch) -> None:
    from collections import deque

    monkeypatch.setattr(export, "_SERVER_EXPORTS", deque())  # each view's exports counted afresh (the server's rate)
    session = Session(d3=finished.d3, full=finished.full, comparison=finished.comparison)  # and the session's
    args = {k: v for k, v in DEFAULTS.items() if k != "prompt"}
    if figure == "fills":  # never computed for this session: the export says so rather than export a placeholder
        with pytest.raises(gr.Error, match="Nothing to export yet: press “Compare fills”"):
            export.export_figure(pool, session, figure, **args)
        session = Session(d3=finished.d3, full=finished.full, fills={"copy": finished.comparison})
    if figure in ("lens", "scrub"):  # a run stopped before its first token has no lens or token to export
        with pytest.raises(gr.Error, match="Nothing to export yet: press Generate first"):
            export.export_figure(pool, Session(d3=finished.d3.with_steps([]), full=finished.full), figure, **args)
    if figure in ("needs", "layers"):  # drawn from their own measurement: none yet, the export says what to press
        with pytest.raises(gr.Error, match="Nothing to export yet: press “Measure"):
            export.export_figure(pool, session, figure, **args)
    *pages, script = map(Path, export.export_figure(pool, session, figure, **measured(pool, figure, args), **args))
    assert [p.name for p in pages] == (["scrub.html", "scrub_topk.html"] if figure == "scrub" else [f"{figure}.html"])
    for path in pages:
        text = path.read_text()
        assert "<html>" in text and "Plotly" in text
        assert "Press Generate" not in text and "Nothing to" not in text and "Press “Measure" not in text
        assert 'src="plotly.min.js"' in text
    assert script == export.EXPORT_ROOT / "plotly.min.js"


def test_export_figure_refuses_unknown_names(pool) -> None:
    args = {k: v for k, v in DEFAULTS.items() if k != "prompt"}
    with pytest.raises(gr.Error, match="figure"):
        export.export_figure(pool, Session(), "../../etc/passwd", **args)


# ---------------------------------------------------------------- the page itself


def test_import_does_not_load_a_model() -> None:
    assert not any(app.demo.pool.is_loaded(name) for name in app.demo.pool.names)


def test_every_event_has_an_api_name() -> None:
    fns = app.demo.fns.values() if isinstance(app.demo.fns, dict) else app.demo.fns
    named = [fn for fn in fns if fn.fn is not None]
    assert len(named) > 20 and all(fn.api_name for fn in named)
    names = {fn.api_name for fn in named}
    assert {"generate", "stop", "redraw_schedule", "compare_fills", "export_trace", "export_figure"} <= names


def test_public_page_offers_only_the_known_models(tiny_engine) -> None:
    demo = page.build_demo(lambda name: tiny_engine, public=True, model_names=("tiny",))
    dropdowns = [b for b in demo.blocks.values() if isinstance(b, gr.Dropdown) and b.label == "Model"]
    assert len(dropdowns) == 1 and dropdowns[0].allow_custom_value is False
    assert [c[1] for c in dropdowns[0].choices] == ["tiny"]


@pytest.mark.integration
def test_generate_on_the_embedded_model() -> None:
    pool = ModelPool(caps=Caps(max_new_tokens=16))
    session = Session()
    outputs = list(live.generate(pool, session, **{**DEFAULTS, "model": "smollm2-135m", "core_head": 3,
                                                   "core_tail": 3, "attention_layer": 15, "max_new_tokens": 12,
                                                   "alpha": 0.95}))
    assert "Done." in last_value(outputs, "status")
    assert session.d3.num_layers == 30 and session.d3.layers_used[0] == 30
    assert session.d3.layers_used[-1] < 30 and session.comparison is not None
    assert session.full.text.strip()
