"""Downloads are bounded: a session is needed, each session has a rate and the server has one for all sessions
together, all exports stay under a size cap with the oldest deleted first, plotly.js is written once, and tests
keep every file in pytest's tmp dirs."""

from __future__ import annotations

import tempfile
import time
from collections import deque
from pathlib import Path

import gradio as gr
import pandas as pd
import pytest

from explorer import export
from explorer.export import export_figure
from explorer.pool import ModelPool
from explorer.session import Session
from tests.apphelpers import DEFAULTS

pytestmark = [pytest.mark.usefixtures("exports_in_tmp"), pytest.mark.filterwarnings("ignore::DeprecationWarning")]
FIGURE_ARGS = {k: v for k, v in DEFAULTS.items() if k != "prompt"}


def figure(pool, session, key: str = "usage") -> list[str]:
    return export.export_figure(pool, session, key, **FIGURE_ARGS)


@pytest.fixture(autouse=True)
def server_rate(monkeypatch) -> deque:
    """The server's export rate counted afresh for each test."""
    monkeypatch.setattr(export, "_SERVER_EXPORTS", deque())
    return export._SERVER_EXPORTS


@pytest.fixture
def fresh(finished) -> Session:
    """The finished run, in a session of its own with no downloads yet."""
    return Session(d3=finished.d3, full=finished.full, comparison=finished.comparison)


def test_exports_are_kept_in_the_tests_tmp_dir(exports_in_tmp, pool, fresh) -> None:
    shared = Path(tempfile.gettempdir()) / "d3-explorer-exports"
    assert exports_in_tmp in export.EXPORT_ROOT.parents and export.EXPORT_ROOT != shared
    page, script = map(Path, figure(pool, fresh))
    assert exports_in_tmp in page.parents and exports_in_tmp in script.parents


def test_a_figure_export_needs_a_session(pool) -> None:
    with pytest.raises(gr.Error, match="press Generate first"):
        figure(pool, None, "decay")  # the schedule figures need no run, but a session still


@pytest.mark.parametrize("call", [lambda pool: export.export_trace(None), lambda pool: figure(pool, None),
                                  lambda pool: export.export_sweep(None)], ids=["trace", "figure", "sweep"])
def test_an_export_refused_puts_no_traceback_in_the_log(pool, call) -> None:
    """Anyone can call these with no session: Gradio prints the traceback of a gr.Error unless told not to."""
    with pytest.raises(gr.Error, match="Nothing to export yet") as err:
        call(pool)
    assert err.value.print_exception is False


def test_plotly_js_is_written_once_and_each_page_is_small(pool, fresh) -> None:
    pages = [Path(figure(pool, fresh, key)[0]) for key in ("usage", "decay", "flow")]
    scripts = list(export.EXPORT_ROOT.rglob("plotly*.js"))
    assert scripts == [export.EXPORT_ROOT / "plotly.min.js"] and scripts[0].stat().st_size > 1_000_000
    assert all(p.stat().st_size < 300_000 for p in pages), [p.stat().st_size for p in pages]


def test_each_session_has_a_rate(pool, fresh) -> None:
    for _ in range(export.EXPORTS_PER_MINUTE):
        figure(pool, fresh)
    with pytest.raises(gr.Error, match=f"at most {export.EXPORTS_PER_MINUTE} a minute"):
        figure(pool, fresh)
    with pytest.raises(gr.Error, match="a minute"):
        export.export_trace(fresh)
    export.export_trace(Session(d3=fresh.d3, full=fresh.full))  # someone else is not held up
    fresh.exports[0] -= 61  # a minute later, one more fits
    figure(pool, fresh)


def test_the_server_has_a_rate_that_new_sessions_do_not_reset(pool, server_rate) -> None:
    """A session costs nothing to make, so the server counts every session's downloads together, the sweep's
    CSV too; the schedule figures need no run."""
    for i in range(export.SERVER_EXPORTS_PER_MINUTE):
        figure(pool, Session(), ("decay", "planned")[i % 2])
    with pytest.raises(gr.Error, match=f"at most {export.SERVER_EXPORTS_PER_MINUTE} a minute for everyone"):
        figure(pool, Session(), "decay")
    with pytest.raises(gr.Error, match="for everyone"):
        export.export_sweep(pd.DataFrame({"alpha": [0.9]}))
    assert len(server_rate) == export.SERVER_EXPORTS_PER_MINUTE  # a refused download is not counted
    server_rate[0] -= 61  # a minute later, one more fits
    figure(pool, Session(), "planned")


