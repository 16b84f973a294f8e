"""The logit lens of the last run's D3 tokens (handlers in explorer/explain.py)."""

from __future__ import annotations

from explorer.explain import lens_switch
from explorer.views import View
from viz.lens import has_lens

EXPLAIN = """**What the model would say if it stopped after each layer** (the *logit lens*: the final norm and
the output head applied to the hidden state after that layer), for every D3 token of the last run.
One column per generated token, one row per layer. The colour is the probability of the token D3 finally
wrote. Grey hatched cells are layers that did not run for that token. The black line is the *prediction depth*:
the first layer from which the lens's top token is the final one and stays so.

**What to look for:** where the black line sits well below the grey cells, the skipped layers were not needed
for that token. Where it climbs into them, D3 cut layers that token was still using. The lens is recorded
during every run while the box above the view is ticked (the default); untick it for runs about 1.6x faster."""


VIEW = View("lens", "Logit lens", EXPLAIN, needs="a run that recorded the lens (drawn while its tab is open)",
            position=90, controls=lambda ui, facts: lens_switch(ui),
            ready=lambda s: s.d3 is not None and has_lens(s.d3),
            first="press Generate first (with “Record the logit lens” ticked).")
