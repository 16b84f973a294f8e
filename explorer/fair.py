"""Fair slots: what one visitor may hold of the queue. Generations keep `D3_CONCURRENCY` slots of their own; the
heavy measurements (which layers matter, what each token needs, fit α, the fill comparison, the sweep) share
`heavy_slots` apart, so no visitor's first token waits behind a measurement, whatever its model. A visitor's newer
measurement replaces their older one still waiting (a newer generation already stops the older, `Session`), and
in public mode one address has at most `D3_EVENTS_PER_ADDRESS` events running or waiting (the guard refuses more)."""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Iterator

import gradio as gr
from gradio.context import LocalContext

RUNS = "model"  # generations (and their scenario runs): `Caps.concurrency` slots
HEAVY = "heavy"  # measurements: `heavy_slots` slots, apart from the runs'
GROUPS = (RUNS, HEAVY)
REPLACED = "replaced by your newer request of the same kind"


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
