"""Attention overview: every head of the recorded layer, D3 beside full depth and their difference
(viz/attention_overview.py)."""

from __future__ import annotations

from explorer.views import Shown, View, attention_captured, waiting
from viz.attention_overview import attention_overview

EXPLAIN = """**Every attention head of the recorded layer at once** (one row per head): D3, full depth, and
D3 minus full depth, for each generated token (rows, down) over the prompt and the earlier tokens (columns). The
weights share one colour scale; the difference is red where D3 attends more, blue where it attends less. Grey rows:
tokens for which D3 skipped this layer. The dotted line is where the prompt ends, a dashed one where the two texts first differ. Choose the layer
under *More controls* before generating.

**What to look for:** a difference panel that stays pale up to the dashed line: skipping other layers left this
layer's heads looking where full depth looks. After the divergence the two runs read different texts."""


def draw(shown: Shown, options) -> object:
    p = options.presentation
    if shown.d3 is None or shown.full is None or not shown.d3.steps:
        return waiting("Press Generate: every head of the recorded layer, D3 beside full depth.", presentation=p)
    if not attention_captured(shown.full, options.layer):
        return waiting(f"Layer {options.layer} was not recorded in this run.<br>Press Generate to record it.",
                       presentation=p)
    return attention_overview(shown.d3, shown.full, layer=options.layer, presentation=p)


VIEW = View("heads", "Attention: all heads", EXPLAIN, needs="a run that recorded the chosen layer's attention",
            position=45, draw=draw, after_run=True)
