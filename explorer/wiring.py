"""Wiring: which event calls which handler with which inputs and outputs, under which API name and queue."""

from __future__ import annotations

import functools
import json
from typing import Any

import gradio as gr

from d3.research.data import ASSETS
from explorer import views
from explorer.controls import CONTROL_NAMES, PREVIEW_IDS, REDRAW_NAMES, RELEASE_NAMES, SETTLED_NAMES
from explorer.export import export_figure, export_inputs, export_sweep, export_trace
from explorer.fair import HEAVY, heavy_slots, replaced_by_newer
from explorer.live import FILLS_OUTPUTS, GENERATE_OUTPUTS, compare_fills, generate, interrupt, stop
from explorer.moves import Moves
from explorer.pool import ModelPool
from explorer.scenarios import offered
from explorer.share import wire_share
from explorer.sweep_tab import (
    SWEEP_INPUTS,
    SWEEP_LOAD_OUTPUTS,
    SWEEP_OUTPUTS,
    load_sweep_point,
    load_sweep_setting,
    stream_sweep,
)
from explorer.view_handlers import (
    ATTENTION_OUTPUTS,
    DRAWN_ON_OPEN,
    MODEL_OUTPUTS,
    SCENARIO_OUTPUTS,
    SETTLE_OUTPUTS,
    VIEW_OUTPUTS,
    apply_scenario,
    check_release,
    load_model,
    model_changed,
    new_session,
    open_view,
    redraw_schedule,
    render_attention,
    scenario_goes_on,
    scenario_interrupted,
    set_presentation,
    settle_controls,
    settle_released,
    show_finding,
    use_example,
    view_opened,
)

# a click on a point of the Sweep's Pareto view loads its setting; on a cell of the attention overview, opens that head
PLOT_CLICK_JS = ASSETS / "plot_click.js"
PAGE_JS = ASSETS / "page.js"  # fits plots to their boxes after tab switches
PREVIEW_JS = ASSETS / "decay_preview.js"  # the decay curve drawn in the browser while a slider moves
# Letting go of one of these sliders regenerates; while one moves, the browser redraws the decay curve from
# them (the control table's `release`; decay_preview.js follows them by name).
RELEASE_TRIGGERS = RELEASE_NAMES
# What a release was (assets/decay_preview.js: a pointer on a slider's track or reset, or a box left): its first input.
RELEASE_JS = "(session, how, ...rest) => [session, window.d3Released ? window.d3Released() : 'pointer', ...rest]"
# The API a gradio_client user sees (`Client(url).view_api()`): the runs and exports, documented. The page's other
# events stay callable but undocumented (views, scenarios, links), except browser plumbing that means nothing
# outside a page (private: the page calls them, no client can).
PUBLIC_API = ("generate", "stop", "compare_fills", "measure_needs", "fit_alpha_to_prompt", "measure_layers",
              "export_trace", "export_figure", "run_sweep", "export_sweep")
BROWSER_ONLY = ("new_session", "interrupt", "interrupt_on_release", "interrupt_fills", "load_sweep_setting")
# A person's move of one of these settles the controls (`settle_controls`; the control table's `settles`).
SETTLED_CONTROLS = SETTLED_NAMES


def preview_js() -> str:
    """assets/decay_preview.js with the ids of the controls it follows, from the control table."""
    return PREVIEW_JS.read_text(encoding="utf-8").replace("__PREVIEW_IDS__", json.dumps(PREVIEW_IDS))


def _pick(ui: dict[str, Any], names: tuple[str, ...]) -> list[Any]:
    return [ui[n] for n in names]


def _with_controls(ui: dict[str, Any], *leading: str) -> list[Any]:
    """Inputs of a handler made by `takes_controls`: its leading inputs, then every control in page order."""
    return _pick(ui, (*leading, *CONTROL_NAMES))


