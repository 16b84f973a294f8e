"""Fair slots (explorer.fair): a visitor's first token waits behind no measurement, a newer measurement replaces
the visitor's older one still waiting, and one address holds a bounded share of the queue on a public server."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from explorer import fair, page
from explorer.caps import Caps
from explorer.guard import RequestGuard

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"), pytest.mark.filterwarnings("ignore::UserWarning")]
MEASUREMENTS = ("measure_layers", "measure_needs", "fit_alpha_to_prompt", "compare_fills", "run_sweep")


def test_measurements_take_slots_apart_from_the_generations(engine) -> None:
    """A visitor's generation and heavy measurement on the 28-layer model held both run slots and another visitor
    waited 201.6 s for a first token: measurements now share slots of their own, and the generations keep all
    D3_CONCURRENCY slots, so a first token waits behind generations only."""
    demo = page.build_demo(lambda name: engine, model_names=("tiny",), public=True, caps=Caps(concurrency=2))
    by_name = {fn.api_name: fn for fn in demo.fns.values()}
    runs = {fn.concurrency_id for name, fn in by_name.items() if str(name).startswith("generate")}
    assert runs == {fair.RUNS} and by_name["generate"].concurrency_limit == 2
    for name in MEASUREMENTS:
        assert by_name[name].concurrency_id == fair.HEAVY and by_name[name].concurrency_limit == 1, name


def event(session: str, at: float, group: str = fair.HEAVY, host: str = "10.0.0.1") -> SimpleNamespace:
    return SimpleNamespace(_id=f"{session}-{at}", session_hash=session, enqueue_time=at, concurrency_id=group,
                           request=SimpleNamespace(client=SimpleNamespace(host=host)))


def queue_of(active: list, waiting: list) -> SimpleNamespace:
    groups = {g: SimpleNamespace(queue=[e for e in waiting if e.concurrency_id == g]) for g in fair.GROUPS}
    return SimpleNamespace(active_jobs=[active, None], event_queue_per_concurrency_id=groups)


def test_a_newer_measurement_of_the_same_visitor_replaces_the_older_one_waiting() -> None:
    older, newer, other = event("a", 1.0), event("a", 2.0), event("b", 3.0)
    queue = queue_of([older], [newer, other])
    assert fair.newer_waiting(queue, older._id)  # a's newer one waits: the older does nothing when its turn comes
    assert not fair.newer_waiting(queue, newer._id)
    assert not fair.newer_waiting(queue_of([older], [other, event("a", 4.0, fair.RUNS)]), older._id)  # other kind


def test_one_address_holds_a_bounded_share_of_the_queue_in_public_mode() -> None:
    held = [event("a", 1.0), event("b", 2.0, fair.RUNS)]
    demo = SimpleNamespace(_queue=queue_of(held[:1], held[1:]))
    guard = RequestGuard(None, demo=demo, max_body=1000, events_per_address=2)  # type: ignore[arg-type]
    run = SimpleNamespace(concurrency_id=fair.RUNS)
    status, message = guard.crowded({"client": ("10.0.0.1", 5)}, run) or (0, "")
    assert status == 429 and "at most 2 runs and measurements per address" in message
    assert guard.crowded({"client": ("10.0.0.2", 5)}, run) is None  # another address
    assert guard.crowded({"client": ("10.0.0.1", 5)}, SimpleNamespace(concurrency_id="load")) is None
    assert RequestGuard(None, demo=demo, max_body=1000).crowded({"client": ("10.0.0.1", 5)}, run) is None  # type: ignore[arg-type]


def join(guard: RequestGuard, host: str = "10.0.0.1") -> tuple[int, dict[str, str], dict]:
    """The page's own join of the queue for event 0, through the guard: (status, headers, JSON body or {})."""
    import asyncio
    import json

    sent: list[dict] = []

    async def app(scope, receive, send) -> None:  # gradio, when the guard lets the join through
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    async def receive() -> dict:
        body = json.dumps({"fn_index": 0, "data": [], "session_hash": "s"}).encode()
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/gradio_api/queue/join", "query_string": b"",
             "client": (host, 1), "headers": []}
    guard.app = app
    asyncio.run(guard(scope, receive, send))
    headers = {k.decode(): v.decode() for k, v in sent[0]["headers"]}
    return sent[0]["status"], headers, json.loads(sent[1]["body"] or b"{}")


