"""Gradio glue the handlers share: a person's mistake as a readable gr.Error, and outputs in a fixed order."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

import gradio as gr
from gradio.context import LocalContext

from d3.config import max_core_side
from d3.research import ShouldStop, Stopped
from explorer.controls import both_words
from explorer.deadline import Deadline

log = logging.getLogger("d3.app")


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """A person's mistake (ValueError) becomes a clear gr.Error naming each field as the page labels it and as the
    API calls it (`both_words`: the same toast reaches both); anything else is logged, never shown as a trace."""
    try:
        yield
    except gr.Error:
        raise
    except ValueError as err:
        raise gr.Error(both_words(str(err)), print_exception=False) from None
    except Exception:
        log.exception("handler failed")
        raise gr.Error("Something went wrong on the server (the details are in its log). The app is still "
                       "running: try again, perhaps with a shorter prompt or fewer tokens.", print_exception=False) from None


def caller_gone() -> bool:
    """Inside a queued event's handler: True once its caller has gone (the tab closed, the client dropped the
    stream): gradio then marks the event not alive, and only a generator's next step would notice. False outside
    an event (a direct call)."""
    return caller_check()()


def caller_check() -> Callable[[], bool]:
    """`caller_gone` for the event running now, callable later from any thread (a worker thread, a generator's
    later step): the event is found now, its state read at each call."""
    blocks, event_id = LocalContext.blocks.get(None), LocalContext.event_id.get(None)
    queue = getattr(blocks, "_queue", None)
    if queue is None or event_id is None:
        return _never

    def gone() -> bool:
        for events in list(queue.active_jobs):
            for event in events or ():
                if event._id == event_id:
                    return not event.alive
        return False

    return gone


def _never() -> bool:
    return False


@contextlib.contextmanager
def within_limit(limit_s: float, what: str) -> Iterator[ShouldStop]:
    """A `should_stop()` for a measurement: true past `limit_s` seconds from now or once the caller has gone. A
    measurement stopped by it (`d3.research.Stopped`) becomes a person's message naming the limit."""
    deadline = Deadline(limit_s)  # a step that would end past the limit is not started
    try:
        yield lambda: deadline.passed() or caller_gone()
    except Stopped:
        why = "its caller left" if caller_gone() else f"it reached the server's time limit of {limit_s:g} s"
        raise ValueError(f"{what} stopped: {why}; try a shorter prompt or fewer tokens") from None


def refused(err: Exception) -> gr.Error:
    """A run refused for a person's mistake: the page already shows why in its status line, so the toast is
    hidden; an API caller still gets the error and its message."""
    return gr.Error(str(err), visible=False, print_exception=False)


def slider_range(top: int) -> dict[str, Any]:
    """Keyword arguments for a slider from 0 to `top` (a layer or head index): Gradio refuses a slider whose maximum
    is not above its minimum, so a model with one layer or one head gets a slider to 1 that cannot be moved."""
    return {"maximum": max(top, 1), "interactive": top > 0}


def core_sliders(num_layers: int, head: int, tail: int) -> dict[str, Any]:
    """Both core sliders set to (head, tail), each one's maximum computed from the other's new value so that
    head + tail stays below the model's layers: whatever sets the core (a model switch, a link, a scenario, a sweep
    row) sets both bounds with it, and only a person's own move re-bounds the other slider (`bound_core`)."""
    return {"core_head": gr.update(**slider_range(max_core_side(tail, num_layers)), value=head),
            "core_tail": gr.update(**slider_range(max_core_side(head, num_layers)), value=tail)}


def ordered(names: tuple[str, ...], **values: Any) -> tuple[Any, ...]:
    """Handler outputs in `names` order; names not given are left as they are (gr.skip())."""
    return tuple(values[n] if n in values else gr.skip() for n in names)


def model_queue(concurrency: int) -> dict[str, Any]:
    """Event settings of a button that measures with the model: in the heavy measurements' queue, apart from the
    generations' slots (explorer.fair), once per click, raw inputs."""
    from explorer.fair import HEAVY, heavy_slots

    return dict(concurrency_id=HEAVY, concurrency_limit=heavy_slots(concurrency), preprocess=False,
                trigger_mode="once")

