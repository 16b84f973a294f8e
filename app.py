"""D3 Explorer: the Gradio page. Layout and wiring only: the session logic is in d3.live, the figures in viz."""

from __future__ import annotations

import contextlib
import functools
import gc
import html
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import gradio as gr
import pandas as pd

from d3.config import DROP_ORDERS, FILLS, default_core
from d3.engine import Engine
from d3.live import (
    DECODINGS,
    HISTORY_COLUMNS,
    KNOWN_FACTS,
    SCENARIOS,
    STRATEGY_LABELS,
    SWEEP_DEFAULT,
    SWEEP_MAX_NEW_TOKENS,
    SWEEP_MENU,
    SWEEP_MIN_NEW_TOKENS,
    SWEEP_TABLE_COLUMNS,
    Caps,
    LiveUpdate,
    ModelPool,
    RunSetup,
    Session,
    as_choice,
    check_run,
    default_attention_layer,
    example_prompts,
    fill_comparison,
    is_public,
    measured_speedup,
    parse_schedule,
    prepare_run,
    scenario_controls,
    side_by_side,
    run_small_sweep,
    sweep_bounds_text,
    sweep_controls,
    sweep_spec,
    sweep_table,
)
from viz import app_extras as views
from viz import counters_html, to_html, token_html

log = logging.getLogger("d3.app")
CSS_PATH = Path(__file__).resolve().parent / "assets" / "style.css"
SWEEP_CLICK_JS = CSS_PATH.with_name("sweep_click.js")
EXPORT_ROOT = Path(tempfile.gettempdir()) / "d3-explorer-exports"
EXPORT_TTL_S = 3600

# Control names in the order handlers take them; each is a component in the page and an API parameter.
RUN_INPUTS = ("prompt", "model", "chat_template", "strategy", "alpha", "core_head", "core_tail", "start", "drop_order",
              "fill", "max_new_tokens", "decoding", "temperature", "seed", "unified_ratio", "skipdecode_max",
              "skipdecode_min", "threshold", "attention_layer")
VIEW_INPUTS = ("attention_head", "metric", "log_kl", "presentation")
SCHEDULE_INPUTS = ("model", "strategy", "alpha", "core_head", "core_tail", "start", "drop_order", "fill",
                   "max_new_tokens", "unified_ratio", "skipdecode_max", "skipdecode_min", "threshold", "presentation")
SCENARIO_OUTPUTS = ("strategy", "alpha", "core_head", "core_tail", "start", "drop_order", "fill", "decoding",
                    "scenario_text")
GENERATE_OUTPUTS = ("session", "status", "d3_title", "d3_tokens", "d3_counters", "full_tokens", "full_counters",
                    "usage", "decay", "flow", "attention", "errors", "fills", "history")
VIEW_OUTPUTS = ("usage", "flow", "attention", "errors", "fills", "root", *(f"explain_{k}" for k in views.EXPLAIN))
FIGURES = ("usage", "decay", "planned", "flow", "attention", "errors", "fills")
SWEEP_INPUTS = ("model", "chat_template", "sweep_prompts", "sweep_settings", "sweep_tokens")
SWEEP_OUTPUTS = ("sweep_results", "sweep_table", "sweep_pareto", "sweep_note")
SWEEP_LOAD_OUTPUTS = ("strategy", "alpha", "core_head", "core_tail", "start", "drop_order", "fill", "max_new_tokens",
                      "unified_ratio", "skipdecode_max", "skipdecode_min", "sweep_note", "modes", "status")
SWEEP_EXPLAIN = (
    "**Sweep**: measure a few settings against full depth on your prompts (timing and greedy agreement / KL per "
    "setting) with the model chosen in the Live tab, and see them on the speed–quality plane with the Pareto front. "
    "**Click a point of the plot or a row of the table** to load that setting into the Live tab's controls, then "
    "press Generate there to watch it side by side with full depth. The full-depth row is the reference and loads "
    "nothing. With the defaults (1 prompt, 16 tokens, 4 settings) it takes about 20 s for SmolLM2-135M on a 2-core "
    "CPU (the largest request, 2 prompts × 24 tokens, about twice that); timings are noisy with one repeat, above "
    "all on a busy machine.")


# ---------------------------------------------------------------- small helpers


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """A person's mistake (ValueError) becomes a clear gr.Error; anything else is logged, never shown as a trace."""
    try:
        yield
    except gr.Error:
        raise
    except ValueError as err:
        raise gr.Error(str(err), print_exception=False) from None
    except Exception:
        log.exception("handler failed")
        raise gr.Error("Something went wrong on the server (the details are in its log). The app is still "
                       "running: try again, perhaps with a shorter prompt or fewer tokens.", print_exception=False) from None


def ordered(names: tuple[str, ...], **values: Any) -> tuple[Any, ...]:
    """Handler outputs in `names` order; names not given are left as they are (gr.skip())."""
    return tuple(values[n] if n in values else gr.skip() for n in names)


def _export_dir() -> Path:
    """A fresh server-named folder for one export; folders older than an hour are removed."""
    EXPORT_ROOT.mkdir(parents=True, exist_ok=True)
    for old in EXPORT_ROOT.iterdir():
        if old.is_dir() and time.time() - old.stat().st_mtime > EXPORT_TTL_S:
            shutil.rmtree(old, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix="export-", dir=EXPORT_ROOT))