def test_a_run_that_would_wait_past_the_bound_is_refused_at_once_saying_when_to_retry() -> None:
    """30 students on a 2-core server: runs waited in the queue for 700 s and timed out. A run whose wait for a slot
    would pass D3_MAX_WAIT_S is now refused when it is asked for, with how long it would have waited and when to
    try again (and a Retry-After header); one that fits the bound is queued."""
    generate = SimpleNamespace(fn=lambda: None, inputs=[], concurrency_id=fair.RUNS, api_name="generate",
                               api_visibility="public")
    runs = SimpleNamespace(concurrency_limit=2, current_concurrency=2, queue=[object(), object()])
    async def process_events(*args) -> None:
        pass

    queue = SimpleNamespace(active_jobs=[], event_queue_per_concurrency_id={fair.RUNS: runs},
                            process_events=process_events)
    timings = fair.Timings()
    timings.add(fair.RUNS, 30.0)
    timings.add(fair.RUNS, 50.0)  # a run holds its slot 40 s, as measured
    demo = SimpleNamespace(_queue=queue, fns={0: generate})
    guard = RequestGuard(None, demo=demo, max_body=1000, max_wait_s=60, timings=timings)  # type: ignore[arg-type]

    assert join(guard)[0] == 200  # 4 ahead, 2 slots: 3 must end first, 3 x 40 s / 2 = 60 s, within the bound
    runs.queue.append(object())
    status, headers, body = join(guard)  # 5 ahead: 80 s
    assert status == 429 and headers["retry-after"] == "40"
    assert body["error"] == ("The server is busy: 5 runs are running or waiting ahead of yours, about 80 s of waiting "
                             "(this server queues at most 60 s). Nothing was queued: try again in about 40 s.")
    unbounded = RequestGuard(None, demo=demo, max_body=1000)  # type: ignore[arg-type]
    assert join(unbounded)[0] == 200  # not public: a run waits however long
    assert Caps.from_env({"D3_MAX_WAIT_S": "90"}).max_wait_s == 90 and Caps().max_wait_s == 60


def test_the_time_an_event_holds_its_slot_is_measured_around_the_queues_processing() -> None:
    import asyncio

    now = [100.0]

    async def process_events(events, batch, begin_time, fn) -> None:  # gradio's, standing in: 12 s in the slot
        now[0] += 12.0

    queue = SimpleNamespace(process_events=process_events)
    timings = fair.Timings(clock=lambda: now[0])
    assert timings.typical(fair.HEAVY) == fair.FIRST_GUESS_S  # nothing measured yet
    timings.install(queue)
    timings.install(queue)  # once per queue
    asyncio.run(queue.process_events([SimpleNamespace(concurrency_id=fair.HEAVY)], False, 0.0, None))
    assert timings.typical(fair.HEAVY) == 12.0 and timings.typical(fair.RUNS) == fair.FIRST_GUESS_S


def test_a_public_server_computes_with_one_torch_thread_unless_told_otherwise() -> None:
    """Torch's threads (one per core) left the page's own requests waiting while runs went on: a public server
    computes with one thread by default; D3_TORCH_THREADS still decides, and a private one keeps torch's default."""
    import gc

    import torch

    before = torch.get_num_threads()
    try:
        seen = []
        for env in ({"D3_PUBLIC": "1"}, {"D3_PUBLIC": "1", "D3_TORCH_THREADS": "2"}, {}):
            torch.set_num_threads(3)
            page.tune_process(env)
            seen.append(torch.get_num_threads())
        assert seen == [1, 2, 3]
    finally:
        torch.set_num_threads(before)
        gc.unfreeze()
