"""The "What each token needs" view: the oracle on the current prompt drawn over D3's decay curve, and the button
that fits α to it and sets the α slider. Its components, handlers and wiring live here."""

from __future__ import annotations

import functools
import html
import math
from dataclasses import dataclass
from typing import Any

import gradio as gr
import plotly.graph_objects as go

from d3.config import D3Config
from d3.research.oracle import measure
from d3.research.oracle_fit import fit_alpha, underserved_fraction
from explorer.controls import ALPHA_STEP, CONTROL_NAMES, PAGE_RANGES, Controls, page_words, takes_controls
from explorer.pool import ModelPool
from explorer.runs import check_run, prepare_run
from explorer.ui import model_queue, ordered, user_errors, within_limit
from explorer.views import waiting
from viz.oracle import token_needs

NEEDS_OUTPUTS = ("needs_state", "needs", "needs_note")
FIT_OUTPUTS = ("needs_state", "alpha", "needs", "needs_note")
ORACLE_MAX_TOKENS = 64  # every budget of every token runs: bounded so that a click costs about a minute on a CPU
COVERAGE_K = 0.10  # "fit α" picks the fastest decay that gives at most this share of tokens less than they need
# Controls after which the drawn budgets change; redrawing needs no model.
REDRAW_ON = ("alpha", "start", "core_head", "core_tail", "drop_order", "presentation")


@dataclass(frozen=True)
class Needs:
    """One measured answer, kept in the session's state; `key` says what it was measured under."""

    key: tuple[Any, ...]
    num_layers: int
    oracle_depth: tuple[int, ...]
    prediction_depth: tuple[int, ...]
    texts: tuple[str, ...]


def _config(pool: ModelPool, controls: Controls) -> tuple[D3Config, tuple[Any, ...], int]:
    """D3's config from the controls (whatever strategy is chosen), the key of what the oracle depends on, the
    number of tokens it measures. ValueError for a bad control, before any model loads."""
    setup = check_run(pool, controls.with_(strategy="d3"))
    cfg = setup.strategy
    assert isinstance(cfg, D3Config)
    layers = pool.facts(setup.model).num_layers
    tokens = min(setup.gen.max_new_tokens, ORACLE_MAX_TOKENS)
    key = (setup.model, setup.prompt, setup.chat_template, tokens, cfg.core(layers), cfg.drop_order)
    return cfg, key, tokens


def _measured(pool: ModelPool, state: Needs | None, controls: Controls) -> tuple[D3Config, Needs]:
    """The needs for the current prompt and settings: from the state when they match, else measured now."""
    cfg, key, tokens = _config(pool, controls)
    if state is not None and state.key == key:
        return cfg, state
    setup = prepare_run(pool, controls.with_(strategy="d3"))
    with within_limit(pool.caps.max_run_s, "the oracle") as should_stop:
        answer = measure(setup.engine, setup.prompt, cfg, tokens, chat_template=setup.chat_template,
                         should_stop=should_stop)
    return cfg, Needs(key, setup.engine.num_layers, tuple(answer.oracle_depth), tuple(answer.prediction_depth),
                      tuple(answer.texts))


def _figure(needs: Needs, cfg: D3Config, *, fitted: D3Config | None = None, presentation: bool = False) -> go.Figure:
    return token_needs(needs.oracle_depth, needs.num_layers, cfg, texts=needs.texts, fitted=fitted,
                       prediction_depth=needs.prediction_depth, presentation=presentation)


def _note(needs: Needs, cfg: D3Config) -> str:
    share = underserved_fraction([needs.oracle_depth], cfg, needs.num_layers)
    mean = sum(needs.oracle_depth) / len(needs.oracle_depth)
    return (f"{len(needs.oracle_depth)} tokens need {mean:.1f} of {needs.num_layers} layers on average; "
            f"D3 at α={cfg.alpha:g}, start {cfg.start} gives {share:.0%} of them fewer than they need.")


@takes_controls
def measure_needs(pool: ModelPool, state: Needs | None, controls: Controls) -> tuple[Any, ...]:
    """Run the oracle on the prompt's full-depth answer (or reuse it) and draw it over D3's budgets."""
    with user_errors():
        cfg, needs = _measured(pool, state, controls)
        return ordered(NEEDS_OUTPUTS, needs_state=needs, needs_note=html.escape(_note(needs, cfg)),
                       needs=_figure(needs, cfg, presentation=controls.view.presentation))


