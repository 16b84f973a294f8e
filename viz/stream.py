"""HTML for the streaming pane: tokens coloured by the layers they used, and the live counters."""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

import numpy as np
from plotly.colors import sample_colorscale, unlabel_rgb

from d3.trace import TokenStep, Trace, run_counts, token_agreement
from viz.layout import FONT_FAMILY, SEQUENTIAL, readable_token, short_label, shown_text

DIFF_COLOR = "#D55E00"


def layer_range_text(layers: Sequence[int]) -> str:
    """Compact ranges of layer indices: [3, 4, 5, 9] -> "3–5, 9"."""
    out: list[str] = []
    layers = sorted(layers)
    i = 0
    while i < len(layers):
        j = i
        while j + 1 < len(layers) and layers[j + 1] == layers[j] + 1:
            j += 1
        out.append(str(layers[i]) if i == j else f"{layers[i]}–{layers[j]}")
        i = j + 1
    return ", ".join(out) if out else "none"


def differing_positions(trace: Trace, reference: Trace | None) -> list[int]:
    """Positions (over the shorter run) where `trace` picked a different token than `reference`."""
    if reference is None:
        return []
    return [i for i, (a, b) in enumerate(zip(trace.steps, reference.steps)) if a.token_id != b.token_id]


def _depth_scale(trace: Trace) -> tuple[int, int]:
    """(few, many) layers the colour scale spans: the fewest layers a token of this run used up to all layers, so
    that a gentle decay (28 to 30 of 30) spans the whole scale, light to dark, instead of the top 8% of one that
    starts at the core floor (every token the same navy; issue 24). The legend says the range."""
    used = trace.layers_used
    few = int(used.min()) if used.size else trace.num_layers
    return max(1, few), trace.num_layers


@lru_cache(maxsize=4096)  # sampling a plotly colour scale is slow (~2 ms); a pane has few distinct depths
def _colors(n_layers: int, few: int, many: int) -> tuple[str, str]:
    """(background, text colour) for a token that used `n_layers`: light = few layers, dark = many."""
    frac = 1.0 if many <= few else float(np.clip((n_layers - few) / (many - few), 0, 1))
    background = sample_colorscale(SEQUENTIAL, [frac])[0]
    r, g, b = unlabel_rgb(background)
    text = "#111827" if 0.299 * r + 0.587 * g + 0.114 * b > 150 else "#FFFFFF"
    return background, text


def _token_title(step: TokenStep, num_layers: int, other: TokenStep | None) -> str:
    """Plain-text details of one token for its tooltip (escaped by the caller)."""
    skipped = sorted(set(range(num_layers)) - set(step.layers_run))
    lines = [f"step {step.step} · token '{readable_token(shown_text(step))}' (id {step.token_id})",
             f"{step.n_layers}/{num_layers} layers (planned {step.planned}) · skipped: {layer_range_text(skipped)}"]
    fills: dict[str, int] = {}
    for _, how, _ in step.filled:
        fills[how] = fills.get(how, 0) + 1
    if fills:
        lines.append("KV filled: " + ", ".join(f"{how} ×{n}" for how, n in fills.items()))
    if step.exit_layer is not None:
        lines.append(f"exited after layer {step.exit_layer}")
    if math.isfinite(step.logprob):
        lines.append(f"p = {math.exp(step.logprob):.3f}")
    if math.isfinite(step.entropy):
        lines.append(f"entropy {step.entropy:.2f} nats")
    if step.topk:
        lines.append("top: " + ", ".join(f"'{readable_token(text)}' {p:.2f}" for _, text, p in step.topk))
    if other is not None and other.token_id != step.token_id:
        lines.append(f"full depth picked '{readable_token(shown_text(other))}' here")
    return "\n".join(lines)


def _legend_strip(few: int, many: int, extra: str = "") -> str:
    """One line of swatches from few to many layers (at most 5: the pane's answer keeps its lines), then `extra`."""
    values = sorted({int(round(v)) for v in np.linspace(few, many, num=min(5, many - few + 1))})
    swatches = []
    for n in values:
        background, text = _colors(n, few, many)
        swatches.append(f'<span style="background:{background};color:{text};padding:0 4px;border-radius:3px">{n}</span>')
    return ('<div class="d3-legend" title="layers each token used: lighter is fewer" style="font-size:0.75em;'
            'margin-bottom:4px;line-height:1.5;white-space:nowrap;overflow:hidden;text-overflow:ellipsis">layers '
            + " ".join(swatches) + f' of {many}{extra}</div>')


