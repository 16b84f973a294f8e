"""Downloads: the traces as JSON and CSV, any view as an HTML page, the sweep's table as CSV, each written into a
fresh server-named folder inside Gradio's own file cache, which serves them from there without a second copy.
Bounded for the server as a whole: a session needs to exist and may download so often, all sessions together
(a new session buys no more) so often, all exports together stay under a size cap (the oldest go first), and
plotly.js is written once and referenced by every page."""

from __future__ import annotations

import inspect
import json
import os
import shutil
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gradio as gr
import pandas as pd
from gradio.utils import get_upload_folder
from plotly.offline import get_plotlyjs

from explorer import views
from explorer.controls import Controls, takes_controls
from explorer.parse import as_choice
from explorer.pool import ModelPool
from explorer.session import Session
from explorer.ui import user_errors
from explorer.view_handlers import redraw_schedule
from viz import to_html

# Inside Gradio's cache folder (GRADIO_TEMP_DIR), where Gradio serves a returned file as it is: anywhere else it
# copies each file into that folder and keeps the copy for an hour, out of reach of the cap below.
EXPORT_ROOT = Path(get_upload_folder()) / "d3-exports"
EXPORT_TTL_S = 3600
EXPORT_MAX_BYTES = 256 * 2**20  # every export folder together; beyond it the oldest folders are deleted
EXPORTS_PER_MINUTE = 10  # per session
SERVER_EXPORTS_PER_MINUTE = 20  # all sessions together, the sweep's CSV included
PLOTLY_JS = "plotly.min.js"  # one copy in EXPORT_ROOT, downloaded beside each figure page
# Every view Export offers: every view of the registry, in tab order (the decay curve first). Most are drawn from the
# session's run; the schedule's two from the controls; the lens is read out of the run first; "What each token
# needs" and "Which layers matter" from their own measurements (kept in their states); the scrubber at a token.
def figures() -> tuple[str, ...]:
    """The views Export offers, in tab order: every view of the registry that exports (`View.export`)."""
    return tuple(v.key for v in views.registry() if v.export)


FIGURES = figures()


def export_inputs() -> tuple[str, ...]:
    """The components whose values Export takes after the figure: each view's `export_input`, in tab order."""
    return tuple(v.export_input for v in views.registry() if v.export and v.export_input)


_PRUNING = threading.Lock()  # one pruner at a time in this process: two would delete and stat the same folders


def _stat(path: Path) -> os.stat_result | None:
    """The path's stat, or None when it is gone (another server process sharing the folder may delete it)."""
    try:
        return path.stat()
    except FileNotFoundError:
        return None


def _size(path: Path) -> int:
    if not path.is_dir():
        st = _stat(path)
        return st.st_size if st else 0
    return sum(st.st_size for f in path.rglob("*") if (st := _stat(f)) is not None and f.is_file())


def _prune(root: Path, room: int) -> None:
    """Delete export folders older than the TTL, then the oldest ones until `room` more bytes fit under the cap."""
    with _PRUNING:
        stamped = [(st.st_mtime, p) for p in root.iterdir() if p.is_dir() and (st := _stat(p)) is not None]
        now, total = time.time(), sum(_size(p) for p in root.iterdir())
        for mtime, folder in sorted(stamped):
            if now - mtime <= EXPORT_TTL_S and total + room <= EXPORT_MAX_BYTES:
                break
            total -= _size(folder)
            shutil.rmtree(folder, ignore_errors=True)


# When the server's last exports were made (time.monotonic()), every session's together. Global on purpose: this
# bound is the server's, and a session costs nothing to make.
_SERVER_EXPORTS: deque[float] = deque()
_COUNTING = threading.Lock()


def _recent(times: deque[float], now: float) -> int:
    """How many of `times` fall in the last minute (older ones are dropped)."""
    while times and now - times[0] > 60:
        times.popleft()
    return len(times)


def _count_export(session: Session | None) -> None:
    """One more export, within the session's rate and the server's; gr.Error beyond either, and then neither
    is counted."""
    with _COUNTING:
        now = time.monotonic()
        if session is not None and _recent(session.exports, now) >= EXPORTS_PER_MINUTE:
            raise gr.Error(f"Too many downloads: at most {EXPORTS_PER_MINUTE} a minute. Wait a little and try "
                           "again.", print_exception=False)
        if _recent(_SERVER_EXPORTS, now) >= SERVER_EXPORTS_PER_MINUTE:
            raise gr.Error(f"Too many downloads on this server just now: at most {SERVER_EXPORTS_PER_MINUTE} a "
                           "minute for everyone together. Wait a minute and try again.", print_exception=False)
        _SERVER_EXPORTS.append(now)
        if session is not None:
            session.exports.append(now)


def export_dir(session: Session | None, room: int = 0) -> Path:
    """A fresh server-named folder for one export, with room for about `room` bytes; counted against the
    session's rate (the sweep's CSV has no session) and the server's."""
    _count_export(session)
    EXPORT_ROOT.mkdir(parents=True, exist_ok=True)
    _prune(EXPORT_ROOT, room)
    return Path(tempfile.mkdtemp(prefix="export-", dir=EXPORT_ROOT))


