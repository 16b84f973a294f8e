"""What reaches the page's routes: a request for an event that does not exist, has no server-side function,
is private to the page's own browser code, or sends other than the number of values its route takes is answered
with one plain line before gradio sees it (gradio answers those with a traceback in the log, copying the values
received into it); a stream asked for an unknown session or event too (gradio answers those with a uvicorn
traceback); request bodies are bounded, and uploads in all, counted per file (per minute and over the time gradio
keeps them), one file per request; an upload's progress asked for an upload that is not under way is answered
404 at once (gradio holds each unknown id 3 s), and the requests one client keeps open at once are bounded. And
the server's log: every record of every logger cut to a bounded length, gradio's and uvicorn's tracebacks of a
bad request one line each, at most one line per kind a minute."""

from __future__ import annotations

import collections
import importlib
import json
import logging
import re
import sys
import threading
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any
from urllib.parse import parse_qs

import gradio as gr

from explorer import fair

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

BY_NAME = re.compile(r"/gradio_api/(?P<route>call|run|api)/(?P<name>[^/]+)/?$")  # a client calling an event by name
BY_KEYWORD = re.compile(r"/gradio_api/call/v2/(?P<name>[^/]+)/?$")  # a client calling an event with keywords
BY_INDEX = re.compile(r"/gradio_api/(?:queue/join|run/predict)/?$")  # the page's own calls, by fn_index
UPLOAD = re.compile(r"/gradio_api/upload/?$")
UPLOAD_PROGRESS = re.compile(r"/gradio_api/upload_progress/?$")  # gradio waits 3 s for an unknown id to appear
STREAM = re.compile(r"/gradio_api/queue/data/?$")  # the page's stream of one session's events
RESULT = re.compile(r"/gradio_api/call/(?:v2/)?[^/]+/(?P<event>[^/]+)/?$")  # a client's stream of one event
LOG_RECORD_CHARS = 4000  # one log record (message and traceback) is cut to this many characters
LINE_PER_KIND_S = 60.0  # a failed request's traceback becomes one line, at most one of a kind this often
OPEN_PER_CLIENT = 100  # requests one client address keeps open at once (a page holds one stream and a few calls)


@dataclass(frozen=True)
class UploadBounds:
    """What gradio's /upload route takes (the page has no upload control; the route answers anyone, and gradio
    keeps each file up to `kept_s`): one request's body, and all requests together per `window_s` and over
    `kept_s`. Beyond a request's bound: 413; beyond a total: 429."""

    request_bytes: int = 1_100_000  # one file of gradio's max_file_size (1 MB here) and its multipart framing
    request_files: int = 1  # file parts in one request (the page uploads nothing; a client needs no more)
    window_s: float = 60.0
    window_requests: int = 16
    window_bytes: int = 8_000_000
    kept_s: float = 7200.0  # gradio deletes uploads older than an hour, looking once an hour (delete_cache)
    kept_requests: int = 64
    kept_bytes: int = 32_000_000


class UploadBudget:
    """The uploads taken over the last `kept_s` seconds (time, bytes), checked against `UploadBounds`."""

    def __init__(self, bounds: UploadBounds = UploadBounds(), clock: Callable[[], float] = time.monotonic) -> None:
        self.bounds, self.clock = bounds, clock
        self.taken: collections.deque[tuple[float, int]] = collections.deque()
        self._lock = threading.Lock()

    def take(self, size: int, files: int = 1) -> str | None:
        """Count an upload of `size` bytes in `files` files (each file counts, at least one per request), or say
        (one line) which total it would pass and count nothing."""
        b, now, files = self.bounds, self.clock(), max(files, 1)
        with self._lock:
            while self.taken and now - self.taken[0][0] > b.kept_s:
                self.taken.popleft()
            recent = [n for t, n in self.taken if now - t <= b.window_s]
            if len(recent) + files > b.window_requests or sum(recent) + size > b.window_bytes:
                return (f"uploads are limited to {b.window_requests} files and {b.window_bytes:,} bytes per "
                        f"{b.window_s:g} s: try again later")
            if len(self.taken) + files > b.kept_requests or sum(n for _, n in self.taken) + size > b.kept_bytes:
                return (f"uploads are limited to {b.kept_requests} files and {b.kept_bytes:,} bytes per "
                        f"{b.kept_s / 3600:g} h: try again later")
            self.taken.extend([(now, size)] + [(now, 0)] * (files - 1))
            return None


