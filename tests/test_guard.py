"""What a visitor can send the served page: bounded uploads and bodies, no private or missing event reachable by
name or index, no traceback and no copy of the values in the log."""

from __future__ import annotations

import logging
from pathlib import Path

import httpx
import pytest

from explorer import page
from explorer.caps import Caps
from explorer.guard import BoundedRecords
from tests.apphelpers import new_client
from tests.apphelpers import RUN, CountingEngine, serve
from tests.tiny import tiny_llama, tiny_tokenizer

pytestmark = [pytest.mark.usefixtures("exports_in_tmp"), pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::UserWarning")]
MB = 1_000_000


@pytest.fixture(scope="module")
def served():
    engine = CountingEngine(tiny_llama(6), tiny_tokenizer(), name="tiny")
    demo = page.build_demo(lambda name: engine, model_names=("tiny",), public=True, caps=Caps(max_new_tokens=8))
    with serve(demo) as url:
        yield demo, url


def files_over(folder: Path, size: int) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file() and p.stat().st_size >= size]


def test_a_10_mb_upload_is_refused_and_nothing_is_written(served) -> None:
    _, url = served
    answer = httpx.post(f"{url}gradio_api/upload", files={"files": ("x.bin", b"0" * (10 * MB))}, timeout=60)
    assert answer.status_code == 413 and "maximum allowed size" in answer.text
    import os

    assert files_over(Path(os.environ["GRADIO_TEMP_DIR"]), MB) == []


def _join(url: str, fn_index, data) -> httpx.Response:
    return httpx.post(f"{url}gradio_api/queue/join", timeout=30,
                      json={"data": data, "fn_index": fn_index, "session_hash": "probe", "event_data": None})


def test_events_no_client_may_call_answer_one_line_and_the_log_stays_quiet(served, capfd) -> None:
    demo, url = served
    capfd.readouterr()
    private = next(fn for fn in demo.fns.values() if fn.api_visibility == "private" and fn.fn is not None)
    js_only = next(fn for fn in demo.fns.values() if fn.fn is None)
    generate = next(fn for fn in demo.fns.values() if fn.api_name == "generate")
    answers = {
        "js-only by name": httpx.post(f"{url}gradio_api/call/{js_only.api_name}", json={"data": []}, timeout=30),
        "private by name": httpx.post(f"{url}gradio_api/call/{private.api_name}", json={"data": []}, timeout=30),
        "fn_index 999": _join(url, 999, []),
        "fn_index -1": _join(url, -1, []),
        "js-only by index": _join(url, js_only._id, []),
        "wrong count by name": httpx.post(f"{url}gradio_api/call/generate", json={"data": [1, 2]}, timeout=30),
        "wrong count by index": _join(url, generate._id, ["x" * 1000] * 3),
        "2 MB of values": httpx.post(f"{url}gradio_api/call/generate", json={"data": ["x" * (2 * MB)]}, timeout=30),
        "not JSON": httpx.post(f"{url}gradio_api/queue/join", content=b"{", timeout=30),
    }
    statuses = {what: a.status_code for what, a in answers.items()}
    assert statuses == {"js-only by name": 404, "private by name": 404, "fn_index 999": 404, "fn_index -1": 404,
                        "js-only by index": 404, "wrong count by name": 422, "wrong count by index": 422,
                        "2 MB of values": 413, "not JSON": 422}
    assert all(len(a.text) < 200 and "\n" not in a.text for a in answers.values())
    log = "".join(capfd.readouterr())
    assert "Traceback" not in log and "xxxxxxxxxx" not in log and len(log) < 2000, log[:2000]


def test_the_public_api_and_the_pages_own_calls_still_go_through(served) -> None:
    demo, url = served
    final = new_client(url).predict(**{**RUN, "max_new_tokens": 2}, api_name="/generate")
    assert "Done." in final[0]
    session = next(fn for fn in demo.fns.values() if fn.api_name == "new_session")  # the page calls it by index
    answer = httpx.post(f"{url}gradio_api/run/predict", timeout=30,
                        json={"data": [], "fn_index": session._id, "session_hash": "probe", "event_data": None})
    assert answer.status_code == 200


def test_a_log_record_is_cut_to_a_bounded_length() -> None:
    record = logging.LogRecord("x", logging.ERROR, __file__, 1, "received %s", ("y" * (2 * MB),), None)
    assert BoundedRecords(4000).filter(record)
    assert len(record.getMessage()) < 4100 and "characters cut" in record.getMessage()
