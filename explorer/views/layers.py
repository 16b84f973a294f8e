"""Which layers matter: each flex layer dropped alone, and the calibrated order (handlers in explorer/layers_view.py)."""

from __future__ import annotations

from explorer.layers_view import layers_controls, layers_placeholder, redraw_layers
from explorer.views import View

EXPLAIN = """**Which flex layers can this model spare, on this prompt?** Each flex layer is dropped alone while
full depth's own answer is read back (teacher-forced: the prompt at full depth, the answer through the other
layers). Bars: the share of full depth's next tokens still on top; dots: the KL from full depth. The number on a
bar is its place in the **calibrated order**: greedily, the layer whose removal (on top of those already removed)
hurts least goes next. Below: tokens kept after dropping the first *k* layers of the calibrated order (green) and of
the order in use (orange, dashed; its first dropped layers are outlined above). **Use this order** sets the drop
order to the calibrated one.

**What to look for:** which layers D3 drops decides as much as how many. A layer that barely matters for prose
can carry arithmetic: measure on the kind of text you care about."""


VIEW = View("layers", "Which layers matter", EXPLAIN, needs="its own measurement (Measure), not a run", position=80,
            empty=lambda presentation: layers_placeholder(), controls=lambda ui, facts: layers_controls(ui),
            measured=True, redraw=redraw_layers, first="press “Measure which layers matter” in its tab first.")
