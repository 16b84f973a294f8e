"""Attention of generated tokens for one layer and head, optionally full depth next to a skipping run."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from d3.trace import TokenStep, Trace
from viz.layout import (
    SEQUENTIAL,
    axis_ref,
    empty_figure,
    fit_title,
    guide_line,
    make_figure,
    panels,
    plot_text,
    quoted,
    short_label,
    shown_text,
    strategy_label,
    tick_subset,
)

SKIPPED_TEXT = "#9CA3AF"
SKIPPED_FILL = "#D1D5DB"  # a row whose token skipped the layer: filled grey, so it reads as skipped, not as empty
# Byte-level (GPT-2 style) and SentencePiece markers in raw prompt tokens, read as the text they stand for.
_TOKEN_MARKERS = str.maketrans({"Ġ": " ", "Ċ": "\n", "ĉ": "\t", "▁": " "})

KEY_TICKS = 14  # key-position labels per panel at most (more overlap: tokens are a few characters wide)


def prompt_length(trace: Trace, layer: int) -> int:
    """Number of prompt positions among the keys: `prompt_stats.tokens` if recorded, else inferred from
    the first step with attention at `layer` (the token of step s attends to kv_len = prompt + s keys)."""
    if trace.prompt_stats.tokens:
        return len(trace.prompt_stats.tokens)
    for s in trace.steps:
        if layer in s.attention:
            return max(0, int(np.asarray(s.attention[layer]).shape[-1]) - s.step)
    return 0


def attention_matrix(trace: Trace, layer: int, head: int, *, min_width: int = 0) -> np.ndarray:
    """float32 [T, K]: row t is the attention of generated step t over key positions (prompt then
    generated), from `step.attention[layer][head]` ([kv_len], kv_len grows by one per step), NaN-padded
    to K = the longest row (at least `min_width`); an all-NaN row where the step did not run `layer`."""
    rows = [_attention_row(trace, s, layer, head) for s in trace.steps]
    width = max([min_width] + [len(r) for r in rows if r is not None])
    out = np.full((len(rows), width), np.nan, dtype=np.float32)
    for t, row in enumerate(rows):
        if row is not None:
            out[t, : len(row)] = row
    return out


def _attention_row(trace: Trace, step: TokenStep, layer: int, head: int) -> np.ndarray | None:
    """float32 [kv_len] for one step, or None. Step 0 comes out of the prefill, so its row is the last
    prompt position's row of the prompt attention ([heads, P, P]) when that was kept."""
    if layer in step.attention:
        return np.asarray(step.attention[layer][head], dtype=np.float32)
    prompt = trace.prompt_stats.attention.get(layer)
    if step.step == 0 and prompt is not None and prompt.shape[-1]:
        return np.asarray(prompt[head, -1], dtype=np.float32)
    return None


def key_labels(trace: Trace, prompt_len: int, width: int) -> list[str]:
    """A readable label per key position [K]: prompt tokens, then the generated tokens fed back in."""
    labels = []
    for k in range(width):
        if k < len(trace.prompt_stats.tokens):  # raw tokenizer pieces ("Ġthe"): shown like generated text ("␣the")
            labels.append(plot_text(trace.prompt_stats.tokens[k].translate(_TOKEN_MARKERS)))
        elif prompt_len <= k < prompt_len + len(trace.steps):
            labels.append(plot_text(shown_text(trace.steps[k - prompt_len])))
        else:
            labels.append(f"pos {k}")
    return labels


def _categories(trace: Trace, weights: np.ndarray, labels: list[str], prompt_len: int,
                layer: int) -> tuple[list[str], list[str]]:
    """Unique, self-explaining names for rows [T] and columns [K]: the heatmap uses them as categories,
    so hover reads "%{y} · %{x}" without a per-cell text array (512 x 600 strings cost ~0.3 s to copy)."""
    has_row = np.isfinite(weights).any(axis=1)  # [T]
    rows = [f"step {s.step} (producing {quoted(shown_text(s))})" + ("" if has_row[t] else _missing(s, layer))
            for t, s in enumerate(trace.steps)]
    cols = [f"key {k} '{labels[k]}' ({'prompt' if k < prompt_len else 'generated'})" for k in range(weights.shape[1])]
    return rows, cols