# ---------------------------------------------------------------- handlers


def new_session() -> Session:
    return Session()


def use_example(title: str) -> str:
    prompts = {p.title: p.prompt for p in example_prompts()}
    with user_errors():
        return prompts[as_choice("example", title, tuple(prompts))]


def model_changed(pool: ModelPool, model: str) -> tuple[Any, ...]:
    """Size the layer and head controls to the chosen model (known models: without loading them)."""
    with user_errors():
        facts = pool.facts(model)
    layers = facts.num_layers
    head, tail = default_core(layers)
    return (gr.update(maximum=layers, value=head), gr.update(maximum=layers, value=tail),
            gr.update(maximum=layers - 1, value=default_attention_layer(layers)),
            gr.update(maximum=max(facts.num_heads - 1, 0), value=0), gr.update(value=facts.chat_template))


def redraw_schedule(pool: ModelPool, session: Session | None, model: str, strategy: str, alpha: float, core_head: int,
                    core_tail: int, start: int, drop_order: str, fill: str, max_new_tokens: int, unified_ratio: float,
                    skipdecode_max: int, skipdecode_min: int, threshold: float, presentation: bool) -> tuple[Any, Any]:
    """Decay curve and planned grid from the controls alone: no model runs (called on every slider move)."""
    raw = dict(strategy=strategy, alpha=alpha, core_head=core_head, core_tail=core_tail, start=start,
               drop_order=drop_order, fill=fill, max_new_tokens=max_new_tokens, unified_ratio=unified_ratio,
               skipdecode_max=skipdecode_max, skipdecode_min=skipdecode_min, threshold=threshold)
    p = presentation is True
    try:
        with user_errors():
            facts = pool.facts(model)  # an unknown model is a gr.Error
        s = parse_schedule(raw, facts.num_layers, pool.caps)
    except ValueError as err:  # shown in the preview while a slider moves; Generate raises it as gr.Error
        message = views.waiting(f"Cannot draw this schedule:<br>{html.escape(str(err))}", presentation=p)
        return message, message
    trace = session.d3 if session is not None else None
    return (views.decay_view(s.strategy, s.num_layers, s.steps, trace=trace, others=s.others, presentation=p),
            views.planned_view(s.strategy, s.num_layers, s.steps, presentation=p))


def interrupt(session: Session | None) -> None:
    """A new run was asked for: stop this session's running one now, before the new one waits in the queue."""
    if session is not None:
        session.trigger()


def stop(session: Session | None) -> str:
    if session is None:
        return views.status_html(None, None, "Nothing is running.")
    session.request_stop()
    return views.status_html(session.d3, session.full, "Stopping… (within one token)")


def _run_raw(prompt: str, model: str, chat_template: bool, strategy: str, alpha: float, core_head: int,
             core_tail: int, start: int, drop_order: str, fill: str, max_new_tokens: int, decoding: str,
             temperature: float, seed: int, unified_ratio: float, skipdecode_max: int, skipdecode_min: int,
             threshold: float, attention_layer: int) -> dict[str, Any]:
    return dict(prompt=prompt, model=model, chat_template=chat_template, strategy=strategy, alpha=alpha,
                core_head=core_head, core_tail=core_tail, start=start, drop_order=drop_order, fill=fill,
                max_new_tokens=max_new_tokens, decoding=decoding, temperature=temperature, seed=seed,
                unified_ratio=unified_ratio, skipdecode_max=skipdecode_max, skipdecode_min=skipdecode_min,
                threshold=threshold, attention_layer=attention_layer)


def _whole(value: Any, default: int = 0) -> int:
    """A view index from whatever was sent: junk falls back to `default` (it only changes a drawing)."""
    try:
        return max(0, int(value))
    except (TypeError, ValueError, OverflowError):
        return default


def _view_options(attention_layer: Any, attention_head: Any, metric: Any, log_kl: Any, presentation: Any) -> dict[str, Any]:
    """View settings, made safe: they only change how a trace is drawn."""
    return dict(layer=_whole(attention_layer), head=_whole(attention_head),
                metric=metric if metric in ("both", "cos", "dist") else "both", log_kl=log_kl is True,
                presentation=presentation is True)


def _is_due(update: LiveUpdate, every: int) -> bool:
    """Heavy figures redraw on the first token, every `every` D3 tokens, and at each phase change."""
    if update.phase != "streaming":
        return True
    return update.pane == "d3" and update.d3 is not None and (len(update.d3.steps) - 1) % every == 0


def _render(session: Session, setup: RunSetup, update: LiveUpdate, view: dict[str, Any], every: int) -> tuple[Any, ...]:
    """The outputs of one streamed update: panes and counters always, heavy figures when due."""
    d3, full, p = update.d3, update.full, view["presentation"]
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
        out.update(flow=views.flow_view(d3, full, metric=view["metric"], presentation=p),
                   attention=views.attention_view(d3, full, view["layer"], view["head"], presentation=p),
                   errors=views.error_view(update.comparison, phase=update.phase, log_kl=view["log_kl"], presentation=p))
    if update.finished:
        out["history"] = session.history_frame()
    return ordered(GENERATE_OUTPUTS, **out)


