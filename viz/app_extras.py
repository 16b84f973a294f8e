"""What the page needs around the figure builders: each view with its empty state, the status line, the
teaching text. Pure like the rest of viz/: traces in, figures or HTML out."""

from __future__ import annotations

import html
import math
from typing import Mapping

import numpy as np
import plotly.graph_objects as go

from d3.config import StrategyConfig
from d3.trace import Comparison, Trace
from viz.attention import attention_map
from viz.depth import decay_curve
from viz.errors import error_propagation, fill_strategies
from viz.flow import sublayer_flow
from viz.grid import layer_grid, planned_grid_figure
from viz.layout import empty_figure, readable_token, strategy_label

VIEWS: dict[str, str] = {
    "usage": "Per-token layer usage",
    "decay": "Decay curve",
    "planned": "Planned layer grid",
    "flow": "Information flow: core vs flex",
    "attention": "Attention: full depth vs D3",
    "errors": "Error propagation",
    "fills": "Fill strategies",
}

EXPLAIN: dict[str, str] = {
    "usage": """**One row per generated token, one column per decoder layer.**
Blue cells ran. Grey cells were skipped. Orange, green and red cells were skipped, and their key/value
entry was filled by *copy*, by *propagate*, or left as a masked *hole*.
The purple bands are the **core** layers, which always run.

**What to look for:** the rows get shorter as the response goes on. That is the depth decay.
Hover over a cell to see what happened to it.""",
    "decay": """**How many layers token *i* gets:** `floor(L · α^i)`, never below the core floor (head + tail).
The dashed line is the formula alone. The thick line is the planned budget, and the dots are what each token
actually ran. Other strategies' schedules are drawn on the same axes.

**What to look for:** α close to 1 decays slowly. Moving the α or core sliders redraws this at once,
without running the model. Letting go of a slider runs the model again.""",
    "planned": """**The schedule before any model runs:** which layers each future token *will* run
under the current controls. The middle (flex) layers are dropped first, in the chosen drop order.

**What to look for:** with *middle-out*, *top-down* or *bottom-up* each token's layers are a subset of the
previous token's layers (nested). With *strided* they are not, so a later token can read a layer that an
earlier token skipped.""",
    "flow": """**How much each sublayer changes the hidden state,** per layer, measured live on this prompt.
The change is 1 − cosine between the input and output of the sublayer, or the relative distance between them.
Dotted lines: averaged over the prompt. Solid lines: averaged over generated tokens (D3). Dashed lines: full depth.
Purple bands: core layers.

**What to look for:** the change is largest at the first and last layers. That is why D3 always runs
them (the *core*) and only skips the middle.""",
    "attention": """**Where one attention head looks** while each token is generated (rows), over the prompt and
the earlier tokens (columns): full depth on the left, D3 on the right. Choose the layer *before* generating,
because only that layer is recorded, to keep traces small. The head can be changed afterwards. The default
layer is the first flex layer, which D3 keeps the longest.

**What to look for:** grey rows are tokens for which D3 skipped this layer. Similar patterns mean
that skipping left this head's behaviour intact.""",
    "errors": """**How far D3 drifts from full depth,** per position.
*Teacher-forced* KL: both models see the same full-depth text, so this is the local error of one step.
*Free-running* KL: D3 continues on its own text, so errors compound.
The bottom panel shows how wrong the key/value cache is at each layer, compared with full depth. The outlined
cells were filled instead of computed.

**What to look for:** a spike at the first divergence. Filled entries with a large error.""",
    "fills": """**The same prompt and schedule with each fill strategy:**
*copy* takes the key/value entry of the nearest lower layer that ran. *propagate* passes the hidden state
through the skipped layer unchanged and projects its own key/value from it. *none* leaves a hole and masks it.
This costs extra runs, so press **Compare fills** to compute it.

**What to look for:** with a nested drop order, all three fills give the same result, because no later token
reads a hole. With *strided*, the fills give different results.""",
}

INTRO = """**D3 (Position-Aware Depth Decay Decoding)** makes a language model use fewer of its layers the
further it gets into its answer. Later tokens are easier to predict, so they need less depth.
The *i*-th new token runs `floor(L · α^i)` of the model's *L* layers. The first and last (*core*) layers
always run, and only the middle (*flex*) layers are skipped. When a later token needs the key/value state
of a layer that an earlier token skipped, that state is *filled*.
Below, D3 and the full model write side by side so that you can see what changes."""


