"""The "Logit lens" view: what the model would say after each layer, for the last run's D3 tokens. The D3 run keeps
each layer's output (explorer.runs.check_run); the lens is read out of them, in one batched LM-head call, the first
time this tab or the scrubber's is opened after a run (explorer/views/scrub.py draws both then, in one event); no
other model work happens here."""

from __future__ import annotations

from typing import Any

import gradio as gr
import plotly.graph_objects as go

from d3.lens import has_lens_states, read_lens
from d3.trace import Trace
from explorer.controls import DEFAULTS, Controls
from explorer.pool import ModelPool
from explorer.session import Session
from explorer.views import View, waiting
from viz.lens import has_lens, logit_lens_heatmap

KEY = "lens"
LENS_SWITCH = "Record the logit lens while generating"


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


def read_session_lens(pool: ModelPool, session: Session | None) -> None:
    """Read the logit lens of the session's D3 run out of the layer outputs it kept, once (they are dropped then)."""
    trace = session.d3 if session is not None else None
    if session is None or trace is None or not has_lens_states(trace) or not pool.is_loaded(trace.model):
        return  # nothing kept, already read, or the model was unloaded since (the view says how to get it back)
    engine = pool.engine(trace.model)
    with engine.lock:
        read = read_lens(engine.adapter, engine.tokenizer, trace)
    if session.d3 is trace:  # a newer run may have replaced it meanwhile
        session.d3 = read


def lens_switch(ui: dict[str, Any]) -> None:
    """Above the lens: whether the D3 run keeps what the lens reads (its layer outputs; no LM head while it runs)."""
    ui["logit_lens"] = gr.Checkbox(DEFAULTS.logit_lens, label=LENS_SWITCH, elem_id="logit-lens",
                                   info="the D3 run keeps each layer's output; the lens is read out of them when this "
                                        "tab opens (one batched LM-head call), so generating is not slowed down")


def exported(pool: ModelPool, session: Session, own: Any, controls: Controls) -> dict[str, go.Figure]:
    """The lens for Export (`prepare` read it out of the run first, if nobody opened its tab)."""
    return {KEY: lens_view(session.d3, session.full, presentation=controls.view.presentation)}


EXPLAIN = """**What the model would say if it stopped after each layer** (the *logit lens*: the final norm and
the output head applied to the hidden state after that layer), for every D3 token of the last run.
One column per generated token, one row per layer. The colour is the probability of the token D3 finally
wrote. Grey hatched cells are layers that did not run for that token. The black line is the *prediction depth*:
the first layer from which the lens's top token is the final one and stays so.

**What to look for:** where the black line sits well below the grey cells, the skipped layers were not needed
for that token. Where it climbs into them, D3 cut layers that token was still using. The lens is recorded
during every run while the box above the view is ticked (the default); untick it for runs about 1.6x faster."""



VIEW = View(KEY, "Logit lens", EXPLAIN, needs="a run that recorded the lens (drawn while its tab is open)",
            position=90, controls=lambda ui, facts: lens_switch(ui), prepare=read_session_lens,
            ready=lambda s: s.d3 is not None and has_lens(s.d3), exported=exported,
            first="press Generate first (with “Record the logit lens” ticked).")
