"""Fill strategies: the same prompt and schedule with each fill, against full depth."""

from __future__ import annotations

import gradio as gr

from explorer.views import Shown, View, fills_view

KEY = "fills"
EXPLAIN = """**The same prompt and schedule with each fill strategy:**
*copy* takes the key/value entry of the nearest lower layer that ran. *propagate* passes the hidden state
through the skipped layer unchanged and projects its own key/value from it. *none* leaves a hole and masks it.
This costs extra runs, so press **Compare fills** to compute it.

**What to look for:** with a nested drop order, all three fills give the same result, because no later token
reads a hole. With *strided*, the fills give different results."""

def draw(shown: Shown, options) -> object:
    return fills_view(shown.fills, presentation=options.presentation)


def controls(ui: dict, facts) -> None:
    ui["fills_button"] = gr.Button("Compare fills (copy · propagate · none)", elem_id="fills-button")


VIEW = View(KEY, "Fill strategies", EXPLAIN, needs="a fill comparison (Compare fills)", position=60, draw=draw,
            controls=controls, ready=lambda s: s.fills,
            first="press “Compare fills” in the Fill strategies tab first.")
