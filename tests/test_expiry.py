"""Sessions that are gone let go of what gradio keeps for them: forgotten after the session lifetime, bounded in
number."""

from __future__ import annotations

import datetime

import pytest

from explorer import expiry, page
from explorer.caps import Caps
from tests.apphelpers import new_client
from tests.apphelpers import RUN, serve, wait_until

pytestmark = [pytest.mark.usefixtures("exports_in_tmp"), pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::UserWarning")]


def test_idle_sessions_are_forgotten_with_their_state(engine, monkeypatch) -> None:
    monkeypatch.setattr(expiry, "PRUNE_EVERY_S", 0.2)
    demo = page.build_demo(lambda name: engine, model_names=("tiny",), public=True,
                           caps=Caps(max_new_tokens=8, session_ttl_s=1))
    with serve(demo) as url:
        holder = demo.server_app.state_holder
        for _ in range(3):
            new_client(url).predict(**RUN, api_name="/generate")
        wait_until(lambda: not holder.session_data, timeout=60)  # all three gone, with their Session objects
        assert not holder.time_last_used
        queue = demo._queue  # and gradio's own entries for them in its queue, which it keeps for ever
        wait_until(lambda: not queue.pending_messages_per_session and not queue.pending_event_ids_session, timeout=60)
        final = new_client(url).predict(**RUN, api_name="/generate")  # and a new visitor is served as before
    assert "Done." in final[0]


def test_only_sessions_idle_past_the_lifetime_go(engine) -> None:
    demo = page.build_demo(lambda name: engine, model_names=("tiny",), public=True,
                           caps=Caps(max_new_tokens=8, session_ttl_s=3600))
    with serve(demo) as url:
        holder = demo.server_app.state_holder
        for _ in range(2):
            new_client(url).predict(**RUN, api_name="/generate")
        old, recent = list(holder.time_last_used)[:2]
        holder.time_last_used[old] -= datetime.timedelta(hours=2)
        assert expiry.forget_idle_sessions(holder, 3600) == 1
        assert list(holder.session_data) == [recent]


def test_sessions_are_bounded_in_number(engine) -> None:
    demo = page.build_demo(lambda name: engine, model_names=("tiny",), public=True,
                           caps=Caps(max_new_tokens=8, max_sessions=4))
    with serve(demo) as url:
        for _ in range(7):
            new_client(url).predict(**RUN, api_name="/generate")
        assert len(demo.server_app.state_holder.session_data) <= 4
