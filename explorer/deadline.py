"""A run's time limit held within a margin: a step that would end past it is not started. Each check comes before
a step; the longest time between two checks so far (a step as measured on this machine, under its load, the
prefill among them) is what the next one is taken to need."""

from __future__ import annotations

import math
import time
from collections.abc import Callable


class Deadline:
    """`limit_s` seconds from now; `passed()` before each step: True once now plus the longest step measured so far
    would pass the limit (so a run ends before its limit, not one step after it)."""

    def __init__(self, limit_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.at = clock() + limit_s
        self.step_s = 0.0  # the longest time between two checks so far
        self._last = -math.inf
        self.reached = False  # whether a check found the limit reached (what stopped the run)

    def passed(self) -> bool:
        now = self.clock()
        if self._last > -math.inf:
            self.step_s = max(self.step_s, now - self._last)
        self._last = now
        self.reached = self.reached or now + self.step_s > self.at
        return self.reached
