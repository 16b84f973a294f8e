"""Sessions that are gone let go of their memory: gradio keeps, per session, a copy of the page's configuration
and every gr.State value, and drops a session only beyond `state_session_capacity` (a State's own time_to_live
frees its value, never the session's copy of the page). A background task forgets every session unused for the
session lifetime, with its entries in gradio's queue (a message queue and an event list per session, which gradio
keeps for ever), so memory follows the visitors of the last hour, not every visitor since the start. What they held
is then handed back to the system: glibc keeps freed memory in its per-thread arenas (gradio runs handlers on many
threads), and the server's RSS stayed where the visitors had taken it (scripts/session_memory.py)."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import datetime
import gc
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

log = logging.getLogger(__name__)
PRUNE_EVERY_S = 10.0


def forget_idle_sessions(state_holder: Any, ttl_s: float, now: datetime.datetime | None = None,
                         queue: Any = None) -> int:
    """Drop every session of gradio's `state_holder` last used more than `ttl_s` seconds ago, and its entries in
    gradio's `queue`; how many went. A session with an event running or waiting in the queue is never dropped
    (gradio marks a session used when its event starts, not while it streams: a run longer than the lifetime
    would lose its session mid-run). Memory freed is handed back (`give_back`)."""
    now = now or datetime.datetime.now()
    busy = busy_sessions(queue) if queue is not None else set()
    with state_holder.lock:
        idle = [sid for sid, used in list(state_holder.time_last_used.items())
                if (now - used).total_seconds() > ttl_s and sid not in busy]
        for sid in idle:
            state_holder.time_last_used.pop(sid, None)
            session = state_holder.session_data.pop(sid, None)
            if session is not None:
                for component, value, _ in list(session.state_components):
                    component.delete_callback(value)
    if queue is not None:
        for sid in idle:
            forget_in_queue(queue, sid)
    if idle:
        log.info("forgot %d idle session(s)", len(idle))
        give_back()
    return len(idle)


def busy_sessions(queue: Any) -> set[str]:
    """The sessions with an event running or waiting in gradio's `queue`."""
    busy = {sid for sid, ids in list(queue.pending_event_ids_session.items()) if ids}
    for jobs in list(queue.active_jobs):
        busy.update(event.session_hash for event in jobs or ())
    for events in list(queue.event_queue_per_concurrency_id.values()):
        busy.update(event.session_hash for event in list(events.queue))
    return busy


def evict_only_idle(state_holder: Any, queue: Any) -> None:
    """Beyond its capacity gradio drops the least recently used session, even one whose event runs or waits: make
    it drop the least recently used session that has none (the newest session is kept over capacity if every
    other one is busy: bounded by the queue's size and the running events)."""
    def update(session_id: str) -> None:
        with state_holder.lock:
            data = state_holder.session_data
            if session_id in data:
                data.move_to_end(session_id)
            if len(data) > state_holder.capacity:
                busy = busy_sessions(queue) | {session_id}
                evicted = next((sid for sid in data if sid not in busy), None)
                if evicted is not None:
                    data.pop(evicted)
                    state_holder.time_last_used.pop(evicted, None)

    state_holder.update = update


def forget_in_queue(queue: Any, session_hash: str) -> None:
    """gradio's per-session entries in its queue (a message queue, the session's event ids), unless an event of the
    session is still pending: gradio makes them on a session's first event and never drops them."""
    if queue.pending_event_ids_session.get(session_hash):
        return
    queue.pending_event_ids_session.pop(session_hash, None)
    queue.pending_messages_per_session.pop(session_hash, None)


def give_back() -> None:
    """Collect what the forgotten sessions held and hand glibc's free memory back to the system (malloc_trim;
    nothing where the C library has none)."""
    gc.collect()
    trim = getattr(_libc(), "malloc_trim", None)
    if trim is not None:
        trim(0)


def _libc() -> Any:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name) if name else None
    except OSError:
        return None


def session_expiry(ttl_s: float, every_s: float | None = None) -> Callable[[Any], Any]:
    """A FastAPI lifespan (gradio chains it with its own) that runs `forget_idle_sessions` every `every_s`
    (default PRUNE_EVERY_S)."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        async def prune() -> None:
            while True:
                await asyncio.sleep(every_s or PRUNE_EVERY_S)
                try:
                    forget_idle_sessions(app.state_holder, ttl_s, queue=getattr(app.get_blocks(), "_queue", None))
                except Exception:  # never let the task die: the next pass tries again
                    log.exception("forgetting idle sessions failed")

        queue = getattr(app.get_blocks(), "_queue", None)
        if queue is not None:
            evict_only_idle(app.state_holder, queue)
        task = asyncio.create_task(prune())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    return lifespan
