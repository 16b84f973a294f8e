"""The page put together: layout and wiring over one model pool, and how it is served."""

from __future__ import annotations

import gc
import os
import socket
import warnings
from collections.abc import Callable
from typing import Any

import gradio as gr
from starlette.middleware import Middleware

from d3.engine import Engine
from d3.models import KNOWN_MODELS
from d3.research.data import ASSETS
from explorer.caps import Caps, is_public
from explorer.expiry import session_expiry
from explorer.guard import RequestGuard, UploadBudget, bound_the_log
from explorer.layout import build_layout
from explorer.pool import ModelPool
from explorer.prepare import EVERY_S, Preparation, prepare_order
from explorer.wiring import wire

CSS_PATH = ASSETS / "style.css"


def build_demo(engine_factory: Callable[[str], Engine] | None = None, *, caps: Caps | None = None,
               public: bool | None = None, model_names: tuple[str, ...] | None = None,
               preparation: Preparation | None = None) -> gr.Blocks:
    """The page. The model loads lazily on first use; `engine_factory(name)` replaces the real loader (tests).
    A public server prepares its known models once, from `launch` on (`preparation`: explorer/prepare.py), and
    shows how far that is at the top of the page."""
    caps = caps or Caps.from_env()
    public = is_public() if public is None else public
    names = model_names or tuple(KNOWN_MODELS)
    pool = ModelPool(engine_factory, caps=caps, public=public, names=names)
    if preparation is None and public and engine_factory is None:
        preparation = Preparation(prepare_order(names))
    if preparation is not None:
        pool.preparing = preparation.message
    facts = pool.facts(names[0])
    with gr.Blocks(title="D3 Explorer", delete_cache=(3600, 3600)) as demo:
        if preparation is not None:
            _show_preparation(preparation)
        ui = build_layout(pool, facts)
        wire(pool, ui, demo)
    demo.preparation = preparation  # type: ignore[attr-defined]  (started by `launch`)
    demo.pool = pool  # type: ignore[attr-defined]  (tests and scripts reach the shared engines through it)
    demo.ui = ui  # type: ignore[attr-defined]  (the components by key, for tests of the wiring)
    return demo


def _show_preparation(preparation: Preparation) -> None:
    """A line at the top of the page with each model's preparation, refreshed every EVERY_S until all are ready."""
    line = gr.HTML(preparation.html(), elem_id="preparing", visible=False)  # shown by the first tick, if need be
    timer = gr.Timer(EVERY_S)

    def tick() -> tuple[Any, Any]:
        shown = preparation.html()
        return gr.update(value=shown, visible=bool(shown)), gr.Timer(active=not preparation.done())

    timer.tick(tick, None, [line, timer], api_name=False, queue=False, show_progress="hidden")


def tune_process(env: dict[str, str] | None = None) -> None:
    """Process settings for serving (`python app.py`, not the tests): D3_TORCH_THREADS sets torch's CPU threads
    (on a busy or shared CPU, 1 thread can be several times faster than torch's default), 1 by default on a public
    server (its visitors' runs already share the cores, and torch's threads left the page's own requests waiting:
    the class load test, docs/reliability.md), and everything alive now (gradio, torch, the page) is moved out of
    the garbage collector's full passes, which otherwise pause a slider redraw for about half a second now and then
    (both measured by scripts/measure_app.py)."""
    env = dict(os.environ) if env is None else env
    threads = env.get("D3_TORCH_THREADS", "").strip() or ("1" if is_public(env) else "")
    if threads.isdigit() and int(threads) > 0:
        import torch

        torch.set_num_threads(int(threads))
    gc.freeze()


# The page has no upload control; gradio's /upload route still takes files from anyone (kept up to an hour): a
# bound far below what fills a disk. gradio answers 413 above it, and explorer.guard bounds all uploads together.
MAX_UPLOAD_BYTES = 1_000_000
MAX_REQUEST_BYTES = 256_000  # one event's values, the prompt aside (a prompt may add 4 bytes per character)
WARNINGS_REMEMBERED = 4096  # distinct warnings remembered as shown; past that the memory starts afresh


def show_warnings_once() -> None:
    """The server's log shows each warning (its category and text) once per process. Python's own "once" and
    "default" actions forget what they showed whenever any code changes the warning filters (every
    `warnings.catch_warnings` does, and libraries on the page's path enter one per update), so a library's
    deprecation warning inside a decoding step was printed again run after run. Warnings that filters ignore
    stay ignored, and a `catch_warnings(record=True)` (pytest's) still records every one."""
    show = warnings.showwarning
    if getattr(show, "shows_once", False):
        return
    shown: set[tuple[type, str]] = set()

    def once(message: Any, category: type, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
        key = (category, str(message))
        if key in shown:
            return
        if len(shown) >= WARNINGS_REMEMBERED:
            shown.clear()
        shown.add(key)
        show(message, category, filename, lineno, file, line)

    once.shows_once = True  # type: ignore[attr-defined]
    warnings.showwarning = once


def launch(demo: gr.Blocks, **kwargs: Any) -> Any:
    """Queue (bounded, with the concurrency the caps allow) and serve the page with its stylesheet, uploads and
    request bodies bounded, requests for events no client may call refused (`explorer.guard`); the server's log
    shows each warning once and cuts each record to a bounded length."""
    show_warnings_once()
    preparation: Preparation | None = getattr(demo, "preparation", None)
    if preparation is not None:
        preparation.start()  # the known models, converted or downloaded once, in the background
    caps: Caps = demo.pool.caps  # type: ignore[attr-defined]
    demo.queue(max_size=caps.queue_size, default_concurrency_limit=caps.concurrency)
    kwargs.setdefault("css_paths", [CSS_PATH])
    kwargs.setdefault("state_session_capacity", caps.max_sessions)
    kwargs.setdefault("max_file_size", MAX_UPLOAD_BYTES)
    app_kwargs = dict(kwargs.pop("app_kwargs", None) or {})
    public = demo.pool.public  # type: ignore[attr-defined]
    guard = Middleware(RequestGuard, demo=demo, max_body=MAX_REQUEST_BYTES + 4 * caps.max_prompt_chars,
                       uploads=UploadBudget(), events_per_address=caps.events_per_address if public else None,
                       max_wait_s=caps.max_wait_s if public else None)
    app_kwargs["middleware"] = [*app_kwargs.get("middleware", ()), guard]
    app_kwargs.setdefault("lifespan", session_expiry(caps.session_ttl_s))
    bound_the_log()
    return demo.launch(app_kwargs=app_kwargs, **kwargs)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (for tests and scripts that serve the page)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