def waiting(message: str, *, presentation: bool = False) -> go.Figure:
    """A placeholder figure that says what to do to fill it."""
    return empty_figure(message, presentation=presentation, height=360)


def usage_view(d3: Trace | None, *, presentation: bool = False) -> go.Figure:
    if d3 is None or not d3.steps:
        return waiting("Press Generate: each D3 token will get a row here.", presentation=presentation)
    return layer_grid(d3, presentation=presentation)


def decay_view(cfg: StrategyConfig, num_layers: int, steps: int, *, trace: Trace | None = None,
               others: Mapping[str, StrategyConfig] | None = None, presentation: bool = False) -> go.Figure:
    """The decay curve; `trace` is drawn only if it ran exactly this schedule (else it would mislead)."""
    shown = trace if trace is not None and trace.strategy == cfg.to_dict() else None
    return decay_curve(cfg, num_layers, steps, trace=shown, others=dict(others or {}), presentation=presentation)


def planned_view(cfg: StrategyConfig, num_layers: int, steps: int, *, presentation: bool = False) -> go.Figure:
    return planned_grid_figure(cfg, num_layers, steps, show_fill=True, presentation=presentation)


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
        return waiting(message.get(phase, "The error views appear when both streams have finished."),
                       presentation=presentation)
    return error_propagation(comparison, log_kl=log_kl, presentation=presentation)


def fills_view(fills: Mapping[str, Comparison] | None, *, presentation: bool = False) -> go.Figure:
    if not fills:
        return waiting("Press “Compare fills” to run copy, propagate and none on this prompt.",
                       presentation=presentation)
    return fill_strategies(dict(fills), presentation=presentation)


# ---------------------------------------------------------------- the text around the panes


def pane_title(trace_or_cfg: Trace | StrategyConfig | None, fallback: str) -> str:
    if trace_or_cfg is None:
        return fallback
    strategy = trace_or_cfg.strategy if isinstance(trace_or_cfg, Trace) else trace_or_cfg
    return strategy_label(strategy)


def _divergence(d3: Trace, full: Trace) -> tuple[int, int, int | None]:
    """(positions compared, positions agreeing, first differing position) over the shorter run."""
    n = min(len(d3.steps), len(full.steps))
    ids_a = np.array([s.token_id for s in d3.steps[:n]])
    ids_b = np.array([s.token_id for s in full.steps[:n]])
    bad = np.flatnonzero(ids_a != ids_b)
    return n, n - bad.size, int(bad[0]) if bad.size else None


PHASES = {
    "loading": "Loading the model (first use only)…",
    "streaming": "Generating…",
    "comparing": "Both streams are done. Now measuring the error against full depth…",
    "done": "Done.",
    "stopped": "Stopped.",
}


def status_html(d3: Trace | None, full: Trace | None, phase: str, *, comparison: Comparison | None = None,
                note: str = "") -> str:
    """One status line: the phase, tokens so far, and the first divergence called out in words."""
    parts = [f'<span class="d3-phase">{html.escape(PHASES.get(phase, phase))}</span>']
    if d3 is not None and full is not None:
        n, agree, first = _divergence(d3, full)
        parts.append(f"{len(d3.steps)} D3 tokens, {len(full.steps)} full-depth tokens, {agree}/{n} agree.")
        if first is not None:
            a, b = readable_token(d3.steps[first].text), readable_token(full.steps[first].text)
            parts.append(f'<span class="d3-callout">First divergence at token {first}: D3 wrote '
                         f'<code>{html.escape(a)}</code> where full depth wrote <code>{html.escape(b)}</code>.</span>')
        elif n:
            parts.append('<span class="d3-agree">No divergence so far: D3 wrote exactly what full depth wrote.</span>')
    if comparison is not None:
        s = comparison.summary()
        parts.append(f"Mean KL against full depth: {_fmt(s['kl_teacher_mean'])} nats teacher-forced, "
                     f"{_fmt(s['kl_free_mean'])} nats free-running.")
    if note:
        parts.append(html.escape(note))
    return f'<div class="d3-status">{" ".join(parts)}</div>'


def _fmt(value: float | None) -> str:
    return "—" if value is None or not math.isfinite(value) else f"{value:.3g}"


def caps_html(text: str, public: bool) -> str:
    where = "public deployment: only the listed models" if public else "local: any supported model path"
    return (f'<div class="d3-caps">Limits on this server: {html.escape(text)} ({html.escape(where)}). '
            "If the page says the app is busy, wait a few seconds and press Generate again.</div>")
