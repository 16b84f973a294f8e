"""The Live tab's views: the registry (one module per view in this package, each defining `VIEW`), the drawing
helpers they share (traces in, figures out, with the page's wording around the pure figure builders of viz/), the
status line and the caps note."""

from __future__ import annotations

import functools
import html
import importlib
import math
import pkgutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import gradio as gr
import plotly.graph_objects as go

from d3.config import StrategyConfig
from d3.trace import Comparison, Trace, measured_speedup, run_counts
from explorer.controls import CONTROL_NAMES, page_words, takes_controls
from explorer.ui import model_queue, user_errors
from explorer.wording import PHASES
from viz.attention import attention_map
from viz.depth import decay_curve
from viz.errors import error_propagation, fill_strategies
from viz.flow import sublayer_flow
from viz.grid import layer_grid, planned_grid_figure
from viz.layout import empty_figure, readable_token, short_label, shown_text, strategy_label
from viz.stream import count_words, speed_words

SCHEDULE = ("decay", "planned")  # the schedule preview: the two views drawn from the controls alone (no run)
# px; the decay curve shares the first screen with the panes. In presentation mode its box sets its height
# (assets/style.css): 232 px at 1280x800, taller on a taller screen (a room reads it from 1920x1080).
DECAY_HEIGHT = {False: 265, True: None}


def waiting(message: str, *, presentation: bool = False) -> go.Figure:
    """A placeholder figure that says what to do to fill it."""
    return empty_figure(message, presentation=presentation, height=360)


def usage_view(d3: Trace | None, *, presentation: bool = False) -> go.Figure:
    if d3 is None or not d3.steps:
        return waiting("Press Generate: each D3 token will get a row here.", presentation=presentation)
    return layer_grid(d3, presentation=presentation)


def decay_view(cfg: StrategyConfig, num_layers: int, steps: int, *, trace: Trace | None = None,
               others: Mapping[str, StrategyConfig] | None = None, presentation: bool = False) -> go.Figure:
    """The decay curve beside the panes; `trace` is drawn only if it ran exactly this schedule (else it would
    mislead). Compact (no title: the D3 pane's title names the schedule) so that it fits on the first screen."""
    shown = trace if trace is not None and trace.strategy == cfg.to_dict() else None
    return decay_curve(cfg, num_layers, steps, trace=shown, others=dict(others or {}), presentation=presentation,
                       title="", height=DECAY_HEIGHT[presentation], box_height=DECAY_HEIGHT[presentation] is None)


def planned_view(cfg: StrategyConfig, num_layers: int, steps: int, *, layer_types: Sequence[str] | None,
                 presentation: bool = False) -> go.Figure:
    return planned_grid_figure(cfg, num_layers, steps, show_fill=True, layer_types=layer_types,
                               presentation=presentation)


def flow_view(d3: Trace | None, full: Trace | None, *, metric: str = "both", presentation: bool = False) -> go.Figure:
    if d3 is None or not d3.steps:
        return waiting("Press Generate: the per-layer change is measured on your prompt.", presentation=presentation)
    return sublayer_flow(d3, metric=metric, compare=full, presentation=presentation)


def attention_captured(trace: Trace | None, layer: int) -> bool:
    return trace is not None and any(layer in s.attention for s in trace.steps)


def attention_view(d3: Trace | None, full: Trace | None, layer: int, head: int, *,
                   presentation: bool = False) -> go.Figure:
    if d3 is None or not d3.steps:
        return waiting("Press Generate: the attention of the chosen layer is recorded while generating.",
                       presentation=presentation)
    if d3.num_heads and not 0 <= head < d3.num_heads:
        return waiting(f"Head {head} does not exist: this model has {d3.num_heads} heads per layer "
                       f"(0–{d3.num_heads - 1}).", presentation=presentation)
    if not (attention_captured(d3, layer) or attention_captured(full, layer)):
        captured = sorted({layer for s in d3.steps for layer in s.attention})
        was = f" (this run recorded layer {', '.join(map(str, captured))})" if captured else ""
        return waiting(f"Layer {layer} was not recorded in this run{was}.<br>Press Generate to record it.",
                       presentation=presentation)
    return attention_map(d3, layer, head, compare=full, presentation=presentation)


