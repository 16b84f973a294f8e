"""Fair slots: what one visitor may hold of the queue. Generations keep `D3_CONCURRENCY` slots of their own; the
heavy measurements (which layers matter, what each token needs, fit α, the fill comparison, the sweep) share
`heavy_slots` apart, so no visitor's first token waits behind a measurement, whatever its model. A visitor's newer
measurement replaces their older one still waiting (a newer generation already stops the older, `Session`), and
in public mode one address has at most `D3_EVENTS_PER_ADDRESS` events running or waiting (the guard refuses more).

Admission (public mode): a run or measurement whose wait for a slot would pass `D3_MAX_WAIT_S` is refused when it is
asked for, with a message that says how long it would wait and when to try again, instead of waiting minutes in the
queue (a class of 30 on a 2-core server cannot all run at once). The wait is estimated from the events running and
waiting in its group and the mean time the group's last events took in their slot (`Timings`, measured)."""

from __future__ import annotations

import collections
import functools
import inspect
import math
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import gradio as gr
from gradio.context import LocalContext

RUNS = "model"  # generations (and their scenario runs): `Caps.concurrency` slots
HEAVY = "heavy"  # measurements: `heavy_slots` slots, apart from the runs'
GROUPS = (RUNS, HEAVY)
REPLACED = "replaced by your newer request of the same kind"
FIRST_GUESS_S = 30.0  # what an event is taken to hold its slot before any of its group has ended (then: measured)
RECENT = 16  # the last events of a group whose times make its estimate


def heavy_slots(concurrency: int) -> int:
    """Slots for heavy measurements: half the runs' (at least one)."""
    return max(1, concurrency // 2)


def _event(queue: Any, event_id: str) -> Any:
    for jobs in list(queue.active_jobs):
        for event in jobs or ():
            if event._id == event_id:
                return event
    return None


def newer_waiting(queue: Any, event_id: str | None) -> bool:
    """Whether a newer event of the same session waits in the queue of the same group as event `event_id`."""
    event = _event(queue, event_id) if queue is not None and event_id is not None else None
    if event is None:
        return False
    waiting = queue.event_queue_per_concurrency_id.get(event.concurrency_id)
    return waiting is not None and any(e.session_hash == event.session_hash and e.enqueue_time > event.enqueue_time
                                       for e in list(waiting.queue))


def superseded() -> bool:
    """Inside a queued event's handler: a newer event of this visitor waits behind it (it is replaced)."""
    blocks = LocalContext.blocks.get(None)
    return newer_waiting(getattr(blocks, "_queue", None), LocalContext.event_id.get(None))


def replaced_by_newer(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn`, which does nothing (the API caller is told why) when a newer event of its visitor waits behind it."""
    if inspect.isgeneratorfunction(fn) or inspect.isgeneratorfunction(getattr(fn, "func", None)):
        @functools.wraps(fn)
        def stream(*args: Any, **kwargs: Any) -> Iterator[Any]:
            if superseded():
                raise gr.Error(REPLACED, visible=False, print_exception=False)
            yield from fn(*args, **kwargs)

        return stream

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        if superseded():
            raise gr.Error(REPLACED, visible=False, print_exception=False)
        return fn(*args, **kwargs)

    return call


def crowded(queue: Any, host: str, limit: int) -> str | None:
    """Why address `host` may not queue one more run or measurement (it has `limit` running or waiting), else
    None."""
    if queue is None or not host:
        return None
    events = [e for jobs in list(queue.active_jobs) for e in jobs or ()]
    events += [e for group in GROUPS if (q := queue.event_queue_per_concurrency_id.get(group)) for e in list(q.queue)]
    held = sum(e.concurrency_id in GROUPS and _host(e) == host for e in events)
    if held < limit:
        return None
    return (f"at most {limit} runs and measurements per address at once, running or waiting: wait for one to end "
            "or stop it")


def _host(event: Any) -> str:
    client = getattr(getattr(event, "request", None), "client", None)
    return getattr(client, "host", "") or ""


class Timings:
    """How long the last `RECENT` events of each group held their slot, measured around the queue's own processing
    of each event (`install`); `typical(group)` is their mean (what a sum of waits adds up to), `FIRST_GUESS_S`
    before any has ended."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.taken: dict[str, collections.deque[float]] = {}
        self._lock = threading.Lock()

    def add(self, group: str, seconds: float) -> None:
        with self._lock:
            self.taken.setdefault(group, collections.deque(maxlen=RECENT)).append(max(0.0, seconds))

    def typical(self, group: str) -> float:
        with self._lock:
            taken = list(self.taken.get(group, ()))
        return sum(taken) / len(taken) if taken else FIRST_GUESS_S

    def install(self, queue: Any) -> None:
        """Time each event `queue` processes, from the moment it takes a slot until it lets it go (once per queue)."""
        if getattr(queue, "_d3_timings", None) is self:
            return
        original = queue.process_events

        async def timed(events: list[Any], *args: Any, **kwargs: Any) -> Any:
            started = self.clock()
            try:
                return await original(events, *args, **kwargs)
            finally:
                if events:
                    self.add(getattr(events[0], "concurrency_id", ""), self.clock() - started)

        queue.process_events = timed
        queue._d3_timings = self


def expected_wait(queue: Any, group: str, timings: Timings) -> tuple[int, float]:
    """(events ahead, seconds) a new event of `group` would wait for a slot: the events running and waiting in its
    group past its free slots, each taken to hold a slot its group's typical time, `slots` of them at once."""
    events = queue.event_queue_per_concurrency_id.get(group) if queue is not None else None
    if events is None or not events.concurrency_limit:
        return 0, 0.0
    ahead = int(events.current_concurrency) + len(events.queue)
    before_a_slot = ahead + 1 - events.concurrency_limit  # events that must end before a slot is this one's
    return ahead, max(0, before_a_slot) * timings.typical(group) / events.concurrency_limit


def too_long(queue: Any, group: str, timings: Timings, bound_s: float) -> tuple[str, int] | None:
    """(why, seconds to wait before trying again) when a new event of `group` would wait more than `bound_s` for a
    slot, else None."""
    ahead, wait = expected_wait(queue, group, timings)
    if wait <= bound_s:
        return None
    retry = max(5, math.ceil(wait - bound_s + timings.typical(group) / 2))
    kind = "runs" if group == RUNS else "measurements"
    return (f"The server is busy: {ahead} {kind} are running or waiting ahead of yours, about {wait:.0f} s of waiting "
            f"(this server queues at most {bound_s:g} s). Nothing was queued: try again in about {retry} s."), retry
