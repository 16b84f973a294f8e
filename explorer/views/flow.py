"""Information flow: how much each sublayer changes the hidden state, core vs flex layers."""

from __future__ import annotations

import gradio as gr

from explorer.controls import DEFAULTS
from explorer.views import Shown, View, flow_view, redrawn_by

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


# its own control redraws it, out of the queue (no model runs)
render_flow, wire = redrawn_by(KEY, "metric", draw, "render_flow")


VIEW = View(KEY, "Information flow: core vs flex", EXPLAIN,
            needs="a run's per-sublayer change (D3 and full depth)", position=30,
            draw=draw, after_run=True, controls=controls, wire=wire)