def _first_outputs(session: Session, setup: RunSetup, view: dict[str, Any]) -> tuple[Any, ...]:
    """Clear what the previous run left in the views, and name the strategy over the D3 pane."""
    p = view["presentation"]
    blank = "<div class='d3-tokens'>(waiting for the first token…)</div>"
    return ordered(GENERATE_OUTPUTS, session=session, status=views.status_html(None, None, "streaming"),
                   d3_title=f"### {views.pane_title(setup.strategy, 'D3')}", d3_tokens=blank, full_tokens=blank,
                   d3_counters="", full_counters="", flow=views.flow_view(None, None, presentation=p),
                   attention=views.attention_view(None, None, 0, 0, presentation=p),
                   errors=views.error_view(None, presentation=p), fills=views.fills_view(None, presentation=p))


def _stream(session: Session, run_id: int, setup: RunSetup, view: dict[str, Any], every: int) -> Iterator[tuple[Any, ...]]:
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


def generate(pool: ModelPool, session: Session | None, prompt: str, model: str, chat_template: bool, strategy: str,
             alpha: float, core_head: int, core_tail: int, start: int, drop_order: str, fill: str,
             max_new_tokens: int, decoding: str, temperature: float, seed: int, unified_ratio: float,
             skipdecode_max: int, skipdecode_min: int, threshold: float, attention_layer: int, attention_head: int,
             metric: str, log_kl: bool, presentation: bool) -> Iterator[tuple[Any, ...]]:
    """Stream D3 (or the chosen strategy) and full depth side by side, then compare them."""
    session = session or Session()
    raw = _run_raw(prompt, model, chat_template, strategy, alpha, core_head, core_tail, start, drop_order, fill,
                   max_new_tokens, decoding, temperature, seed, unified_ratio, skipdecode_max, skipdecode_min,
                   threshold, attention_layer)
    view = _view_options(attention_layer, attention_head, metric, log_kl, presentation)
    with user_errors():
        checked = check_run(pool, raw)  # a mistake is reported before a slow model load
        run_id = session.begin()  # any earlier run of this session stops within one token
        if not pool.is_loaded(checked.model):
            yield ordered(GENERATE_OUTPUTS, session=session, status=views.status_html(None, None, "loading"))
        setup = prepare_run(pool, raw)
        session.clear()
        yield _first_outputs(session, setup, view)
        yield from _stream(session, run_id, setup, view, pool.caps.figure_every)


def compare_fills(pool: ModelPool, session: Session | None, prompt: str, model: str, chat_template: bool,
                  strategy: str, alpha: float, core_head: int, core_tail: int, start: int, drop_order: str, fill: str,
                  max_new_tokens: int, decoding: str, temperature: float, seed: int, unified_ratio: float,
                  skipdecode_max: int, skipdecode_min: int, threshold: float, attention_layer: int,
                  presentation: bool) -> Iterator[tuple[Any, Any, Any]]:
    """Run the same prompt and schedule with each fill (copy, propagate, none) against full depth."""
    session = session or Session()
    raw = _run_raw(prompt, model, chat_template, strategy, alpha, core_head, core_tail, start, drop_order, fill,
                   max_new_tokens, decoding, temperature, seed, unified_ratio, skipdecode_max, skipdecode_min,
                   threshold, attention_layer)
    with user_errors():
        check_run(pool, raw)
        run_id = session.begin()
        setup = prepare_run(pool, raw)
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
                       views.fills_view(session.fills, presentation=presentation is True))
        done = "Fill comparison done: see the Fill strategies tab." if len(session.fills) == len(FILLS) else "Stopped."
        yield session, views.status_html(None, None, done), views.fills_view(session.fills, presentation=presentation is True)


def render_flow(session: Session | None, metric: str, presentation: bool) -> Any:
    view, s = _view_options(0, 0, metric, False, presentation), session or Session()
    with user_errors():
        return views.flow_view(s.d3, s.full, metric=view["metric"], presentation=view["presentation"])


def render_attention(session: Session | None, attention_layer: int, attention_head: int, presentation: bool) -> Any:
    view, s = _view_options(attention_layer, attention_head, "both", False, presentation), session or Session()
    with user_errors():
        return views.attention_view(s.d3, s.full, view["layer"], view["head"], presentation=view["presentation"])


def render_errors(session: Session | None, log_kl: bool, presentation: bool) -> Any:
    view, s = _view_options(0, 0, "both", log_kl, presentation), session or Session()
    with user_errors():
        return views.error_view(s.comparison, log_kl=view["log_kl"], presentation=view["presentation"])


def set_presentation(session: Session | None, attention_layer: int, attention_head: int, metric: str, log_kl: bool,
                     presentation: bool) -> tuple[Any, ...]:
    """Presentation mode: bigger fonts everywhere, explanations hidden so each view takes the full width."""
    view = _view_options(attention_layer, attention_head, metric, log_kl, presentation)
    s, p = session or Session(), view["presentation"]
    classes = ["d3-root", "d3-present"] if p else ["d3-root"]
    explain = {f"explain_{k}": gr.update(visible=not p) for k in views.EXPLAIN}
    with user_errors():
        return ordered(VIEW_OUTPUTS, usage=views.usage_view(s.d3, presentation=p),
                       flow=views.flow_view(s.d3, s.full, metric=view["metric"], presentation=p),
                       attention=views.attention_view(s.d3, s.full, view["layer"], view["head"], presentation=p),
                       errors=views.error_view(s.comparison, log_kl=view["log_kl"], presentation=p),
                       fills=views.fills_view(s.fills, presentation=p), root=gr.update(elem_classes=classes),
                       **explain)


