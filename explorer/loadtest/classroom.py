"""The class load test: `--students` simulated students against one server for `--minutes`, each as a person
would use the page in a lesson: open the page, run a scenario, move a slider (a run with another α), switch to
the deep model once, open two views (the attention views drawn from the session's run), think a few seconds,
and again. One of them (with a deep model) measures "Which layers matter" on it all lesson long instead: the
heavy measurement the others' first tokens must not wait behind (explorer.fair). Reports first-token p50/p95, runs finished / refused with a message / failed, peak RSS, log bytes and
open file descriptors of the server."""

from __future__ import annotations

import concurrent.futures
import os
import random
import re
import threading
import time
from collections import Counter
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from d3.models import KNOWN_MODELS, QWEN_CODER
from explorer.controls import CONTROL_NAMES, DEFAULTS
from explorer.loadtest.client import D3_TOKENS, REFUSED, STATUS, TOKEN_ID, error_kind
from explorer.loadtest.report import percentiles
from explorer.loadtest.server import TINY, Server, rss_mib, running_server
from explorer.scenarios import scenario_controls

THINK_S = (3.0, 10.0)  # a student reads what came back before the next move
# How long a student waits, as a person with a browser would (the browser itself waits minutes; the person does not):
PAGE_TIMEOUT_S = 30.0  # for the page (its HTML and config) to open
REQUEST_TIMEOUT_S = 60.0  # for any one request to be answered (a view, a cancel), and to connect
RUN_TIMEOUT_S = 300.0  # for a run, click to last token: the longest wait queued (60 s) + the run's limit (180 s) + 60 s
# gradio_client's own requests (httpx's default: 5 s, which no browser does): a connection within REQUEST_TIMEOUT_S,
# and the stream of a session's events silent at most RUN_TIMEOUT_S (the server sends a heartbeat every 15 s; a
# shorter read timeout ended every run of the student's session at once when one stream went quiet)
HTTP_TIMEOUT = dict(timeout=REQUEST_TIMEOUT_S, read=RUN_TIMEOUT_S)
RETRY = re.compile(r"try again in about (\d+) s")
RUN_TOKENS = 16  # new tokens of a student's run on the small model
DEEP_TOKENS = 4  # and on the deep one (28 layers at about a token a second on a busy 2-core machine)
CONTROLS = ("prompt", "model", "chat_template", "strategy", "alpha", "core_head", "core_tail", "start", "drop_order",
            "layer_order", "fill", "max_new_tokens")


@dataclass
class ClassReport:
    """What the class load test measured."""

    model: str
    deep: str
    students: int
    minutes: float
    command: str = ""
    wall_s: float = 0.0
    runs: Counter = field(default_factory=Counter)  # finished / refused / failed
    refusals: Counter = field(default_factory=Counter)  # the messages runs were refused with (first line)
    failures: Counter = field(default_factory=Counter)  # what went wrong otherwise
    views: Counter = field(default_factory=Counter)  # drawn / failed
    measurements: Counter = field(default_factory=Counter)  # the heavy student's: finished / refused / failed
    pages: Counter = field(default_factory=Counter)  # opened / failed
    first_token_s: dict[str, dict[str, float]] = field(default_factory=dict)  # by model
    page_s: dict[str, float] = field(default_factory=dict)
    rss_mib: dict[str, float] = field(default_factory=dict)  # start, peak, end
    open_fds: dict[str, int] = field(default_factory=dict)  # start, peak, end
    log_bytes: int = 0
    server_tracebacks: int = 0
    server_alive: bool = True
    server_log_tail: str = ""  # kept when the server logged a traceback

    def to_dict(self) -> dict[str, Any]:
        return {f.name: dict(v) if isinstance(v := getattr(self, f.name), Counter) else v for f in fields(self)}


class Monitor:
    """Samples the server's RSS and open file descriptors every `every_s` in a thread."""

    def __init__(self, pid: int, every_s: float = 1.0) -> None:
        self.pid, self.every_s = pid, every_s
        self.rss: list[float] = []
        self.fds: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> None:
        self.rss.append(rss_mib(self.pid))
        try:
            self.fds.append(len(os.listdir(f"/proc/{self.pid}/fd")))
        except OSError:
            pass

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.sample()

    def __enter__(self) -> Monitor:
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(10)
        self.sample()


def _key(message: str) -> str:
    """A refusal's message as it is counted: its figures as N (the same refusal with another wait is one kind)."""
    return re.sub(r"\d+", "N", message)[:200]


def _first_token(job: Any, started: float, timeout: float) -> tuple[float | None, Any]:
    """Seconds from submission to the first streamed update with a D3 token (None if none came), and the job's
    final outputs (raises what the job raised)."""
    first = None
    deadline = started + timeout
    while not job.done() and time.monotonic() < deadline:
        if first is None and any(TOKEN_ID.search(str(out[D3_TOKENS])) for out in job.outputs()[-2:]):
            first = time.monotonic() - started
        time.sleep(0.1)
    final = job.result(timeout=max(1.0, deadline - time.monotonic()))
    if first is None and TOKEN_ID.search(str(final[D3_TOKENS])):
        first = time.monotonic() - started
    return first, final


