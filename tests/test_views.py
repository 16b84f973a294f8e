"""explorer/views: the view registry (issue 23): one module per view, and everything that lists views reads it."""

from __future__ import annotations

import importlib
import sys

import numpy as np
import pytest

from d3.config import D3Config, GenerationConfig
from explorer import views
from tests.figures import by_role, title_text

NEW_VIEW = '''
from explorer.views import Shown, View, waiting


def draw(shown: Shown, options):
    n = len(shown.d3.steps) if shown.d3 is not None else 0
    return waiting(f"{n} D3 tokens", presentation=options.presentation)


VIEW = View("count", "Token count", "How many tokens D3 wrote.", needs="a run", position=55, draw=draw,
            after_run=True)
'''


def test_every_view_is_one_module_with_its_title_explanation_and_needs() -> None:
    keys = [v.key for v in views.registry()]
    assert {"usage", "planned", "flow", "attention", "errors", "fills", "needs", "layers", "lens", "scrub",
            "decay"} <= set(keys)
    for view in views.registry():
        assert importlib.import_module(f"explorer.views.{view.key}").VIEW is view  # the module is named by its key
        assert view.title and len(view.explain) > 80 and view.needs


@pytest.fixture()
def one_more_view(tmp_path, monkeypatch):
    """A view added as one module (in a tmp folder on the package's path), the registry read afresh."""
    (tmp_path / "count.py").write_text(NEW_VIEW)
    monkeypatch.setattr(views, "__path__", [*views.__path__, str(tmp_path)])
    views.registry.cache_clear()
    yield
    monkeypatch.undo()  # the package's own path again, before the modules below read the registry afresh
    sys.modules.pop("explorer.views.count", None)
    views.registry.cache_clear()
    reload_page_modules()


def reload_page_modules() -> None:
    """The page's modules whose lists of views are read at import (and those that import those lists), afresh."""
    import explorer.export
    import explorer.layout
    import explorer.live
    import explorer.page
    import explorer.view_handlers
    import explorer.wiring

    for module in (explorer.view_handlers, explorer.live, explorer.export, explorer.layout, explorer.wiring,
                   explorer.page):
        importlib.reload(module)


def test_a_view_added_as_one_module_is_in_the_tabs_the_runs_presentation_and_export(one_more_view, tiny_engine) -> None:
    """Adding a view is a viz function plus one module: the layout, a run's outputs, presentation mode, clearing
    on a model switch and Export all pick it up from the registry, with nothing else edited."""
    import explorer.export
    import explorer.live
    import explorer.view_handlers

    reload_page_modules()
    from explorer import page

    assert "count" in explorer.live.GENERATE_OUTPUTS and "count" in explorer.view_handlers.VIEW_OUTPUTS
    assert "count" in explorer.export.FIGURES and "count" in explorer.view_handlers.CLEARED_OUTPUTS
    demo = page.build_demo(lambda _: tiny_engine, model_names=("tiny",), public=False)
    assert "count" in demo.ui and "tab_count" in demo.ui and "explain_count" in demo.ui
    from explorer.session import Session

    session = Session()
    outputs = list(explorer.live.generate(demo.pool, session, prompt="hi", model="tiny", max_new_tokens=3))
    last = dict(zip(explorer.live.GENERATE_OUTPUTS, outputs[-1]))
    assert f"{len(session.d3.steps)} D3 tokens" in str(last["count"].to_dict())


def comparison(engine, order: str, fill: str = "copy"):
    from d3.compare import compare

    return compare(engine, "the cat sat on", D3Config(alpha=0.85, core_head=1, core_tail=1, drop_order=order, fill=fill),
                   GenerationConfig(max_new_tokens=10, stop_at_eos=False))


def test_under_a_nested_order_the_error_view_says_no_filled_entry_is_ever_read(tiny_engine) -> None:
    from viz.errors import error_propagation

    fig = error_propagation(comparison(tiny_engine, "middle_out"))
    assert not by_role(fig, "filled")[0].x.size and by_role(fig, "filled-unread")[0].x.size
    # Said under the title (issue 17 item 8: over the heatmap it covered the cells, and a phone cut it)
    assert "no filled entry is ever read" in title_text(fig)
    # Issue 44, U5: one line each, not four lines of a note in the left half of the figure; the run's one count
    assert fig.layout.title.text.count("<br>") <= 2 and " tokens agree" in title_text(fig)
    strided = error_propagation(comparison(tiny_engine, "strided"))
    assert by_role(strided, "filled")[0].x.size  # here later tokens read filled entries: outlined
    assert "no filled entry is ever read" not in title_text(strided)