def apply_scenario(pool: ModelPool, key: str, step: int, session: Session | None, model: str) -> tuple[Any, ...]:
    """Set the controls of run `step` of a preset scenario (and stop whatever this session is running)."""
    interrupt(session)
    with user_errors():
        values = scenario_controls(key, step, pool.facts(model).num_layers)
    scenario = SCENARIOS[key]
    text = f"**{scenario.title}** — {scenario.text}"
    if len(scenario.runs) > 1:
        text += f"\n\n*Run {step + 1} of {len(scenario.runs)}.*"
    return ordered(SCENARIO_OUTPUTS, scenario_text=text, **values)


def export_trace(session: Session | None) -> list[str]:
    """The traces as JSON (D3, full depth, comparison) and one CSV table, written under server-chosen names."""
    if session is None or session.d3 is None or session.full is None:
        raise gr.Error("Nothing to export yet: press Generate first.")
    folder = _export_dir()
    files = {"d3_trace.json": session.d3.to_json(), "full_trace.json": session.full.to_json()}
    if session.comparison is not None:
        files["comparison.json"] = json.dumps(session.comparison.to_dict())
    for name, text in files.items():
        (folder / name).write_text(text, encoding="utf-8")
    table = pd.concat([session.d3.to_frame().assign(run="d3"), session.full.to_frame().assign(run="full")])
    table.to_csv(folder / "traces.csv", index=False)
    return [str(folder / n) for n in (*files, "traces.csv")]


def export_figure(pool: ModelPool, session: Session | None, figure: str, model: str, strategy: str, alpha: float,
                  core_head: int, core_tail: int, start: int, drop_order: str, fill: str, max_new_tokens: int,
                  unified_ratio: float, skipdecode_max: int, skipdecode_min: int, threshold: float,
                  attention_layer: int, attention_head: int, metric: str, log_kl: bool, presentation: bool) -> str:
    """One view as a standalone HTML page (plotly.js inlined, works offline)."""
    s = session or Session()
    view = _view_options(attention_layer, attention_head, metric, log_kl, presentation)
    with user_errors():
        key = as_choice("figure", figure, FIGURES)
        p = view["presentation"]
        if key in ("decay", "planned"):
            decay, planned = redraw_schedule(pool, s, model, strategy, alpha, core_head, core_tail, start, drop_order,
                                             fill, max_new_tokens, unified_ratio, skipdecode_max, skipdecode_min,
                                             threshold, p)
            fig = decay if key == "decay" else planned
        else:
            fig = {"usage": lambda: views.usage_view(s.d3, presentation=p),
                   "flow": lambda: views.flow_view(s.d3, s.full, metric=view["metric"], presentation=p),
                   "attention": lambda: views.attention_view(s.d3, s.full, view["layer"], view["head"], presentation=p),
                   "errors": lambda: views.error_view(s.comparison, log_kl=view["log_kl"], presentation=p),
                   "fills": lambda: views.fills_view(s.fills, presentation=p)}[key]()
    path = _export_dir() / f"{key}.html"
    path.write_text(to_html(fig), encoding="utf-8")
    return str(path)


def _sweep_figure(df: pd.DataFrame, presentation: bool = False) -> Any:
    from viz import pareto

    return pareto(df, y="agreement", title="Greedy agreement vs measured speedup", presentation=presentation)


def run_sweep(pool: ModelPool, model: str, chat_template: bool, sweep_prompts: str, sweep_settings: list[str],
              sweep_tokens: int, progress: gr.Progress = gr.Progress()) -> tuple[Any, ...]:
    """A small bounded sweep (d3.sweep.run_sweep) on the chosen model: the table, its Pareto view, a note."""
    with user_errors():
        name = pool.check_name(model)
        spec = sweep_spec(name, sweep_prompts, sweep_settings, sweep_tokens, chat_template, pool.caps)
        progress(0.0, desc="Loading the model…" if not pool.is_loaded(name) else "Starting the sweep…")
        engine = pool.engine(name)
        df = run_small_sweep(engine, spec, progress=lambda fraction, desc: progress(fraction, desc=desc))
    note = (f"Measured {len(df)} rows ({len(df) - 1} settings + the full-depth reference) on {len(spec.prompts)} "
            f"prompt(s), {spec.max_new_tokens} new tokens. Click a point or a row to load its setting into the "
            "controls.")
    return ordered(SWEEP_OUTPUTS, sweep_results=df, sweep_table=sweep_table(df), sweep_pareto=_sweep_figure(df),
                   sweep_note=note)


