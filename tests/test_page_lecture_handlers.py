"""Issue 17, "The page in a lecture hall", below the browser: handler and figure checks, tiny random models."""

from __future__ import annotations

import numpy as np
import pytest

from d3.config import D3Config, GenerationConfig, TraceConfig
from d3.schedule import plan
from explorer.controls import DEFAULTS, default_attention_layer
from tests.figures import title_text
from viz.attention import SKIPPED_FILL, attention_map, key_labels

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"), pytest.mark.filterwarnings("ignore::UserWarning")]


def by_role(fig, role: str):
    return [t for t in fig.data if (t.meta or {}).get("role") == role]


# ---------------------------------------------------------------- 1: attention view


@pytest.mark.parametrize("layers", [30, 18])  # SmolLM2-135M and Gemma 3 270M
def test_the_default_attention_layer_runs_for_most_default_d3_tokens_and_is_dropped_later(layers) -> None:
    layer = default_attention_layer(layers)
    cfg = D3Config(alpha=DEFAULTS.alpha)
    ran = [layer in plan(cfg, layers, i).run for i in range(DEFAULTS.max_new_tokens)]
    assert 0.6 <= np.mean(ran) < 1  # most rows show the head at work, the last ones are grey
    assert ran[0]  # not the first layer the schedule drops (skipped from token 1: a blank panel)


def test_rows_of_tokens_that_skipped_the_layer_are_filled_grey(tiny_engine) -> None:
    cfg = D3Config(alpha=0.93, core_head=1, core_tail=1)
    trace = tiny_engine.generate("the cat sat", cfg, GenerationConfig(max_new_tokens=12, stop_at_eos=False),
                                 TraceConfig(attention_layers=(1,)))
    skipped = [t for t, s in enumerate(trace.steps) if 1 not in s.layers_run]
    assert skipped and len(skipped) < len(trace.steps)
    grey = by_role(attention_map(trace, 1, 0), "skipped-rows")
    assert len(grey) == 1 and grey[0].colorscale[0][1] == SKIPPED_FILL
    z = np.asarray(grey[0].z, dtype=float)
    assert [t for t in range(len(z)) if np.isfinite(z[t]).all()] == skipped  # whole rows, exactly the skipped ones


# ---------------------------------------------------------------- 8: labels


def test_prompt_keys_read_like_generated_ones(tiny_engine) -> None:
    trace = tiny_engine.generate("the cat sat", D3Config(alpha=0.9, core_head=1, core_tail=1),
                                 GenerationConfig(max_new_tokens=3), TraceConfig(attention_layers=(0,)))
    trace = trace.__class__(**{**trace.__dict__, "prompt_stats": trace.prompt_stats.__class__(
        tokens=("Ġthe", "Ġcat", "Ċ"), stats={}, attention={})})
    assert key_labels(trace, 3, 3) == ["␣the", "␣cat", "⏎"]
    fig = attention_map(trace, 0, 0)
    assert fig.layout.xaxis.title.text == "key position"  # short: two panels' titles side by side do not collide


# ---------------------------------------------------------------- 4: typed values


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


# ---------------------------------------------------------------- 6: switching models


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


# ---------------------------------------------------------------- 2: errors and fills under a nested order


def comparison(engine, order: str, fill: str = "copy"):
    from d3.compare import compare

    return compare(engine, "the cat sat on", D3Config(alpha=0.85, core_head=1, core_tail=1, drop_order=order, fill=fill),
                   GenerationConfig(max_new_tokens=10, stop_at_eos=False))


def test_under_a_nested_order_the_error_view_says_no_filled_entry_is_ever_read(tiny_engine) -> None:
    from viz.errors import error_propagation

    fig = error_propagation(comparison(tiny_engine, "middle_out"))
    assert not by_role(fig, "filled")[0].x.size and by_role(fig, "filled-unread")[0].x.size
    # Said under the title (issue 17 item 8: over the heatmap it covered the cells, and a phone cut it)
    assert "no filled entry is ever read" in title_text(fig)
    strided = error_propagation(comparison(tiny_engine, "strided"))
    assert by_role(strided, "filled")[0].x.size  # here later tokens read filled entries: outlined
    assert "no filled entry is ever read" not in title_text(strided)


def test_the_fill_view_says_what_compare_shows_and_why_nested_lines_coincide(tiny_engine) -> None:
    from explorer.views import fills_view

    cold = " ".join(a.text for a in fills_view(None).layout.annotations)
    assert "copy, propagate, none" in cold and "coincide" in cold
    nested = fills_view({f: comparison(tiny_engine, "middle_out", f) for f in ("copy", "none")})
    assert "coincide" in nested.layout.title.text
    strided = fills_view({f: comparison(tiny_engine, "strided", f) for f in ("copy", "none")})
    assert "coincide" not in strided.layout.title.text