def test_the_total_stays_under_the_cap_oldest_first(pool, finished, monkeypatch) -> None:
    one = Path(figure(pool, Session(d3=finished.d3, full=finished.full), "usage")[0]).stat().st_size
    js = (export.EXPORT_ROOT / "plotly.min.js").stat().st_size
    monkeypatch.setattr(export, "EXPORT_MAX_BYTES", js + 3 * one + one // 2)  # room for three pages
    folders = []
    for _i in range(6):
        folders.append(Path(figure(pool, Session(d3=finished.d3, full=finished.full), "usage")[0]).parent)
        time.sleep(0.02)  # distinct modification times
    left = [f for f in folders if f.exists()]
    assert left == folders[-3:]  # the newest three, the oldest deleted first
    total = sum(f.stat().st_size for f in export.EXPORT_ROOT.rglob("*") if f.is_file())
    assert total <= export.EXPORT_MAX_BYTES


def test_exporting_a_figure_that_was_never_computed_says_so() -> None:
    pool = ModelPool(lambda name: None, names=("tiny",))
    with pytest.raises(Exception, match="(?i)nothing to export|not computed|press generate"):
        export_figure(pool, Session(), "errors", model="tiny")


def test_before_a_run_every_view_exports_its_figure_or_says_what_to_do_first(pool) -> None:
    """Every view of the registry, in a session with no run: the ones drawn from the controls alone export their
    figure; every other one answers "Nothing to export yet" with what to do first, from its own `View` (none
    exports the placeholder that asks for a run: the layer stack and the all-heads view once did, issue 33)."""
    from explorer import views

    for view in views.registry():
        try:
            pages = figure(pool, Session(), view.key)
        except gr.Error as err:
            assert err.message == f"Nothing to export yet: {view.first}" and (view.measured or view.after_run
                                                                           or view.ready is not None), view.key
            continue
        assert not view.measured and view.ready is None and not view.after_run, view.key  # drawn from the controls
        assert "Press Generate" not in Path(pages[0]).read_text(encoding="utf-8"), view.key


def test_a_view_declaring_a_fourth_input_gets_a_parameter_of_its_own(pool, fresh, monkeypatch) -> None:
    """Issue 43 item 4: Export's parameters come from each view's declaration (`View.export_input`), whatever
    their number: a view that declares a fourth input gets a parameter of its name after the three of today
    (their names, the gradio_client API's, unchanged), and its value, positional as Gradio passes it or by
    keyword, reaches that view and no other."""
    import inspect

    import plotly.graph_objects as go

    from explorer import views
    from explorer.controls import CONTROL_NAMES

    seen: list = []

    def exported(pool, session, own, controls):
        seen.append(own)
        return {"fourth": go.Figure(go.Bar(x=["a"], y=[own["bars"]]))}

    fourth = views.View(key="fourth", title="Fourth", explain="", needs="", position=10**6, exported=exported,
                        export_input="fourth_state", ready=lambda session: True)
    registry = (*views.registry(), fourth)
    monkeypatch.setattr(views, "registry", lambda: registry)
    exporter = export.figure_exporter()
    names = list(inspect.signature(exporter).parameters)
    assert names == ["pool", "session", "figure", "needs_state", "layers_state", "scrub_index", "fourth_state",
                     *CONTROL_NAMES]
    assert list(inspect.signature(export.export_figure).parameters)[:6] == names[:6]  # the page's own, as before
    page, _script = exporter(pool, fresh, "fourth", None, None, None, {"bars": 4}, **FIGURE_ARGS)
    assert Path(page).name == "fourth.html" and seen == [{"bars": 4}]
    exporter(pool, fresh, "fourth", fourth_state={"bars": 5}, **FIGURE_ARGS)
    assert seen[-1] == {"bars": 5}
    usage, _ = exporter(pool, fresh, "usage", None, None, None, {"bars": 6}, **FIGURE_ARGS)
    assert Path(usage).name == "usage.html" and len(seen) == 2  # another view never reads it
