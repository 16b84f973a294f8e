"""A person's moves of the controls, wired so that each move starts one event.

Several handlers follow one move (a slider's `.input` settles the controls and redraws the needs and layers views;
its `.release` also redraws the schedule and regenerates). Given as separate events on the same trigger, they fed
each other for minutes (issue 24): when gradio's page is asked for an `always_last` event that is still in flight,
it defers it, and once that event completes it dispatches the deferred *trigger* again, which re-runs every event
on it. Two such events in flight re-trigger each other, forever. So here every trigger gets exactly one event: the
triggers are grouped by the handlers that follow them, the group's first handler listens to them, and the others
follow it with `.then` (dispatched by the page one event at a time, so a deferred one re-runs only itself).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gradio as gr


@dataclass
class _Handler:
    fn: Callable[..., Any]
    inputs: list[Any]
    outputs: list[Any]
    api_name: str | bool
    after: Callable[[Any, bool], None] | None  # called with each event made for it (and whether it is the first)
    kwargs: dict[str, Any]
    events: list[Any] = field(default_factory=list)


class Moves:
    """Collects `on(triggers, handler)` for a person's moves; `wire()` makes the events, one per trigger."""

    def __init__(self) -> None:
        self._handlers: list[_Handler] = []
        self._triggers: dict[tuple[int, str], tuple[Any, list[int]]] = {}  # (block id, event) -> (trigger, handlers)
        self._wired = False

    def on(self, triggers: list[Any], fn: Callable[..., Any], inputs: list[Any], outputs: list[Any], *,
           api_name: str | bool = False, after: Callable[[Any, bool], None] | None = None, **kwargs: Any) -> None:
        """`fn` follows each of `triggers` (bound event methods such as `slider.input`); `after(event, first)` hangs
        further events on each event made for it. Handlers run in the order they were registered."""
        if self._wired:
            raise RuntimeError("Moves.on after wire(): register every move first")
        self._handlers.append(_Handler(fn, list(inputs), list(outputs), api_name, after, kwargs))
        for trigger in triggers:
            key = (trigger.__self__._id, trigger.event_name)
            self._triggers.setdefault(key, (trigger, []))[1].append(len(self._handlers) - 1)

    def wire(self) -> None:
        """One event per group of triggers that the same handlers follow; the group's other handlers after it."""
        self._wired = True
        groups: dict[tuple[int, ...], list[Any]] = {}
        for trigger, handlers in self._triggers.values():
            groups.setdefault(tuple(handlers), []).append(trigger)
        for handlers, triggers in groups.items():
            head, *rest = (self._handlers[k] for k in handlers)
            event = self._make(head, lambda h, **kw: gr.on(triggers, h.fn, h.inputs, h.outputs, **kw))  # noqa: B023 (called within this iteration)
            for handler in rest:
                self._make(handler, lambda h, **kw: event.then(h.fn, h.inputs, h.outputs, **kw))  # noqa: B023 (called within this iteration)

    @staticmethod
    def _make(handler: _Handler, make: Callable[..., Any]) -> Any:
        first = not handler.events
        event = make(handler, api_name=handler.api_name if first else False, trigger_mode="always_last",
                     **handler.kwargs)
        handler.events.append(event)
        if handler.after is not None:
            handler.after(event, first)
        return event
