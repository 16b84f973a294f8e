"""What a visitor can send the served page: bounded uploads and bodies, no private or missing event reachable by
name or index, no traceback and no copy of the values in the log."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import httpx
import pytest

from explorer import page
from explorer.caps import Caps
from explorer.guard import BoundedRecords, RequestGuard, UploadBounds, UploadBudget, bound_the_log
from tests.apphelpers import RUN, CountingEngine, new_client, serve
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
    assert answer.status_code == 413 and "an upload is at most" in answer.json()["error"]
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
        "one value too few by index": _join(url, generate._id, ["x" * 1000] * (len(generate.inputs) - 1)),
        "one value too few on run/": httpx.post(f"{url}gradio_api/run/generate", timeout=30,
                                                json={"data": ["x" * 1000] * (len(generate.inputs) - 1)}),
        "fn_index on a named route": httpx.post(f"{url}gradio_api/run/generate", timeout=30,
                                                json={"data": [], "fn_index": js_only._id}),
        "2 MB of values": httpx.post(f"{url}gradio_api/call/generate", json={"data": ["x" * (2 * MB)]}, timeout=30),
        "not JSON": httpx.post(f"{url}gradio_api/queue/join", content=b"{", timeout=30),
    }
    statuses = {what: a.status_code for what, a in answers.items()}
    assert statuses == {"js-only by name": 404, "private by name": 404, "fn_index 999": 404, "fn_index -1": 404,
                        "js-only by index": 404, "wrong count by name": 422, "wrong count by index": 422,
                        "one value too few by index": 422, "one value too few on run/": 422,
                        "fn_index on a named route": 422,
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


def test_a_call_by_name_takes_the_values_a_client_sees_or_every_input(served) -> None:
    """gradio's /call/ route fills in the inputs hidden from the API (session states): both counts pass the guard
    there, and only there."""
    demo, _ = served
    generate = next(fn for fn in demo.fns.values() if fn.api_name == "generate")
    guard = RequestGuard(None, demo, max_body=MB)
    seen = sum(not c.skip_api for c in generate.inputs)
    assert seen < len(generate.inputs)
    body = lambda n: json.dumps({"data": [None] * n}).encode()  # noqa: E731
    assert guard.problem(body(seen), "generate", "call") is None
    assert guard.problem(body(len(generate.inputs)), "generate", "call") is None
    assert guard.problem(body(seen), "generate", "run")[0] == 422
    assert guard.problem(json.dumps({"data": [None] * seen, "fn_index": generate._id}).encode(), None)[0] == 422


def test_streams_of_unknown_sessions_and_events_answer_one_line_and_the_log_stays_quiet(served, capfd) -> None:
    _, url = served
    capfd.readouterr()
    with httpx.Client(timeout=30) as client:
        answers = [client.get(f"{url}gradio_api/queue/data", params={"session_hash": f"nobody{i}"}) for i in range(10)]
        answers += [client.get(f"{url}gradio_api/call/generate/bogus{i}") for i in range(10)]
    assert {a.status_code for a in answers} == {404}
    assert all(len(a.text) < 200 and "\n" not in a.text for a in answers)
    log = "".join(capfd.readouterr())
    assert "Traceback" not in log and len(log) < 1000, log[:2000]


def test_uploads_are_bounded_in_all(served) -> None:
    """Each upload under gradio's 1 MB bound, many of them: refused with 429 once the minute's total is spent,
    so the temp folder grows by that total at most."""
    import os

    _, url = served
    temp = Path(os.environ["GRADIO_TEMP_DIR"])
    before = sum(p.stat().st_size for p in temp.rglob("*") if p.is_file())
    with httpx.Client(timeout=60) as client:
        answers = [client.post(f"{url}gradio_api/upload", files={"files": (f"{i}.bin", b"0" * 900_000)})
                   for i in range(20)]
    statuses = [a.status_code for a in answers]
    taken = UploadBounds().window_bytes // 900_000
    assert statuses[:taken] == [200] * taken and set(statuses[taken:]) == {429}, statuses
    assert "uploads are limited to" in answers[-1].json()["error"]
    grown = sum(p.stat().st_size for p in temp.rglob("*") if p.is_file()) - before
    assert grown <= UploadBounds().window_bytes


def test_the_upload_budget_holds_per_window_and_over_the_time_uploads_are_kept() -> None:
    now = [0.0]
    bounds = UploadBounds(window_s=60, window_requests=3, window_bytes=10**9, kept_s=3600, kept_requests=5,
                          kept_bytes=10**9)
    budget = UploadBudget(bounds, clock=lambda: now[0])
    assert [budget.take(1) for _ in range(4)][:3] == [None] * 3 and budget.take(1) is not None
    now[0] = 61.0  # a new minute: two more fit under the hour's five
    assert budget.take(1) is None and budget.take(1) is None
    now[0] = 122.0
    assert "per 1 h" in budget.take(1)
    now[0] = 3700.0  # the first three are no longer counted
    assert budget.take(1) is None


def test_gradio_printed_tracebacks_are_one_bounded_line_per_kind(capfd) -> None:
    """gradio prints a failed request's traceback (with the values it received) straight to stderr: after
    bound_the_log it is one line through the "gradio" logger, cut, and of one kind once a minute."""
    import gradio.queueing

    bound_the_log()
    capfd.readouterr()
    for _ in range(30):
        try:
            raise ValueError("Received inputs:\n" + "x" * (200 * 1000))
        except ValueError:
            gradio.queueing.traceback.print_exc()
    log = "".join(capfd.readouterr())
    assert len(log) < 1000 and log.count("\n") <= 1 and "Traceback" not in log, log[:2000]


def test_uvicorn_error_records_are_bounded_and_one_line_per_kind(capfd) -> None:
    """uvicorn configures its own handlers when the server starts, after the log was bounded: its error logger
    still writes a bad request's traceback as one bounded line, one per kind a minute."""
    import logging.config

    import uvicorn.config

    bound_the_log()
    names = ("uvicorn", "uvicorn.error", "uvicorn.access")
    kept = {name: (list(logging.getLogger(name).handlers), logging.getLogger(name).level) for name in names}
    try:
        logging.config.dictConfig(uvicorn.config.LOGGING_CONFIG)  # what uvicorn does as it starts
        capfd.readouterr()
        log = logging.getLogger("uvicorn.error")
        for _i in range(30):
            try:
                raise KeyError("y" * (200 * 1000))
            except KeyError:
                log.exception("Exception in ASGI application")
        log.error("a plain line %s", "z" * (200 * 1000))
        out = "".join(capfd.readouterr())
    finally:  # uvicorn's handlers write to this test's captured stderr: the next server installs its own
        for name, (handlers, level) in kept.items():
            logging.getLogger(name).handlers[:] = handlers
            logging.getLogger(name).setLevel(level)
    assert len(out) < 6000 and out.count("\n") <= 2 and "Traceback" not in out, out[:3000]


