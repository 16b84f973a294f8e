"""The "What each token needs" view: the oracle on the current prompt (the depth each token of full depth's answer
needs) drawn over D3's decay curve, and the button that fits α to it and sets the α slider. A measured view
(`Measured`): its handlers here, its components and wiring from the pattern."""

from __future__ import annotations

import html
import math
from dataclasses import dataclass
from typing import Any

import plotly.graph_objects as go

from d3.config import D3Config
from d3.research.oracle import measure
from d3.research.oracle_fit import fit_alpha, underserved_fraction
from explorer.controls import ALPHA_STEP, PAGE_RANGES, Controls, takes_controls
from explorer.pool import ModelPool
from explorer.runs import check_run, prepare_run
from explorer.ui import ordered, user_errors, within_limit
from explorer.views import Measured, redraw_measured, waiting
from viz.oracle import token_needs

KEY = "needs"
NEEDS_OUTPUTS = (f"{KEY}_state", KEY, f"{KEY}_note")
FIT_OUTPUTS = (f"{KEY}_state", "alpha", KEY, f"{KEY}_note")
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
    assert setup.engine is not None  # prepare_run loads the model
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
        assert isinstance(fitted, D3Config)
        clamp = f" (the fit gave α={fit.alpha:g}, below the slider's {lo})" if fit.alpha < lo else ""
        note = (f"α set to {alpha:g}{clamp}: the fastest decay from start {cfg.start} that gives at most "
                f"{COVERAGE_K:.0%} of these tokens fewer layers than they need. " + _note(needs, fitted))
        return ordered(FIT_OUTPUTS, needs_state=needs, alpha=alpha, needs_note=html.escape(note),
                       needs=_figure(needs, fitted, presentation=controls.view.presentation))


def cold_view(presentation: bool = False) -> go.Figure:
    """The view before anything was measured: what to press."""
    return waiting("Press “Measure what each token needs” above: the oracle runs the full-depth answer to this "
                   "prompt<br>and finds the fewest layers each of its tokens needs.", presentation=presentation)


@takes_controls
def redraw_needs(pool: ModelPool, state: Needs | None, controls: Controls) -> Any:
    """Redraw the measured needs over the budgets of the current controls (no model runs)."""
    p = controls.view.presentation
    return redraw_measured(state, p, cold_view, lambda: _config(pool, controls),
                           lambda needs, got: _figure(needs, got[0], presentation=p), what="this schedule",
                           changed="The prompt or the layer settings changed: measure again.")


EXPLAIN = """**The depth each token of the full-depth answer really needs** (the *oracle*): the smallest D3
budget, with the same core and drop order, whose top-1 token is still full depth's, with every earlier token at
full depth. Dots are tokens; red crosses need more layers than D3 gives them at the current α. Hollow dots: the
*logit lens*, after how many layers the final token is already on top and stays there.
**Fit α to this prompt** sets α to the fastest decay that under-serves at most 10% of these tokens.

**What to look for:** D3 assumes that later tokens need fewer layers. If the dots do not fall to the right, the
decay cuts layers that these tokens need. Measuring runs every budget for every token of up to 64: about a
minute on SmolLM2-135M on a quiet CPU, two or more on a busy one or on Gemma 3, several on the 28-layer model (it
stops at the server's time limit and says so)."""



VIEW = Measured(measure_needs, "Measure what each token needs", "measure_needs", fit_to_prompt, "fit",
                "Fit α to this prompt", FIT_OUTPUTS, "fit_alpha_to_prompt", redraw_needs, REDRAW_ON, cold_view,
                redraw_api="redraw_needs").view(KEY, "What each token needs", EXPLAIN, position=70)