def load_sweep_setting(sweep_results: pd.DataFrame | None, evt: gr.SelectData) -> tuple[Any, ...]:
    """A clicked table row sets the live controls to that row's strategy and parameters."""
    index = evt.index[0] if isinstance(evt.index, (list, tuple)) else evt.index
    return _load_sweep_row(sweep_results, index)


def load_sweep_point(sweep_results: pd.DataFrame | None, sweep_point: str) -> tuple[Any, ...]:
    """A clicked point of the Pareto view ("ROW@stamp", written by assets/sweep_click.js) loads that row."""
    return _load_sweep_row(sweep_results, str(sweep_point or "").partition("@")[0].strip())


def _load_sweep_row(sweep_results: pd.DataFrame | None, index: Any) -> tuple[Any, ...]:
    if sweep_results is None or len(sweep_results) == 0:
        raise gr.Error("No sweep results yet: press Run sweep first.", print_exception=False)
    try:
        if int(index) < 0:
            raise IndexError(index)
        row = sweep_results.reset_index(drop=True).iloc[int(index)]
    except (TypeError, ValueError, IndexError):
        raise gr.Error("That row is not in the sweep's results.", print_exception=False) from None
    with user_errors():
        values = sweep_controls(row)
    if "alpha" in values:  # a tuned alpha below the slider's range widens it rather than being clipped
        values["alpha"] = gr.update(value=values["alpha"], minimum=min(0.8, values["alpha"]))
    note = f"Loaded **{row['label']}** into the controls: press Generate to run it side by side with full depth."
    status = views.status_html(None, None, f"Loaded from the sweep: {row['label']}. Press Generate to run it.")
    return ordered(SWEEP_LOAD_OUTPUTS, sweep_note=note, modes=gr.Tabs(selected="live"), status=status, **values)


def export_sweep(sweep_results: pd.DataFrame | None) -> str:
    """The sweep's whole table (every column) as CSV, under a server-chosen name."""
    if sweep_results is None or len(sweep_results) == 0:
        raise gr.Error("Nothing to export yet: run a sweep first.", print_exception=False)
    path = _export_dir() / "sweep.csv"
    sweep_results.to_csv(path, index=False)
    return str(path)


# ---------------------------------------------------------------- layout


def _controls(pool: ModelPool, facts: Any, ui: dict[str, Any]) -> None:
    """The run controls: strategy, schedule, decoding, and the baselines' own settings."""
    caps, layers = pool.caps, facts.num_layers
    head, tail = default_core(layers)
    with gr.Row():
        ui["strategy"] = gr.Dropdown([(label, key) for key, label in STRATEGY_LABELS.items()], value="d3",
                                     label="Strategy (against full depth)")
        ui["fill"] = gr.Dropdown(list(FILLS), value="copy", label="Fill for skipped layers' KV",
                                 info="copy · propagate · none (masked hole)")
        ui["drop_order"] = gr.Dropdown(list(DROP_ORDERS), value="middle_out", label="Drop order of flex layers",
                                       info="strided is not nested: filling matters")
        ui["decoding"] = gr.Radio(list(DECODINGS), value="greedy", label="Decoding")
    with gr.Row():
        ui["alpha"] = gr.Slider(0.8, 1.0, value=0.99, step=0.001, label="α (decay per token)",
                                info="token i runs floor(L·α^i) layers", elem_id="alpha")
        ui["core_head"] = gr.Slider(0, layers, value=head, step=1, label="Core head (first layers, always run)")
        ui["core_tail"] = gr.Slider(0, layers, value=tail, step=1, label="Core tail (last layers, always run)")
        ui["start"] = gr.Slider(0, caps.max_new_tokens, value=0, step=1, label="Start (tokens at full depth)")
    with gr.Row():
        ui["max_new_tokens"] = gr.Number(min(64, caps.max_new_tokens), label=f"Max new tokens (1–{caps.max_new_tokens})",
                                         elem_id="max-new-tokens")
        ui["temperature"] = gr.Slider(0.05, 2.0, value=0.8, step=0.05, label="Temperature (sampling only)")
        ui["seed"] = gr.Number(0, label="Seed (sampling only)")
        ui["attention_layer"] = gr.Slider(0, layers - 1, value=default_attention_layer(layers), step=1,
                                          label="Attention layer to record (before generating)")
    with gr.Accordion("Baselines' settings", open=False):
        with gr.Row():
            ui["unified_ratio"] = gr.Number(1.5, label="Unified skipping: target speedup r (keeps floor(L/r) layers)")
            ui["skipdecode_max"] = gr.Number(0, label="SkipDecode: max layers (0 = auto)")
            ui["skipdecode_min"] = gr.Number(0, label="SkipDecode: min layers (0 = auto)")
            ui["threshold"] = gr.Number(0.9, label="Early exit: confidence threshold (0, 1]")


def _panes(ui: dict[str, Any]) -> None:
    with gr.Row(equal_height=False):
        with gr.Column(elem_classes=["d3-pane"]):
            ui["d3_title"] = gr.Markdown("### D3", elem_id="d3-title")
            ui["d3_tokens"] = gr.HTML(elem_classes=["d3-pane-tokens"], elem_id="d3-pane")
            ui["d3_counters"] = gr.HTML(elem_id="d3-counters")
        with gr.Column(elem_classes=["d3-pane"]):
            gr.Markdown("### Full depth (every layer, the reference)")
            ui["full_tokens"] = gr.HTML(elem_classes=["d3-pane-tokens"], elem_id="full-pane")
            ui["full_counters"] = gr.HTML(elem_id="full-counters")


