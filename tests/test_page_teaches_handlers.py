"""Issue 11, "The page teaches", below the browser: handlers, the sweep tab's numbers, figures and the engine's
token text. Tiny random models, except where a claim is about the real SmolLM2 (integration)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from d3.config import D3Config, FullConfig, GenerationConfig
from d3.schedule import plan
from d3.research.sweep.grid import d3_for_depth, planned_mean_layers
from explorer import views
from explorer.caps import Caps
from explorer.controls import Controls, default_attention_layer
from explorer.export import export_figure
from explorer.live import stop
from explorer.pool import ModelPool
from explorer.runs import side_by_side
from explorer.session import Session
from explorer.sweep_tab import run_small_sweep, sweep_spec
from viz.attention import attention_map
from viz.depth import decay_curve

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"), pytest.mark.filterwarnings("ignore::UserWarning")]


def run_pair(engine, strategy, tokens: int = 8, prompt: str = "hello there"):
    """The finished update of a side-by-side run on `engine`."""
    *_, last = side_by_side(engine, prompt, strategy, GenerationConfig(max_new_tokens=tokens))
    return last



# ---------------------------------------------------------------- 5: the Sweep tab


@pytest.mark.parametrize("tokens", [2, 3, 4, 6, 16, 24])
def test_the_sweep_tabs_67_percent_setting_runs_at_67_percent(tokens) -> None:
    spec = sweep_spec("tiny", "a prompt", ["d3_67"], tokens, False, Caps())
    cfg = d3_for_depth(spec.depths[0], 30, tokens)
    assert planned_mean_layers(cfg, 30, tokens) / 30 == pytest.approx(2 / 3, abs=0.04)


def test_the_sweep_tab_times_full_depth_as_1x_after_a_warm_up_and_reports_progress_often(tiny_engine) -> None:
    from explorer.sweep_tab import SWEEP_OUTPUTS, run_sweep

    calls: list[tuple[float, str]] = []
    pool = ModelPool(lambda name: tiny_engine, names=("tiny",))
    out = dict(zip(SWEEP_OUTPUTS, run_sweep(pool, "tiny", False, "hello there", ["d3_75", "unified_67"], 6,
                                            progress=lambda f, desc=None: calls.append((f, desc)))))
    df = out["sweep_results"]
    assert df.loc[df["strategy"] == "full", "measured_speedup"].tolist() == [1.0]  # the unit, not a timing artefact
    assert df["timing_pairs"].min() >= 3  # several pairs per row, not one
    assert "timed against itself read" in out["sweep_note"]
    assert out["sweep_file"] is None  # the previous sweep's CSV download is withdrawn
    fractions = [f for f, _ in calls]
    assert fractions == sorted(fractions) and len(set(fractions)) >= 10  # the bar moves run by run
    assert any(0 < f < 1 / 3 for f in fractions)  # ... from the first runs on, not only once a row is done


# ---------------------------------------------------------------- 6: small things


def test_stop_while_idle_says_nothing_is_running() -> None:
    session = Session()
    assert "Stopping" not in stop(session) and "Nothing is running" in stop(session)


def test_a_finished_run_that_never_diverged_says_so_without_so_far(tiny_engine) -> None:
    last = run_pair(tiny_engine, D3Config(alpha=1.0))
    assert last.phase == "done"
    text = views.status_html(last.d3, last.full, "done", comparison=last.comparison)
    assert "so far" not in text and "No divergence" in text


def test_exporting_a_figure_that_was_never_computed_says_so() -> None:
    pool = ModelPool(lambda name: None, names=("tiny",))
    with pytest.raises(Exception, match="(?i)nothing to export|not computed|press generate"):
        export_figure(pool, Session(), "errors", model="tiny")


def test_prefill_time_is_in_the_trace_and_its_json(tiny_engine) -> None:
    trace = tiny_engine.generate("hello", FullConfig(), GenerationConfig(max_new_tokens=3))
    assert trace.prefill_ms > 0 and trace.prefill_ms == pytest.approx(trace.steps[0].wall_ms)
    assert json.loads(trace.to_json())["prefill_ms"] == trace.prefill_ms


def test_partial_utf8_tokens_are_decoded_incrementally() -> None:
    """A byte-level BPE splits one emoji into several tokens; joining the per-token texts gives the text back."""
    from transformers import AutoTokenizer

    from d3.models import cache_root

    found = sorted((cache_root() / "smollm2-135m").glob("*/tokenizer.json"))
    if not found:
        pytest.skip("SmolLM2's tokenizer is not cached")
    tok = AutoTokenizer.from_pretrained(str(found[0].parent))
    from d3.engine import Engine

    text = "ok 🙂 café 北京"
    ids = tok.encode(text, add_special_tokens=False)
    pieces = [Engine.token_text(type("E", (), {"tokenizer": tok})(), ids, i) for i in range(len(ids))]
    assert "\ufffd" not in "".join(pieces)
    assert "".join(pieces) == text


# ---------------------------------------------------------------- 9: attention view


def test_the_default_attention_layer_is_one_the_default_schedule_skips() -> None:
    layer = default_attention_layer(30)
    cfg = D3Config(alpha=0.99)
    skipped_at = [i for i in range(64) if layer not in plan(cfg, 30, i).run]
    assert skipped_at  # grey rows appear within the default run (issue 17: and most rows show attention)


def test_attention_key_labels_are_thinned_so_they_do_not_overlap(tiny_engine) -> None:
    from d3.config import TraceConfig

    trace = tiny_engine.generate("the quick brown fox jumps over the lazy dog " * 3, FullConfig(),
                                 GenerationConfig(max_new_tokens=40), TraceConfig(attention_layers=(2,)))
    fig = attention_map(trace, 2, 0)
    ticks = fig.layout.xaxis.ticktext
    assert ticks is not None and len(ticks) <= 24  # about one label per 30 px of a 700 px wide panel


# ---------------------------------------------------------------- 7: the decay curve's labels


@pytest.mark.parametrize("presentation", [False, True])
def test_the_core_floor_label_sits_clear_of_the_d3_line(presentation) -> None:
    """The label stands in the right margin at the floor line's end (issue 17 item 8): inside the plot the line,
    the markers of tokens that ran at the floor and other strategies' lines can all run through it."""
    from viz.depth import FLOOR_LABEL_EM

    fig = decay_curve(D3Config(alpha=0.9), 30, 64, presentation=presentation)
    note = next(a for a in fig.layout.annotations if "core floor" in a.text)
    assert (note.xref, note.x, note.xanchor, note.y) == ("paper", 1, "left", 6)  # right of the plot, at the floor
    assert note.text == "core floor<br>3+3=6"
    widest = max(len(line) for line in note.text.split("<br>"))  # "core floor" is 4.2 em wide in Arial
    assert fig.layout.margin.r >= FLOOR_LABEL_EM * note.font.size + note.xshift and FLOOR_LABEL_EM >= 0.42 * widest


