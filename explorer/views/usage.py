"""Per-token layer usage: one row per D3 token, one column per layer (ran, skipped, and how each skipped entry was filled)."""

from __future__ import annotations

from explorer.views import Shown, View, usage_view

KEY = "usage"
EXPLAIN = """**One row per generated token, one column per decoder layer.**
Blue cells ran. Every other cell was skipped, and its colour says what went into its key/value entry instead:
orange, a *copy* of a lower layer's entry (the default fill), green, *propagate*, red, a masked *hole* (fill
*none*); grey, nothing (no entry written). The purple bands are the **core** layers, which always run.

**What to look for:** the blue part of each row shrinks as the response goes on, and the skipped (orange, with
the default fill) block in the middle widens: later tokens run fewer layers. That is the depth decay. Every row
still spans all the layers, because every skipped layer gets an entry. Hover over a cell to see what happened to it."""

def draw(shown: Shown, options) -> object:
    return usage_view(shown.d3, presentation=options.presentation)


VIEW = View(KEY, "Per-token layer usage", EXPLAIN, needs="a run's D3 trace", position=10, draw=draw, after_run=True, live=True)
