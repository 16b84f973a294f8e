"""The "Token scrubber" view: one token of the last run at a time, its layers and its top tokens, with a slider and
Play. It draws from the traces the session keeps from its last run, together with the logit lens
(explorer/views/lens.py): after each run, and when one of their tabs opens, one event (`show_run`) draws both, so
their wiring lives here. No model work happens here beyond reading the lens."""

from __future__ import annotations

import functools
from typing import Any

import gradio as gr
import plotly.graph_objects as go

from d3.trace import Trace
from explorer.controls import CONTROL_NAMES, Controls, takes_controls
from explorer.parse import as_number, whole
from explorer.pool import ModelPool
from explorer.session import Session
from explorer.ui import ordered, user_errors
from explorer.views import Page, View, waiting
from explorer.views.lens import KEY as LENS
from explorer.views.lens import lens_view, read_session_lens
from viz.scrub import scrub_html, token_layers, topk_compare

KEY = "scrub"
SCRUB_OUTPUTS = (KEY, f"{KEY}_topk", f"{KEY}_card")
RUN_OUTPUTS = (LENS, f"{KEY}_index", *SCRUB_OUTPUTS)  # after a run, or when presentation mode changes
PLAY_OUTPUTS = (f"{KEY}_index", f"{KEY}_playing", f"{KEY}_timer", f"{KEY}_play")
PLAY_EVERY_S = 0.8  # Play moves to the next token this often
PLAY, PAUSE = "Play", "Pause"  # words: a pause glyph (U+23F8) is a box without an emoji font
LAZY_VIEWS = (LENS, KEY)  # drawn only while their tab is open: the lens heatmap is a large figure


def _scrub_message(message: str, p: bool) -> tuple[Any, Any, str]:
    return (waiting(message, presentation=p), waiting(message, presentation=p),
            f'<div class="d3-scrub">{message}</div>')


def scrub_views(d3: Trace | None, full: Trace | None, index: int, *, presentation: bool = False) -> tuple[Any, Any, str]:
    """(token layers, top-5 D3 vs full depth, the card in words) for token `index` of the D3 run."""
    p = presentation
    if d3 is None or not d3.steps:
        return _scrub_message("Press Generate, then pick a token here.", p)
    if not 0 <= index < len(d3.steps):
        return _scrub_message(f"Token {index} does not exist: this run has {len(d3.steps)} tokens "
                              f"(0–{len(d3.steps) - 1}).", p)
    return (token_layers(d3, index, presentation=p), topk_compare(d3, index, full, presentation=p),
            scrub_html(d3, index, full))


def _traces(session: Session | None) -> tuple[Trace | None, Trace | None]:
    return (session.d3, session.full) if session is not None else (None, None)


@takes_controls
def render_scrub(session: Session | None, index: Any, controls: Controls) -> tuple[Any, ...]:
    """Token `index` of the last run (0 = the first generated token); a non-number is a plain error."""
    with user_errors():
        token = int(as_number("token", index, 0, 10**6, integer=True))
        return scrub_views(*_traces(session), token, presentation=controls.view.presentation)



@takes_controls
def show_run(pool: ModelPool, session: Session | None, index: Any, controls: Controls) -> tuple[Any, ...]:
    """After a run (or a change of presentation mode, or when the tab opens): the lens, and the scrubber sized to
    the run's tokens with its token kept where it was (or moved to the last one, if the run is shorter). Nothing
    while another view's tab is open: nobody sees them there, and the lens heatmap is a large figure to send and
    draw after every run; opening the tab draws them."""
    if session is not None and session.view not in LAZY_VIEWS:
        return ordered(RUN_OUTPUTS)
    read_session_lens(pool, session)
    d3, full = _traces(session)
    p = controls.view.presentation
    tokens = len(d3.steps) if d3 is not None else 0
    token = min(whole(index), max(tokens - 1, 0))
    with user_errors():
        return ordered(RUN_OUTPUTS, lens=lens_view(d3, full, presentation=p),
                       scrub_index=gr.update(maximum=max(tokens - 1, 1), value=token),
                       **dict(zip(SCRUB_OUTPUTS, scrub_views(d3, full, token, presentation=p))))


def _play_state(index: int, playing: bool) -> tuple[Any, ...]:
    return ordered(PLAY_OUTPUTS, scrub_index=index, scrub_playing=playing, scrub_timer=gr.Timer(active=playing),
                   scrub_play=PAUSE if playing else PLAY)


def toggle_play(session: Session | None, index: Any, playing: Any) -> tuple[Any, ...]:
    """Play from the selected token (from the first, if it is the last), or pause."""
    tokens = len(session.d3.steps) if session is not None and session.d3 is not None else 0
    if playing is True or tokens < 2:
        return _play_state(min(whole(index), max(tokens - 1, 0)), False)
    token = whole(index)
    return _play_state(0 if token >= tokens - 1 else token, True)