# ---------------------------------------------------------------- 3: the layer-usage text matches the picture


def test_the_layer_usage_text_names_the_colours_a_default_run_draws(tiny_engine) -> None:
    from d3.trace import CELL_NAMES, FILLED_COPY, SKIPPED
    from explorer.wording import EXPLAIN
    from viz.grid import layer_grid

    trace = tiny_engine.generate("the cat sat", D3Config(alpha=0.85, core_head=1, core_tail=1),
                                 GenerationConfig(max_new_tokens=8, stop_at_eos=False))
    z = np.asarray(layer_grid(trace).data[0].z)
    codes = set(np.unique(z[np.isfinite(z)]).astype(int))
    assert FILLED_COPY in codes and SKIPPED not in codes  # the default fill: skipped cells are orange, none grey
    text = EXPLAIN["usage"]
    assert "orange, a *copy*" in text and "(the default fill)" in text
    assert "rows get shorter" not in text and "spans all the layers" in text
    assert CELL_NAMES[FILLED_COPY] == "filled (copy)"


# ---------------------------------------------------------------- 5: the core scenario compares equal lengths


def test_the_core_scenario_compares_its_runs_over_the_tokens_both_wrote_and_quotes_each() -> None:
    from explorer.scenarios import scenario_finding

    def run(layers, agree, text):
        return {"tokens": len(layers), "mean_layers": float(np.mean(layers)), "theoretical_speedup": 30 / np.mean(layers),
                "agreement": float(np.mean(agree)), "first_divergence": agree.index(False) if False in agree else None,
                "layers": tuple(layers), "agree": tuple(agree), "text": text}

    budgets = [30, 30, 29, 29, 28, 28, 27, 27, 26, 26] + [20] * 54  # the same schedule in both runs
    with_core = run(budgets, [True] * 9 + [False] * 55, "The sky is blue because")
    without = run(budgets[:10], [True] + [False] * 9, "Blue blue blue")  # stopped early at its end-of-text token
    text = scenario_finding("core", [with_core, without], 30)
    assert "compared over the first 10 tokens of each" in text
    assert text.count("28.0 of 30 layers") == 2  # equal lengths: equal depth, not 21.8 against 28.0
    assert "“The sky is blue because”" in text and "“Blue blue blue”" in text  # run 1's text stays readable
    assert "8 tokens longer" in text


# ---------------------------------------------------------------- 11: small wording


def test_the_small_wording_says_what_happens() -> None:
    from explorer.explain import PAUSE, PLAY
    from explorer.sweep_tab import SWEEP_REPEATS, sweep_bounds_text
    from explorer.wording import SWEEP_EXPLAIN

    assert f"{SWEEP_REPEATS} timing pairs" in sweep_bounds_text() and "1 repeat" not in sweep_bounds_text()
    assert "one repeat" not in SWEEP_EXPLAIN and "3 pairs" in SWEEP_EXPLAIN
    assert all(ord(ch) < 0x2000 for ch in PLAY + PAUSE)  # no glyph that needs an emoji font


# ---------------------------------------------------------------- 8: labels that do not collide


def test_the_usage_grid_labels_every_other_layer_and_thins_token_labels_in_presentation_mode(tiny_engine) -> None:
    from viz.grid import layer_grid
    from viz.stream import token_html

    trace = tiny_engine.generate("the cat sat", D3Config(alpha=0.9, core_head=1, core_tail=1),
                                 GenerationConfig(max_new_tokens=20, stop_at_eos=False))
    wide = trace.__class__(**{**trace.__dict__, "num_layers": 30})  # SmolLM2's 30 columns
    assert len(layer_grid(wide).layout.xaxis.tickvals) <= 16  # 30 labels at ~25 px each ran into each other
    rows = len(trace.steps)
    assert len(layer_grid(trace).layout.yaxis.tickvals) == rows
    assert len(layer_grid(trace, presentation=True).layout.yaxis.tickvals) <= (rows + 1) // 2
    full = tiny_engine.generate("the cat sat", D3Config(alpha=1.0, core_head=1, core_tail=1),
                                GenerationConfig(max_new_tokens=20, stop_at_eos=False))
    html = token_html(trace, reference=full)
    if "first divergence" in html:
        assert "white-space:nowrap\">first divergence ▸" in html  # the ▸ never wraps alone onto a line