def test_a_call_with_keywords_takes_the_endpoints_parameters_only(served, capfd) -> None:
    """gradio's /call/v2/<name> answers an unknown parameter or endpoint with a uvicorn traceback (and a dropped
    connection): the guard answers one line; a call with the endpoint's own parameters goes through."""
    _, url = served
    capfd.readouterr()
    bad = httpx.post(f"{url}gradio_api/call/v2/generate", json={"not_a_field": "x" * 10_000}, timeout=30)
    missing = httpx.post(f"{url}gradio_api/call/v2/nothing_here", json={}, timeout=30)
    good = httpx.post(f"{url}gradio_api/call/v2/generate", json={"prompt": "hello", "max_new_tokens": 2}, timeout=30)
    assert (bad.status_code, missing.status_code, good.status_code) == (422, 404, 200)
    assert "not_a_field" in bad.json()["error"] and "event_id" in good.json()
    log = "".join(capfd.readouterr())
    assert "Traceback" not in log and "xxxxxxxxxx" not in log, log[:2000]


def test_an_unknown_upload_progress_is_answered_404_at_once_by_the_guard(served) -> None:
    """gradio holds each unknown upload id 3 s before its own 404 (thousands at once left /config unanswered):
    the guard answers it first, in one JSON line."""
    _, url = served
    answer = httpx.get(f"{url}gradio_api/upload_progress", params={"upload_id": "no-such-upload"}, timeout=30)
    assert answer.status_code == 404 and answer.json() == {"error": "no such upload"}


def test_the_requests_one_client_keeps_open_are_bounded() -> None:
    """Past `open_per_client` requests open at once from one address, the next is answered 429 at once (it never
    reaches gradio); another address is served, and once the open ones end the first one is served again."""
    import asyncio

    async def scenario() -> tuple[list[int], int, int]:
        release, reached = asyncio.Event(), []

        async def held(scope, receive, send) -> None:  # an app that holds every request until released
            reached.append(scope["client"][0])
            await release.wait()
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})

        guard = RequestGuard(held, demo=object(), max_body=1000, open_per_client=3)

        async def request(host: str) -> int:
            sent: list[dict] = []

            async def receive() -> dict:
                return {"type": "http.request", "body": b"", "more_body": False}

            async def send(message: dict) -> None:
                sent.append(message)

            scope = {"type": "http", "method": "GET", "path": "/config", "query_string": b"",
                     "client": (host, 1), "headers": []}
            await guard(scope, receive, send)
            return sent[0]["status"]

        first = [asyncio.create_task(request("10.0.0.1")) for _ in range(3)]
        while len(reached) < 3:
            await asyncio.sleep(0)
        refused = await request("10.0.0.1")  # answered while the three are still open
        other = asyncio.create_task(request("10.0.0.2"))
        while len(reached) < 4:
            await asyncio.sleep(0)
        release.set()
        statuses = [await t for t in first] + [await other]
        return statuses, refused, await request("10.0.0.1")

    statuses, refused, later = asyncio.run(scenario())
    assert refused == 429 and statuses == [200] * 4 and later == 200


def test_an_upload_counts_each_file_and_carries_one(served) -> None:
    """One multipart request with many small files was counted as one upload and left every file on disk."""
    import os

    _, url = served
    temp = Path(os.environ["GRADIO_TEMP_DIR"])
    before = {p for p in temp.rglob("*") if p.is_file()}
    files = [("files", (f"{i}.txt", b"0123456789")) for i in range(50)]
    answer = httpx.post(f"{url}gradio_api/upload", files=files, timeout=60)
    assert answer.status_code == 413 and "at most 1 file" in answer.json()["error"]
    assert {p for p in temp.rglob("*") if p.is_file()} == before
    budget = UploadBudget(UploadBounds(window_requests=16))
    assert budget.take(100, files=16) is None and budget.take(10, files=1) is not None  # each file counted
