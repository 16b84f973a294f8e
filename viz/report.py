"""The sweep's self-contained HTML report: its figures (Pareto fronts, per-task accuracy, layers vs step, Fig. 3)
and the page around them, built from `d3.reports.sweep`'s tables and headline (`python -m d3 report`)."""

from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Any, Iterable

import pandas as pd
from plotly.offline import get_plotlyjs

from d3.reports.sweep import (ACC_LIMIT, MATCHED_COLUMNS, PARETO_METRICS, TABLE_COLUMNS, block_frame, context_text, headline,
                       layer_traces, load_records, matched_table, task_frame, task_table)
from d3.reports.generation import HEADING as GENERATION_HEADING
from d3.reports.generation import headline_lines as generation_headline
from d3.reports.generation import matched_table as generation_table
from d3.research.sweep.table import read_results
from viz.depth import layers_vs_step
from viz.flow import block_change
from viz.grid import fig1_panels
from viz.results import paired_curves, pareto, task_accuracy_delta


def pareto_figures(df: pd.DataFrame) -> list[tuple[str, Any]]:
    """(title, figure) per quality metric that was measured: quality vs measured speedup with its Pareto front."""
    out = []
    for metric in PARETO_METRICS:
        if metric in df and df[metric].notna().any():
            target = (1.5, ACC_LIMIT) if metric == "accuracy" else (1.5, 0.01)
            out.append((f"{metric.replace('_', ' ')} vs measured speedup", pareto(df, y=metric, target=target)))
    return out


def figures(df: pd.DataFrame, records: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    """Every figure of the report, in order."""
    out = pareto_figures(df)
    tasks = task_frame(df)
    if not tasks.empty:
        out.append(("accuracy difference per task", task_accuracy_delta(tasks)))
    traces = layer_traces(records, df)
    if traces:
        out.append(("layers vs step", layers_vs_step(traces)))
        out.append(("which layers each token ran", fig1_panels(traces)))
    blocks = block_frame(records)
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


def render_html(df: pd.DataFrame, records: list[dict[str, Any]], *, title: str = "D3 sweep report",
                generation: pd.DataFrame | None = None) -> str:
    """The whole report as one HTML string; plotly.js is embedded once, in the head. `generation`: a generation
    accuracy sweep's table (d3.research.sweep.generation), shown in a section of its own."""
    h = headline(df)
    parts = [f"<h1>{html.escape(title)}</h1>", _context(df), "<section><h2>Headline</h2>", _markdown_html(h["text"]),
             "</section>"]
    for name, fig in figures(df, records):
        parts.append(f"<section><h2>{html.escape(_heading(name))}</h2>")
        parts.append(fig.to_html(full_html=False, include_plotlyjs=False))
        parts.append("</section>")
    parts += ["<section><h2>At matched mean depth</h2>", _table_html(matched_table(df), ("target_depth", *MATCHED_COLUMNS)),
              "</section>"]
    tasks = task_table(df)
    if not tasks.empty:
        parts += ["<section><h2>Task accuracy beside chance</h2>", _table_html(tasks, tasks.columns), "</section>"]
    parts += ["<section><h2>All settings</h2>", _table_html(df, TABLE_COLUMNS), "</section>"]
    if generation is not None and len(generation):
        parts += _generation_section(generation)
    head = (f"<head><meta charset='utf-8'><title>{html.escape(title)}</title><style>{CSS}</style>"
            f"<script type='text/javascript'>{get_plotlyjs()}</script></head>")
    return f"<!DOCTYPE html><html>{head}<body>{''.join(parts)}</body></html>"


def _generation_section(gen: pd.DataFrame) -> list[str]:
    """Generation accuracy: the paper's criterion per strategy, then every setting at matched depth."""
    lines = "\n".join(f"- {line}" for line in generation_headline(gen))
    table = generation_table(gen)
    curves = [fig.to_html(full_html=False, include_plotlyjs=False) for fig in paired_figures(gen)]
    return [f"<section><h2>{GENERATION_HEADING}: exact match on generated answers</h2>", _markdown_html(lines),
            *curves, _table_html(table, table.columns), "</section>"]


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
    return [paired_curves(curves, x="layers", x_title="mean layers run per answer token",
                          title="Accuracy against the depth actually run"),
            paired_curves(curves, x="speedup", x_title="measured speedup", title="Accuracy against measured speedup")]


def _heading(name: str) -> str:
    """A figure's name as a heading: first letter up, metric abbreviations spelled as readers know them."""
    text = name[:1].upper() + name[1:]
    for raw, shown in (("Kl ", "KL "), ("Ppl ratio", "Perplexity ratio")):
        text = text.replace(raw, shown)
    return text


def _context(df: pd.DataFrame) -> str:
    return f"<p>{html.escape(context_text(df))}</p>"


def write_report(results: str | Path, out: str | Path, *, title: str | None = None,
                 generation: pd.DataFrame | None = None) -> Path:
    """The HTML report of the sweep CSV `results` (and of a generation sweep's table), written to `out`."""
    df = read_results(results)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_html(df, load_records(results), title=title or f"D3 sweep: {Path(results).name}",
                               generation=generation), encoding="utf-8")
    return out