class RequestGuard:
    """ASGI middleware over gradio's app: checks POSTs to the event routes against `demo`'s events, uploads
    against their budget, and the GETs of an event's stream against the queue's sessions and events."""

    def __init__(self, app: Any, demo: gr.Blocks, max_body: int, uploads: UploadBudget | None = None,
                 open_per_client: int = OPEN_PER_CLIENT, events_per_address: int | None = None,
                 max_wait_s: float | None = None, timings: fair.Timings | None = None) -> None:
        self.app, self.demo, self.max_body = app, demo, max_body
        self.uploads = uploads or UploadBudget()
        self.open_per_client = open_per_client
        self.events_per_address = events_per_address  # None: not bounded per address (a server that is not public)
        self.max_wait_s = max_wait_s  # None: a run waits in the queue however long (a server that is not public)
        self.timings = timings or fair.Timings()
        self.open: collections.Counter[str] = collections.Counter()  # requests open now, by client address
        self._named: dict[str, tuple[str, ...]] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        client = (scope.get("client") or ("", 0))[0]
        if self.open[client] >= self.open_per_client:
            return await _answer(send, 429, f"at most {self.open_per_client} requests open at once per client: "
                                            "wait for one to end")
        self.open[client] += 1
        try:
            await self.route(scope, receive, send)
        finally:
            self.open[client] -= 1
            if not self.open[client]:
                del self.open[client]

    async def route(self, scope: Scope, receive: Receive, send: Send) -> None:
        method = scope.get("method")
        path = scope.get("path", "") if method in ("GET", "POST") else ""
        if method == "GET":
            problem = self.unknown_stream(path, scope.get("query_string", b""))
            if problem is not None:
                return await _answer(send, 404, problem)
            return await self.app(scope, receive, send)
        if method == "POST" and UPLOAD.search(path):
            return await self.upload(scope, receive, send)
        by_keyword = BY_KEYWORD.search(path) if method == "POST" else None
        if by_keyword is not None:
            name = by_keyword.group("name")
            return await self.checked(scope, receive, send, lambda body: self.keyword_problem(body, name)
                                      or self.crowded(scope, self._by_name(name)))
        by_name = None if BY_INDEX.search(path) else BY_NAME.search(path)
        if by_name is None and not BY_INDEX.search(path):
            return await self.app(scope, receive, send)
        await self.checked(scope, receive, send, lambda body: self.problem(
            body, by_name.group("name") if by_name else None, by_name.group("route") if by_name else "queue")
            or self.crowded(scope, self._by_name(by_name.group("name")) if by_name else self._by_index(
                json.loads(body or b"{}").get("fn_index"))))

    async def checked(self, scope: Scope, receive: Receive, send: Send,
                      problem: Callable[[bytes], tuple[int, str] | tuple[int, str, int] | None]) -> None:
        """Read the body (at most `max_body` bytes), answer its `problem` if it has one, else hand it to gradio."""
        body = await _read(receive, self.max_body)
        if body is None:
            return await _answer(send, 413, f"the request is larger than {self.max_body:,} bytes")
        found = problem(body)
        if found is not None:
            return await _answer(send, *found)
        await self.app(scope, _replay(body, receive), send)

    async def upload(self, scope: Scope, receive: Receive, send: Send) -> None:
        limit, most = self.uploads.bounds.request_bytes, self.uploads.bounds.request_files
        body = await _read(receive, limit)
        if body is None:
            return await _answer(send, 413, f"an upload is at most {limit:,} bytes")
        files = file_parts(body, _header(scope, b"content-type"))
        if files > most:
            return await _answer(send, 413, f"an upload request carries at most {most} file{'s' * (most > 1)}, "
                                            f"not {files}")
        refused = self.uploads.take(len(body), files)
        if refused is not None:
            return await _answer(send, 429, refused)
        await self.app(scope, _replay(body, receive), send)

    def crowded(self, scope: Scope, fn: Any) -> tuple[int, str] | tuple[int, str, int] | None:
        """429 when the caller's address already has its share of runs and measurements running or waiting, or
        when the run would wait for a slot longer than `max_wait_s` (then with the seconds to wait before trying
        again, the Retry-After header); public servers only (explorer.fair)."""
        if fn is None or fn.concurrency_id not in fair.GROUPS:
            return None
        queue = getattr(self.demo, "_queue", None)
        if self.events_per_address is not None:
            host = (scope.get("client") or ("", 0))[0]
            refused = fair.crowded(queue, host, self.events_per_address)
            if refused is not None:
                return 429, refused
        if self.max_wait_s is None or queue is None:
            return None
        self.timings.install(queue)
        busy = fair.too_long(queue, fn.concurrency_id, self.timings, self.max_wait_s)
        return None if busy is None else (429, busy[0], busy[1])

    def keyword_problem(self, body: bytes, name: str) -> tuple[int, str] | None:
        try:
            request = json.loads(body) if body else {}
        except ValueError:
            return 422, "the request body is not JSON"
        if not isinstance(request, dict):
            return 422, "the request body is not a JSON object"
        if self._by_name(name) is None or name not in self._parameters():
            return 404, f"no such endpoint: {name[:40]!r}"
        allowed = self._parameters()[name]
        unknown = sorted(k for k in request if k not in allowed and k != "oauth_token")
        if unknown:
            return 422, (f"{str(unknown[0])[:40]!r} is not a parameter of {name[:40]}; its parameters: "
                         f"{', '.join(allowed)}"[:300])
        return None

    def _parameters(self) -> dict[str, tuple[str, ...]]:
        """Each named endpoint's parameter names, as gradio's API info gives them (read once)."""
        if self._named is None:
            named = self.demo.get_api_info().get("named_endpoints", {})
            self._named = {k.lstrip("/"): tuple(p.get("parameter_name", "") for p in v.get("parameters", ()))
                           for k, v in named.items()}
        return self._named

    def unknown_stream(self, path: str, query: bytes) -> str | None:
        """Why a GET of an event stream names nothing the queue holds (gradio would open the stream and fail inside
        it, a uvicorn traceback in the log), else None."""
        if UPLOAD_PROGRESS.search(path):
            upload = (parse_qs(query.decode("latin-1")).get("upload_id") or [""])[0]
            return None if _upload_under_way(upload) else "no such upload"
        queue = getattr(self.demo, "_queue", None)
        if queue is None:
            return None
        if STREAM.search(path):
            session = (parse_qs(query.decode("latin-1")).get("session_hash") or [""])[0]
            return None if session in queue.pending_messages_per_session else "no such session: join the queue first"
        result = RESULT.search(path)
        if result is None:
            return None
        event_id = result.group("event")
        event = queue.event_ids_to_events.get(event_id)
        session = event.session_hash if event is not None else next(
            (s for s, ids in list(queue.pending_event_ids_session.items()) if event_id in ids), event_id)
        return None if session in queue.pending_messages_per_session else "no such event"

    def problem(self, body: bytes, name: str | None, route: str = "queue") -> tuple[int, str] | None:
        """(status, message) when the request must not reach gradio, else None. `route`: "queue" (the page's
        calls by fn_index), or the by-name route ("call", "run", "api")."""
        try:
            request = json.loads(body) if body else {}
        except ValueError:
            return 422, "the request body is not JSON"
        if not isinstance(request, dict):
            return 422, "the request body is not a JSON object"
        if name is not None and request.get("fn_index") is not None:  # gradio would call fns[fn_index], not `name`
            return 422, "a call by name takes no fn_index"
        fn = self._by_name(name) if name is not None else self._by_index(request.get("fn_index"))
        if fn is None:
            return 404, f"no such endpoint: {str(name if name is not None else request.get('fn_index'))[:40]!r}"
        data = request.get("data", [])
        allowed = _input_counts(fn, route)
        if not isinstance(data, list) or len(data) not in allowed:
            got = len(data) if isinstance(data, list) else type(data).__name__
            return 422, (f"this endpoint takes {' or '.join(map(str, sorted(allowed)))} values in data, "
                         f"not {got}")
        return None
    def _by_name(self, name: str) -> Any:
        """A named event a client may call: it has a function and is not private to the page's own code."""
        for fn in self.demo.fns.values():
            if fn.api_name == name:
                return fn if fn.fn is not None and fn.api_visibility != "private" else None
        return None

    def _by_index(self, index: Any) -> Any:
        """The event the page's browser code calls by index: it exists and has a function."""
        if isinstance(index, bool) or not isinstance(index, int):
            return None
        fn = self.demo.fns.get(index)
        return fn if fn is not None and fn.fn is not None else None