def next_token(session: Session | None, index: Any, playing: Any) -> tuple[Any, ...]:
    """One tick of Play: the next token; at the last one Play stops."""
    tokens = len(session.d3.steps) if session is not None and session.d3 is not None else 0
    if playing is not True or tokens < 2:
        return _play_state(min(whole(index), max(tokens - 1, 0)), False)
    token = min(whole(index) + 1, tokens - 1)
    return _play_state(token, token < tokens - 1)


def scrub_controls(ui: dict[str, Any]) -> None:
    """The scrubber's components: the token slider and Play above, the card, then its two plots side by side."""
    ui["scrub_playing"] = gr.State(False)
    ui["scrub_timer"] = gr.Timer(PLAY_EVERY_S, active=False)
    with gr.Row(equal_height=True):
        ui["scrub_index"] = gr.Slider(0, 1, value=0, step=1, label="Token (0 = the first generated token)",
                                      elem_id="scrub-index", scale=4, min_width=240)  # Play wraps on a phone
        ui["scrub_play"] = gr.Button(PLAY, elem_id="scrub-play", scale=1, min_width=110)
    ui["scrub_card"] = gr.HTML(elem_id="scrub-card", elem_classes=["d3-scrub-card"])
    with gr.Row(equal_height=False):
        with gr.Column(min_width=280):
            ui["scrub"] = gr.Plot(show_label=False, elem_id="plot-scrub")
        with gr.Column(min_width=280):
            ui["scrub_topk"] = gr.Plot(show_label=False, elem_id="plot-scrub-topk")


def exported(pool: ModelPool, session: Session, index: Any, controls: Controls) -> dict[str, go.Figure]:
    """The scrubber's two figures for Export, at the slider's token (None: the last); `ready` checked the run."""
    assert session.d3 is not None
    last = len(session.d3.steps) - 1
    token = last if index is None else int(as_number("Token", index, 0, last, integer=True))
    layers, topk, _ = scrub_views(session.d3, session.full, token, presentation=controls.view.presentation)
    return {KEY: layers, f"{KEY}_topk": topk}


def wire(pool: ModelPool, ui: dict[str, Any], page: Page) -> None:
    """The lens's and the scrubber's events, none of which runs the model (out of the queue): after each run
    (`page.each_run`), when either tab opens and on presentation mode (a person's move) both views redraw; the slider
    and Play move the scrubber."""
    instant = dict(queue=False, preprocess=False, show_progress="hidden")
    index = ui[f"{KEY}_index"]
    with_index = [ui["session"], index, *(ui[n] for n in CONTROL_NAMES)]
    outputs = [ui[n] for n in RUN_OUTPUTS]
    show = functools.partial(show_run, pool)
    page.moves.on([ui["presentation"].input], show, with_index, outputs, queue=False, preprocess=False,
                  show_progress="hidden")
    page.each_run(lambda suffix, run: run.then(show, with_index, outputs, api_name=f"show_run{suffix}", **instant))
    for key in LAZY_VIEWS:  # each view tab's select event
        page.opened[key].then(show, with_index, outputs, api_name=False, **instant)
    scrub = [ui[n] for n in SCRUB_OUTPUTS]  # a person's move of the slider; Play's ticks draw their own token
    gr.on([index.input, index.release], render_scrub, with_index, scrub, api_name="render_scrub",
          trigger_mode="always_last", **instant)
    play = [ui["session"], index, ui[f"{KEY}_playing"]]
    played = ui[f"{KEY}_play"].click(toggle_play, play, [ui[n] for n in PLAY_OUTPUTS], api_name="scrub_play", **instant)
    played.then(render_scrub, with_index, scrub, api_name=False, **instant)
    tick = ui[f"{KEY}_timer"].tick(next_token, play, [ui[n] for n in PLAY_OUTPUTS], api_name="scrub_next", **instant)
    tick.then(render_scrub, with_index, scrub, api_name=False, **instant)


EXPLAIN = """**One token at a time.** Pick a generated token with the slider, or press **Play** to step through
them in order. Left: the layers it ran (blue), skipped (grey), and where each skipped layer's key/value
entry came from (copied from which layer, propagated, or a masked hole). Right: its top 5 next tokens under D3 and
at full depth. Full depth is shown only while it had written the same text so far, since after a divergence
it answers a different context.

**What to look for:** tokens where D3's top choice is close to full depth's even with many layers skipped, and
the token where the two first part ways."""



VIEW = View(KEY, "Token scrubber", EXPLAIN, needs="a run (drawn while its tab is open)", position=100,
            controls=lambda ui, facts: scrub_controls(ui), plot=False,
            ready=lambda s: s.d3 is not None and bool(s.d3.steps), wire=wire, exported=exported,
            export_input=f"{KEY}_index")
