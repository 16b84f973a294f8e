"""The layer stack, animated: the model's layers as a stack for each D3 token, the path up through the layers that ran,
skipped layers grey, and where each skipped layer's key/value entry came from (viz/stack.py)."""

from __future__ import annotations

from explorer.views import Shown, View, waiting
from viz.stack import layer_stack

EXPLAIN = """**The model's layers as a stack, one D3 token at a time** (bottom: the first layer). Coloured boxes ran;
grey boxes were skipped. The line is the token's path up through the layers that ran. For each skipped layer an
arrow shows where its key/value entry came from: *copied* from the layer the arrow starts at, *propagated* (a dot),
or a masked *hole* (a cross). Purple bands are the core layers. Press **▶** to play the tokens in order, **❚❚**
to pause, or drag the slider to step one token at a time.

**What to look for:** the stack gets thinner from the middle as the answer goes on (the decay), while the
first and last layers always run. With a nested drop order, a skipped layer stays skipped for every later token."""


def draw(shown: Shown, options) -> object:
    if shown.d3 is None or not shown.d3.steps:
        return waiting("Press Generate: each D3 token's way up the layer stack is drawn here.",
                       presentation=options.presentation)
    streaming = shown.phase == "streaming"  # while streaming, the newest token alone: cheap to redraw
    return layer_stack(shown.d3, animate=not streaming, presentation=options.presentation)


VIEW = View("stack", "Layer stack (animated)", EXPLAIN, needs="a run's D3 trace (what ran and how each skip was filled)",
            position=15, draw=draw, after_run=True, live=True)
