"""Abandoned jobs are bounded: every run stops at the server's time limit, whether or not anyone reads its stream."""

from __future__ import annotations

import time

import gradio as gr
import httpx
import pytest

from explorer import live, sweep_tab
from explorer.caps import Caps
from explorer.page import build_demo
from explorer.pool import ModelPool
from explorer.session import Session
from tests.apphelpers import exports_in_tmp, new_client  # noqa: F401  (a fixture)
from tests.test_app import DEFAULTS, tiny_factory
from tests.test_app_client import RUN, CountingEngine, serve, wait_until
from tests.test_robustness import api_defaults
from tests.tiny import tiny_llama, tiny_tokenizer

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"),
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
    started = time.perf_counter()
    outputs = list(live.generate(pool, session, **{**DEFAULTS, "max_new_tokens": 60}))
    assert time.perf_counter() - started < 4  # 60 tokens x 2 panes x 50 ms would take 6 s and more
    status = outputs[-1][1]
    assert "Stopped." in status and "time limit of 1 s" in status and len(session.d3.steps) < 60
    fills = list(live.compare_fills(pool, Session(), **{**DEFAULTS, "max_new_tokens": 60, "drop_order": "strided"}))
    assert "Stopped." in fills[-1][1] and "time limit of 1 s" in fills[-1][1]


def test_a_sweep_stops_at_the_time_limit(tiny_engine) -> None:
    pool = ModelPool(tiny_factory(tiny_engine), names=("tiny",), caps=Caps(max_new_tokens=64, max_run_s=0))
    out = sweep_tab.run_sweep(pool, "tiny", True, "hello there", ["d3_85"], 4, progress=lambda *a, **k: None)
    assert "time limit of 0 s" in out[sweep_tab.SWEEP_OUTPUTS.index("sweep_note")]


def test_a_sweep_stops_within_a_token_of_the_time_limit() -> None:
    """One run of this sweep (24 tokens x 250 ms) outlasts the limit: checked as each run starts, the sweep
    overran by most of a run (on a busy server, seconds); checked before every token, it stops within one step."""
    engine = CountingEngine(tiny_llama(6), tiny_tokenizer(), name="tiny", delay=0.25)
    pool = ModelPool(tiny_factory(engine), names=("tiny",), caps=LIMIT)
    started = time.perf_counter()
    out = sweep_tab.run_sweep(pool, "tiny", True, "hello there", ["d3_85"], 24, progress=lambda *a, **k: None)
    assert "Stopped: the sweep reached its time limit of 1 s" in out[sweep_tab.SWEEP_OUTPUTS.index("sweep_note")]
    elapsed = time.perf_counter() - started
    assert elapsed < LIMIT.max_run_s + 1.0 and engine.steps < 10, (elapsed, engine.steps)


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
        time.sleep(2.5)
        steps = slow_engine.steps
        time.sleep(1.0)
        assert slow_engine.steps == steps  # nothing decodes for the abandoned job any more
        slow_engine.delay = 0.0
        final = new_client(url).predict(**{**RUN, "max_new_tokens": 2}, api_name="/generate")
    assert "Done." in final[0]  # the next person's run went through
