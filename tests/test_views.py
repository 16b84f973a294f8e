"""explorer/views: the view registry (issue 23): one module per view, and everything that lists views reads it."""

from __future__ import annotations

import importlib
import sys

import pytest

from explorer import views

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
    sys.modules.pop("explorer.views.count", None)
    views.registry.cache_clear()


def test_a_view_added_as_one_module_is_in_the_tabs_the_runs_presentation_and_export(one_more_view, tiny_engine) -> None:
    """Adding a view is a viz function plus one module: the layout, a run's outputs, presentation mode, clearing
    on a model switch and Export all pick it up from the registry, with nothing else edited."""
    import explorer.export
    import explorer.live
    import explorer.view_handlers
    from explorer import page

    for module in (explorer.view_handlers, explorer.live, explorer.export):  # their lists are read at import
        importlib.reload(module)
    try:
        assert "count" in explorer.live.GENERATE_OUTPUTS and "count" in explorer.view_handlers.VIEW_OUTPUTS
        assert "count" in explorer.export.FIGURES and "count" in explorer.view_handlers.CLEARED_OUTPUTS
        demo = page.build_demo(lambda _: tiny_engine, model_names=("tiny",), public=False)
        assert "count" in demo.ui and "tab_count" in demo.ui and "explain_count" in demo.ui
        from explorer.session import Session

        session = Session()
        outputs = list(explorer.live.generate(demo.pool, session, prompt="hi", model="tiny", max_new_tokens=3))
        last = dict(zip(explorer.live.GENERATE_OUTPUTS, outputs[-1]))
        assert f"{len(session.d3.steps)} D3 tokens" in str(last["count"].to_dict())
    finally:
        views.registry.cache_clear()
        sys.modules.pop("explorer.views.count", None)
        for module in (explorer.view_handlers, explorer.live, explorer.export):
            importlib.reload(module)
