"""Error propagation: KL per position against full depth and the KV cache's error per layer."""

from __future__ import annotations

import gradio as gr

from explorer.controls import DEFAULTS
from explorer.views import Shown, View, error_view, redrawn_by

KEY = "errors"
EXPLAIN = """**How far D3 drifts from full depth,** per position.
*Teacher-forced* KL: both models see the same full-depth text, so this is the local error of one step.
*Free-running* KL: D3 continues on its own text, so errors compound.
The bottom panel shows how wrong the key/value cache is at each layer, compared with full depth. Outlined
squares were filled instead of computed and are read by later tokens; grey dots were filled but no later token
ever reads them.

**What to look for:** a spike at the first divergence. With a nested drop order (the default) every filled entry
is a grey dot: no later token runs a skipped layer again, so no filled entry is ever read and the fill changes
nothing; errors there cannot propagate, the skipped layers' own absence is the error. With *strided* or
early exit, filled entries with a large error are read and the error propagates."""


def draw(shown: Shown, options) -> object:
    return error_view(shown.comparison, phase=shown.phase, log_kl=options.log_kl, presentation=options.presentation)


def controls(ui: dict, facts) -> None:
    ui["log_kl"] = gr.Checkbox(DEFAULTS.log_kl, label="Log scale for KL")


# its own control redraws it, out of the queue (no model runs)
render_errors, wire = redrawn_by(KEY, "log_kl", draw, "render_errors")


VIEW = View(KEY, "Error propagation", EXPLAIN, needs="a run's comparison with full depth", position=50, draw=draw,
            after_run=True, controls=controls, wire=wire, ready=lambda s: s.comparison,
            first="let a run finish (the error views come after both streams).")