def _queued(pool: ModelPool, ui: dict[str, Any]) -> dict[str, Any]:
    """Runs that use the model share one queue slot pool of `concurrency` at a time. Their progress and error
    badges go on a hidden element: the status line says what a run is doing, or why it was refused, once,
    instead of a timer or a red "Error" on every pane, counter and plot."""
    return dict(concurrency_id="model", concurrency_limit=pool.caps.concurrency, preprocess=False,
                show_progress="minimal", show_progress_on=[ui["run_state"]])


def _wire_generation(pool: ModelPool, ui: dict[str, Any], triggers: list[Any], suffix: str = "") -> Any:
    """Stop this session's running generation out of the queue, then generate in the queue."""
    first = gr.on(triggers, interrupt, [ui["session"]], ui["status"], queue=False, show_progress="hidden",
                  api_name=f"interrupt{suffix}", trigger_mode="multiple")
    return _generate_after(pool, ui, first, suffix)


def _generate_after(pool: ModelPool, ui: dict[str, Any], event: Any, suffix: str | bool) -> Any:
    return event.then(functools.partial(generate, pool), _with_controls(ui, "session"), _pick(ui, GENERATE_OUTPUTS),
                      api_name=f"generate{suffix}" if suffix is not False else False, trigger_mode="always_last",
                      **_queued(pool, ui))


def _wire_release(pool: ModelPool, ui: dict[str, Any], moves: Moves, runs: dict[str, Any]) -> None:
    """A slider let go: what follows from the released value first (`settle_released`), then, only on valid
    controls, stop this session's run and generate (a value typed out of the slider's range runs nothing;
    `settle_controls` says why). Each generation it wires goes into `runs` (the views that draw a run follow it)."""
    def then_run(settled: Any, first: bool) -> None:
        name = (lambda n: f"{n}_on_release") if first else (lambda n: False)
        check = settled.success(functools.partial(check_release, pool), _with_controls(ui, "session"), None,
                                queue=False, show_progress="hidden", api_name=name("check"), preprocess=False)
        stopped = check.success(interrupt, [ui["session"]], ui["status"], queue=False, show_progress="hidden",
                                api_name=name("interrupt"))
        key = "_on_release" if first else f"_on_release_{sum(k.startswith('_on_release') for k in runs) + 1}"
        runs[key] = _generate_after(
            pool, ui, stopped, "_on_release" if first else False)

    moves.on([ui[n].release for n in RELEASE_TRIGGERS], functools.partial(settle_released, pool),
             _with_controls(ui, "session", "release_how"), _pick(ui, SETTLE_OUTPUTS), after=then_run, queue=False,
             show_progress="hidden", preprocess=False, js=RELEASE_JS)


def _heavy(pool: ModelPool, ui: dict[str, Any]) -> dict[str, Any]:
    """As `_queued`, in the heavy measurements' slots (explorer.fair): no generation waits behind them."""
    return {**_queued(pool, ui), "concurrency_id": HEAVY, "concurrency_limit": heavy_slots(pool.caps.concurrency)}


def _wire_fills(pool: ModelPool, ui: dict[str, Any], event: Any, suffix: str) -> Any:
    return event.then(functools.partial(compare_fills, pool), _with_controls(ui, "session"), _pick(ui, FILLS_OUTPUTS),
                      api_name=f"compare_fills{suffix}", trigger_mode="always_last", **_heavy(pool, ui))


def _redraw_after(pool: ModelPool, ui: dict[str, Any], event: Any) -> None:
    """Redraw what follows from the controls (the schedule preview, then each view that follows them,
    `View.follow`) once `event` has set them: the server's own updates of the controls trigger nothing (no
    `.change` listener anywhere), so whatever sets them says what to redraw."""
    redrawn = event.then(functools.partial(redraw_schedule, pool), _with_controls(ui, "session"),
                         _pick(ui, views.SCHEDULE), api_name=False, queue=False, preprocess=False,
                         show_progress="hidden")
    for view in views.registry():
        if view.follow is not None:
            view.follow(pool, ui, redrawn)


