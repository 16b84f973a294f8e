"""The time limit holds within a margin: a step that would end past it is not started (explorer.deadline)."""

from __future__ import annotations

from explorer.deadline import Deadline
from explorer.session import Session


def test_a_step_that_would_end_past_the_limit_is_not_started() -> None:
    """On a loaded machine Qwen runs ended 27-32 s after the 180 s limit (one long step begun just before it):
    the longest step measured so far is taken as what the next one needs."""
    now = [0.0]
    deadline = Deadline(180, clock=lambda: now[0])
    for t in (0.0, 27.0, *range(28, 154)):  # a 27 s first step (the prefill), then 1 s ones
        now[0] = t
        assert not deadline.passed()
    now[0] = 154.0  # 154 + 27 would end past 180: not started, although the limit is 26 s away
    assert deadline.passed() and deadline.reached and deadline.step_s == 27.0


def test_a_run_stops_before_its_limit_when_its_next_step_would_cross_it() -> None:
    now = [0.0]
    deadline = Deadline(10, clock=lambda: now[0])
    session = Session()
    run = session.begin()
    should_stop = session.stopper(run, deadline)
    stops = []
    for t in (0.0, 4.0, 5.0, 6.5):
        now[0] = t
        stops.append(should_stop())
    assert stops == [False, False, False, True]  # 6.5 + 4 > 10: the 4 s step is not started at 6.5
