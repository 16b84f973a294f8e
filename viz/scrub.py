"""The token scrubber: for one generated token, which layers ran, where each skipped layer's KV entry came
from, and its top-5 next tokens under D3 and at full depth."""

from __future__ import annotations

import html
import math
from collections import defaultdict

import numpy as np
import plotly.graph_objects as go

from d3.trace import (
    FILLED_COPY,
    FILLED_PROPAGATE,
    HOLE,
    RAN,
    SKIPPED,
    TokenStep,
    Trace,
    prediction_depth,
    token_agreement,
)
from viz.grid import cell_hover
from viz.layout import (
    CELL_COLORS,
    STRATEGY_COLORS,
    core_shapes,
    drawn_core,
    fit_title,
    font_size,
    layer_kinds,
    make_figure,
    plot_text,
    quoted,
    readable_token,
    shown_text,
    strategy_label,
)
from viz.stream import layer_range_text


def full_context_agrees(trace: Trace, reference: Trace | None, index: int) -> bool:
    """True if `reference` wrote the same tokens as `trace` before position `index`, so that its next-token
    distribution at `index` answers the same text (it may still pick a different token there)."""
    if reference is None or not 0 <= index < len(reference.steps):
        return False
    return token_agreement(trace.token_ids[:index], reference.token_ids[:index]).first_divergence is None


def _recorded_source(step: TokenStep, layer: int) -> int | None:
    """The layer this step's entry at `layer` was copied from, as the decoder recorded it."""
    return next((source for filled, how, source in step.filled if filled == layer and how == "copy"), None)


def _cell_label(step: TokenStep, cells: np.ndarray, layer: int) -> str:
    code = int(cells[layer])
    if code == RAN:
        if len(step.lens_prob) == len(cells):
            return f"ran · lens top-1 {quoted(step.logit_lens[layer])}, p = {step.lens_prob[layer]:.2f}"
        return "ran"
    if code == FILLED_COPY:
        source = _recorded_source(step, layer)
        return f"skipped · KV copied from layer {source}" if source is not None else "skipped · KV copied"
    return {FILLED_PROPAGATE: "skipped · KV from the passed-through state (propagate)",
            HOLE: "skipped · no KV: a hole masked out of attention",
            SKIPPED: "skipped · no KV written"}[code]


def token_layers(trace: Trace, index: int, *, title: str | None = None, presentation: bool = False,
                 height: int | None = None) -> go.Figure:
    """One bar per layer (layer 0 at the bottom) for token `index` of `trace`, coloured by what happened there
    (`TokenStep.cells`, int8 [L]), each labelled with the lens reading or the source of its KV entry."""
    step = trace.steps[index]
    num_layers = trace.num_layers
    cells = step.cells(num_layers)
    kinds = layer_kinds(num_layers, drawn_core(trace))
    hover = cell_hover(cells[None, :], [f"token {quoted(shown_text(step))} (step {step.step})"], kinds,
                       sources=step.fill_sources(num_layers)[None, :])[0]
    bars = go.Bar(y=np.arange(num_layers), x=np.ones(num_layers), orientation="h", width=0.9,
                  marker=dict(color=[CELL_COLORS[int(c)] for c in cells]),
                  text=[_cell_label(step, cells, layer) for layer in range(num_layers)],
                  textposition="inside", insidetextanchor="start", textangle=0,
                  insidetextfont=dict(color=["#FFFFFF" if c == RAN else "#111827" for c in cells],
                                      size=font_size(presentation, delta=-3)),
                  hovertext=hover, hovertemplate="%{hovertext}<extra></extra>", showlegend=False,
                  meta={"role": "token-layers", "step": step.step})
    layout = dict(
        xaxis=dict(visible=False, range=[0, 1]),
        yaxis=dict(title=dict(text="layer"), tickmode="array", tickvals=list(range(num_layers)),
                   ticktext=[f"{layer} {kinds[layer]}" for layer in range(num_layers)], range=[-0.5, num_layers - 0.5],
                   showgrid=False, tickfont=dict(size=font_size(presentation, delta=-4))),
        shapes=core_shapes(num_layers, drawn_core(trace), axis="y"), bargap=0.05,
    )
    if title is None:
        title = fit_title(f"Token {index}: {quoted(shown_text(step))}",
                          f"{step.n_layers} of {num_layers} layers ran (planned {step.planned})")
    return make_figure([bars], layout, title=title, presentation=presentation, legend=False,
                       height=height or int(np.clip(20 * num_layers + 150, 360, 900)))


def _candidates(*steps: TokenStep | None) -> list[tuple[int, str]]:
    """(id, text) of every token in the given steps' top-k, first step's order first, no repeats."""
    seen: dict[int, str] = {}
    for step in steps:
        for token_id, text, _ in (step.topk if step is not None else ()):
            seen.setdefault(token_id, text)
    return list(seen.items())


def _topk_bar(step: TokenStep, candidates: list[tuple[int, str]], *, name: str, color: str) -> go.Bar:
    probs = {token_id: p for token_id, _, p in step.topk}
    x = [probs.get(token_id) for token_id, _ in candidates]
    hover = [f"{name}: p({quoted(text)}) = {p:.3f}" if p is not None else f"{name}: {quoted(text)} is not in its top {len(probs)}"
             for (_, text), p in zip(candidates, x)]
    return go.Bar(y=list(range(len(candidates))), x=[p if p is not None else 0 for p in x], orientation="h", name=name,
                  marker=dict(color=color), hovertext=hover, hovertemplate="%{hovertext}<extra></extra>",
                  text=[f"{p:.2f}" if p is not None else "" for p in x], textposition="outside", cliponaxis=False,
                  meta={"role": "topk", "name": name})