def _wire_scenarios(pool: ModelPool, ui: dict[str, Any]) -> dict[str, Any]:
    """Each scenario's chain of runs; returns its last run's event by API name suffix (the views that draw a
    finished run follow it). Each step after a run goes on only while nothing else was asked for since
    (`Session.start_scenario`): a scenario, Generate, Stop or release during a scenario's run ends its chain there,
    instead of its next run setting the controls under the newer run and stopping it (issue 24)."""
    done, hidden = {}, dict(queue=False, preprocess=False, show_progress="hidden", show_progress_on=[ui["run_state"]])
    for key, scenario in offered(pool.names).items():
        event = ui[f"scenario_{key}"].click
        interrupted = functools.partial(scenario_interrupted, key)
        for step in range(len(scenario.runs)):
            applied = (event if step == 0 else event.then)(
                functools.partial(apply_scenario, pool, key, step), [ui["session"], ui["model"]],
                _pick(ui, SCENARIO_OUTPUTS), api_name=f"scenario_{key}_{step}", **hidden)
            applied.failure(interrupted, ui["session"], ui["scenario_finding"], api_name=False, **hidden)
            _redraw_after(pool, ui, applied)
            event = applied.success(functools.partial(generate, pool), _with_controls(ui, "session"),
                                    _pick(ui, GENERATE_OUTPUTS), api_name=f"generate_scenario_{key}_{step}",
                                    trigger_mode="always_last", **_queued(pool, ui))
        done[f"_scenario_{key}"] = event
        if scenario.fills:
            going_on = event.then(functools.partial(scenario_goes_on, key), ui["session"], None, api_name=False,
                                  **hidden)
            going_on.failure(interrupted, ui["session"], ui["scenario_finding"], api_name=False, **hidden)
            event = going_on.success(functools.partial(compare_fills, pool), _with_controls(ui, "session"),
                                     _pick(ui, FILLS_OUTPUTS), api_name=f"compare_fills_scenario_{key}",
                                     trigger_mode="always_last", **_heavy(pool, ui))
        event.then(functools.partial(show_finding, pool, key), [ui["session"], ui["model"]], ui["scenario_finding"],
                   api_name=f"scenario_{key}_finding", **hidden)
    return done


def person_moved(ui: dict[str, Any], names: tuple[str, ...]) -> list[Any]:
    """The events of a person's own moves of these controls: `.input` (typing, dragging, picking) and a slider's
    `.release`. Never `.change`, which also fires when the server sets a control: a handler on it that sets
    another control is how the core sliders once fed each other for minutes (issue 24)."""
    events = [ui[n].input for n in names]
    return events + [ui[n].release for n in names if isinstance(ui[n], gr.Slider)]


def _wire_views(pool: ModelPool, ui: dict[str, Any], moves: Moves) -> None:
    instant = dict(queue=False, preprocess=False, show_progress="hidden")
    # While a slider moves the browser redraws the decay curve itself (assets/decay_preview.js), with no round
    # trip: it keeps up with the pointer while the server is busy. The server redraws the curve and the heavy
    # planned grid when a slider is let go, when a person changes any other control, and after a scenario, a
    # sweep row, a model switch or a shared link set the controls (`_redraw_after`). (No backend: the page runs it
    # and it defers nothing, see explorer/moves.py.)
    gr.on([ui[n].input for n in RELEASE_TRIGGERS], None, _pick(ui, RELEASE_TRIGGERS), None,
          js=f"({', '.join(RELEASE_TRIGGERS)}) => {{ window.d3DecayPreview?.follow({{{', '.join(RELEASE_TRIGGERS)}}}); }}",
          api_name=False, queue=False, show_progress="hidden")
    # Registered in the order they run after a move: what the person sees change first.
    moves.on([ui["presentation"].input], set_presentation, _with_controls(ui, "session"), _pick(ui, VIEW_OUTPUTS),
             api_name="set_presentation", **instant)
    # What follows from the one state of the controls (bounds, a re-fitted order, a message), set once per move.
    moved = [ui[n].input for n in SETTLED_CONTROLS] + [ui[n].release for n in SETTLED_CONTROLS
                                                         if isinstance(ui[n], gr.Slider) and n not in RELEASE_TRIGGERS]
    moves.on(moved, functools.partial(settle_controls, pool), _with_controls(ui, "session"),
             _pick(ui, SETTLE_OUTPUTS), **instant)
    moves.on([*(ui[n].release for n in RELEASE_TRIGGERS),
              *(ui[n].input for n in REDRAW_NAMES if n not in (*RELEASE_TRIGGERS, "model"))],
             functools.partial(redraw_schedule, pool), _with_controls(ui, "session"), _pick(ui, views.SCHEDULE),
             api_name="redraw_schedule", **instant)
    moves.on(person_moved(ui, ("attention_layer", "attention_head")), render_attention, _with_controls(ui, "session"),
             _pick(ui, ATTENTION_OUTPUTS), api_name="render_attention", **instant)


