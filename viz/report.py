"""The sweep's self-contained HTML report: its figures (Pareto fronts, per-task accuracy, layers vs step, Fig. 3)
and the page around them. Pure drawing: what it shows (the tables, the headline, the traces) is worked out by
`d3.reports` and handed in as `ReportParts` (`python -m d3 report` assembles them, d3/cli/report.py), so viz
imports nothing from the research tools or the reports."""

from __future__ import annotations

import html
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from plotly.offline import get_plotlyjs

from viz.depth import layers_vs_step
from viz.flow import block_change
from viz.grid import fig1_panels
from viz.results import paired_curves, pareto, task_accuracy_delta


@dataclass(frozen=True)
class GenerationParts:
    """A generation-accuracy sweep's section: its heading, headline lines, matched-depth table and rows."""

    heading: str
    headline: Sequence[str]
    table: pd.DataFrame
    rows: pd.DataFrame


@dataclass(frozen=True)
class ReportParts:
    """Everything the report shows, worked out by `d3.reports.sweep` (the CLI fills it in)."""

    results: pd.DataFrame  # the sweep's table, one row per setting
    context: str
    headline: str  # the headline's small markdown
    matched: pd.DataFrame  # at matched mean depth
    matched_columns: Sequence[str]
    tasks: pd.DataFrame  # per task and setting, for the accuracy-difference figure
    task_table: pd.DataFrame  # task accuracy beside chance
    table_columns: Sequence[str]  # the all-settings table's columns
    traces: dict[str, Any]  # label -> Trace, for layers vs step and Fig. 1
    blocks: pd.DataFrame  # per layer change, for Fig. 3
    metrics: Sequence[str]  # the quality metrics with a Pareto figure
    accuracy_limit: float  # the accuracy loss the Pareto target marks
    generation: GenerationParts | None = None


def pareto_figures(df: pd.DataFrame, metrics: Sequence[str], accuracy_limit: float) -> list[tuple[str, Any]]:
    """(title, figure) per quality metric that was measured: quality vs measured speedup with its Pareto front."""
    out = []
    for metric in metrics:
        if metric in df and df[metric].notna().any():
            target = (1.5, accuracy_limit) if metric == "accuracy" else (1.5, 0.01)
            out.append((f"{metric.replace('_', ' ')} vs measured speedup", pareto(df, y=metric, target=target)))
    return out


def figures(parts: ReportParts) -> list[tuple[str, Any]]:
    """Every figure of the report, in order."""
    out = pareto_figures(parts.results, parts.metrics, parts.accuracy_limit)
    if not parts.tasks.empty:
        out.append(("accuracy difference per task", task_accuracy_delta(parts.tasks)))
    if parts.traces:
        out.append(("layers vs step", layers_vs_step(parts.traces)))
        out.append(("which layers each token ran", fig1_panels(parts.traces)))
    blocks = parts.blocks
    if not blocks.empty:
        out.append(("change per block across layers",
                    block_change(blocks, title="Change per block across layers, full depth, mean ± std over prompts "
                                               "(paper Fig. 3)")))
    return out


# ---------------------------------------------------------------- HTML


CSS = """body{font-family:Inter,'Helvetica Neue',Arial,sans-serif;margin:2rem auto;max-width:1200px;color:#111827}
table{border-collapse:collapse;font-size:13px}th,td{border:1px solid #E5E7EB;padding:3px 6px;text-align:right}
th{background:#F3F4F6}td:nth-child(2),td:nth-child(3){text-align:left}section{margin:2rem 0}"""


def _table_html(df: pd.DataFrame, columns: Iterable[str]) -> str:
    cols = [c for c in columns if c in df]
    return df[cols].to_html(index=False, float_format=lambda x: f"{x:.4g}", na_rep="–", border=0)


