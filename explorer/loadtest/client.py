"""One person's request under load: their prompt and seed, the tokens read off the streamed panes, what went wrong."""

from __future__ import annotations

import concurrent.futures
import json
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from d3.config import default_core

# Outputs of /generate over the API, in order (the session State is not part of the API).
STATUS, D3_TOKENS, FULL_TOKENS = 0, 2, 4
# The step line of each token's tooltip: "step 3 · token 'x' (id 42)" (viz.stream._token_title).
# A tooltip may open with a line of its own (the end-of-text mark, white space before the answer) before its step line.
TOKEN_ID = re.compile(r'data-step="(\d+)"[^>]*? title="(?:[^"\n]*\n)*?step \d+ · token [^"]*?\(id (\d+)\)(?=\n|")')


@dataclass(frozen=True)
class Spec:
    """One person's generation: their own prompt and sampling seed."""

    prompt: str
    seed: int
    tokens: int

    def kwargs(self, model: str, num_layers: int) -> dict[str, Any]:
        core = default_core(num_layers)[0]
        return dict(prompt=self.prompt, model=model, chat_template=True, strategy="d3", alpha=0.95,
                    core_head=core, core_tail=core, start=0, drop_order="middle_out", fill="copy",
                    max_new_tokens=self.tokens, decoding="sample", temperature=0.9, seed=self.seed,
                    attention_layer=num_layers // 2, attention_head=0)


@dataclass(frozen=True)
class Tokens:
    """Token ids of both panes, as the page shows them."""

    d3: tuple[int, ...]
    full: tuple[int, ...]


def token_ids(pane_html: Any) -> tuple[int, ...]:
    """Token ids of a pane, in order, from each token's tooltip."""
    found = sorted((int(step), int(tok)) for step, tok in TOKEN_ID.findall(str(pane_html)))
    if [s for s, _ in found] != list(range(len(found))):
        raise ValueError("the pane's tokens are not numbered 0..n-1")
    return tuple(t for _, t in found)


def tokens_of(final: Sequence[Any]) -> Tokens:
    return Tokens(token_ids(final[D3_TOKENS]), token_ids(final[FULL_TOKENS]))


@dataclass
class Outcome:
    """What one request got: its tokens or the kind of error, and how long it took."""

    spec: Spec
    latency_s: float = float("nan")
    tokens: Tokens | None = None
    updates: int = 0  # streamed updates received
    streamed: list[Tokens] = field(default_factory=list)  # the panes' tokens in each streamed update
    error: str = ""
    exported: tuple[int, ...] | None = None  # D3 token ids in the session's exported trace


REFUSED = "refused: "  # error_kind's prefix for a request the server refused at once with a message (not a failure)


def refused_with(err: BaseException) -> str | None:
    """The server's message when it refused the request at once, busy (429 or 503 with a JSON {"error": ...}, as
    explorer.guard answers: too long a wait, too many from one address), else None."""
    response = getattr(err, "response", None)
    if getattr(response, "status_code", None) not in (429, 503):
        return None
    try:
        message = response.json().get("error") or response.json().get("detail")  # type: ignore[union-attr]
    except Exception:
        return None
    return str(message) if message else None


def error_kind(err: BaseException) -> str:
    """A short, countable name for what went wrong."""
    message = str(err)
    if isinstance(err, (TimeoutError, concurrent.futures.TimeoutError)):
        return "timeout"
    if "Queue is full" in message:
        return "queue_full"
    if "has not enabled verbose error reporting" in message or not message.strip():
        return "unhandled_server_exception"
    if "Something went wrong on the server" in message:
        return "server_error"
    if type(err).__name__ == "AppError":
        return "app_error: " + message.splitlines()[0][:80]
    refusal = refused_with(err)
    if refusal is not None:
        return REFUSED + refusal
    return f"client: {type(err).__name__}: {message[:80]}"


def generate(client: Any, spec: Spec, model: str, num_layers: int, timeout: float) -> Outcome:
    """Submit one generation, wait for its last update, and read the tokens off every streamed update."""
    outcome = Outcome(spec)
    started = time.perf_counter()
    job = client.submit(**spec.kwargs(model, num_layers), api_name="/generate")
    try:
        final = job.result(timeout=max(1.0, timeout))  # waits on a future (iterating the job would spin)
        outcome.latency_s = time.perf_counter() - started
        updates = job.outputs()
        outcome.updates = len(updates)
        if "Done." not in str(final[STATUS]):
            raise RuntimeError(f"the run did not finish: {str(final[STATUS])[:120]}")
        outcome.tokens = tokens_of(final)
        if not outcome.tokens.d3 or not outcome.tokens.full:
            raise RuntimeError("no tokens in the final panes")
        outcome.streamed = [tokens_of(update) for update in updates]
    except Exception as err:  # any failure is counted by kind; the load test goes on
        outcome.error = error_kind(err)
        job.cancel()
    return outcome


def is_prefix(part: Tokens, whole: Tokens) -> bool:
    return whole.d3[:len(part.d3)] == part.d3 and whole.full[:len(part.full)] == part.full


def exported_d3_ids(client: Any) -> tuple[int, ...]:
    """The D3 token ids of this session's last run, from its trace export (the session State on the server)."""
    paths = client.predict(api_name="/export_trace")
    d3_path = next(Path(p) for p in paths if Path(p).name == "d3_trace.json")
    return tuple(int(s["token_id"]) for s in json.loads(d3_path.read_text())["steps"])
