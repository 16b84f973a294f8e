"""The decay curve beside the panes: each token's layer budget under the controls, and what the last run ran."""

from __future__ import annotations

from explorer.views import View

KEY = "decay"
EXPLAIN = """**How many layers token *i* gets:** `floor(L · α^i)`, never below the core floor (head + tail).
The dashed line is the formula alone. The thick line is the planned budget, and the dots are what each token
actually ran. Other strategies' schedules are drawn on the same axes.

**What to look for:** α close to 1 decays slowly. Moving the α or core sliders redraws this at once,
without running the model. Letting go of a slider runs the model again."""


VIEW = View(KEY, "Decay curve", EXPLAIN, needs="the controls alone (a run adds its tokens)", position=0, tab=False)
