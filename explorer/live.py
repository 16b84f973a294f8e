"""Handlers of the Live tab's runs: generate (both panes streamed, then the comparison), compare fills, stop."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import gradio as gr

from d3.config import FILLS
from explorer import views
from explorer.controls import Controls, ViewOptions, takes_controls
from explorer.pool import ModelPool
from explorer.runs import LiveUpdate, RunSetup, check_run, fill_comparison, measured_speedup, prepare_run, side_by_side
from explorer.session import Session
from explorer.ui import ordered, user_errors
from viz import counters_html, token_html

GENERATE_OUTPUTS = ("session", "status", "d3_title", "d3_tokens", "d3_counters", "full_tokens", "full_counters",
                    "usage", "decay", "flow", "attention", "errors", "fills", "history")
FILLS_OUTPUTS = ("session", "status", "fills")


def interrupt(session: Session | None) -> None:
    """A new run was asked for: stop this session's running one now, before the new one waits in the queue."""
    if session is not None:
        session.trigger()


def stop(session: Session | None) -> str:
    if session is None:
        return views.status_html(None, None, "Nothing is running.")
    session.request_stop()
    return views.status_html(session.d3, session.full, "Stopping… (within one token)")


def _is_due(update: LiveUpdate, every: int) -> bool:
    """Heavy figures redraw on the first token, every `every` D3 tokens, and at each phase change."""
    if update.phase != "streaming":
        return True
    return update.pane == "d3" and update.d3 is not None and (len(update.d3.steps) - 1) % every == 0


def _render(session: Session, setup: RunSetup, update: LiveUpdate, view: ViewOptions, every: int) -> tuple[Any, ...]:
    """The outputs of one streamed update: panes and counters always, heavy figures when due."""
    d3, full, p = update.d3, update.full, view.presentation
    measured = measured_speedup(d3, full)
    out: dict[str, Any] = dict(
        session=session, status=views.status_html(d3, full, update.phase, comparison=update.comparison),
        d3_tokens=token_html(d3, reference=full) if d3 else gr.skip(),
        d3_counters=counters_html(d3, reference=full, measured_speedup=measured) if d3 else gr.skip(),
        full_tokens=token_html(full) if full else gr.skip(),
        full_counters=counters_html(full, reference=d3, measured_speedup=1.0 if measured else None) if full else gr.skip())
    if _is_due(update, every):
        cfg, steps, layers = setup.strategy, setup.gen.max_new_tokens, setup.engine.num_layers
        out.update(usage=views.usage_view(d3, presentation=p),
                   decay=views.decay_view(cfg, layers, steps, trace=d3, others=setup.others, presentation=p))
    if update.phase != "streaming":
        out.update(flow=views.flow_view(d3, full, metric=view.metric, presentation=p),
                   attention=views.attention_view(d3, full, view.layer, view.head, presentation=p),
                   errors=views.error_view(update.comparison, phase=update.phase, log_kl=view.log_kl, presentation=p))
    if update.finished:
        out["history"] = session.history_frame()
    return ordered(GENERATE_OUTPUTS, **out)


def _first_outputs(session: Session, setup: RunSetup, view: ViewOptions) -> tuple[Any, ...]:
    """Clear what the previous run left in the views, and name the strategy over the D3 pane."""
    p = view.presentation
    blank = "<div class='d3-tokens'>(waiting for the first token…)</div>"
    return ordered(GENERATE_OUTPUTS, session=session, status=views.status_html(None, None, "streaming"),
                   d3_title=f"### {views.pane_title(setup.strategy, 'D3')}", d3_tokens=blank, full_tokens=blank,
                   d3_counters="", full_counters="", flow=views.flow_view(None, None, presentation=p),
                   attention=views.attention_view(None, None, 0, 0, presentation=p),
                   errors=views.error_view(None, presentation=p), fills=views.fills_view(None, presentation=p))


def _stream(session: Session, run_id: int, setup: RunSetup, view: ViewOptions, every: int) -> Iterator[tuple[Any, ...]]:
    label = views.pane_title(setup.strategy, "D3")
    run = side_by_side(setup.engine, setup.prompt, setup.strategy, setup.gen, setup.trace,
                       chat_template=setup.chat_template, should_stop=session.stopper(run_id))
    with contextlib.closing(run):
        for update in run:
            if not session.is_current(run_id):
                return  # a newer run of this session owns the panes now
            if update.finished:
                session.finish(update, label)
            else:
                session.show(update)
            yield _render(session, setup, update, view, every)


@takes_controls
def generate(pool: ModelPool, session: Session | None, controls: Controls) -> Iterator[tuple[Any, ...]]:
    """Stream D3 (or the chosen strategy) and full depth side by side, then compare them."""
    session = session or Session()
    with user_errors():
        checked = check_run(pool, controls)  # a mistake is reported before a slow model load
        run_id = session.begin()  # any earlier run of this session stops within one token
        if not pool.is_loaded(checked.model):
            yield ordered(GENERATE_OUTPUTS, session=session, status=views.status_html(None, None, "loading"))
        setup = prepare_run(pool, controls)
        session.clear()
        yield _first_outputs(session, setup, controls.view)
        yield from _stream(session, run_id, setup, controls.view, pool.caps.figure_every)


@takes_controls
def compare_fills(pool: ModelPool, session: Session | None, controls: Controls) -> Iterator[tuple[Any, Any, Any]]:
    """Run the same prompt and schedule with each fill (copy, propagate, none) against full depth."""
    session, p = session or Session(), controls.view.presentation
    with user_errors():
        check_run(pool, controls)
        run_id = session.begin()
        setup = prepare_run(pool, controls)
        session.fills = {}
        yield session, views.status_html(None, None, "Comparing fills: running full depth…"), gr.skip()
        runs = fill_comparison(setup.engine, setup.prompt, setup.strategy, setup.gen, chat_template=setup.chat_template,
                               should_stop=session.stopper(run_id))
        with contextlib.closing(runs):
            for name, comparison in runs:
                if not session.is_current(run_id):
                    return
                session.fills = {**session.fills, name: comparison}
                yield (session, views.status_html(None, None, f"Comparing fills: {', '.join(session.fills)} done…"),
                       views.fills_view(session.fills, presentation=p))
        done = "Fill comparison done: see the Fill strategies tab." if len(session.fills) == len(FILLS) else "Stopped."
        yield session, views.status_html(None, None, done), views.fills_view(session.fills, presentation=p)