def plotly_js() -> Path:
    """plotly.js, written once into the export root (atomically, so a concurrent export never reads half of it)."""
    path = EXPORT_ROOT / PLOTLY_JS
    if not path.is_file():
        fd, staging = tempfile.mkstemp(dir=EXPORT_ROOT, prefix=".plotly-")
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(get_plotlyjs())
        os.replace(staging, path)
    return path


def export_trace(session: Session | None) -> list[str]:
    """The traces as JSON (D3, full depth, comparison) and one CSV table, written under server-chosen names."""
    if session is None or session.d3 is None or session.full is None:
        raise gr.Error("Nothing to export yet: press Generate first.", print_exception=False)
    files = {"d3_trace.json": session.d3.to_json(), "full_trace.json": session.full.to_json()}
    if session.comparison is not None:
        files["comparison.json"] = json.dumps(session.comparison.to_dict())
    folder = export_dir(session, room=2 * sum(len(text) for text in files.values()))
    for name, text in files.items():
        (folder / name).write_text(text, encoding="utf-8")
    table = pd.concat([session.d3.to_frame().assign(run="d3"), session.full.to_frame().assign(run="full")])
    table.to_csv(folder / "traces.csv", index=False)
    return [str(folder / n) for n in (*files, "traces.csv")]


def _figures(pool: ModelPool, s: Session, view: views.View, own: Any, controls: Controls) -> dict[str, Any]:
    """The view's figure(s) by file name (the scrubber has two); `own`: the value of its `export_input` (a measured
    view's state, the scrubber's token)."""
    if view.key in views.SCHEDULE:  # drawn from the controls alone
        return {view.key: dict(zip(views.SCHEDULE, redraw_schedule(pool, s, **vars(controls))))[view.key]}
    if view.measured:  # its own measurement, kept in its state (what to press first: `view.first`)
        if own is None:
            raise gr.Error(f"Nothing to export yet: {view.first}", print_exception=False)
        assert view.redraw is not None
        return {view.key: view.redraw(pool, own, **vars(controls))}
    if view.exported is not None:
        return view.exported(pool, s, own, controls)
    return {view.key: views.draw(view.key, views.Shown.of(s), controls.view)}


def _export_figure(pool: ModelPool, session: Session | None, figure: str, own_values: dict[str, Any],
                   controls: Controls) -> list[str]:
    """One view as an HTML page (the scrubber: its two) that loads plotly.js from the file beside it: all are
    returned, so the pages work offline once downloaded into one folder. own_values: each view's `export_input`
    by name (a measured view's state, the scrubber's token); the figure's view reads its own."""
    s = session
    if s is None:  # the page makes one on load; an API caller gets one by generating
        raise gr.Error("Nothing to export yet: press Generate first.", print_exception=False)
    with user_errors():
        view = views.by_key()[as_choice("figure", figure, figures())]
        if view.prepare is not None:
            view.prepare(pool, s)
        if not view.measured and not view.ready_in(s):  # else the export would be the placeholder that asks for it
            raise gr.Error(f"Nothing to export yet: {view.first}", print_exception=False)
        own = own_values.get(view.export_input) if view.export_input else None
        drawn = _figures(pool, s, view, own, controls)
    pages = {name: to_html(fig, plotlyjs=PLOTLY_JS) for name, fig in drawn.items()}
    folder = export_dir(s, room=sum(map(len, pages.values())))
    for name, page in pages.items():
        (folder / f"{name}.html").write_text(page, encoding="utf-8")
    return [*(str(folder / f"{name}.html") for name in pages), str(plotly_js())]


def figure_exporter(inputs: tuple[str, ...] | None = None) -> Callable[..., list[str]]:
    """`export_figure(pool, session, figure, <each view's export_input>..., <every control>...)`, its parameters
    made from the registry's declarations (`export_inputs()`, in tab order; default None each), whatever their
    number: Gradio passes the inputs positionally and names the API's parameters after this signature, so a view
    that declares an input adds a parameter of its name, and no other moves."""
    names = export_inputs() if inputs is None else inputs

    def export_figure(pool: ModelPool, session: Session | None, figure: str, *rest: Any) -> list[str]:
        *values, controls = rest
        return _export_figure(pool, session, figure, dict(zip(names, values)), controls)

    leading = [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD)
               for name in ("pool", "session", "figure")]
    own = [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None) for name in names]
    controls = inspect.Parameter("controls", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None)
    export_figure.__signature__ = inspect.Signature([*leading, *own, controls])  # type: ignore[attr-defined]
    export_figure.__doc__ = _export_figure.__doc__
    return takes_controls(export_figure)


# The views' inputs as the registry declares them when this module is imported (the page's modules are imported,
# or reloaded, after the views: `explorer.wiring` passes `export_inputs()` in the same order).
export_figure = figure_exporter()


def export_sweep(sweep_results: pd.DataFrame | None) -> str:
    """The sweep's whole table (every column) as CSV, under a server-chosen name."""
    if sweep_results is None or len(sweep_results) == 0:
        raise gr.Error("Nothing to export yet: run a sweep first.", print_exception=False)
    path = export_dir(None, room=len(sweep_results) * 2048) / "sweep.csv"
    sweep_results.to_csv(path, index=False)
    return str(path)
