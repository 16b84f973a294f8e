"""One memory budget for what all sessions keep. A run's recorded attention is most of what a session holds (two
traces of [layers, heads, prompt + t] float16 weights per token: about 170 MB for a 480-token prompt on SmolLM2);
their sum over every live session is held under one server-wide budget (D3_SESSION_MEMORY_MIB). Past it the
least recently used sessions lose their runs' attention first (tokens, layers, history and every other view stay),
and the attention views of such a session say so when they are opened."""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from d3.trace import Comparison, Trace

# An explorer.session.Session, not imported: session -> runs -> pool -> here would make a circle (tests/test_layers.py).
Session = Any

DROPPED = "This run's attention was dropped to make room for other visitors' runs:<br>press Generate to record it again."
NEEDS_ATTENTION = ("attention", "heads")  # the views drawn from a run's recorded attention


def attention_bytes(trace: Trace | None) -> int:
    """Bytes of attention weights `trace` keeps."""
    if trace is None:
        return 0
    return sum(a.nbytes for s in trace.steps for a in s.attention.values())


def kept_bytes(session: Session) -> int:
    """The heavy part of what `session` keeps: its current run's recorded attention (the comparison's traces are
    the same objects as the run's, counted once)."""
    traces = {id(t): t for t in (session.d3, session.full, *_compared(session.comparison)) if t is not None}
    return sum(attention_bytes(t) for t in traces.values())


def _compared(comparison: Comparison | None) -> tuple[Trace, ...]:
    return () if comparison is None else (comparison.skip, comparison.full)


def _without_attention(trace: Trace) -> Trace:
    if not attention_bytes(trace):
        return trace
    return trace.with_steps(replace(s, attention={}) for s in trace.steps)


def drop_attention(session: Session) -> None:
    """Let go of the session's recorded attention (its traces keep everything else), and remember it was dropped."""
    lighter: dict[int, Trace] = {}

    def light(trace: Trace) -> Trace:
        return lighter.setdefault(id(trace), _without_attention(trace))

    session.d3 = light(session.d3) if session.d3 is not None else None
    session.full = light(session.full) if session.full is not None else None
    c = session.comparison
    if c is not None:
        session.comparison = replace(c, skip=light(c.skip), full=light(c.full))
    session.dropped = True


class SessionMemory:
    """What every live session keeps, against `budget_bytes`: `kept(session)` after a run counts it (and marks it
    the most recently used); past the budget, the least recently used idle sessions' attention goes first."""

    def __init__(self, budget_bytes: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.budget_bytes, self.clock = budget_bytes, clock
        self._sessions: dict[int, tuple[weakref.ref[Session], float, int]] = {}  # id -> (session, used, bytes)
        self._lock = threading.Lock()

    def total(self) -> int:
        with self._lock:
            return sum(size for ref, _, size in self._sessions.values() if ref() is not None)

    def touch(self, session: Session | None) -> None:
        """`session` was used (a view opened): the last to lose its attention."""
        if session is None:
            return
        with self._lock:
            ref, _, size = self._sessions.get(id(session), (weakref.ref(session), 0.0, 0))
            if ref() is session:
                self._sessions[id(session)] = (ref, self.clock(), size)

    def kept(self, session: Session) -> list[Session]:
        """Count what `session` keeps now; past the budget, drop the attention of the least recently used other
        sessions with no run going until the total fits. Returns those dropped."""
        size = kept_bytes(session)
        if size:
            session.dropped = False
        dropped: list[Session] = []
        with self._lock:
            self._sessions = {k: v for k, v in self._sessions.items() if v[0]() is not None}
            self._sessions[id(session)] = (weakref.ref(session), self.clock(), size)
            total = sum(s for _, _, s in self._sessions.values())
            for key, (ref, used, bytes_) in sorted(self._sessions.items(), key=lambda kv: kv[1][1]):
                other = ref()
                if total <= self.budget_bytes:
                    break
                if other is None or other is session or not bytes_ or other.running is not None:
                    continue
                dropped.append(other)
                self._sessions[key] = (ref, used, 0)
                total -= bytes_
        for other in dropped:
            drop_attention(other)
        return dropped


def dropped_view(session: Any, key: str) -> bool:
    """Whether view `key` of `session` would draw attention that was dropped to make room."""
    return key in NEEDS_ATTENTION and bool(getattr(session, "dropped", False))