# How likely full depth finds a token of D3's text (teacher-forced on that text): a paraphrase full depth would also
# write is likely; a broken answer is not. (probability floor, colour, word), highest first; Okabe-Ito colours.
PLAUSIBILITY = ((0.3, "#009E73", "likely"), (0.05, "#E69F00", "possible"), (0.0, "#D55E00", "unlikely"))


def plausibility(p: float) -> tuple[str, str]:
    """(colour, word) for full depth's probability `p` of a token."""
    return next((color, word) for floor, color, word in PLAUSIBILITY if p >= floor)


def _plausibility_legend(full_ppl: float | None = None) -> str:
    """The words of the underlines, on the swatches' line (the pane keeps its height for the answer); the
    perplexity in its tooltip (the status line shows it too)."""
    marks = " ".join(f'<span style="border-bottom:3px solid {c};padding:0 2px">{w}</span>' for _, c, w in PLAUSIBILITY)
    ppl = f"perplexity {full_ppl:.2f}: " if full_ppl is not None and math.isfinite(full_ppl) else "perplexity: "
    tip = ("full depth's probability of each token, read on this text: likely p ≥ 0.3, possible p ≥ 0.05, else "
           f"unlikely; {ppl}how surprised full depth is by the whole text (a paraphrase stays near full depth's "
           "own, a broken answer rises)")
    return (f'<span class="d3-plausibility" title="{html.escape(tip, quote=True)}"> · <span class="d3-plausibility-words">'
            f'full depth finds it: </span>'
            f'{marks}</span>')


def token_html(trace: Trace, *, reference: Trace | None = None, full_prob: Sequence[float] | None = None,
               full_ppl: float | None = None) -> str:
    """The generated text as HTML: one <span> per token coloured by layers used, a tooltip with details,
    tokens that differ from `reference` (full depth) at the same position underlined and outlined, and
    a badge at the first divergence. `full_prob` [T]: full depth's probability of each token on this text
    (teacher-forced), drawn as a coloured bottom border (likely / possible / unlikely). Token text is HTML-escaped."""
    few, many = _depth_scale(trace)
    differ = set(differing_positions(trace, reference))
    first = token_agreement(trace.token_ids, reference.token_ids).first_divergence if reference is not None else None
    spans = []
    started = False
    for i, step in enumerate(trace.steps):
        other = reference.steps[i] if reference is not None and i < len(reference.steps) else None
        background, color = _colors(int(step.n_layers), int(few), int(many))
        style = f"background:{background};color:{color};border-radius:3px;padding:1px 1px"
        cls = "d3-tok"
        if i in differ:
            cls += " d3-diff"
            style += f";text-decoration:underline wavy {DIFF_COLOR};outline:2px solid {DIFF_COLOR}"
        if i == first:
            spans.append(f'<span class="d3-badge" title="first token that differs from full depth" style="background:'
                         f'{DIFF_COLOR};color:#fff;font-size:0.75em;font-weight:600;padding:1px 5px;border-radius:8px;'
                         f'margin:0 3px;white-space:nowrap">first divergence ▸</span>')
        # White space before the answer's first visible character is not drawn: an answer that opens with two
        # line breaks (Gemma 3's does) read "⏎⏎" before its first word, or filled a three-line pane with empty
        # lines. Such a token stays, a sliver in its colour, its tooltip saying what it was (issue 35).
        leading = not started and not step.text.strip() and step.text != ""
        text = "" if leading else html.escape(step.text).replace("\n", "⏎\n")
        if _orphan(trace.steps, i):  # bytes no later token made a character of: shown as bytes, never "�"
            text, cls = html.escape(step.piece), cls + " d3-bytes"
            style += ";font-family:monospace;font-size:0.8em"
        # The end-of-text token a run stopped at is a special token, not text: a mark, never "<|endoftext|>"
        ended = trace.finish_reason == "eos" and i == len(trace.steps) - 1
        if ended:
            text, cls = "∎ end", cls + " d3-end"
            style += ";font-size:0.7em;opacity:0.8;white-space:nowrap"
        if leading or (step.piece and not step.text and not text):  # or part of a character the next token completes
            style += ";display:inline-block;min-width:0.4em;height:1.1em;vertical-align:text-bottom"
        started = started or bool(step.text.strip())
        tip = _token_title(step, trace.num_layers, other)
        if ended:
            tip = f"the end-of-text token {step.text!r}: the run stopped here\n" + tip
        if leading:
            tip = "white space before the answer's first word (not drawn)\n" + tip
        if full_prob is not None and i < len(full_prob):
            mark, word = plausibility(float(full_prob[i]))
            style += f";border-bottom:3px solid {mark}"
            cls += f" d3-{word}"
            tip += f"\nfull depth gives this token p = {float(full_prob[i]):.3f} here ({word})"
        title = html.escape(tip, quote=True)
        spans.append(f'<span class="{cls}" data-step="{step.step}" data-layers="{step.n_layers}" title="{title}" '
                     f'style="{style}">{text}</span>')
    body = "".join(spans) if spans else '<span style="color:#6B7280">(no tokens yet)</span>'
    return (f'<div class="d3-tokens" style="font-family:{html.escape(FONT_FAMILY, quote=True)};font-size:1.05em;'
            f'line-height:1.75">{_legend_strip(few, many, _plausibility_legend(full_ppl) if full_prob is not None else "")}'
            f'<div class="d3-stream" style="white-space:pre-wrap">{body}</div></div>')