def _wire_tabs(pool: ModelPool, ui: dict[str, Any]) -> dict[str, Any]:
    """A view tab opened: drawn then if it changed while hidden (only the open view is drawn, `Session.due`).
    Returns each tab's select event by view key."""
    opened, instant = {}, dict(api_name=False, queue=False, preprocess=False, show_progress="hidden")
    for key in (k for k in views.titles() if f"tab_{k}" in ui):
        tab = ui[f"tab_{key}"]
        if key in DRAWN_ON_OPEN:
            opened[key] = tab.select(functools.partial(open_view, pool, key), _with_controls(ui, "session"), ui[key],
                                     **instant)
        else:
            opened[key] = tab.select(functools.partial(view_opened, key), ui["session"], None, **instant)
    return opened


def _wire_sweep(pool: ModelPool, ui: dict[str, Any], demo: gr.Blocks) -> None:
    ui["sweep_run"].click(functools.partial(stream_sweep, pool), _pick(ui, SWEEP_INPUTS), _pick(ui, SWEEP_OUTPUTS),
                          api_name="run_sweep", preprocess=False, concurrency_id=HEAVY,
                          concurrency_limit=heavy_slots(pool.caps.concurrency), trigger_mode="once")
    _redraw_after(pool, ui, ui["sweep_table"].select(load_sweep_setting, ui["sweep_results"],
                                                     _pick(ui, SWEEP_LOAD_OUTPUTS), api_name="load_sweep_setting",
                                                     queue=False))
    _redraw_after(pool, ui, ui["sweep_point"].change(load_sweep_point, _pick(ui, ("sweep_results", "sweep_point")),
                                                     _pick(ui, SWEEP_LOAD_OUTPUTS), api_name="load_sweep_point",
                                                     queue=False))
    demo.load(None, js=PLOT_CLICK_JS.read_text(encoding="utf-8"), api_name=False)
    ui["sweep_export"].click(export_sweep, ui["sweep_results"], ui["sweep_file"], api_name="export_sweep")


def _name_components(ui: dict[str, Any]) -> None:
    """A component without a label is named by its key (not shown on the page), so no API input or output is
    `value_71`: the label is the name gradio_client's view_api gives it."""
    for key, component in ui.items():
        if isinstance(component, gr.components.Component) and not isinstance(component, gr.State) \
                and getattr(component, "label", None) is None:
            component.label, component.show_label = key, False


def set_api_visibility(demo: gr.Blocks) -> None:
    """PUBLIC_API documented, BROWSER_ONLY private, every other event with a backend undocumented."""
    for fn in demo.fns.values():
        if fn.api_visibility == "private":  # no backend function, or api_name=False
            continue
        fn.api_visibility = ("public" if fn.api_name in PUBLIC_API
                             else "private" if fn.api_name in BROWSER_ONLY else "undocumented")


def replace_older_measurements(demo: gr.Blocks) -> None:
    """A visitor's measurement that a newer one of theirs waits behind does nothing (`fair.replaced_by_newer`); the
    fill comparison already takes its turn from the session, as the generations do."""
    for fn in demo.fns.values():
        target = getattr(fn.fn, "func", fn.fn)
        if fn.concurrency_id == HEAVY and target is not compare_fills:
            fn.fn = replaced_by_newer(fn.fn)