def error_view(comparison: Comparison | None, *, phase: str = "", log_kl: bool = False,
               presentation: bool = False) -> go.Figure:
    if comparison is None:
        message = {"comparing": "Computing the error against full depth (a teacher-forced run)…",
                   "stopped": "The run was stopped before the comparison. Press Generate to run it again."}
        return waiting(message.get(phase, "Press Generate: the error views appear when both streams have finished."),
                       presentation=presentation)
    return error_propagation(comparison, log_kl=log_kl, presentation=presentation)


def fills_view(fills: Mapping[str, Comparison] | None, *, presentation: bool = False) -> go.Figure:
    if not fills:
        return waiting("Press “Compare fills” to run this prompt and schedule with each fill (copy, propagate, none)"
                       "<br>against full depth: KL per token and agreement, one line per fill (about 4 runs)."
                       "<br>With a nested drop order (the default) the lines coincide: no later token reads a filled"
                       " entry.<br>Choose drop order strided to see the fills differ.", presentation=presentation)
    return fill_strategies(dict(fills), presentation=presentation)


# ---------------------------------------------------------------- the text around the panes


def pane_title(trace_or_cfg: Trace | StrategyConfig | None, fallback: str) -> str:
    if trace_or_cfg is None:
        return fallback
    strategy = trace_or_cfg.strategy if isinstance(trace_or_cfg, Trace) else trace_or_cfg
    return strategy_label(strategy)


def _wrote(trace: Trace, i: int) -> str:
    """What a run did at token `i`, as the status says it (HTML): "wrote <code>␣Q</code>", or, at the end-of-text
    token the run stopped at, "ended (its end-of-text token, ∎ end)", as its pane marks it (viz.stream), never the
    special token as text ("<|endoftext|>")."""
    if trace.finish_reason == "eos" and i == len(trace.steps) - 1:
        return "ended (its end-of-text token, ∎ end)"
    return f"wrote <code>{html.escape(readable_token(shown_text(trace.steps[i])))}</code>"


def status_html(d3: Trace | None, full: Trace | None, phase: str, *, comparison: Comparison | None = None,
                note: str = "") -> str:
    """One status line: the phase, tokens so far, and the first divergence called out in words."""
    parts = [f'<span class="d3-phase">{html.escape(PHASES.get(phase, phase))}</span>']
    if d3 is not None and full is not None:
        name, final = short_label(d3.strategy), phase in ("done", "stopped", "comparing")
        counts = run_counts(d3, full)
        n, first = counts["compared"], counts["first_divergence"]
        parts.append(html.escape(f"{len(d3.steps)} {name} tokens, {len(full.steps)} full-depth tokens: "
                                 f"{count_words(counts, name, final=final)}."))
        if first is not None:
            a, b = _wrote(d3, first), _wrote(full, first)
            parts.append(f'<span class="d3-callout">First divergence at token {first}: {html.escape(name)} {a} '
                         f'where full depth {b}.</span>')
        elif n:
            so_far = "" if final else " so far"
            parts.append(f'<span class="d3-agree">No divergence{so_far}: {html.escape(name)} wrote exactly what full '
                         'depth wrote.</span>')
        if final and (speedup := measured_speedup(d3, full)) is not None:
            reading = speed_words(speedup.ratio, speedup.low, speedup.high, speedup.theoretical)
            if reading and reading != "within timing noise":  # noise: the counters say "too small to measure"
                parts.append(html.escape(f"Measured speed {speedup.ratio:.2f}×: {reading}."))
    if comparison is not None:
        s = comparison.summary()
        parts.append(f"Mean KL against full depth: {_fmt(s['kl_teacher_mean'])} nats teacher-forced, "
                     f"{_fmt(s['kl_free_mean'])} nats free-running. Full-depth perplexity of "
                     f"{html.escape(short_label(comparison.skip.strategy))}'s text: "
                     f"{_fmt(s['full_ppl_of_skip'])} (of its own: {_fmt(s['full_ppl_of_full'])}).")
    if note:
        parts.append(html.escape(note))
    return f'<div class="d3-status">{" ".join(parts)}</div>'


