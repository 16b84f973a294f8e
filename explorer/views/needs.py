"""What each token needs: the oracle depth of full depth's answer against D3's budget (handlers in explorer/needs.py)."""

from __future__ import annotations

from explorer.needs import cold_view, needs_controls, redraw_needs
from explorer.views import View

EXPLAIN = """**The depth each token of the full-depth answer really needs** (the *oracle*): the smallest D3
budget, with the same core and drop order, whose top-1 token is still full depth's, with every earlier token at
full depth. Dots are tokens; red crosses need more layers than D3 gives them at the current α. Hollow dots: the
*logit lens*, after how many layers the final token is already on top and stays there.
**Fit α to this prompt** sets α to the fastest decay that under-serves at most 10% of these tokens.

**What to look for:** D3 assumes that later tokens need fewer layers. If the dots do not fall to the right, the
decay cuts layers that these tokens need. Measuring runs every budget for every token: about a minute."""


VIEW = View("needs", "What each token needs", EXPLAIN, needs="its own measurement (Measure), not a run", position=70,
            empty=lambda presentation: cold_view(presentation=presentation), controls=lambda ui, facts: needs_controls(ui),
            measured=True, redraw=redraw_needs, first="press “Measure what each token needs” in its tab first.")