def wire(pool: ModelPool, ui: dict[str, Any], demo: gr.Blocks) -> None:
    """Every event of the page, each with an API name; only PUBLIC_API is documented."""
    _name_components(ui)
    demo.load(new_session, None, ui["session"], api_name="new_session", queue=False)
    demo.load(None, js=PAGE_JS.read_text(encoding="utf-8"), api_name=False)
    demo.load(None, js=preview_js(), api_name=False)
    # In the queue, where an unknown title is a plain error message rather than an HTTP 500.
    ui["example"].input(use_example, ui["example"], ui["prompt"], api_name="use_example", preprocess=False,
                        concurrency_limit=None, show_progress="hidden")
    sized = ui["model"].input(functools.partial(model_changed, pool), _pick(ui, ("model", "session", "presentation")),
                              _pick(ui, MODEL_OUTPUTS),
                              api_name="model_changed", queue=False, preprocess=False, show_progress="hidden")
    # A model that must be loaded first: in the queue, one load at a time, apart from the generations' slots.
    loaded = sized.then(functools.partial(load_model, pool), ui["model"], _pick(ui, MODEL_OUTPUTS),
                        api_name="load_model", preprocess=False, concurrency_id="load", concurrency_limit=1,
                        trigger_mode="always_last", show_progress_on=[ui["run_state"]])
    runs = {"": _wire_generation(pool, ui, [ui["generate"].click, ui["prompt"].submit])}
    # A person's moves of the controls, one event per trigger (explorer/moves.py): registered here, wired below.
    moves = Moves()
    _wire_release(pool, ui, moves, runs)
    # Every click of Stop is sent: with gradio's default for a click ("once") the page drops a click while an
    # earlier one is still in flight, and Stop would seem not to answer.
    ui["stop"].click(stop, ui["session"], ui["status"], api_name="stop", queue=False, show_progress="hidden",
                     trigger_mode="multiple")
    fills = gr.on([ui["fills_button"].click], interrupt, [ui["session"]], ui["status"], queue=False,
                  api_name="interrupt_fills", show_progress="hidden")
    _wire_fills(pool, ui, fills, "")
    runs.update(_wire_scenarios(pool, ui))
    runs["_model"] = loaded  # the lens and scrubber forget the other model's run too
    _redraw_after(pool, ui, loaded)
    _wire_views(pool, ui, moves)
    opened = _wire_tabs(pool, ui)
    set_controls: list[Any] = []  # the views' own events that set controls: what follows is redrawn after them
    after_runs: list[Any] = []  # what the views hang on each run
    page = views.Page(moves, opened, set_controls.append, after_runs.append)
    for view in views.registry():  # a view's own events, declared in its module (`View.wire`)
        if view.wire is not None:
            view.wire(pool, ui, page)
    moves.wire()  # wires the runs that follow a slider's release (`_wire_release`): every run is wired now
    for hang in after_runs:
        for suffix, run in runs.items():
            hang(suffix, run)
    ui["export_trace"].click(export_trace, ui["session"], ui["files"], api_name="export_trace")
    # each view's own input to Export (a measured view's state, the scrubber's token): Export offers every view
    ui["export_figure"].click(functools.partial(export_figure, pool),
                              _with_controls(ui, "session", "figure", *export_inputs()),
                              ui["files"], api_name="export_figure", preprocess=False)
    _wire_sweep(pool, ui, demo)
    for event in set_controls:  # e.g. fit α sets α, Use this order sets the order
        _redraw_after(pool, ui, event)
    restored = wire_share(pool, ui, demo)
    _redraw_after(pool, ui, restored)  # on every page load, link or not: the first preview
    replace_older_measurements(demo)
    # A link may turn presentation mode on: nothing listens to the checkbox's .change, so apply it here.
    restored.then(set_presentation, _with_controls(ui, "session"), _pick(ui, VIEW_OUTPUTS), api_name=False,
                  queue=False, preprocess=False, show_progress="hidden")
    set_api_visibility(demo)
