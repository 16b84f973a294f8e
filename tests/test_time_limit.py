"""Abandoned jobs are bounded: every run stops at the server's time limit, whether or not anyone reads its stream."""

from __future__ import annotations

import re

import gradio as gr
import httpx
import pytest

from explorer import live, sweep_tab
from explorer.caps import Caps
from explorer.page import build_demo
from explorer.pool import ModelPool
from explorer.session import Session
from explorer.views import layers as layers_view
from explorer.views import needs
from tests.apphelpers import DEFAULTS, RUN, CountingEngine, api_defaults, new_client, serve, tiny_factory, wait_until
from tests.tiny import tiny_llama, tiny_tokenizer

pytestmark = [pytest.mark.usefixtures("exports_in_tmp"), pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::UserWarning")]
LIMIT = Caps(max_new_tokens=64, max_run_s=1)


@pytest.fixture
def slow_engine():
    engine = CountingEngine(tiny_llama(6), tiny_tokenizer(), name="tiny", delay=0.05)
    yield engine
    engine.delay = 0.0


def test_a_run_stops_at_the_time_limit_and_says_so(slow_engine) -> None:
    pool = ModelPool(tiny_factory(slow_engine), names=("tiny",), caps=LIMIT)
    session = Session()
    outputs = list(live.generate(pool, session, **{**DEFAULTS, "max_new_tokens": 60}))
    status = outputs[-1][1]
    assert "Stopped." in status and "time limit of 1 s" in status and len(session.d3.steps) < 60
    written = min(len(session.d3.steps), len(session.full.steps))  # what both panes wrote: what fits the limit
    assert f"after {written} of the 60 tokens asked" in status and f"ask for {written} tokens or fewer" in status
    fills = list(live.compare_fills(pool, Session(), **{**DEFAULTS, "max_new_tokens": 60, "drop_order": "strided"}))
    assert "Stopped." in fills[-1][1] and "time limit of 1 s" in fills[-1][1]


def test_the_time_limit_note_says_what_was_written_and_what_fits() -> None:
    note = live._time_limit_note(180, 54, 256, 38.4)
    assert note == ("This run reached the server's time limit of 180 s after 54 of the 256 tokens asked "
                    "(the first token came after 38 s: the prefill and any wait for another run): ask for 54 tokens "
                    "or fewer to see it finish.")
    assert "tokens/s" not in note  # one pace on screen: the counters' "tokens/s while decoding" (issue 40)
    assert "try a shorter prompt or a smaller model" in live._time_limit_note(180, 0, 64)  # not one token in time
    assert live._time_limit_note(180) == "This run reached the server's time limit of 180 s: try fewer tokens."


def test_a_sweep_stops_at_the_time_limit(tiny_engine) -> None:
    pool = ModelPool(tiny_factory(tiny_engine), names=("tiny",), caps=Caps(max_new_tokens=64, max_run_s=0))
    out = sweep_tab.run_sweep(pool, "tiny", True, "hello there", ["d3_85"], 4, progress=lambda *a, **k: None)
    assert "time limit of 0 s" in out[sweep_tab.SWEEP_OUTPUTS.index("sweep_note")]


def test_a_sweep_stops_within_a_token_of_the_time_limit() -> None:
    """One run of this sweep (24 tokens x 250 ms) outlasts the limit: checked as each run starts, the sweep
    overran by most of a run (on a busy server, seconds); checked before every token, it stops within one step."""
    engine = CountingEngine(tiny_llama(6), tiny_tokenizer(), name="tiny", delay=0.25)
    pool = ModelPool(tiny_factory(engine), names=("tiny",), caps=LIMIT)
    out = sweep_tab.run_sweep(pool, "tiny", True, "hello there", ["d3_85"], 24, progress=lambda *a, **k: None)
    assert "Stopped: the sweep reached its time limit of 1 s" in out[sweep_tab.SWEEP_OUTPUTS.index("sweep_note")]
    assert engine.steps < 10, engine.steps  # 1 s is 4 steps of 250 ms: it stopped within one, not after the run


def test_a_job_nobody_reads_frees_its_slot(slow_engine) -> None:
    """A POST whose result stream is never opened: on a server with one slot, it stops at the limit and the next
    person's run goes through."""
    demo = build_demo(lambda name: slow_engine, model_names=("tiny",), public=True,
                      caps=Caps(max_new_tokens=64, max_run_s=1, concurrency=1))
    with serve(demo) as url:
        defaults = api_defaults(new_client(url))["/generate"]
        values = {k: {**RUN, "max_new_tokens": 60}.get(k, v) for k, v in defaults.items()}
        posted = httpx.post(f"{url}gradio_api/call/generate", json={"data": list(values.values())}, timeout=30)
        posted.raise_for_status()  # ... and its event stream is never read
        wait_until(lambda: slow_engine.steps > 0, timeout=30)
        wait_until(lambda: slow_engine.closed > 0, timeout=60)  # the abandoned run stopped at the limit
        abandoned = slow_engine.steps
        slow_engine.delay = 0.0
        final = new_client(url).predict(**{**RUN, "max_new_tokens": 2}, api_name="/generate")
    # the next person's run went through (on a loaded machine it may itself reach the 1 s limit, after its tokens)
    assert "Done." in final[0] or re.search(r"\b[1-9]\d* D3 tokens", final[0]), final[0]
    assert abandoned < 60  # 60 tokens x 2 panes were asked for: it stopped long before (1 s is ~20 steps of 50 ms)


# ---------------------------------------------------------------- the measuring endpoints



MEASURING = {"measure_layers": lambda pool: layers_view.measure_layers(pool, None, **RUN_TINY),
             "measure_needs": lambda pool: needs.measure_needs(pool, None, **RUN_TINY),
             "fit_alpha_to_prompt": lambda pool: needs.fit_to_prompt(pool, None, **RUN_TINY)}
RUN_TINY = {**DEFAULTS, "max_new_tokens": 60, "core_head": 1, "core_tail": 1}


@pytest.mark.parametrize("endpoint", list(MEASURING))
def test_a_measuring_endpoint_stops_at_the_time_limit_and_says_so(slow_engine, endpoint) -> None:
    """With the limit already reached, the measurement stops at its first check, before any decoding step."""
    pool = ModelPool(tiny_factory(slow_engine), names=("tiny",), caps=Caps(max_new_tokens=64, max_run_s=0))
    with pytest.raises(gr.Error, match=r"stopped: it reached the server's time limit of 0 s"):
        MEASURING[endpoint](pool)
    assert slow_engine.steps == 0


@pytest.mark.parametrize("api_name", ["measure_needs", "measure_layers"])
def test_a_measurement_whose_caller_left_stops_and_frees_its_slot(slow_engine, api_name) -> None:
    """A caller that drops its stream: the measurement stops at its next step (long before its 60 tokens, and long
    before the server's limit), and the next person's run goes through on the server's one slot."""
    slow_engine.delay = 0.2
    demo = build_demo(lambda name: slow_engine, model_names=("tiny",), public=False,
                      caps=Caps(max_new_tokens=64, max_run_s=3600, concurrency=1))
    with serve(demo) as url:
        defaults = api_defaults(new_client(url))[f"/{api_name}"]
        values = {k: RUN_TINY.get(k, v) for k, v in defaults.items()}
        posted = httpx.post(f"{url}gradio_api/call/{api_name}", json={"data": list(values.values())}, timeout=30)
        event_id = posted.json()["event_id"]
        with httpx.stream("GET", f"{url}gradio_api/call/{api_name}/{event_id}", timeout=30):
            wait_until(lambda: slow_engine.steps > 0, timeout=60)
        # the stream is closed: the caller has gone
        wait_until(lambda: slow_engine.closed > 0, timeout=60)
        assert slow_engine.steps < 30  # a dozen at most: the 60-token answer was never finished
        slow_engine.delay = 0.0
        final = new_client(url).predict(**{**RUN, "max_new_tokens": 2}, api_name="/generate")
    assert "Done." in final[0]


def test_compare_fills_stops_within_one_step_once_its_caller_has_gone() -> None:
    """gradio never closes a generator whose caller left; it marks the event not alive. The fill comparison reads
    that before each step (as /measure_layers does), so it stops at the next step, not at the time limit."""
    from types import SimpleNamespace

    from gradio.context import LocalContext

    engine = CountingEngine(tiny_llama(6), tiny_tokenizer(), name="tiny")
    pool = ModelPool(tiny_factory(engine), names=("tiny",), caps=Caps(max_new_tokens=64))
    event = SimpleNamespace(_id="event-1", alive=True)
    blocks = SimpleNamespace(_queue=SimpleNamespace(active_jobs=[[event]]))
    tokens = {"blocks": LocalContext.blocks.set(blocks), "event_id": LocalContext.event_id.set("event-1")}
    try:
        run = live.compare_fills(pool, Session(), **{**DEFAULTS, "max_new_tokens": 40, "drop_order": "strided"})
        next(run)  # the first status line: nothing has run yet
        event.alive = False  # the caller closed its tab
        outputs = list(run)
    finally:
        LocalContext.blocks.reset(tokens["blocks"])
        LocalContext.event_id.reset(tokens["event_id"])
    assert "Stopped." in outputs[-1][1] and "time limit" not in outputs[-1][1]
    assert engine.steps <= 1, engine.steps  # the full-depth run alone is 40 steps


def test_a_step_whose_time_limit_passed_while_it_waited_for_the_engine_is_not_computed(tiny_engine) -> None:
    """On a busy server a step waits for the engine (another run's steps, a comparison's full pass): the deadline
    is read once the engine is free, so a run whose time ran out meanwhile computes nothing more, not even its
    prompt's prefill (step 0). The clock is a fake one, moved on while the engine is held."""
    import threading

    from d3.config import FullConfig, GenerationConfig

    now = [0.0]
    deadline = 10.0
    asked, results = threading.Event(), []

    def should_stop() -> bool:
        asked.set()
        return now[0] > deadline

    def run() -> None:
        results.extend(tiny_engine.stream("hello there", FullConfig(), GenerationConfig(max_new_tokens=8),
                                          should_stop=should_stop))

    with tiny_engine.lock:  # another user's pass holds the engine
        worker = threading.Thread(target=run)
        worker.start()
        asked.wait(0.5)  # before the fix the run asked first, then waited here
        now[0] = deadline + 1  # the time limit passes while it waits
    worker.join(60)
    assert results == []  # not one step computed after the deadline


def test_the_comparisons_full_pass_is_skipped_when_the_time_limit_passed_while_it_waited(tiny_engine) -> None:
    """The comparison after the tokens ends with one full-depth pass over the prompt and D3's text (compare passes
    its should_stop): a deadline that passed while that pass waited for the engine skips it (None)."""
    import threading

    now, results = [0.0], []
    asked = threading.Event()

    def should_stop() -> bool:
        asked.set()
        return now[0] > 10.0

    def run() -> None:
        results.append(tiny_engine.full_depth_logprobs("hello there", [5, 6, 7], should_stop=should_stop))

    with tiny_engine.lock:
        worker = threading.Thread(target=run)
        worker.start()
        asked.wait(0.5)
        now[0] = 11.0
    worker.join(60)
    assert results == [None]
    assert tiny_engine.full_depth_logprobs("hello there", [5, 6, 7]).shape[0] == 3  # no should_stop: as before