class Student:
    """One simulated student: their own gradio session (a gradio_client Client) and their moves."""

    def __init__(self, n: int, server: Server, model: str, deep: str, report: ClassReport, lock: threading.Lock,
                 first_tokens: dict[str, list[float]], page_times: list[float]) -> None:
        self.n, self.server, self.model, self.deep = n, server, model, deep
        self.report, self.lock, self.first_tokens, self.page_times = report, lock, first_tokens, page_times
        self.rng = random.Random(n)
        self.client: Any = None
        self.round, self.arrived = 0, False
        self.retry_at = 0.0  # a refusal said to try again then

    def count(self, counter: str, key: str) -> None:
        with self.lock:
            getattr(self.report, counter)[key] += 1

    def open_page(self) -> None:
        import httpx

        started = time.monotonic()
        try:
            for path in ("", "config"):
                httpx.get(self.server.url + path, timeout=PAGE_TIMEOUT_S).raise_for_status()
            from gradio_client import Client

            self.client = Client(self.server.url, verbose=False,
                                 httpx_kwargs={"timeout": httpx.Timeout(**HTTP_TIMEOUT)})
            with self.lock:
                self.page_times.append(time.monotonic() - started)
            self.count("pages", "opened")
        except Exception as err:  # counted; the student tries again next round
            self.count("pages", "failed")
            self.count("failures", "page: " + error_kind(err))

    def refused(self, kind: str) -> bool:
        """Whether a request that ended with error `kind` was refused at once with a message (a gr.Error shown on
        the page, a full queue, a busy server's 429 or 503 with its line), not failed; a refusal that says when to
        try again makes the student wait that long, as a person told so would."""
        if not (kind.startswith(("app_error", REFUSED)) or kind == "queue_full"):
            return False
        retry = RETRY.search(kind)
        if retry is not None:
            self.retry_at = time.monotonic() + int(retry.group(1))
        return True

    def generate(self, controls: dict[str, Any]) -> None:
        model = controls["model"]
        started = time.monotonic()
        job = self.client.submit(**controls, api_name="/generate")
        try:
            first, final = _first_token(job, started, RUN_TIMEOUT_S)
            status = str(final[STATUS])
            if "Done." in status or "Stopped." in status:  # stopped: at the time limit, with a message
                self.count("runs", "finished")
                if first is not None:
                    with self.lock:
                        self.first_tokens.setdefault(model, []).append(first)
            else:  # the status line says why it did not run
                self.count("runs", "refused")
                self.count("refusals", status[:100])
        except Exception as err:
            kind = error_kind(err)
            if self.refused(kind):
                self.count("runs", "refused")
                self.count("refusals", _key(kind))
            else:
                self.count("runs", "failed")
                self.count("failures", kind)
                try:
                    job.cancel()
                except Exception as cancel_err:  # a server too busy to answer /cancel in time: counted, not fatal
                    self.count("failures", "cancel: " + error_kind(cancel_err))

    def controls(self, model: str, step: int, tokens: int, **changes: Any) -> dict[str, Any]:
        layers = KNOWN_MODELS[model].facts.num_layers if model in KNOWN_MODELS else 6
        key = ("full_vs_d3", "core")[step % 2]
        run = {**scenario_controls(key, step % 2, layers, model), "model": model, "max_new_tokens": tokens}
        return {k: v for k, v in {**run, **changes}.items() if k in CONTROLS}

    def open_views(self, controls: dict[str, Any]) -> None:
        try:  # an API session is on no tab: both attention views are drawn from its run
            values = [controls.get(name, getattr(DEFAULTS, name)) for name in CONTROL_NAMES]
            # an undocumented endpoint: by position
            self.client.submit(*values, api_name="/render_attention").result(timeout=REQUEST_TIMEOUT_S)
            self.count("views", "drawn")
        except Exception as err:
            self.count("views", "failed")
            self.count("failures", "views: " + error_kind(err))

    def measure(self, controls: dict[str, Any]) -> bool:
        """The heavy student: "Which layers matter" on the deep model (a measurement that takes its time limit).
        False when it was refused."""
        job = self.client.submit(**controls, api_name="/measure_layers")
        try:
            job.result(timeout=RUN_TIMEOUT_S)
            self.count("measurements", "finished")
        except Exception as err:
            kind = error_kind(err)
            if kind.startswith("app_error") and "time limit" in kind:  # it ran to the server's limit and said so
                self.count("measurements", "stopped at the time limit")
                return True
            if self.refused(kind):
                self.count("measurements", "refused")
                self.count("refusals", "measure: " + _key(kind))
                return False
            self.count("measurements", "failed")
            self.count("failures", "measure: " + kind)
            job.cancel()
        return True

    def think(self, until: float) -> None:
        """Read what came back (a few seconds), or wait as long as the server said to before trying again."""
        pause = max(self.rng.uniform(*THINK_S), self.retry_at - time.monotonic())
        time.sleep(max(0.0, min(pause, until - time.monotonic())))

    def lesson(self, until: float) -> None:
        """The student's rounds; whatever goes wrong on the client's side is counted and the student goes on."""
        while time.monotonic() < until:
            try:
                self.rounds(until)
                return
            except Exception as err:
                self.count("failures", "student: " + error_kind(err))
                self.think(until)

    def rounds(self, until: float) -> None:
        """Rounds of moves until `until` (time.monotonic()); the deep model once, in the student's second round."""
        if not self.arrived:  # they arrive over the first 20 s
            time.sleep(self.rng.uniform(0, min(20.0, (until - time.monotonic()) / 3)))
            self.arrived = True
        while time.monotonic() < until:
            if self.client is None:
                self.open_page()
                if self.client is None:
                    self.think(until)
                    continue
            if self.n == 0 and self.deep:  # one student measures on the deep model all lesson long
                if not self.measure(self.controls(self.deep, 0, RUN_TOKENS)):
                    self.think(until)  # refused: wait as told (or read the message) before asking again
                continue
            scenario = self.controls(self.model, self.round, RUN_TOKENS)
            self.generate(scenario)
            self.think(until)
            if time.monotonic() >= until:
                break
            moved = {**scenario, "alpha": round(self.rng.uniform(0.9, 0.999), 3)}  # a slider let go: a run
            self.generate(moved)
            self.open_views(moved)
            self.round += 1
            if self.round == 2 and self.deep:
                self.generate(self.controls(self.deep, 1, DEEP_TOKENS))
            self.think(until)


