"""The "Which layers matter" view: for the current prompt and model, each flex layer's single-drop effect on full
depth's own answer (agreement and KL, teacher-forced), the greedy calibrated order with its removal curve beside
the order in use, and "Use this order", which sets the drop order to the calibrated one. A measured view
(`Measured`): its handlers here, its components and wiring from the pattern; the measuring is
`d3.research.calibrate`."""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any

import gradio as gr
import plotly.graph_objects as go

from d3.config import D3Config
from d3.research.calibrate import Calibration, calibrate_and_compare, prompt_set
from d3.schedule import flex_drop_order, order_key
from explorer.controls import Controls, layer_order_text, takes_controls
from explorer.pool import ModelPool
from explorer.runs import check_run, prepare_run
from explorer.ui import ordered, user_errors, within_limit
from explorer.views import Measured, redraw_measured, waiting
from viz.layers import layer_importance

KEY = "layers"
LAYERS_OUTPUTS = (f"{KEY}_state", KEY, f"{KEY}_note")
USE_OUTPUTS = ("drop_order", "layer_order", f"{KEY}_note")
LAYERS_STEPS = 8  # greedy removals measured on the page (the rest of the order follows by single-drop score)
LAYERS_BUDGET = 0.8  # of the server's time limit: fewer greedy steps where 8 would not fit (a 28-layer 1.5B model)
LAYERS_TOKENS = 32  # tokens of full depth's answer the agreement is read on
REDRAW_ON = ("drop_order", "layer_order", "core_head", "core_tail", "presentation")


@dataclass(frozen=True)
class Layers:
    """One measurement, kept in the session's state; `key` says what it was measured on."""

    key: tuple[Any, ...]
    calibration: Calibration
    in_use: tuple[int, ...]
    in_use_name: str
    in_use_curve: tuple[float, ...]


def _setup(pool: ModelPool, controls: Controls) -> tuple[D3Config, tuple[Any, ...], int]:
    setup = check_run(pool, controls.with_(strategy="d3"))
    cfg = setup.strategy
    assert isinstance(cfg, D3Config)
    layers = pool.facts(setup.model).num_layers
    tokens = min(setup.gen.max_new_tokens, LAYERS_TOKENS)
    return cfg, (setup.model, setup.prompt, setup.chat_template, tokens, setup.gen.max_new_tokens, cfg.core(layers)), layers


def _in_use(cfg: D3Config, num_layers: int) -> tuple[tuple[int, ...], str]:
    """The order the controls run, as layers (strided is not nested: drawn as its middle-out neighbour)."""
    head, tail = cfg.core(num_layers)
    if cfg.drop_order == "strided":
        return flex_drop_order(num_layers, head, tail, "middle_out"), "strided (not nested; middle-out shown)"
    return flex_drop_order(num_layers, head, tail, order_key(cfg)), cfg.drop_order.replace("_", "-")


def _read_on(tokens: int, asked: int) -> str:
    """The tokens of full depth's answer the measurement read, and why fewer than asked: every drop re-reads them."""
    if tokens < asked:
        return (f"the first {tokens} of the {asked} tokens asked of full depth's answer: every layer dropped re-reads "
                f"them, so the measurement reads at most {LAYERS_TOKENS} to stay within the server's time limit")
    return f"{tokens} tokens of full depth's answer"


def _note(state: Layers) -> str:
    c = state.calibration
    spare = [x for x in c.order[:c.steps]]
    kept = c.curve[min(3, len(c.curve)) - 1]
    worst = min(c.single, key=lambda layer: c.single[layer])
    text = (f"On this prompt ({_read_on(c.tokens, state.key[4])}), the layers "
            f"this model spares best are "
            f"{', '.join(map(str, spare[:5]))} (greedy): dropping the first {min(3, len(c.curve))} keeps {kept:.0%} of "
            f"full depth's next tokens. Dropped alone, layer {worst} hurts most ({c.single[worst]:.0%} kept). "
            f"Measured in {c.seconds:.0f} s.")
    wanted = min(LAYERS_STEPS, len(c.order))
    if c.steps < wanted:
        text += (f" {c.steps} greedy step{'s' if c.steps > 1 else ''} of {wanted} fit the server's time limit "
                 f"on this model; the rest of the order follows by single-drop score.")
    if state.in_use_curve:
        k = min(3, len(state.in_use_curve))
        text += f" The order in use ({state.in_use_name}) keeps {state.in_use_curve[k - 1]:.0%} after its first {k}."
    return text