def _view_tab(key: str, ui: dict[str, Any], extra: Callable[[], None] | None = None) -> None:
    with gr.Tab(views.VIEWS[key], id=key):
        with gr.Row():
            with gr.Column(scale=3):
                if extra is not None:
                    extra()
                ui[key] = gr.Plot(show_label=False, elem_id=f"plot-{key}")
            with gr.Column(scale=1, min_width=240, elem_classes=["d3-explain"]) as column:
                gr.Markdown(views.EXPLAIN[key])
        ui[f"explain_{key}"] = column


def _tabs(pool: ModelPool, facts: Any, ui: dict[str, Any]) -> None:
    def flow_extra() -> None:
        ui["metric"] = gr.Radio([("both", "both"), ("1 − cosine", "cos"), ("relative distance", "dist")],
                                value="both", label="Measure of change")

    def attention_extra() -> None:
        ui["attention_head"] = gr.Slider(0, max(facts.num_heads - 1, 0), value=0, step=1, label="Head")

    def errors_extra() -> None:
        ui["log_kl"] = gr.Checkbox(False, label="Log scale for KL")

    def fills_extra() -> None:
        ui["fills_button"] = gr.Button("Compare fills (copy · propagate · none)", elem_id="fills-button")

    with gr.Tabs():
        _view_tab("usage", ui)
        _view_tab("decay", ui)
        _view_tab("planned", ui)
        _view_tab("flow", ui, flow_extra)
        _view_tab("attention", ui, attention_extra)
        _view_tab("errors", ui, errors_extra)
        _view_tab("fills", ui, fills_extra)
        with gr.Tab("Run history", id="history"):
            gr.Markdown("Every run of this session: compare scenarios here (only you see your runs).")
            ui["history"] = gr.Dataframe(pd.DataFrame(columns=HISTORY_COLUMNS), interactive=False)
        with gr.Tab("Export", id="export"):
            with gr.Row():
                ui["export_trace"] = gr.Button("Download traces (JSON + CSV)")
                ui["figure"] = gr.Dropdown([(views.VIEWS[k], k) for k in FIGURES], value="usage",
                                           label="Figure to export")
                ui["export_figure"] = gr.Button("Download figure (standalone HTML)")
            ui["files"] = gr.File(label="Files", file_count="multiple", interactive=False)


def _sweep_tab(pool: ModelPool, ui: dict[str, Any]) -> None:
    from d3.sweep import BUILTIN_PROMPTS

    with gr.Tab("Sweep", id="sweep"):
        gr.Markdown(SWEEP_EXPLAIN)
        gr.Markdown(f"*{sweep_bounds_text()}*")
        with gr.Row():
            with gr.Column(scale=3):
                ui["sweep_prompts"] = gr.Textbox(BUILTIN_PROMPTS[0], lines=2, max_lines=6,
                                                 label="Prompts (one per line, at most 2)")
                ui["sweep_settings"] = gr.CheckboxGroup([(c.label, k) for k, c in SWEEP_MENU.items()],
                                                        value=list(SWEEP_DEFAULT), label="Settings (at most 4)")
            with gr.Column(scale=1, min_width=220):
                top = min(SWEEP_MAX_NEW_TOKENS, max(pool.caps.max_new_tokens, SWEEP_MIN_NEW_TOKENS))
                ui["sweep_tokens"] = gr.Slider(SWEEP_MIN_NEW_TOKENS, top, value=min(16, top), step=1,
                                               label=f"New tokens per run (at most {top})", elem_id="sweep-tokens")
                ui["sweep_run"] = gr.Button("Run sweep", variant="primary", elem_id="sweep-run")
                ui["sweep_export"] = gr.Button("Download results (CSV)")
        ui["sweep_note"] = gr.Markdown(elem_id="sweep-note")
        ui["sweep_pareto"] = gr.Plot(show_label=False, elem_id="plot-sweep")
        # written by assets/sweep_click.js when a point of the Pareto view is clicked
        ui["sweep_point"] = gr.Textbox(visible="hidden", elem_id="sweep-point", show_label=False)
        ui["sweep_table"] = gr.Dataframe(pd.DataFrame(columns=SWEEP_TABLE_COLUMNS), interactive=False,
                                         label="Results (click a row, or a point above, to load it into the controls)")
        ui["sweep_file"] = gr.File(label="Sweep CSV", interactive=False)