def _orphan(steps: Sequence[TokenStep], i: int) -> bool:
    """Whether token i holds bytes of a character that the next token does not go on with or complete (it neither
    holds bytes itself nor starts with a character beyond ASCII): those bytes are shown as bytes ("<0xE2>")."""
    step = steps[i]
    if not step.piece or step.text or i + 1 >= len(steps):
        return False
    after = steps[i + 1]
    return not after.piece and not (after.text[:1] > "\x7f")


def _counter(value: str, label: str, tip: str = "") -> str:
    title = f' title="{html.escape(tip, quote=True)}"' if tip else ""
    return (f'<div class="d3-counter"{title} style="padding:6px 12px;border:1px solid #E5E7EB;border-radius:8px;'
            f'min-width:7em"><div class="d3-counter-value" style="font-size:1.5em;font-weight:600">{html.escape(value)}'
            f'</div><div class="d3-counter-label" style="font-size:0.85em;color:#4B5563">{html.escape(label)}</div></div>')


def step_rate(trace: Trace, other: Trace | None = None) -> float | None:
    """Tokens per second from the median decode step (the prefill left out), over the positions `trace` and `other`
    both reached: the same steps and the same statistic as the measured speedup, so the two never disagree."""
    n = len(trace.steps) if other is None else min(len(trace.steps), len(other.steps))
    ms = [s.wall_ms for s in trace.steps[1:n] if s.wall_ms is not None and math.isfinite(s.wall_ms)]
    if not ms:
        return None
    median = float(np.median(ms))
    return 1000.0 / median if median > 0 else None


def count_words(counts: Mapping[str, Any], name: str = "D3", *, final: bool = True) -> str:
    """The one sentence of a run's count against full depth (`d3.trace.run_counts`, or a summary holding its keys),
    said the same way by the status line, the counters, the scenario findings and the history: how many of the tokens
    both runs wrote agree, and, when one run ended earlier at its end-of-text token (or, `final`, the runs stopped at
    different lengths), how many each wrote: "18 of the 19 tokens both wrote agree (full depth ended at its
    end-of-text token after 19; D3 wrote 24)". `name`: the skipping strategy's name."""
    c = full_counts(counts)
    if not c["compared"]:
        return "no tokens to compare yet"
    text = f"{c['agreeing']} of the {c['compared']} tokens both wrote agree"
    ended, tokens, full = c["ended_first"], c["tokens"], c["full_tokens"]
    if ended == "full":
        text += f" (full depth ended at its end-of-text token after {full}; {name} wrote {tokens})"
    elif ended == "skip":
        text += f" ({name} ended at its end-of-text token after {tokens}; full depth wrote {full})"
    elif final and tokens != full:
        text += f" ({name} wrote {tokens}, full depth {full})"
    return text


def full_counts(counts: Mapping[str, Any]) -> dict[str, Any]:
    """`counts` with every key of `d3.trace.run_counts`: a summary saved before they were all kept is read from its
    per-position `agree` (the positions both runs wrote) where it has one."""
    c = dict(counts)
    agree = c.get("agree")
    if "compared" not in c:
        c["compared"] = len(agree) if agree is not None else c.get("tokens", 0)
        c["agreeing"] = sum(map(bool, agree)) if agree is not None else round(c.get("agreement", 1.0) * c["compared"])
    c.setdefault("full_tokens", c["compared"] if c["compared"] < c.get("tokens", 0) else c.get("tokens", 0))
    c.setdefault("tokens", c["compared"])
    c.setdefault("ended_first", "")
    return c


SPEED_ABOVE_THEORY = 1.02  # a measured speedup above its theoretical one by more than this is a timing artefact


