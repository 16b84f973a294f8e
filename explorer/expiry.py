"""Sessions that are gone let go of their memory: gradio keeps, per session, a copy of the page's configuration
and every gr.State value, and drops a session only beyond `state_session_capacity` (a State's own time_to_live
frees its value, never the session's copy of the page). A background task forgets every session unused for the
session lifetime, so memory follows the visitors of the last hour, not every visitor since the start."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
from typing import Any, AsyncIterator, Callable

log = logging.getLogger(__name__)
PRUNE_EVERY_S = 10.0


def forget_idle_sessions(state_holder: Any, ttl_s: float, now: datetime.datetime | None = None) -> int:
    """Drop every session of gradio's `state_holder` last used more than `ttl_s` seconds ago; how many went."""
    now = now or datetime.datetime.now()
    with state_holder.lock:
        idle = [sid for sid, used in list(state_holder.time_last_used.items())
                if (now - used).total_seconds() > ttl_s]
        for sid in idle:
            state_holder.time_last_used.pop(sid, None)
            session = state_holder.session_data.pop(sid, None)
            if session is not None:
                for component, value, _ in list(session.state_components):
                    component.delete_callback(value)
    if idle:
        log.info("forgot %d idle session(s)", len(idle))
    return len(idle)


def session_expiry(ttl_s: float, every_s: float | None = None) -> Callable[[Any], Any]:
    """A FastAPI lifespan (gradio chains it with its own) that runs `forget_idle_sessions` every `every_s`
    (default PRUNE_EVERY_S)."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        async def prune() -> None:
            while True:
                await asyncio.sleep(every_s or PRUNE_EVERY_S)
                try:
                    forget_idle_sessions(app.state_holder, ttl_s)
                except Exception:  # never let the task die: the next pass tries again
                    log.exception("forgetting idle sessions failed")

        task = asyncio.create_task(prune())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    return lifespan
