"""The token scrubber: one token at a time, its layers and its top tokens (handlers in explorer/explain.py)."""

from __future__ import annotations

from explorer.explain import scrub_controls
from explorer.views import View

EXPLAIN = """**One token at a time.** Pick a generated token with the slider, or press **Play** to step through
them in order. Left: the layers it ran (blue), skipped (grey), and where each skipped layer's key/value
entry came from (copied from which layer, propagated, or a masked hole). Right: its top 5 next tokens under D3 and
at full depth. Full depth is shown only while it had written the same text so far, since after a divergence
it answers a different context.

**What to look for:** tokens where D3's top choice is close to full depth's even with many layers skipped, and
the token where the two first part ways."""


VIEW = View("scrub", "Token scrubber", EXPLAIN, needs="a run (drawn while its tab is open)", position=100,
            controls=lambda ui, facts: scrub_controls(ui), plot=False, ready=lambda s: s.d3 is not None and s.d3.steps)