def speed_words(ratio: float | None, low: float | None, high: float | None, theoretical: float | None) -> str:
    """How to read a measured speedup against theory, the one reading of the Live counters, the scenario findings,
    the history and the Sweep: above its theoretical bound (which skipping layers cannot beat: a timing artefact),
    within the noise (its 95% interval includes 1), slower than full depth, or "" where it stands as measured."""
    finite = lambda v: v is not None and math.isfinite(v)  # noqa: E731
    if not finite(ratio):
        return "not measured"
    if finite(low) and finite(high) and low <= 1.0 <= high:  # type: ignore[operator]
        return "within timing noise"  # first: the counters then say "too small to measure here", never a ratio
    if finite(theoretical) and ratio > theoretical * SPEED_ABOVE_THEORY:  # type: ignore[operator]
        return f"above its theoretical {theoretical:.2f}×: a timing artefact, not a speedup"
    if ratio < 1.0:  # type: ignore[operator]
        return "slower than full depth"
    return ""


def speedup_text(speedup: Any) -> tuple[str, str, str]:
    """(value, label, tip) of the measured-speedup counter: a ratio with its 95% interval only where the run measured
    one (the interval excludes 1); otherwise said plainly, with the theoretical speedup."""
    if speedup is None:
        return "—", "measured speedup", "measured once both runs have a few tokens (D3 and full depth interleave)"
    if not speedup.resolvable:
        return ("too small", f"to measure here: theoretical {speedup.theoretical:.2f}×",
                f"{speedup.steps} paired steps: the 95% interval {speedup.low:.2f}–{speedup.high:.2f}× includes 1")
    measured = f"{speedup.ratio:.2f}× measured ({speedup.low:.2f}–{speedup.high:.2f})"
    tip = f"median full-depth step over this run's, {speedup.steps} interleaved steps, 95% bootstrap interval"
    reading = speed_words(speedup.ratio, speedup.low, speedup.high, speedup.theoretical)
    if reading.startswith("above"):  # the class must not read it as what skipping gives
        return ("timing artefact", f"{measured}: above the theoretical {speedup.theoretical:.2f}×, which skipping "
                "layers cannot beat", tip + "; the machine's load changed between the paired steps")
    if reading:
        return (f"{speedup.ratio:.2f}×", f"{reading}: {measured}", tip)
    return (f"{speedup.ratio:.2f}×", f"measured ({speedup.low:.2f}–{speedup.high:.2f})", tip)


def counters_html(trace: Trace, *, reference: Trace | None = None, speedup: Any = None,
                  paired: Trace | None = None) -> str:
    """Live counters: tokens, tokens/s, mean layers per token, theoretical speedup, the measured speedup (with
    `reference`, the full-depth run: `speedup` is `d3.trace.Speedup` or None), and how many tokens agree with
    `reference` so far (with the first divergence). tokens/s is the median step's rate over the positions both runs
    reached (`paired`, or `reference`), the statistic the measured speedup compares."""
    n = len(trace.steps)
    theory = trace.theoretical_speedup()
    theory_tip = "L / mean layers per token"
    if trace.fixed_cost_layers:
        theory_tip += f"; {trace.theoretical_speedup(with_fixed_cost=True):.2f}× counting embedding + LM head"
    rate = step_rate(trace, paired or reference)
    boxes = [
        _counter(str(n), "tokens"),
        _counter("—" if rate is None else f"{rate:.1f}", "tokens/s while decoding",
                 "from the median decode step over the positions both runs reached: the prompt's prefill and any "
                 "wait before the first token are left out"),
        _counter(f"{trace.mean_layers:.1f} / {trace.num_layers}", "mean layers / token"),
        _counter(f"{theory:.2f}×", "theoretical speedup", theory_tip),
    ]
    if reference is not None:
        boxes.append(_counter(*speedup_text(speedup)))
    if reference is not None:
        counts = run_counts(trace, reference)
        value = f"{counts['agreeing']} / {counts['compared']}" if counts["compared"] else "—"
        first = counts["first_divergence"]
        tip = count_words(counts, short_label(trace.strategy), final=False) + ("; no divergence so far" if first is None
                                                                                else f"; first divergence at position {first}")
        label = "tokens agreeing with full depth"
        if counts["ended_first"]:  # the count is over the tokens both wrote: say which run stopped writing
            who = "full depth" if counts["ended_first"] == "full" else "this run"
            label += f" ({who} ended after {counts['compared']})"
        boxes.append(_counter(value, label, tip))

    return (f'<div class="d3-counters" style="display:flex;flex-wrap:wrap;gap:8px;font-family:'
            f'{html.escape(FONT_FAMILY, quote=True)}">' + "".join(boxes) + "</div>")
