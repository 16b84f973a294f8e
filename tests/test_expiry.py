"""Sessions that are gone let go of what gradio keeps for them: forgotten after the session lifetime, bounded in
number."""

from __future__ import annotations

import datetime

import pytest

from explorer import expiry, page
from explorer.caps import Caps
from tests.apphelpers import RUN, new_client, serve, wait_until

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


def test_a_session_with_an_event_running_or_waiting_is_never_forgotten() -> None:
    """With D3_SESSION_TTL below a run's time, a session was forgotten while its own run streamed (gradio marks it
    used when the event starts): a session with an event running or queued stays, however long ago that was."""
    import threading
    from types import SimpleNamespace

    long_ago = datetime.datetime.now() - datetime.timedelta(hours=2)
    holder = SimpleNamespace(lock=threading.Lock(), time_last_used={s: long_ago for s in ("running", "queued", "idle")},
                             session_data={s: None for s in ("running", "queued", "idle")})
    queue = SimpleNamespace(pending_event_ids_session={"running": {"e1"}},
                            pending_messages_per_session={"running": [], "queued": []},
                            active_jobs=[[SimpleNamespace(session_hash="running")], None],
                            event_queue_per_concurrency_id={"model": SimpleNamespace(
                                queue=[SimpleNamespace(session_hash="queued")])})
    assert expiry.forget_idle_sessions(holder, 60, queue=queue) == 1
    assert sorted(holder.session_data) == ["queued", "running"]
    assert "running" in queue.pending_messages_per_session


def test_past_the_session_cap_a_busy_session_is_kept_and_an_idle_one_goes() -> None:
    import collections
    import threading
    from types import SimpleNamespace

    from gradio.state_holder import StateHolder

    holder = StateHolder()
    holder.capacity = 2
    holder.session_data = collections.OrderedDict((s, None) for s in ("running", "idle"))
    queue = SimpleNamespace(pending_event_ids_session={"running": {"e1"}}, active_jobs=[],
                            event_queue_per_concurrency_id={})
    expiry.evict_only_idle(holder, queue)
    holder.lock = threading.Lock()
    holder.session_data["new"] = None
    holder.update("new")  # gradio's own update would drop "running", the least recently used
    assert list(holder.session_data) == ["running", "new"]