def _header(pool: ModelPool, facts: Any, ui: dict[str, Any]) -> None:
    prompts = example_prompts()
    with gr.Row():
        with gr.Column(scale=3):
            ui["prompt"] = gr.Textbox(prompts[0].prompt, label="Prompt", lines=3, max_lines=12,
                                      elem_id="prompt")
            with gr.Row():
                ui["example"] = gr.Dropdown([p.title for p in prompts], value=prompts[0].title,
                                            label="Example prompts")
                ui["model"] = gr.Dropdown(list(pool.names), value=pool.names[0], label="Model",
                                          allow_custom_value=not pool.public)
                ui["chat_template"] = gr.Checkbox(facts.chat_template, label="Chat template (instruct models)")
        with gr.Column(scale=1, min_width=220):
            ui["generate"] = gr.Button("Generate", variant="primary", elem_id="generate")
            ui["stop"] = gr.Button("Stop", variant="stop", elem_id="stop")
            ui["presentation"] = gr.Checkbox(False, label="Presentation mode (big fonts, one view per tab)")
            gr.HTML(views.caps_html(pool.caps.describe(), pool.public))
    gr.Markdown("**Scenarios**: one click sets the controls and runs.")
    with gr.Row():
        for key, scenario in SCENARIOS.items():
            ui[f"scenario_{key}"] = gr.Button(scenario.title, size="sm", elem_id=f"scenario-{key}")
    ui["scenario_text"] = gr.Markdown()


def _layout(pool: ModelPool, facts: Any) -> dict[str, Any]:
    ui: dict[str, Any] = {"session": gr.State(None, time_to_live=pool.caps.session_ttl_s),
                          "sweep_results": gr.State(None, time_to_live=pool.caps.session_ttl_s)}
    with gr.Column(elem_classes=["d3-root"]) as root:
        ui["root"] = root
        gr.Markdown("# D3 Explorer: depth decay decoding, live")
        gr.Markdown(views.INTRO)
        with gr.Tabs(elem_id="modes") as ui["modes"]:
            with gr.Tab("Live: D3 vs full depth", id="live"):
                _header(pool, facts, ui)
                with gr.Accordion("Controls", open=True):
                    _controls(pool, facts, ui)
                ui["status"] = gr.HTML(views.status_html(None, None, "Ready: press Generate."), elem_id="status")
                _panes(ui)
                _tabs(pool, facts, ui)
            _sweep_tab(pool, ui)
    return ui


# ---------------------------------------------------------------- wiring


def _pick(ui: dict[str, Any], names: tuple[str, ...]) -> list[Any]:
    return [ui[n] for n in names]


def _wire_generation(pool: ModelPool, ui: dict[str, Any], triggers: list[Any], suffix: str = "") -> Any:
    """Stop this session's running generation out of the queue, then generate in the queue."""
    first = gr.on(triggers, interrupt, [ui["session"]], None, queue=False, show_progress="hidden",
                  api_name=f"interrupt{suffix}", trigger_mode="multiple")
    return first.then(functools.partial(generate, pool), _pick(ui, ("session", *RUN_INPUTS, *VIEW_INPUTS)),
                      _pick(ui, GENERATE_OUTPUTS), api_name=f"generate{suffix}", preprocess=False,
                      concurrency_id="model", concurrency_limit=pool.caps.concurrency, trigger_mode="always_last",
                      show_progress="minimal")


def _wire_fills(pool: ModelPool, ui: dict[str, Any], event: Any, suffix: str) -> Any:
    return event.then(functools.partial(compare_fills, pool), _pick(ui, ("session", *RUN_INPUTS, "presentation")),
                      _pick(ui, ("session", "status", "fills")), api_name=f"compare_fills{suffix}", preprocess=False,
                      concurrency_id="model", concurrency_limit=pool.caps.concurrency, trigger_mode="always_last",
                      show_progress="minimal")


def _wire_scenarios(pool: ModelPool, ui: dict[str, Any]) -> None:
    for key, scenario in SCENARIOS.items():
        event = ui[f"scenario_{key}"].click
        for step in range(len(scenario.runs)):
            applied = (event if step == 0 else event.then)(
                functools.partial(apply_scenario, pool, key, step), [ui["session"], ui["model"]],
                _pick(ui, SCENARIO_OUTPUTS), queue=False, api_name=f"scenario_{key}_{step}", preprocess=False)
            event = applied.then(functools.partial(generate, pool), _pick(ui, ("session", *RUN_INPUTS, *VIEW_INPUTS)),
                                 _pick(ui, GENERATE_OUTPUTS), api_name=f"generate_scenario_{key}_{step}",
                                 preprocess=False, concurrency_id="model", concurrency_limit=pool.caps.concurrency,
                                 show_progress="minimal")
        if scenario.fills:
            _wire_fills(pool, ui, event, f"_scenario_{key}")


def _wire_views(pool: ModelPool, ui: dict[str, Any], demo: gr.Blocks) -> None:
    schedule_controls = [ui[n] for n in SCHEDULE_INPUTS]
    gr.on([demo.load, *(c.change for c in schedule_controls)], functools.partial(redraw_schedule, pool),
          [ui["session"], *schedule_controls], [ui["decay"], ui["planned"]], api_name="redraw_schedule",
          queue=False, preprocess=False, trigger_mode="always_last", show_progress="hidden")
    ui["metric"].change(render_flow, _pick(ui, ("session", "metric", "presentation")), ui["flow"],
                        api_name="render_flow", queue=False, show_progress="hidden", preprocess=False)
    gr.on([ui["attention_layer"].change, ui["attention_head"].change], render_attention,
          _pick(ui, ("session", "attention_layer", "attention_head", "presentation")), ui["attention"],
          api_name="render_attention", queue=False, show_progress="hidden", trigger_mode="always_last",
          preprocess=False)
    ui["log_kl"].change(render_errors, _pick(ui, ("session", "log_kl", "presentation")), ui["errors"],
                        api_name="render_errors", queue=False, show_progress="hidden", preprocess=False)
    ui["presentation"].change(set_presentation, _pick(ui, ("session", "attention_layer", *VIEW_INPUTS)),
                              _pick(ui, VIEW_OUTPUTS), api_name="set_presentation", queue=False, preprocess=False,
                              show_progress="hidden")