def _input_counts(fn: Any, route: str) -> set[int]:
    """How many values an event takes on `route`: one per input (gradio's "run", "api" and the page's calls by
    index take nothing else), or on "call" also one per input a client sees (gradio fills in the session states
    and other inputs hidden from the API)."""
    if route != "call":
        return {len(fn.inputs)}
    return {len(fn.inputs), sum(not c.skip_api for c in fn.inputs)}


def _upload_under_way(upload_id: str) -> bool:
    """Whether gradio tracks an upload of this id now (an upload request that named it has begun)."""
    from gradio import routes

    return bool(upload_id) and upload_id in getattr(routes.file_upload_statuses, "_statuses", {})


def _header(scope: Scope, name: bytes) -> bytes:
    return next((v for k, v in scope.get("headers", ()) if k.lower() == name), b"")


def file_parts(body: bytes, content_type: bytes) -> int:
    """How many parts of a multipart body are files (their headers name a filename); 0 for any other body."""
    match = re.search(rb'boundary="?([^";]+)"?', content_type)
    if match is None:
        return 0
    parts = body.split(b"--" + match.group(1))
    return sum(b"filename" in part.split(b"\r\n\r\n", 1)[0].lower() for part in parts[1:])


async def _read(receive: Receive, limit: int) -> bytes | None:
    """The whole request body, or None once it passes `limit` bytes (the rest is never read)."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return b"".join(chunks)
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def again() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return again


async def _answer(send: Send, status: int, message: str, retry_after_s: int | None = None) -> None:
    """One JSON line, {"error": message} (the page shows it as the run's error); with a Retry-After header when the
    caller is told when to try again."""
    body = json.dumps({"error": message}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if retry_after_s is not None:
        headers.append((b"retry-after", str(retry_after_s).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _cut(record: logging.LogRecord, limit: int) -> logging.LogRecord:
    """`record` with its message and traceback cut to `limit` characters each (the traceback formatted now, so that
    whichever handler writes it finds the cut text). A record whose arguments do not fit its message is left as it
    is: the handler reports it, as logging does."""
    try:
        text = record.getMessage()
    except Exception:
        return record
    if len(text) > limit:
        record.msg, record.args = text[:limit] + f" … [{len(text) - limit:,} characters cut]", None
    if record.exc_info and not record.exc_text:
        record.exc_text = logging.Formatter().formatException(record.exc_info)
    if record.exc_text and len(record.exc_text) > limit:
        record.exc_text = record.exc_text[-limit:]  # the end of a traceback says what failed
    return record


class BoundedRecords(logging.Filter):
    """Cuts every record (message and traceback) to `limit` characters: nothing a visitor sends can make one
    record of the log long."""

    def __init__(self, limit: int = LOG_RECORD_CHARS) -> None:
        super().__init__()
        self.limit = limit

    def filter(self, record: logging.LogRecord) -> bool:
        _cut(record, self.limit)
        return True


class OneLinePerKind(logging.Filter):
    """A record with a traceback (a request gradio or uvicorn failed on) becomes one line, its message and the
    exception's last line, and of each kind (logger, message, exception type) one is written per `every_s`; the
    next one written says how many were left out."""

    def __init__(self, every_s: float = LINE_PER_KIND_S, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.every_s, self.clock = every_s, clock
        self.last: dict[tuple[str, str, str], float] = {}
        self.left_out: collections.Counter[tuple[str, str, str]] = collections.Counter()
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.exc_info and not record.exc_text:
            return True
        err = record.exc_info[1] if record.exc_info else None
        kind = (record.name, str(record.msg)[:200], type(err).__name__ if err is not None else "")
        now = self.clock()
        with self._lock:
            if now - self.last.get(kind, -float("inf")) < self.every_s:
                self.left_out[kind] += 1
                return False
            if len(self.last) > 1000:  # kinds are few; a flood of distinct ones must not grow this
                self.last.clear()
            self.last[kind], skipped = now, self.left_out.pop(kind, 0)
        last = (record.exc_text or "").strip().splitlines()[-1:] or [f"{kind[2]}: {err}"]
        line = f"{record.getMessage()}: {last[0][:300]}"
        if skipped:
            line += f" ({skipped} more like it in the last {self.every_s:g} s not written)"
        record.msg, record.args, record.exc_info, record.exc_text = line, None, None, None
        return True


class _LoggedTracebacks(ModuleType):
    """Stands for the `traceback` module inside gradio's modules: gradio's `traceback.print_exc()` (a failed event
    or request: the "Received inputs" of a bad request among it) writes to stderr, past every log handler; here it
    goes to the "gradio" logger instead, bounded like every record and one line per kind."""

    def __init__(self) -> None:
        super().__init__("traceback")

    def __getattr__(self, name: str) -> Any:
        return getattr(traceback, name)

    @staticmethod
    def print_exc(*args: Any, **kwargs: Any) -> None:
        logging.getLogger("gradio").error("a request failed", exc_info=sys.exc_info())


GRADIO_MODULES = ("gradio.queueing", "gradio.routes", "gradio.route_utils", "gradio.utils")
ONE_LINE_LOGGERS = ("gradio", "uvicorn.error")  # the loggers a bad request writes a traceback to


def bound_the_log(limit: int = LOG_RECORD_CHARS) -> None:
    """Every record of every logger is cut to `limit` (a record factory: uvicorn configures its own handlers later,
    when the server starts), every handler of the root logger cuts too, gradio's printed tracebacks go through the
    "gradio" logger, and a traceback on "gradio" or "uvicorn.error" is one line, one per kind a minute."""
    logging.basicConfig()
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, BoundedRecords) for f in handler.filters):
            handler.addFilter(BoundedRecords(limit))
    make = logging.getLogRecordFactory()
    if not getattr(make, "bounded", False):
        def bounded(*args: Any, **kwargs: Any) -> logging.LogRecord:
            return _cut(make(*args, **kwargs), limit)

        bounded.bounded = True  # type: ignore[attr-defined]
        logging.setLogRecordFactory(bounded)
    for name in ONE_LINE_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, OneLinePerKind) for f in logger.filters):
            logger.addFilter(OneLinePerKind())
    for name in GRADIO_MODULES:
        module = importlib.import_module(name)
        if getattr(module, "traceback", None) is traceback:
            module.traceback = _LoggedTracebacks()  # type: ignore[attr-defined]
