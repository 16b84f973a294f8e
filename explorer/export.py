"""Downloads: the traces as JSON and CSV, any view as a standalone HTML page, the sweep's table as CSV, each
written into a fresh server-named folder."""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path

import gradio as gr
import pandas as pd

from explorer import views
from explorer.controls import Controls, takes_controls
from explorer.parse import as_choice
from explorer.pool import ModelPool
from explorer.session import Session
from explorer.ui import user_errors
from explorer.view_handlers import redraw_schedule
from viz import to_html

EXPORT_ROOT = Path(tempfile.gettempdir()) / "d3-explorer-exports"
EXPORT_TTL_S = 3600
FIGURES = ("usage", "decay", "planned", "flow", "attention", "errors", "fills")


def export_dir() -> Path:
    """A fresh server-named folder for one export; folders older than an hour are removed."""
    EXPORT_ROOT.mkdir(parents=True, exist_ok=True)
    for old in EXPORT_ROOT.iterdir():
        if old.is_dir() and time.time() - old.stat().st_mtime > EXPORT_TTL_S:
            shutil.rmtree(old, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix="export-", dir=EXPORT_ROOT))


def export_trace(session: Session | None) -> list[str]:
    """The traces as JSON (D3, full depth, comparison) and one CSV table, written under server-chosen names."""
    if session is None or session.d3 is None or session.full is None:
        raise gr.Error("Nothing to export yet: press Generate first.")
    folder = export_dir()
    files = {"d3_trace.json": session.d3.to_json(), "full_trace.json": session.full.to_json()}
    if session.comparison is not None:
        files["comparison.json"] = json.dumps(session.comparison.to_dict())
    for name, text in files.items():
        (folder / name).write_text(text, encoding="utf-8")
    table = pd.concat([session.d3.to_frame().assign(run="d3"), session.full.to_frame().assign(run="full")])
    table.to_csv(folder / "traces.csv", index=False)
    return [str(folder / n) for n in (*files, "traces.csv")]


@takes_controls
def export_figure(pool: ModelPool, session: Session | None, figure: str, controls: Controls) -> str:
    """One view as a standalone HTML page (plotly.js inlined, works offline)."""
    s, view = session or Session(), controls.view
    with user_errors():
        key = as_choice("figure", figure, FIGURES)
        p = view.presentation
        if key in ("decay", "planned"):
            decay, planned = redraw_schedule(pool, s, **vars(controls))
            fig = decay if key == "decay" else planned
        else:
            fig = {"usage": lambda: views.usage_view(s.d3, presentation=p),
                   "flow": lambda: views.flow_view(s.d3, s.full, metric=view.metric, presentation=p),
                   "attention": lambda: views.attention_view(s.d3, s.full, view.layer, view.head, presentation=p),
                   "errors": lambda: views.error_view(s.comparison, log_kl=view.log_kl, presentation=p),
                   "fills": lambda: views.fills_view(s.fills, presentation=p)}[key]()
    path = export_dir() / f"{key}.html"
    path.write_text(to_html(fig), encoding="utf-8")
    return str(path)


def export_sweep(sweep_results: pd.DataFrame | None) -> str:
    """The sweep's whole table (every column) as CSV, under a server-chosen name."""
    if sweep_results is None or len(sweep_results) == 0:
        raise gr.Error("Nothing to export yet: run a sweep first.", print_exception=False)
    path = export_dir() / "sweep.csv"
    sweep_results.to_csv(path, index=False)
    return str(path)