def _figure(state: Layers, *, presentation: bool = False) -> go.Figure:
    c = state.calibration
    return layer_importance(c.single, c.single_kl, c.order, c.curve, full=c.full, in_use=state.in_use,
                            in_use_name=state.in_use_name, in_use_curve=state.in_use_curve, presentation=presentation)


@takes_controls
def measure_layers(pool: ModelPool, state: Layers | None, progress: gr.Progress = gr.Progress(),
                   controls: Controls = Controls()) -> tuple[Any, ...]:
    """Measure each flex layer's single-drop effect and the greedy order on this prompt's full-depth answer."""
    with user_errors():
        cfg, key, layers = _setup(pool, controls)
        setup = prepare_run(pool, controls.with_(strategy="d3"))
        in_use, name = _in_use(cfg, layers)
        report = lambda done, total, what: progress(done / max(total, 1), desc=what)  # noqa: E731
        with within_limit(pool.caps.max_run_s, "the measurement") as should_stop:
            cal, curves = calibrate_and_compare(setup.engine, "agreement", prompt_set(setup.prompt, setup.chat_template),
                                                {"in use": in_use}, core=cfg.core(layers), steps=LAYERS_STEPS,
                                                tokens=key[3], progress=report, should_stop=should_stop,
                                                budget_s=LAYERS_BUDGET * pool.caps.max_run_s)
        state = Layers(key, cal, in_use, name, tuple(curves["in use"]))
        return ordered(LAYERS_OUTPUTS, layers_state=state, layers_note=html.escape(_note(state)),
                       layers=_figure(state, presentation=controls.view.presentation))


@takes_controls
def use_this_order(pool: ModelPool, state: Layers | None, controls: Controls) -> tuple[Any, ...]:
    """Set the drop order to the calibrated one measured on this prompt (the grid and decay curve follow)."""
    with user_errors():
        if state is None:
            raise ValueError("measure first: press “Measure which layers matter”")
        _, key, _ = _setup(pool, controls)
        if key != state.key:
            raise ValueError("the prompt, model, length or core changed since the measurement: measure again")
        order = state.calibration.order
        note = (f"Drop order set to the calibrated order {layer_order_text(order[:6])}, … (measured on this prompt). "
                "Press Generate to run it.")
        return ordered(USE_OUTPUTS, drop_order="calibrated", layer_order=layer_order_text(order),
                       layers_note=html.escape(note))


def layers_placeholder(presentation: bool = False) -> go.Figure:
    """What the view shows before a measurement: what to press and what it costs."""
    return waiting("Press “Measure which layers matter”: each flex layer is dropped in turn on the first "
                   f"{LAYERS_TOKENS} tokens of this prompt's full-depth answer (about 20-60 s on SmolLM2-135M, "
                   "minutes on a larger model; it stops at the server's time limit).", presentation=presentation)


@takes_controls
def redraw_layers(pool: ModelPool, state: Layers | None, controls: Controls) -> Any:
    """Redraw the measurement with the order in use marked (no model runs)."""
    p = controls.view.presentation

    def figure(state: Layers, got: tuple[Any, ...]) -> go.Figure:
        in_use, name = _in_use(got[0], got[2])
        if in_use == state.in_use:
            shown = state
        else:  # the calibrated order itself in use: its curve is the green one; another: measure to draw its curve
            same = in_use == state.calibration.order
            shown = Layers(state.key, state.calibration, in_use, name, state.calibration.curve if same else ())
        return _figure(shown, presentation=p)

    return redraw_measured(state, p, layers_placeholder, lambda: _setup(pool, controls), figure, what="this order",
                           changed="The prompt, model, length or core changed: measure again.")


EXPLAIN = """**Which flex layers can this model spare, on this prompt?** Each flex layer is dropped alone while
full depth's own answer is read back (teacher-forced: the prompt at full depth, the answer through the other
layers). Bars: the share of full depth's next tokens still on top; dots: the KL from full depth. The number on a
bar is its place in the **calibrated order**: greedily, the layer whose removal (on top of those already removed)
hurts least goes next. Below: tokens kept after dropping the first *k* layers of the calibrated order (green) and of
the order in use (orange, dashed; its first dropped layers are outlined above). **Use this order** sets the drop
order to the calibrated one.

**What to look for:** which layers D3 drops decides as much as how many. A layer that barely matters for prose
can carry arithmetic: measure on the kind of text you care about."""



VIEW = Measured(measure_layers, "Measure which layers matter", "measure_layers", use_this_order, "use",
                "Use this order", USE_OUTPUTS, "use_calibrated_order", redraw_layers, REDRAW_ON, layers_placeholder,
                act_runs_model=False).view(KEY, "Which layers matter", EXPLAIN, position=80)
