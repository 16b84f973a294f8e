"""Information flow: how much each sublayer changes the hidden state, core vs flex layers."""

from __future__ import annotations

from typing import Any

import gradio as gr

from explorer.controls import CONTROL_NAMES, DEFAULTS, Controls, takes_controls
from explorer.ui import user_errors
from explorer.views import Page, Shown, View, flow_view

KEY = "flow"
EXPLAIN = """**How much each sublayer changes the hidden state,** per layer, measured live on this prompt.
The change is 1 − cosine between the input and output of the sublayer, or the relative distance between them.
Dotted lines: averaged over the prompt. Solid lines: averaged over generated tokens (D3). Dashed lines: full depth.
Purple bands: core layers.

**What to look for:** the change is largest at the first and last layers. That is why D3 always runs
them (the *core*) and only skips the middle."""


def draw(shown: Shown, options) -> object:
    return flow_view(shown.d3, shown.full, metric=options.metric, presentation=options.presentation)


def controls(ui: dict, facts) -> None:
    ui["metric"] = gr.Radio([("both", "both"), ("1 − cosine", "cos"), ("relative distance", "dist")],
                            value=DEFAULTS.metric, label="Measure of change")


@takes_controls
def render_flow(session: Any, controls: Controls) -> Any:
    """The view redrawn from the session's run after its own control (the measure of change) moved."""
    with user_errors():
        return draw(Shown.of(session), controls.view)


def wire(pool: Any, ui: dict[str, Any], page: Page) -> None:
    """Its own control redraws it, out of the queue (no model runs)."""
    inputs = [ui["session"], *(ui[n] for n in CONTROL_NAMES)]
    ui["metric"].input(render_flow, inputs, ui[KEY], api_name="render_flow", queue=False, preprocess=False,
                       show_progress="hidden")


VIEW = View(KEY, "Information flow: core vs flex", EXPLAIN,
            needs="a run's per-sublayer change (D3 and full depth)", position=30,
            draw=draw, after_run=True, controls=controls, wire=wire)