def _markdown_html(text: str) -> str:
    """The headline's small markdown subset (bullets, nested bullets, **bold**) as HTML."""
    out, depth = [], 0
    for line in text.splitlines():
        level = 2 if line.startswith("  - ") else 1 if line.startswith("- ") else 0
        while depth < level:
            out.append("<ul>")
            depth += 1
        while depth > level:
            out.append("</ul>")
            depth -= 1
        body = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", html.escape(line.lstrip(" -")))
        out.append(f"<li>{body}</li>" if level else f"<p>{body}</p>")
    out += ["</ul>"] * depth
    return "\n".join(out)


def render_html(parts: ReportParts, *, title: str = "D3 sweep report") -> str:
    """The whole report as one HTML string; plotly.js is embedded once, in the head."""
    out = [f"<h1>{html.escape(title)}</h1>", f"<p>{html.escape(parts.context)}</p>", "<section><h2>Headline</h2>",
           _markdown_html(parts.headline), "</section>"]
    for name, fig in figures(parts):
        out.append(f"<section><h2>{html.escape(_heading(name))}</h2>")
        out.append(fig.to_html(full_html=False, include_plotlyjs=False))
        out.append("</section>")
    out += ["<section><h2>At matched mean depth</h2>",
            _table_html(parts.matched, ("target_depth", *parts.matched_columns)), "</section>"]
    if not parts.task_table.empty:
        out += ["<section><h2>Task accuracy beside chance</h2>", _table_html(parts.task_table, parts.task_table.columns),
                "</section>"]
    out += ["<section><h2>All settings</h2>", _table_html(parts.results, parts.table_columns), "</section>"]
    if parts.generation is not None and len(parts.generation.rows):
        out += generation_section(parts.generation)
    head = (f"<head><meta charset='utf-8'><title>{html.escape(title)}</title><style>{CSS}</style>"
            f"<script type='text/javascript'>{get_plotlyjs()}</script></head>")
    return f"<!DOCTYPE html><html>{head}<body>{''.join(out)}</body></html>"


def generation_section(gen: GenerationParts) -> list[str]:
    """Generation accuracy: the paper's criterion per strategy, then every setting at matched depth."""
    lines = "\n".join(f"- {line}" for line in gen.headline)
    curves = [fig.to_html(full_html=False, include_plotlyjs=False) for fig in paired_figures(gen.rows)]
    return [f"<section><h2>{gen.heading}: exact match on generated answers</h2>", _markdown_html(lines),
            *curves, _table_html(gen.table, gen.table.columns), "</section>"]


def write_html(parts: ReportParts, out: str | Path, *, title: str) -> Path:
    """The report of `parts`, written to `out`."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_html(parts, title=title), encoding="utf-8")
    return out


def paired_figures(gen: pd.DataFrame) -> list[Any]:
    """Accuracy difference from full depth with its paired interval, per strategy, against the layers run and
    against measured speedup; none for a table from before the paired columns."""
    if "diff_low" not in gen or gen["diff_low"].isna().all():
        return []
    rows = gen[(gen["strategy"] != "full") & gen["diff_low"].notna()]
    curves: dict[str, list[dict[str, float]]] = {}
    for _, r in rows.iterrows():
        curves.setdefault(str(r["strategy"]), []).append(
            {"layers": float(r["mean_layers"]), "speedup": float(r["measured_speedup"]), "diff": float(r["diff"]),
             "low": float(r["diff_low"]), "high": float(r["diff_high"])})
    by_strategy: dict[str, Sequence[dict[str, float]]] = dict(curves)
    return [paired_curves(by_strategy, x="layers", x_title="mean layers run per answer token",
                          title="Accuracy against the depth actually run"),
            paired_curves(by_strategy, x="speedup", x_title="measured speedup", title="Accuracy against measured speedup")]


def _heading(name: str) -> str:
    """A figure's name as a heading: first letter up, metric abbreviations spelled as readers know them."""
    text = name[:1].upper() + name[1:]
    for raw, shown in (("Kl ", "KL "), ("Ppl ratio", "Perplexity ratio")):
        text = text.replace(raw, shown)
    return text