def _wire(pool: ModelPool, ui: dict[str, Any], demo: gr.Blocks) -> None:
    demo.load(new_session, None, ui["session"], api_name="new_session", queue=False)
    ui["example"].input(use_example, ui["example"], ui["prompt"], api_name="use_example", queue=False,
                        preprocess=False)
    ui["model"].input(functools.partial(model_changed, pool), ui["model"],
                      _pick(ui, ("core_head", "core_tail", "attention_layer", "attention_head", "chat_template")),
                      api_name="model_changed", queue=False, preprocess=False)
    _wire_generation(pool, ui, [ui["generate"].click, ui["prompt"].submit])
    releases = [ui[n].release for n in ("alpha", "core_head", "core_tail", "start")]
    _wire_generation(pool, ui, releases, "_on_release")
    ui["stop"].click(stop, ui["session"], ui["status"], api_name="stop", queue=False, show_progress="hidden")
    fills = gr.on([ui["fills_button"].click], interrupt, [ui["session"]], None, queue=False,
                  api_name="interrupt_fills", show_progress="hidden")
    _wire_fills(pool, ui, fills, "")
    _wire_scenarios(pool, ui)
    _wire_views(pool, ui, demo)
    ui["export_trace"].click(export_trace, ui["session"], ui["files"], api_name="export_trace")
    ui["export_figure"].click(functools.partial(export_figure, pool),
                              _pick(ui, ("session", "figure", *SCHEDULE_INPUTS[:-1], "attention_layer",
                                         *VIEW_INPUTS)), ui["files"], api_name="export_figure", preprocess=False)
    _wire_sweep(pool, ui, demo)


def _wire_sweep(pool: ModelPool, ui: dict[str, Any], demo: gr.Blocks) -> None:
    ui["sweep_run"].click(functools.partial(run_sweep, pool), _pick(ui, SWEEP_INPUTS), _pick(ui, SWEEP_OUTPUTS),
                          api_name="run_sweep", preprocess=False, concurrency_id="model",
                          concurrency_limit=pool.caps.concurrency, trigger_mode="once")
    ui["sweep_table"].select(load_sweep_setting, ui["sweep_results"], _pick(ui, SWEEP_LOAD_OUTPUTS),
                             api_name="load_sweep_setting", queue=False)
    ui["sweep_point"].change(load_sweep_point, _pick(ui, ("sweep_results", "sweep_point")),
                            _pick(ui, SWEEP_LOAD_OUTPUTS), api_name="load_sweep_point", queue=False)
    demo.load(None, js=SWEEP_CLICK_JS.read_text(encoding="utf-8"), api_name=False)
    ui["sweep_export"].click(export_sweep, ui["sweep_results"], ui["sweep_file"], api_name="export_sweep")


def build_demo(engine_factory: Callable[[str], Engine] | None = None, *, caps: Caps | None = None,
               public: bool | None = None, model_names: tuple[str, ...] | None = None) -> gr.Blocks:
    """The page. The model loads lazily on first use; `engine_factory(name)` replaces the real loader (tests)."""
    caps = caps or Caps.from_env()
    public = is_public() if public is None else public
    names = model_names or tuple(KNOWN_FACTS)
    pool = ModelPool(engine_factory, caps=caps, public=public, names=names)
    facts = pool.facts(names[0])
    with gr.Blocks(title="D3 Explorer", delete_cache=(3600, 3600)) as demo:
        ui = _layout(pool, facts)
        _wire(pool, ui, demo)
    demo.pool = pool  # type: ignore[attr-defined]  (tests and scripts reach the shared engines through it)
    return demo


def tune_process() -> None:
    """Process settings for serving (`python app.py`, not the tests): D3_TORCH_THREADS sets torch's CPU threads (on a busy or shared CPU,
    1 thread can be several times faster than torch's default), and everything alive now (gradio,
    torch, the page) is moved out of the garbage collector's full passes, which otherwise pause a
    slider redraw for about half a second now and then (both measured by scripts/measure_app.py)."""
    threads = os.environ.get("D3_TORCH_THREADS", "").strip()
    if threads.isdigit() and int(threads) > 0:
        import torch

        torch.set_num_threads(int(threads))
    gc.freeze()


def launch(demo: gr.Blocks, **kwargs: Any) -> Any:
    """Queue (bounded, with the concurrency the caps allow) and serve the page with its stylesheet."""
    caps: Caps = demo.pool.caps  # type: ignore[attr-defined]
    demo.queue(max_size=caps.queue_size, default_concurrency_limit=caps.concurrency)
    kwargs.setdefault("css_paths", [CSS_PATH])
    kwargs.setdefault("state_session_capacity", 1000)
    return demo.launch(**kwargs)


demo = build_demo()

if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    tune_process()
    launch(demo)