def run_class(students: int, minutes: float, model: str, deep: str, env: dict[str, str], command: str = "",
              start_timeout: float = 600) -> ClassReport:
    """The class against a fresh server (started with `env` over the environment); the report of what it saw."""
    report = ClassReport(model, deep, students, minutes, command)
    lock, first_tokens, page_times = threading.Lock(), {}, []  # type: ignore[var-annotated]
    started = time.monotonic()
    with running_server(model, env, start_timeout=start_timeout) as server:
        log_start = server.log_path.stat().st_size
        with Monitor(server.proc.pid) as monitor:
            until = time.monotonic() + minutes * 60
            with concurrent.futures.ThreadPoolExecutor(students) as pool:
                list(pool.map(lambda n: Student(n, server, model, deep, report, lock, first_tokens,
                                                page_times).lesson(until), range(students)))
        report.log_bytes = server.log_path.stat().st_size - log_start
        report.server_tracebacks = server.tracebacks()
        report.server_alive = server.proc.poll() is None
        if report.server_tracebacks or not report.server_alive:
            report.server_log_tail = server.log_tail(80)
    report.wall_s = time.monotonic() - started
    report.first_token_s = {m: percentiles(v) for m, v in first_tokens.items()}
    report.page_s = percentiles(page_times)
    rss = [r for r in monitor.rss if r == r]
    report.rss_mib = {"start": rss[0], "peak": max(rss), "end": rss[-1]} if rss else {}
    report.open_fds = {"start": monitor.fds[0], "peak": max(monitor.fds), "end": monitor.fds[-1]} if monitor.fds else {}
    return report


def render_class(r: ClassReport) -> str:
    def lat(d: dict[str, float] | None) -> str:
        if not d or not d.get("n"):
            return "n/a"
        return f"p50 {d['p50']:.1f} s, p95 {d['p95']:.1f} s, max {d['max']:.1f} s (n={d['n']})"

    lines = [f"class load test: {r.students} students for {r.minutes:g} min on {r.model} (deep model: {r.deep or 'none'})"
             f"; wall {r.wall_s:.0f} s",
             *([f"command: {r.command}"] if r.command else []),
             f"pages opened: {dict(r.pages)}; open page p50/p95: {lat(r.page_s)}",
             f"runs: {dict(r.runs)}",
             *[f"  refused ({n}): {msg}" for msg, n in r.refusals.most_common(5)],
             *[f"  failed ({n}): {msg}" for msg, n in r.failures.most_common(5)],
             *[f"first token, {m}: {lat(d)}" for m, d in sorted(r.first_token_s.items())],
             f"views drawn: {dict(r.views)}",
             *([f"heavy measurements on the deep model (one student, all along): {dict(r.measurements)}"]
               if r.measurements else []),
             "server RSS (MiB): " + ", ".join(f"{k} {v:.0f}" for k, v in r.rss_mib.items()),
             "open fds: " + ", ".join(f"{k} {v}" for k, v in r.open_fds.items()),
             f"server log: {r.log_bytes:,} bytes, {r.server_tracebacks} tracebacks; server "
             f"{'still serving' if r.server_alive else 'EXITED'}",
             *([r.server_log_tail] if r.server_log_tail else [])]
    return "\n".join(lines)


def default_deep(model: str) -> str:
    return "" if model == TINY else QWEN_CODER


def write(report: ClassReport, path: Path) -> None:
    import json

    path.write_text(json.dumps(report.to_dict(), indent=2) + "\n")