def problem_html(message: str) -> str:
    """The status line of a run that was refused: what to change, once, in plain words."""
    return (f'<div class="d3-status d3-problem"><span class="d3-phase">Cannot run this:</span> '
            f'<span class="d3-error">{html.escape(message)}</span></div>')


def _fmt(value: float | None) -> str:
    return "—" if value is None or not math.isfinite(value) else f"{value:.3g}"


def caps_html(text: str, public: bool) -> str:
    where = "public deployment: only the listed models" if public else "local: any supported model path"
    return (f'<div class="d3-caps">Limits on this server: {html.escape(text)} ({html.escape(where)}). '
            "If the page says the app is busy, wait a few seconds and press Generate again.</div>")


# ---------------------------------------------------------------- the view registry (issue 23)


@dataclass(frozen=True)
class Shown:
    """What a view draws from: the session's run (or a streamed update of it). phase: streaming, comparing, done,
    stopped, or "" for a run at rest."""

    d3: Trace | None = None
    full: Trace | None = None
    comparison: Comparison | None = None
    fills: Mapping[str, Comparison] | None = None
    phase: str = ""

    @classmethod
    def of(cls, session: Any) -> Shown:
        """The session's run; phase "streaming" while a run of the session is going (a view then says it is drawn
        when the run has finished, not "Press Generate")."""
        if session is None:
            return cls()
        phase = "streaming" if getattr(session, "running", None) is not None else ""
        return cls(session.d3, session.full, session.comparison, session.fills, phase)


@dataclass(frozen=True)
class View:
    """One view of the Live tab, all in one module of this package (`explorer/views/<key>.py` defines `VIEW`).

    title / explain: its tab's name and the explanation beside it. needs: what it needs from a run, in words.
    position: where its tab goes (ascending). draw(shown, options): its figure from a run (None: the view draws
    itself, through its own handlers). empty(presentation): what it shows before any run. after_run: drawn when a
    run ends (and emptied when one starts); live: drawn while a run streams, with the heavy figures. controls(ui,
    facts): its own components above its plot; wire(pool, ui, page): its own events (`page`: a `Page`, what they
    hang on); follow(pool, ui, event): redraw the view once `event` (a scenario, a model switch, a link, a view's
    own button) has set the controls, since the server's own updates of the controls trigger no listener. tab: False for a view that sits outside the tabs (the decay curve). plot: False when
    `controls` makes the view's plots itself. export: whether Export offers it (every view does:
    explorer.export.FIGURES).

    How it is exported, said here so that Export loops over the registry and keeps no table of its own:
    ready(session): whether the session holds what the view draws (None: a view drawn after a run needs the run's
    D3 trace; any other view, the controls alone); first: what to do first when it is not ready (the export says it
    rather than export the placeholder that asks for it). measured: the view draws its own measurement (Measure),
    kept in its own state, not in the session; redraw(pool, state, controls) draws that state. prepare(pool,
    session): what the view reads out of the run before it is exported (the lens: its reading). exported(pool,
    session, own, controls): its figures by file name, for a view not drawn by `draw` (the scrubber: two, at its
    token); export_input: the component whose value Export passes as `own` (the scrubber's token)."""

    key: str
    title: str
    explain: str
    needs: str
    position: int
    draw: Callable[[Shown, Any], go.Figure] | None = None
    empty: Callable[[bool], go.Figure] | None = None
    after_run: bool = False
    live: bool = False
    controls: Callable[[dict[str, Any], Any], None] | None = None
    wire: Callable[[Any, dict[str, Any], Page], None] | None = None
    follow: Callable[[Any, dict[str, Any], Any], Any] | None = None
    tab: bool = True
    plot: bool = True
    export: bool = True
    ready: Callable[[Any], Any] | None = None
    first: str = "press Generate first."
    measured: bool = False
    redraw: Callable[..., go.Figure] | None = None
    prepare: Callable[[Any, Any], None] | None = None
    exported: Callable[[Any, Any, Any, Any], dict[str, go.Figure]] | None = None
    export_input: str | None = None

    def ready_in(self, session: Any) -> bool:
        """Whether `session` holds what this view draws (see `ready`); a measured view's state is not the session's."""
        if self.ready is not None:
            return bool(self.ready(session))
        return session.d3 is not None if self.after_run else True


