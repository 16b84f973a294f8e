"""What reaches the page's event routes: a request for an event that does not exist, has no server-side function,
is private to the page's own browser code, or sends the wrong number of values is answered with one plain line
before gradio sees it (gradio answers those with a traceback in the log, copying the values received into it), and
a request body is bounded. And the server's log: every record cut to a bounded length."""

from __future__ import annotations

import json
import logging
import re
from typing import Any, Awaitable, Callable

import gradio as gr

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

BY_NAME = re.compile(r"/gradio_api/(?:call|run|api)/(?P<name>[^/]+)/?$")  # a client calling an endpoint by name
BY_INDEX = re.compile(r"/gradio_api/(?:queue/join|run/predict)/?$")  # the page's own calls, by fn_index
LOG_RECORD_CHARS = 4000  # one log record (message and traceback) is cut to this many characters


class RequestGuard:
    """ASGI middleware over gradio's app: checks POSTs to the event routes against `demo`'s events."""

    def __init__(self, app: Any, demo: gr.Blocks, max_body: int) -> None:
        self.app, self.demo, self.max_body = app, demo, max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" and scope.get("method") == "POST" else ""
        by_name = None if BY_INDEX.search(path) else BY_NAME.search(path)
        if by_name is None and not BY_INDEX.search(path):
            return await self.app(scope, receive, send)
        body = await _read(receive, self.max_body)
        if body is None:
            return await _answer(send, 413, f"the request is larger than {self.max_body:,} bytes")
        problem = self.problem(body, by_name.group("name") if by_name else None)
        if problem is not None:
            return await _answer(send, *problem)
        await self.app(scope, _replay(body, receive), send)

    def problem(self, body: bytes, name: str | None) -> tuple[int, str] | None:
        """(status, message) when the request must not reach gradio, else None."""
        try:
            request = json.loads(body) if body else {}
        except ValueError:
            return 422, "the request body is not JSON"
        if not isinstance(request, dict):
            return 422, "the request body is not a JSON object"
        fn = self._by_name(name) if name is not None else self._by_index(request.get("fn_index"))
        if fn is None:
            return 404, f"no such endpoint: {str(name if name is not None else request.get('fn_index'))[:40]!r}"
        data = request.get("data", [])
        allowed = _input_counts(fn)
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


def _input_counts(fn: Any) -> set[int]:
    """How many values an event takes: every input, or (a client by name) every input but its session states."""
    states = sum(isinstance(c, gr.State) for c in fn.inputs)
    return {len(fn.inputs), len(fn.inputs) - states}


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


async def _answer(send: Send, status: int, message: str) -> None:
    body = json.dumps({"error": message}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


class BoundedRecords(logging.Filter):
    """Cuts every record (message and traceback) to `limit` characters: nothing a visitor sends can make one
    record of the log long."""

    def __init__(self, limit: int = LOG_RECORD_CHARS) -> None:
        super().__init__()
        self.limit = limit

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if len(text) > self.limit:
            record.msg, record.args = text[:self.limit] + f" … [{len(text) - self.limit:,} characters cut]", None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text and len(record.exc_text) > self.limit:
            record.exc_text = record.exc_text[-self.limit:]  # the end of a traceback says what failed
        return True


def bound_the_log(limit: int = LOG_RECORD_CHARS) -> None:
    """Every handler of the root logger (and any added later through basicConfig) cuts records to `limit`."""
    logging.basicConfig()
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, BoundedRecords) for f in handler.filters):
            handler.addFilter(BoundedRecords(limit))
