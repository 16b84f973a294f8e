"""The "Logit lens" and "Token scrubber" views: both draw the traces the session keeps from its last run. The D3 run
keeps each layer's output (explorer.runs.check_run); the lens is read out of them, in one batched LM-head call, the
first time one of these tabs is opened after a run; no other model work happens here. Components, handlers and
wiring live here, like explorer/needs.py."""

from __future__ import annotations

import functools
from typing import Any

import gradio as gr
import plotly.graph_objects as go

from d3.lens import has_lens_states, read_lens
from d3.trace import Trace
from explorer.controls import CONTROL_NAMES, DEFAULTS, Controls, takes_controls
from explorer.parse import as_number, whole
from explorer.pool import ModelPool
from explorer.session import Session
from explorer.ui import ordered, user_errors
from explorer.views import waiting
from viz.lens import has_lens, logit_lens_heatmap
from viz.scrub import scrub_html, token_layers, topk_compare

SCRUB_OUTPUTS = ("scrub", "scrub_topk", "scrub_card")
LENS_SWITCH = "Record the logit lens while generating"
RUN_OUTPUTS = ("lens", "scrub_index", *SCRUB_OUTPUTS)  # after a run, or when presentation mode changes
PLAY_OUTPUTS = ("scrub_index", "scrub_playing", "scrub_timer", "scrub_play")
PLAY_EVERY_S = 0.8  # Play moves to the next token this often
PLAY, PAUSE = "Play", "Pause"  # words: a pause glyph (U+23F8) is a box without an emoji font


def lens_view(d3: Trace | None, full: Trace | None, *, presentation: bool = False) -> go.Figure:
    """The logit lens of the run's D3 tokens (skip mask, prediction depth, first divergence from full depth)."""
    if d3 is None or not d3.steps:
        return waiting("Press Generate: the logit lens of every D3 token is recorded while generating.",
                       presentation=presentation)
    if has_lens_states(d3):  # kept, but its model was unloaded before the lens was read out
        return waiting("The model of this run was unloaded before its lens was read.<br>Press Generate again.",
                       presentation=presentation)
    if not has_lens(d3):
        return waiting(f"This run was recorded without the logit lens.<br>Tick “{LENS_SWITCH}” above and press "
                       "Generate.", presentation=presentation)
    return logit_lens_heatmap(d3, reference=full, presentation=presentation)


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


LAZY_VIEWS = ("lens", "scrub")  # drawn only while their tab is open: the lens heatmap is a large figure


def read_session_lens(pool: ModelPool, session: Session | None) -> None:
    """Read the logit lens of the session's D3 run out of the layer outputs it kept, once (they are dropped then)."""
    trace = session.d3 if session is not None else None
    if not has_lens_states(trace) or not pool.is_loaded(trace.model):
        return  # nothing kept, already read, or the model was unloaded since (the view says how to get it back)
    engine = pool.engine(trace.model)
    with engine.lock:
        read = read_lens(engine.adapter, engine.tokenizer, trace)
    if session.d3 is trace:  # a newer run may have replaced it meanwhile
        session.d3 = read


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


def view_opened(key: str, session: Session | None) -> None:
    """Remember which view tab is open (the lens and the scrubber draw only then)."""
    if session is not None:
        session.opened(key)


def lens_switch(ui: dict[str, Any]) -> None:
    """Above the lens: whether the D3 run keeps what the lens reads (its layer outputs; no LM head while it runs)."""
    ui["logit_lens"] = gr.Checkbox(DEFAULTS.logit_lens, label=LENS_SWITCH, elem_id="logit-lens",
                                   info="the D3 run keeps each layer's output; the lens is read out of them when this "
                                        "tab opens (one batched LM-head call), so generating is not slowed down")


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


def explain_moves(pool: ModelPool, ui: dict[str, Any], moves: Any) -> None:
    """Presentation mode redraws both views (a person's move: `moves` is explorer.moves.Moves)."""
    moves.on([ui["presentation"].input], functools.partial(show_run, pool),
             [ui["session"], ui["scrub_index"], *(ui[n] for n in CONTROL_NAMES)], [ui[n] for n in RUN_OUTPUTS],
             queue=False, preprocess=False, show_progress="hidden")


def wire_explain(pool: ModelPool, ui: dict[str, Any], runs: dict[str, Any], opened: dict[str, Any]) -> None:
    """The views' events, none of which runs the model (out of the queue): after each run (`runs`: API name
    suffix -> the run's event) both views redraw (and on presentation mode: `explain_moves`); the slider and Play
    move the scrubber."""
    instant = dict(queue=False, preprocess=False, show_progress="hidden")
    controls = [ui[n] for n in CONTROL_NAMES]
    with_index = [ui["session"], ui["scrub_index"], *controls]
    outputs = [ui[n] for n in RUN_OUTPUTS]
    show = functools.partial(show_run, pool)
    for suffix, run in runs.items():
        run.then(show, with_index, outputs, api_name=f"show_run{suffix}", **instant)
    for key in LAZY_VIEWS:  # `opened`: each view tab's select event (explorer/wiring.py)
        opened[key].then(show, with_index, outputs, api_name=False, **instant)
    scrub = [ui[n] for n in SCRUB_OUTPUTS]  # a person's move of the slider; Play's ticks draw their own token
    gr.on([ui["scrub_index"].input, ui["scrub_index"].release], render_scrub, with_index, scrub,
          api_name="render_scrub", trigger_mode="always_last", **instant)
    play = [ui["session"], ui["scrub_index"], ui["scrub_playing"]]
    played = ui["scrub_play"].click(toggle_play, play, [ui[n] for n in PLAY_OUTPUTS], api_name="scrub_play", **instant)
    played.then(render_scrub, with_index, scrub, api_name=False, **instant)
    tick = ui["scrub_timer"].tick(next_token, play, [ui[n] for n in PLAY_OUTPUTS], api_name="scrub_next", **instant)
    tick.then(render_scrub, with_index, scrub, api_name=False, **instant)
