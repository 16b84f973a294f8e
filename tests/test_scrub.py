"""explorer/views/scrub.py (and the lens it draws with, explorer/views/lens.py) below the browser: the logit lens
and the token scrubber (slider and Play) drawn from a finished run, only while their tab is open; the lens's inputs kept unless switched off. The page itself is in
tests/test_browser_lens.py."""

from __future__ import annotations

import gradio as gr
import pytest

from d3.config import D3Config, GenerationConfig, TraceConfig
from d3.trace import RAN
from explorer.controls import DEFAULTS
from explorer.runs import check_run, side_by_side
from explorer.session import Session
from explorer.view_handlers import view_opened
from explorer.views.scrub import PAUSE, PLAY, RUN_OUTPUTS, next_token, render_scrub, show_run, toggle_play
from tests.figures import by_role
from viz.layout import CELL_COLORS

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"), pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::FutureWarning")]
LAYERS = 30


ENGINE_LAYERS = LAYERS  # the conftest `engine` fixture's layer count for this module


@pytest.fixture(scope="module")
def session(engine, demo) -> Session:
    """A finished run of the page's kind (D3 and full depth side by side, the lens's inputs kept), in a session."""
    demo.pool.engine("tiny")
    cfg = D3Config(alpha=0.9)
    last = None
    for last in side_by_side(engine, "the cat sat", cfg, GenerationConfig(max_new_tokens=10),
                             TraceConfig(lens_states=True), with_comparison=False):
        pass
    s = Session()
    s.finish(last, "D3")
    return s


def figure_of(value):
    return value if hasattr(value, "data") else value["value"]


def test_the_page_keeps_the_lens_inputs_for_its_runs_unless_switched_off(demo) -> None:
    trace = check_run(demo.pool, DEFAULTS.with_(prompt="hi", model="tiny")).trace
    assert trace.lens_states and not trace.logit_lens  # no LM head per layer while generating: read out on demand
    assert not check_run(demo.pool, DEFAULTS.with_(prompt="hi", model="tiny", logit_lens=False)).trace.lens_states
    with pytest.raises(ValueError, match="logit_lens"):
        check_run(demo.pool, DEFAULTS.with_(prompt="hi", model="tiny", logit_lens="maybe"))


def test_the_lens_and_scrubber_are_drawn_only_while_their_tab_is_open(demo, session) -> None:
    view_opened("usage", session)
    skipped = lambda o: isinstance(o, dict) and o == gr.skip()  # noqa: E731
    assert all(skipped(o) for o in show_run(demo.pool, session, 0))  # nothing is sent after a run
    view_opened("lens", session)
    assert not any(skipped(o) for o in show_run(demo.pool, session, 0))


def test_the_lens_is_read_out_only_when_its_tab_opens(demo, engine) -> None:
    from d3.lens import has_lens_states

    last = None
    for last in side_by_side(engine, "a dog", D3Config(alpha=0.9), GenerationConfig(max_new_tokens=6),
                             TraceConfig(lens_states=True), with_comparison=False):
        pass
    s = Session()
    s.finish(last, "D3")
    assert has_lens_states(s.d3) and s.full.steps[0].lens_states is None  # kept for the D3 pane only
    view_opened("usage", s)
    show_run(demo.pool, s, 0)
    assert has_lens_states(s.d3)  # another tab is open: nothing read
    view_opened("lens", s)
    out = dict(zip(RUN_OUTPUTS, show_run(demo.pool, s, 0)))
    assert not has_lens_states(s.d3) and len(s.d3.steps[0].lens_prob) == LAYERS
    assert by_role(out["lens"], "lens")[0].z.shape == (LAYERS, len(s.d3.steps))


def test_after_a_run_the_lens_has_a_column_per_token_and_a_row_per_layer(demo, session) -> None:
    view_opened("lens", session)
    out = dict(zip(RUN_OUTPUTS, show_run(demo.pool, session, 99)))
    lens, tokens = out["lens"], len(session.d3.steps)
    heat = by_role(lens, "lens")[0]
    assert heat.z.shape == (LAYERS, tokens)  # z[layer][token]: tokens along x
    assert len(by_role(lens, "prediction-depth")[0].x) == tokens
    assert out["scrub_index"]["maximum"] == tokens - 1 and out["scrub_index"]["value"] == tokens - 1  # 99: the last
    layers = by_role(out["scrub"], "token-layers")[0]
    ran = [c == CELL_COLORS[RAN] for c in layers.marker.color]
    assert sum(ran) == session.d3.steps[-1].n_layers and len(ran) == LAYERS


def test_the_scrubber_compares_top5_with_full_depth_while_the_texts_agree(session) -> None:
    layers, topk, card = render_scrub(session, 0)
    assert {t.name for t in by_role(topk, "topk")} == {"D3", "full depth"}  # token 0: nothing written before it
    assert by_role(layers, "token-layers")[0].meta["step"] == 0
    assert "Token 0 of" in card


def test_the_scrubber_says_plainly_what_is_wrong(session) -> None:
    with pytest.raises(gr.Error, match="token must be an integer"):
        render_scrub(session, "three")
    _, _, card = render_scrub(session, 500)
    assert "Token 500 does not exist" in card
    _, _, card = render_scrub(None, 0)
    assert "Press Generate" in card


def test_play_steps_through_the_tokens_and_stops_at_the_last(session) -> None:
    last = len(session.d3.steps) - 1
    index, playing, timer, label = toggle_play(session, 2, False)
    assert (index, playing, label) == (2, True, PAUSE) and timer.active
    index, playing, timer, label = next_token(session, index, playing)
    assert (index, playing) == (3, True)
    index, playing, timer, label = next_token(session, last - 1, True)
    assert (index, playing, label) == (last, False, PLAY) and not timer.active
    assert toggle_play(session, last, False)[:2] == (0, True)  # Play at the end starts again from the first token
    assert toggle_play(session, 4, True)[:2] == (4, False)  # Pause keeps the token
    assert toggle_play(None, 0, False)[1] is False  # nothing to play