def _panel(trace: Trace, layer: int, head: int, index: int, name: str) -> tuple[list, list[dict], dict, dict, str]:
    """One run's attention in panel `index` (1-based): (traces, shapes, x axis, y axis, a note for the
    panel title: which rows skipped the layer, or that the run has no attention there at all)."""
    xref, yref = axis_ref(index)
    prompt_len = prompt_length(trace, layer)
    # Every key the last step could see, even if the steps that skipped `layer` left no row that long.
    weights = attention_matrix(trace, layer, head, min_width=prompt_len + len(trace.steps) - 1)  # [T, K]
    if weights.size == 0 or not np.isfinite(weights).any():
        note = f"{short_label(trace.strategy)}: no attention captured for layer {layer}"
        return [], [], dict(visible=False), dict(visible=False), note
    labels = key_labels(trace, prompt_len, weights.shape[1])
    rows, cols = _categories(trace, weights, labels, prompt_len, layer)
    heat = go.Heatmap(z=weights, x=cols, y=rows, coloraxis="coloraxis", xaxis=xref, yaxis=yref, hoverongaps=False,
                      hovertemplate=f"%{{y}} · head {head} of layer {layer} · %{{x}} · weight %{{z:.3g}}<extra></extra>",
                      name=name, meta={"role": "attention", "name": name})
    picks = tick_subset(len(cols), KEY_TICKS)  # each panel is a few hundred px wide: labels need ~30 px each
    # A short axis title: two panels side by side leave each a few hundred px; the dotted line marks the prompt's end.
    xaxis = dict(type="category", tickmode="array", tickvals=[cols[k] for k in picks], showgrid=False,
                 ticktext=[labels[k] for k in picks], title=dict(text="key position"))
    row_picks = tick_subset(len(rows), 40)
    skipped = [t for t, s in enumerate(trace.steps) if layer not in s.layers_run]
    grey = _skipped_rows(weights, skipped, cols, rows, xref, yref, layer)
    yaxis = dict(type="category", autorange="reversed", tickmode="array", tickvals=[rows[i] for i in row_picks],
                 showgrid=False, ticktext=[_row_tick(shown_text(trace.steps[i]), i in skipped) for i in row_picks])
    shapes = []
    if 0 < prompt_len < weights.shape[1]:  # where the prompt ends and generated tokens begin
        shapes.append(guide_line(x=prompt_len - 0.5, xref=xref, yref=yref, color="#D55E00", dash="dot", width=2))
    note = f"grey rows: {short_label(trace.strategy)} skipped layer {layer}" if skipped else ""
    return [heat, *grey], shapes, xaxis, yaxis, note


def _skipped_rows(weights: np.ndarray, skipped: list[int], cols: list[str], rows: list[str], xref: str, yref: str,
                  layer: int) -> list[go.Heatmap]:
    """A flat grey heatmap over the rows [T] of tokens that skipped `layer` (weights [T, K]: those rows are NaN)."""
    if not skipped:
        return []
    z = np.full(weights.shape, np.nan, dtype=np.float32)
    z[skipped] = 1.0
    return [go.Heatmap(z=z, x=cols, y=rows, xaxis=xref, yaxis=yref, colorscale=[[0, SKIPPED_FILL], [1, SKIPPED_FILL]],
                       zmin=0, zmax=1, showscale=False, hoverongaps=False, name="skipped",
                       hovertemplate=f"%{{y}} · this token did not run layer {layer}<extra></extra>",
                       meta={"role": "skipped-rows"})]


def _missing(step: TokenStep, layer: int) -> str:
    """Why a step has no attention row at `layer`: it skipped the layer, or nothing was recorded."""
    if layer not in step.layers_run:
        return " · layer skipped, no attention"
    return " · not recorded (prefill attention not kept)" if step.step == 0 else " · not recorded"


def _row_tick(text: str, skipped: bool) -> str:
    label = plot_text(text)
    return f"<span style='color:{SKIPPED_TEXT}'>{label}</span>" if skipped else label


def attention_map(trace: Trace, layer: int, head: int, *, compare: Trace | None = None, title: str | None = None,
                  presentation: bool = False, height: int | None = None) -> go.Figure:
    """Attention of each generated token (rows [T]) over key positions (columns [K], prompt then
    generated) for one `layer` and `head` (see `attention_matrix`). With `compare` (a full-depth trace),
    two panels: `compare` left, `trace` right, on one colour scale. A run without attention at that
    layer gets a note instead of a heatmap."""
    if trace.num_heads and not 0 <= head < trace.num_heads:
        raise ValueError(f"head={head} is not allowed: head must be in [0, {trace.num_heads - 1}]")
    runs = [run for run in (compare, trace) if run is not None]
    if not any(layer in s.attention for run in runs for s in run.steps):
        return empty_figure(f"No attention was captured for layer {layer}. Add it to "
                            f"TraceConfig.attention_layers and run again.", title=title, presentation=presentation,
                            height=height)
    # Panel titles stay a word or two ("full depth", "D3"): side by side on a phone each panel is under 100 px
    # wide. The runs' whole labels and the notes go into the figure's title, which wraps.
    names = [short_label(run.strategy) for run in runs]
    layout = panels(len(runs), titles=names if len(runs) > 1 else None, spacing=0.14)
    data, shapes, notes = [], [], []
    for index, (run, _name) in enumerate(zip(runs, names), start=1):
        traces, panel_shapes, xaxis, yaxis, note = _panel(run, layer, head, index, strategy_label(run.strategy))
        suffix = "" if index == 1 else str(index)
        layout["xaxis" + suffix].update(xaxis)
        layout["yaxis" + suffix].update(yaxis)
        if note:
            notes.append((note, SKIPPED_TEXT) if note.startswith("grey") else note)
        data += traces
        shapes += panel_shapes
    layout["yaxis"].setdefault("title", dict(text="generated token"))
    layout.update(shapes=shapes, coloraxis=dict(colorscale=SEQUENTIAL, cmin=0, colorbar=dict(title=dict(text="weight"))))
    if title is None:
        full = [strategy_label(run.strategy) for run in runs]
        labels = [label if label.startswith(name) else f"{name}: {label}" for label, name in zip(full, names)
                  if label != name]
        title = fit_title(f"Attention · layer {layer}, head {head}", *labels, *notes)
    rows = max(len(run.steps) for run in runs)
    return make_figure(data, layout, title=title, presentation=presentation,
                       height=height or int(np.clip(14 * rows + 220, 380, 1200)))