@dataclass(frozen=True)
class Page:
    """What a view's `wire` hangs its events on. moves: a person's moves of the controls (explorer.moves.Moves: one
    event per trigger); opened: view key -> its tab's select event; controls_set(event): a view's event that sets
    controls, after which the page redraws what follows from them (the schedule preview, every view's `follow`);
    each_run(fn): fn(suffix, event) for each run's final event (`suffix`: its API name suffix), called once every
    run is wired (a slider's release wires its runs only with the moves)."""

    moves: Any
    opened: Mapping[str, Any]
    controls_set: Callable[[Any], None]
    each_run: Callable[[Callable[[str, Any], None]], None]


@functools.cache
def registry() -> tuple[View, ...]:
    """Every view, in tab order: each module of this package that defines `VIEW` (adding a view is one module)."""
    found = []
    for info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{info.name}")
        if isinstance(getattr(module, "VIEW", None), View):
            found.append(module.VIEW)
    return tuple(sorted(found, key=lambda v: (v.position, v.key)))


def by_key() -> dict[str, View]:
    return {v.key: v for v in registry()}


def titles() -> dict[str, str]:
    return {v.key: v.title for v in registry()}


def explanations() -> dict[str, str]:
    return {v.key: v.explain for v in registry()}


def drawn_after_run() -> tuple[str, ...]:
    """Views a finished run redraws (and a new run empties), in tab order."""
    return tuple(v.key for v in registry() if v.after_run)


def drawn_from_session() -> tuple[str, ...]:
    """Views drawn from the session's run alone (presentation mode redraws them; Export offers them)."""
    return tuple(v.key for v in registry() if v.draw is not None)


RUNNING = "Generating… this view is drawn when both runs have finished."


def draw(key: str, shown: Shown, options: Any) -> go.Figure:
    """View `key`'s figure of `shown`; a view drawn after a run, while that run has no token yet, says so (it said
    "Press Generate" while Generate was running)."""
    view = by_key()[key]
    if shown.d3 is None and shown.phase == "streaming" and view.after_run:
        return waiting(RUNNING, presentation=options.presentation)
    return view.draw(shown, options)  # type: ignore[misc]


def empty(key: str, presentation: bool = False, *, running: bool = False) -> Any:
    """What view `key` shows with no run: before any, or (`running`) while a run's first tokens are on their way."""
    view = by_key()[key]
    if view.empty is not None:
        return view.empty(presentation)
    return draw(key, Shown(phase="streaming" if running else ""), _Options(presentation))


@dataclass(frozen=True)
class _Options:
    """View options for an empty view (the run's own come from `Controls.view`)."""

    presentation: bool = False
    layer: int = 0
    head: int = 0
    metric: str = "both"
    log_kl: bool = False


def redrawn_by(key: str, control: str, draw_fn: Callable[[Shown, Any], go.Figure], api_name: str
               ) -> tuple[Callable[..., Any], Callable[[Any, dict[str, Any], Page], None]]:
    """(handler, wire) of a view that one of its own controls redraws from the session's run, out of the queue (no
    model runs): the information flow's measure of change, the error view's log scale."""

    @takes_controls
    def render(session: Any, controls: Any) -> Any:
        with user_errors():
            return draw_fn(Shown.of(session), controls.view)

    def wire(pool: Any, ui: dict[str, Any], page: Page) -> None:
        inputs = [ui["session"], *(ui[n] for n in CONTROL_NAMES)]
        ui[control].input(render, inputs, ui[key], api_name=api_name, queue=False, preprocess=False,
                          show_progress="hidden")

    return render, wire


# ---------------------------------------------------------------- a view that draws its own measurement


def redraw_measured(state: Any, presentation: bool, placeholder: Callable[[bool], go.Figure],
                    setup: Callable[[], tuple[Any, ...]], figure: Callable[[Any, tuple[Any, ...]], go.Figure], *,
                    what: str, changed: str) -> go.Figure:
    """A measured view redrawn for the controls (no model runs): `figure(state, setup())` when the measurement was
    made under them (`setup()` returns a tuple whose second item is the key the measurement is kept under); else
    the placeholder (nothing measured), why the controls cannot draw `what`, or `changed` (measured under others)."""
    if state is None:
        return placeholder(presentation)
    try:
        got = setup()
    except ValueError as err:
        return waiting(f"Cannot draw {what}:<br>{html.escape(page_words(str(err)))}", presentation=presentation)
    if got[1] != state.key:
        return waiting(changed, presentation=presentation)
    return figure(state, got)


