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
