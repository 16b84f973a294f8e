"""The planned layer grid: which layers each future token will run under the controls, before any model runs."""

from __future__ import annotations

from explorer.views import View

KEY = "planned"
EXPLAIN = """**The schedule before any model runs:** which layers each future token *will* run
under the current controls. The middle (flex) layers are dropped first, in the chosen drop order.

**What to look for:** with *middle-out*, *top-down* or *bottom-up* each token's layers are a subset of the
previous token's layers (nested). With *strided* they are not, so a later token can read a layer that an
earlier token skipped."""


VIEW = View(KEY, "Planned layer grid", EXPLAIN, needs="the controls alone (drawn by the schedule preview)", position=20)