@dataclass(frozen=True)
class Measured:
    """A view that draws its own measurement rather than a run, written once here: its state, its Measure button
    (in the model's queue), a second button that acts on the measurement, a note, and its redraw (no model) after
    a person's moves of `redraw_on` and after anything else set the controls. Its components are named by the
    view's key: `<key>_state`, `<key>_measure`, `<key>_<act>`, `<key>_note`, the plot `<key>`.

    Every handler takes (pool, state, *controls) (`takes_controls`). measure returns the state, the figure and the
    note; act returns `act_outputs` (component names); redraw the figure. The API names are the page's: measure_api
    and act_api (documented), redraw_api (False: none)."""

    measure: Callable[..., Any]
    measure_label: str
    measure_api: str
    act: Callable[..., Any]
    act_name: str
    act_label: str
    act_outputs: tuple[str, ...]
    act_api: str
    redraw: Callable[..., Any]
    redraw_on: tuple[str, ...]
    placeholder: Callable[[bool], go.Figure]
    act_runs_model: bool = True  # in the model's queue, as Measure; else out of the queue
    redraw_api: str | bool = False

    def view(self, key: str, title: str, explain: str, *, position: int) -> View:
        """The view: its controls and wiring from this pattern; exported by redrawing its state (`View.redraw`)."""
        return View(key, title, explain, needs="its own measurement (Measure), not a run", position=position,
                    empty=self.placeholder, controls=lambda ui, facts: self.controls(key, ui),
                    wire=lambda pool, ui, page: self.wire(key, pool, ui, page),
                    follow=lambda pool, ui, event: self.follow(key, pool, ui, event),
                    measured=True, redraw=self.redraw, export_input=f"{key}_state", first=f"press “{self.measure_label}” in its tab first.")

    def controls(self, key: str, ui: dict[str, Any]) -> None:
        """The view's own components (inside its tab, above the plot)."""
        ui[f"{key}_state"] = gr.State(None)
        with gr.Row():
            ui[f"{key}_measure"] = gr.Button(self.measure_label, elem_id=f"{key}-measure")
            ui[f"{key}_{self.act_name}"] = gr.Button(self.act_label, elem_id=f"{key}-{self.act_name}")
        ui[f"{key}_note"] = gr.Markdown(elem_id=f"{key}-note")

    def _inputs(self, key: str, ui: dict[str, Any]) -> list[Any]:
        return [ui[n] for n in (f"{key}_state", *CONTROL_NAMES)]

    def wire(self, key: str, pool: Any, ui: dict[str, Any], page: Page) -> None:
        """Measure in the model's queue; the second button after it, which sets controls (the page redraws what
        follows); the redraw after a person's moves, out of the queue."""
        inputs, queued = self._inputs(key, ui), model_queue(pool.caps.concurrency)
        ui[f"{key}_measure"].click(functools.partial(self.measure, pool), inputs,
                                   [ui[n] for n in (f"{key}_state", key, f"{key}_note")], api_name=self.measure_api,
                                   **queued)
        act = ui[f"{key}_{self.act_name}"].click(
            functools.partial(self.act, pool), inputs, [ui[n] for n in self.act_outputs], api_name=self.act_api,
            **(queued if self.act_runs_model else dict(queue=False, preprocess=False)))
        page.controls_set(act)
        moved = [*(ui[n].input for n in self.redraw_on),
                 *(ui[n].release for n in self.redraw_on if isinstance(ui[n], gr.Slider))]
        page.moves.on(moved, functools.partial(self.redraw, pool), inputs, [ui[key]], api_name=self.redraw_api,
                      queue=False, preprocess=False, show_progress="hidden")

    def follow(self, key: str, pool: Any, ui: dict[str, Any], event: Any) -> Any:
        return event.then(functools.partial(self.redraw, pool), self._inputs(key, ui), ui[key], api_name=False,
                          queue=False, preprocess=False, show_progress="hidden")