def topk_compare(trace: Trace, index: int, reference: Trace | None = None, *, title: str | None = None,
                 presentation: bool = False, height: int | None = None) -> go.Figure:
    """Grouped bars of token `index`'s top-k next-token probabilities under `trace` and, where full depth had
    written the same text before it (`full_context_agrees`), under `reference` at the same position."""
    step = trace.steps[index]
    same = full_context_agrees(trace, reference, index)
    other = reference.steps[index] if same and reference is not None else None
    candidates = _candidates(step, other)
    label = "D3" if trace.strategy_name == "d3" else strategy_label(trace.strategy)
    data = [_topk_bar(step, candidates, name=label, color=STRATEGY_COLORS.get(trace.strategy_name, "#0072B2"))]
    if other is not None:
        data.append(_topk_bar(other, candidates, name="full depth", color=STRATEGY_COLORS["full"]))
    ticks = []
    for token_id, text in candidates:
        marks = [who for who, s in ((label, step), ("full", other)) if s is not None and s.token_id == token_id]
        ticks.append(plot_text(text) + (f" ◀ {' & '.join(marks)}" if marks else ""))
    layout = dict(barmode="group", bargap=0.25,
                  xaxis=dict(title=dict(text="probability"), range=[0, 1.12], tickformat=".1f"),
                  yaxis=dict(tickmode="array", tickvals=list(range(len(candidates))), ticktext=ticks, autorange="reversed"))
    if title is None:  # wrapped: it sits beside the layers (about 310 px wide), and on a phone
        notes = [f"{label} vs full depth"] if other is not None else []
        if other is None and reference is not None:
            notes.append(_no_reference_note(trace, reference, index, short=True))
        title = fit_title(f"Top {len(step.topk)} next tokens at token {index}", *notes)
    return make_figure(data, layout, title=title, presentation=presentation, legend=other is not None,
                       height=height or int(np.clip(46 * max(len(candidates), 1) + 190, 320, 700)))


def _no_reference_note(trace: Trace, reference: Trace, index: int, *, short: bool = False) -> str:
    """Why full depth's top-5 is not shown at token `index`; `short`: in two subtitle lines, for the chart."""
    if index >= len(reference.steps):
        return (f"Full depth stopped after {len(reference.steps)} tokens"
                + ("." if short else f": nothing to compare at token {index}."))
    first = token_agreement(trace.token_ids, reference.token_ids).first_divergence
    if short:
        return f"Full depth not shown: it wrote different text from token {first} on."
    return (f"Full depth wrote different text from token {first} on: its top-5 at token {index} "
            "would answer another context, so it is not shown.")


def _fills_text(step: TokenStep, cells: np.ndarray) -> list[str]:
    """Where the skipped layers' KV entries at this position came from, grouped by source."""
    groups: dict[str, list[int]] = defaultdict(list)
    for layer, how, source in step.filled:
        if how == "copy":
            groups[f"copied from layer {source}" if source is not None else "copied"].append(layer)
        elif how == "propagate":
            groups["projected from the hidden state passed through unchanged (propagate)"].append(layer)
        else:
            groups["left empty and masked out of attention (holes)"].append(layer)
    return [f"layers {layer_range_text(layers)}: {what}" for what, layers in groups.items()]


def scrub_html(trace: Trace, index: int, reference: Trace | None = None) -> str:
    """A short plain-language card for token `index`: layers run and skipped, KV fills and their sources, the
    prediction depth (if the trace has a lens), and how full depth compares at this position."""
    step = trace.steps[index]
    cells = step.cells(trace.num_layers)
    skipped = [layer for layer in range(trace.num_layers) if cells[layer] != RAN]
    lines = [f"<b>Token {index} of {len(trace.steps)}: <code>{html.escape(readable_token(shown_text(step)))}</code></b> "
             f"(id {step.token_id}{f', p = {math.exp(step.logprob):.2f}' if math.isfinite(step.logprob) else ''})",
             f"Ran {step.n_layers} of {trace.num_layers} layers: {layer_range_text(step.layers_run)}. "
             f"Skipped: {layer_range_text(skipped)}."]
    fills = _fills_text(step, cells)
    if fills:
        lines.append("KV entries at this position: " + "; ".join(html.escape(x) for x in fills) + ".")
    if len(step.lens_rank) == trace.num_layers:
        depth = prediction_depth(np.array([step.lens_rank]))[0]
        lines.append(f"The logit lens ranks this token first from layer {int(depth)} on (prediction depth)."
                     if np.isfinite(depth) else "The logit lens never ranks this token first (it was sampled).")
    lines.append(_reference_text(trace, reference, index))
    return (f'<div class="d3-scrub" data-step="{step.step}">'
            + "".join(f"<p>{line}</p>" for line in lines if line) + "</div>")


def _reference_text(trace: Trace, reference: Trace | None, index: int) -> str:
    if reference is None:
        return ""
    if not full_context_agrees(trace, reference, index):
        return html.escape(_no_reference_note(trace, reference, index))
    other = reference.steps[index]
    if other.token_id == trace.steps[index].token_id:
        return "Full depth wrote the same token here."
    return (f'<span class="d3-callout">First divergence: full depth wrote '
            f"<code>{html.escape(readable_token(shown_text(other)))}</code> here.</span>")