# ---------------------------------------------------------------- 3: the core scenario, on the real model


@pytest.mark.integration
@pytest.mark.slow
def test_the_core_scenario_shows_what_its_text_claims(smol_engine) -> None:
    """Core 3 + 3 keeps D3 on full depth's text for longer than core 0 + 0 (first divergence and agreement), on the
    prompt the page opens with (measured: first divergence at token 9 against 1, agreement 0.31 against 0.06)."""
    from d3.research.data import example_prompts
    from explorer.scenarios import SCENARIOS, scenario_controls

    scenario = SCENARIOS["core"]
    results = []
    for step in range(len(scenario.runs)):
        controls = scenario_controls("core", step, 30)
        cfg = D3Config(alpha=controls["alpha"], core_head=controls["core_head"], core_tail=controls["core_tail"],
                       drop_order=controls["drop_order"])
        last = run_pair(smol_engine, cfg, tokens=32, prompt=example_prompts()[0].prompt)  # the page's first prompt
        results.append(last.comparison.summary())
    with_core, without = results
    assert with_core["first_divergence"] is None or without["first_divergence"] is not None
    assert (with_core["first_divergence"] or 99) > (without["first_divergence"] or 0) + 2
    assert with_core["agreement"] > without["agreement"] + 0.1


# ---------------------------------------------------------------- 10: streaming does not flood the page


def test_streaming_sends_the_page_a_paced_subset_of_updates(tiny_engine) -> None:
    """A fast model makes an update every few ms: the page gets the panes at most every PANES_EVERY_S and the
    heavy figures at most every FIGURES_EVERY_S, but always the first token and every phase change."""
    from explorer import live

    now = [0.0]
    pace = live._Pacer(every=1, clock=lambda: now[0])
    updates = list(side_by_side(tiny_engine, "hello there", D3Config(alpha=0.9), GenerationConfig(max_new_tokens=40)))
    sent, drawn = [], []
    for update in updates:
        now[0] += 0.01  # 100 updates a second
        figures = pace.figures(update)
        if pace.panes(update) or figures:
            sent.append(update)
            drawn += [update] if figures else []
    streamed = [u for u in updates if u.phase == "streaming"]
    assert len(streamed) == 80 and len(sent) <= 80 * 0.01 / live.PANES_EVERY_S + 6
    assert len(drawn) <= 80 * 0.01 / live.FIGURES_EVERY_S + 4
    assert sent[0].d3 is not None and len(sent[0].d3.steps) == 1  # the first token shows at once
    assert [u.phase for u in sent if u.phase != "streaming"] == [u.phase for u in updates if u.phase != "streaming"]