@takes_controls
def fit_to_prompt(pool: ModelPool, state: Needs | None, controls: Controls) -> tuple[Any, ...]:
    """Set α to the fastest decay (at the current start) that under-serves at most 10% of this answer's tokens."""
    with user_errors():
        cfg, needs = _measured(pool, state, controls)
        fit = fit_alpha([needs.oracle_depth], needs.num_layers, core=cfg.core(needs.num_layers), k=COVERAGE_K,
                        start=cfg.start)["coverage"]
        (lo, hi), step = PAGE_RANGES["alpha"], ALPHA_STEP
        # Up to the slider's step: rounding down could under-serve more than the fit allows.
        alpha = min(hi, max(lo, math.ceil(round(fit.alpha / step, 6)) * step))
        alpha = round(alpha, 3)
        fitted = cfg.with_(alpha=alpha)
        clamp = f" (the fit gave α={fit.alpha:g}, below the slider's {lo})" if fit.alpha < lo else ""
        note = (f"α set to {alpha:g}{clamp}: the fastest decay from start {cfg.start} that gives at most "
                f"{COVERAGE_K:.0%} of these tokens fewer layers than they need. " + _note(needs, fitted))
        return ordered(FIT_OUTPUTS, needs_state=needs, alpha=alpha, needs_note=html.escape(note),
                       needs=_figure(needs, fitted, presentation=controls.view.presentation))


def cold_view(*, presentation: bool = False) -> go.Figure:
    """The view before anything was measured: what to press."""
    return waiting("Press “Measure what each token needs” above: the oracle runs the full-depth answer to this "
                   "prompt<br>and finds the fewest layers each of its tokens needs.", presentation=presentation)


@takes_controls
def redraw_needs(pool: ModelPool, state: Needs | None, controls: Controls) -> Any:
    """Redraw the measured needs over the budgets of the current controls (no model runs)."""
    p = controls.view.presentation
    if state is None:
        return cold_view(presentation=p)
    try:
        cfg, key, _ = _config(pool, controls)
    except ValueError as err:
        return waiting(f"Cannot draw this schedule:<br>{html.escape(page_words(str(err)))}", presentation=p)
    if key != state.key:
        return waiting("The prompt or the layer settings changed: measure again.", presentation=p)
    return _figure(state, cfg, presentation=p)


def needs_controls(ui: dict[str, Any]) -> None:
    """The view's own components (inside its tab, above the plot)."""
    ui["needs_state"] = gr.State(None)
    with gr.Row():
        ui["needs_measure"] = gr.Button("Measure what each token needs", elem_id="needs-measure")
        ui["needs_fit"] = gr.Button("Fit α to this prompt", elem_id="needs-fit")
    ui["needs_note"] = gr.Markdown(elem_id="needs-note")


def wire_needs(pool: ModelPool, ui: dict[str, Any], moves: Any) -> Any:
    """The view's events: measure and fit share the model queue; redraws run outside it, after a person's moves
    (`moves`: explorer.moves.Moves). Returns the fit's event
    (it sets α, after which the page redraws what follows from the controls)."""
    inputs = [ui[n] for n in ("needs_state", *CONTROL_NAMES)]
    queued = model_queue(pool.caps.concurrency)
    ui["needs_measure"].click(functools.partial(measure_needs, pool), inputs, [ui[n] for n in NEEDS_OUTPUTS],
                              api_name="measure_needs", **queued)
    fit = ui["needs_fit"].click(functools.partial(fit_to_prompt, pool), inputs, [ui[n] for n in FIT_OUTPUTS],
                          api_name="fit_alpha_to_prompt", **queued)
    moves.on([*(ui[n].input for n in REDRAW_ON), *(ui[n].release for n in REDRAW_ON if isinstance(ui[n], gr.Slider))],
             functools.partial(redraw_needs, pool), inputs, [ui["needs"]], api_name="redraw_needs", queue=False,
             preprocess=False, show_progress="hidden")
    return fit


def redraw_needs_after(pool: ModelPool, ui: dict[str, Any], event: Any) -> Any:
    """Redraw the view once `event` (a scenario, a model switch, a link, ...) has set the controls: the server's
    own updates of the controls trigger no listener."""
    inputs = [ui[n] for n in ("needs_state", *CONTROL_NAMES)]
    return event.then(functools.partial(redraw_needs, pool), inputs, ui["needs"], api_name=False, queue=False,
                      preprocess=False, show_progress="hidden")
