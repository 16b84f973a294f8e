"""explorer/loadtest: its checks on their own (fast), and a small bounded run against a tiny model (slow)."""

from __future__ import annotations

import json

import pytest

from d3.config import D3Config, GenerationConfig
from explorer import loadtest as load_test
from explorer.loadtest.__main__ import main
from viz import token_html

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::UserWarning")]


def test_token_ids_are_read_back_from_the_pane(tiny_engine) -> None:
    gen = GenerationConfig(max_new_tokens=12, temperature=0.9, seed=5)
    trace = tiny_engine.generate("hello there", D3Config(alpha=0.9, core_head=1, core_tail=1), gen)
    assert load_test.token_ids(token_html(trace)) == tuple(trace.token_ids)
    assert load_test.token_ids("<div>(waiting for the first token…)</div>") == ()


def test_a_mixed_up_run_is_counted_as_cross_talk() -> None:
    spec = load_test.Spec("p", seed=1, tokens=3)
    solo = load_test.Tokens((1, 2, 3), (1, 2, 4))
    report = load_test.Report(model="tiny")
    ok = load_test.Outcome(spec, tokens=solo, streamed=[load_test.Tokens((1,), ()), solo], exported=(1, 2, 3))
    load_test.check(report, ok, solo, "a")
    assert report.crosstalk == 0 and not report.errors
    for wrong in (load_test.Outcome(spec, tokens=load_test.Tokens((1, 2, 3), (9, 2, 4))),
                  load_test.Outcome(spec, tokens=solo, streamed=[load_test.Tokens((7,), ())]),  # someone else's token
                  load_test.Outcome(spec, tokens=solo, exported=(1, 2, 9))):  # someone else's trace
        load_test.check(report, wrong, solo, "b")
    assert report.crosstalk == 3 and len(report.crosstalk_examples) == 3
    load_test.check(report, load_test.Outcome(spec, error="queue_full"), solo, "c")
    assert report.errors == {"queue_full": 1}


def test_targets_decide_the_exit_status() -> None:
    report = load_test.Report(model="tiny", planned={"concurrent": 8, "endurance": 30},
                              completed={"references": 12, "concurrent": 8, "endurance": 30},
                              rss_mib={"after_warmup": 600.0, "end": 612.0}, distinct_references=12)
    load_test.judge(report, max_growth=5.0)
    assert report.failures == []
    grown = load_test.Report(**{**report.__dict__, "failures": [], "rss_mib": {"after_warmup": 600.0, "end": 640.0}})
    load_test.judge(grown, max_growth=5.0)
    assert len(grown.failures) == 1 and "RSS grew 6.7%" in grown.failures[0]
    short = load_test.Report(**{**report.__dict__, "failures": [], "completed": {"concurrent": 8, "endurance": 7},
                                "timed_out": True})
    load_test.judge(short, max_growth=5.0)
    assert any("7 of 30 completed (time limit reached)" in f for f in short.failures)


@pytest.mark.slow
def test_bounded_load_run_on_a_tiny_model(tmp_path) -> None:
    """8 clients at once, then 30 generations in a row, against the app served in a subprocess."""
    out = tmp_path / "report.json"
    status = main(["--tiny", "--clients", "8", "--tokens", "6", "--runs", "30", "--run-tokens", "4",
                             "--sessions", "3", "--warmup", "6", "--max-growth", "20", "--time-limit", "420",
                             "--json", str(out)])
    report = json.loads(out.read_text())
    assert report["completed"] == {"references": 11, "concurrent": 8, "endurance": 30}
    assert report["max_in_flight"] == 8 and report["distinct_references"] == 11
    assert report["crosstalk"] == 0, report["crosstalk_examples"]
    assert report["errors"] == {} and report["server_tracebacks"] == 0
    assert report["rss_growth_pct"] < 20  # generous: the script's own target is 5 % over the full 200 runs
    assert status == 0, report["failures"]


def test_a_short_class_on_a_tiny_model(tmp_path) -> None:
    """The class load test's parts, briefly: students open the page, run, move a slider and draw the views; the
    report counts every run and reads the server's memory, descriptors and log."""
    out = tmp_path / "class.json"
    status = main(["--tiny", "--students", "3", "--minutes", "0.4", "--env", "D3_PUBLIC=1", "--json", str(out)])
    report = json.loads(out.read_text())
    assert report["pages"] == {"opened": 3} and report["runs"].get("finished", 0) >= 1, report
    assert not report["runs"].get("failed") and not report["failures"], report["failures"]
    assert report["first_token_s"]["tiny"]["n"] >= 1
    assert report["rss_mib"]["peak"] >= report["rss_mib"]["start"] > 0 and report["open_fds"]["peak"] > 0
    assert report["server_alive"] and report["server_tracebacks"] == 0 and status == 0


def test_a_refusal_with_a_message_is_told_from_a_failure() -> None:
    """The class load test counted a busy server's 429 (its one line: too long a wait, too many from one address) as
    a failure; it is a refusal with a message, and a student told when to try again waits that long."""
    import httpx

    from explorer.loadtest.classroom import ClassReport, Student
    from explorer.loadtest.client import error_kind

    def refusal(status: int, body: dict) -> httpx.HTTPStatusError:
        request = httpx.Request("POST", "http://127.0.0.1/gradio_api/queue/join")
        response = httpx.Response(status, json=body, request=request)
        return httpx.HTTPStatusError(f"Client error '{status}'", request=request, response=response)

    busy = "The server is busy: 5 runs are running or waiting ahead of yours ... try again in about 40 s."
    assert error_kind(refusal(429, {"error": busy})) == "refused: " + busy
    assert error_kind(refusal(503, {"detail": "Queue is full. Max size is 16 and size is 16."})).startswith("refused")
    assert error_kind(refusal(404, {"error": "no such endpoint"})).startswith("client: HTTPStatusError")
    assert error_kind(TimeoutError()) == "timeout"
    student = Student(1, None, "tiny", "", ClassReport("tiny", "", 1, 1.0), None, {}, [])  # type: ignore[arg-type]
    assert student.refused(error_kind(refusal(429, {"error": busy}))) and student.retry_at > 0
    assert not student.refused("timeout") and not student.refused("server_error")
