"""One memory budget for what all sessions keep (explorer.memory): past it the least recently used sessions lose
their runs' attention first, and their attention views say so when opened."""

from __future__ import annotations

import pytest

from explorer import live, memory, view_handlers
from explorer.caps import Caps
from explorer.controls import DEFAULTS as PAGE
from explorer.pool import ModelPool
from explorer.session import Session
from tests.apphelpers import DEFAULTS, tiny_factory

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"), pytest.mark.filterwarnings("ignore::UserWarning")]


def run(pool: ModelPool, session: Session) -> None:
    outputs = list(live.generate(pool, session, **DEFAULTS))
    assert "Done." in outputs[-1][1]


def test_past_the_budget_the_least_recently_used_sessions_lose_their_attention_first(tiny_engine) -> None:
    """Each live session kept 117-281 MiB of recorded attention, bounded only by the number of sessions: the sum
    over all sessions is now held under one budget."""
    pool = ModelPool(tiny_factory(tiny_engine), names=("tiny",), caps=Caps(max_new_tokens=8))
    first = Session()
    run(pool, first)
    size = memory.kept_bytes(first)
    assert size > 0 and pool.sessions.total() == size
    pool.sessions.budget_bytes = int(2.5 * size)  # room for two sessions' attention, not three
    second, third = Session(), Session()
    run(pool, second)
    assert memory.kept_bytes(first) == size  # two fit
    run(pool, third)
    assert memory.kept_bytes(first) == 0 and first.dropped  # the least recently used went first
    assert memory.kept_bytes(second) == size and memory.kept_bytes(third) == size
    assert pool.sessions.total() <= pool.sessions.budget_bytes
    assert first.d3 is not None and first.d3.steps and first.history  # its tokens, layers and history stay
    if first.comparison is not None:
        assert memory.attention_bytes(first.comparison.skip) == 0


def test_a_view_of_dropped_attention_says_so_when_opened(tiny_engine) -> None:
    pool = ModelPool(tiny_factory(tiny_engine), names=("tiny",), caps=Caps(max_new_tokens=8))
    session = Session(view="decay")
    run(pool, session)
    memory.drop_attention(session)
    for key in memory.NEEDS_ATTENTION:
        session.stale.add(key)  # drawn when its tab opens
        figure = view_handlers.open_view.__wrapped__(pool, key, session, PAGE)
        said = " ".join(a.text for a in figure.layout.annotations).replace("<br>", " ")
        assert "attention was dropped" in said and "press Generate to record it again" in said, key
    run(pool, session)  # Generate records it again
    assert not session.dropped and memory.kept_bytes(session) > 0


def test_a_session_opening_a_view_is_the_last_to_lose_its_attention(tiny_engine) -> None:
    pool = ModelPool(tiny_factory(tiny_engine), names=("tiny",), caps=Caps(max_new_tokens=8))
    older, newer = Session(view="decay"), Session()
    run(pool, older)
    run(pool, newer)
    pool.sessions.touch(older)  # a person opened a view of the older run: now the most recently used
    pool.sessions.budget_bytes = int(2.5 * memory.kept_bytes(older))  # room for two of the three
    run(pool, Session())
    assert newer.dropped and not older.dropped