def test_the_fill_view_says_what_compare_shows_and_why_nested_lines_coincide(tiny_engine) -> None:
    from explorer.views import fills_view

    cold = " ".join(a.text for a in fills_view(None).layout.annotations)
    assert "copy, propagate, none" in cold and "coincide" in cold
    nested = fills_view({f: comparison(tiny_engine, "middle_out", f) for f in ("copy", "none")})
    assert "coincide" in nested.layout.title.text
    strided = fills_view({f: comparison(tiny_engine, "strided", f) for f in ("copy", "none")})
    assert "coincide" not in strided.layout.title.text


def test_the_layer_usage_text_names_the_colours_a_default_run_draws(tiny_engine) -> None:
    from d3.trace import CELL_NAMES, FILLED_COPY, SKIPPED
    from explorer.views import explanations
    from viz.grid import layer_grid

    trace = tiny_engine.generate("the cat sat", D3Config(alpha=0.85, core_head=1, core_tail=1),
                                 GenerationConfig(max_new_tokens=8, stop_at_eos=False))
    z = np.asarray(layer_grid(trace).data[0].z)
    codes = set(np.unique(z[np.isfinite(z)]).astype(int))
    assert FILLED_COPY in codes and SKIPPED not in codes  # the default fill: skipped cells are orange, none grey
    text = explanations()["usage"]
    assert "orange, a *copy*" in text and "(the default fill)" in text
    assert "rows get shorter" not in text and "spans all the layers" in text
    assert CELL_NAMES[FILLED_COPY] == "filled (copy)"


EXTRA_VIEW = '''"""A view added in one module: its own control, its figure (viz), its handler and wiring, how it exports."""
import gradio as gr

from explorer.views import View, waiting
from viz.layout import empty_figure


def figure(stars):
    return empty_figure(f"{int(stars)} stars", presentation=False)


def controls(ui, facts):
    ui["stars"] = gr.Slider(1, 9, value=3, step=1, label="Stars", elem_id="stars")


def wire(pool, ui, page):
    ui["stars"].input(figure, ui["stars"], ui["stars_view"], api_name="stars_view", queue=False)


def draw(shown, options):
    return figure(3) if shown.d3 is not None else waiting("Press Generate.", presentation=options.presentation)


VIEW = View("stars_view", "Stars", "**Stars**: a view with its own control.", needs="a run's D3 trace",
            position=200, draw=draw, after_run=True, controls=controls, wire=wire)
'''


@pytest.fixture()
def stars_view(tmp_path, monkeypatch):
    """The view of EXTRA_VIEW added as one module (in a tmp folder on the package's path)."""
    (tmp_path / "stars_view.py").write_text(EXTRA_VIEW, encoding="utf-8")
    monkeypatch.setattr(views, "__path__", [*views.__path__, str(tmp_path)])
    views.registry.cache_clear()
    reload_page_modules()
    yield
    monkeypatch.undo()
    sys.modules.pop("explorer.views.stars_view", None)
    views.registry.cache_clear()
    reload_page_modules()


def test_a_view_with_its_own_control_is_one_module(stars_view, tiny_engine) -> None:
    """Adding a view with its own control touches its module (and its viz figure): the page gets its tab, its
    control, its own wired event (`View.wire`, with an API name of its own), and Export offers it and says what to
    do before a run (from the View, no table elsewhere). The repository is untouched (the module is in tmp)."""
    import gradio as gr

    import explorer.export
    from explorer import page
    from explorer.session import Session

    demo = page.build_demo(lambda name: tiny_engine, model_names=("tiny",), public=False)
    assert demo.ui["stars"].label == "Stars" and "stars_view" in demo.ui and "tab_stars_view" in demo.ui
    assert "stars_view" in {fn.api_name for fn in demo.fns.values()}  # its own wired event
    assert "stars_view" in explorer.export.figures()
    with pytest.raises(gr.Error, match="Nothing to export yet: press Generate first"):
        explorer.export.export_figure(demo.pool, Session(), "stars_view")
    figure = next(fn for fn in demo.fns.values() if fn.api_name == "stars_view").fn(7)  # its handler draws its figure
    assert "7 stars" in str(figure.to_dict())
