"""Attention: one head of the recorded layer, full depth beside D3."""

from __future__ import annotations

import gradio as gr

from explorer.controls import DEFAULTS
from explorer.ui import slider_range
from explorer.views import Shown, View, attention_view

EXPLAIN = """**Where one attention head looks** while each token is generated (rows), over the prompt and
the earlier tokens (columns): full depth on the left, D3 on the right. Every layer is recorded (a long prompt: only the layer chosen
under *More controls* before generating); a click on a cell of the *Attention overview* opens its layer and head
here. The default
layer is a flex layer that the default D3 run keeps for about three quarters of its tokens, then drops. The dotted
line is where the prompt ends.

**What to look for:** grey rows are tokens for which D3 skipped this layer (no attention to show). Similar
patterns in the rows above them mean that skipping other layers left this head's behaviour intact."""

def draw(shown: Shown, options) -> object:
    return attention_view(shown.d3, shown.full, options.layer, options.head, presentation=options.presentation)


def controls(ui: dict, facts) -> None:
    ui["attention_head"] = gr.Slider(0, value=DEFAULTS.attention_head, step=1, label="Head",
                                     **slider_range(facts.num_heads - 1))


VIEW = View("attention", "Attention: full depth vs D3", EXPLAIN, needs="a run that recorded the chosen layer's attention", position=40,
            draw=draw, after_run=True, controls=controls)
