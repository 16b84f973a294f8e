"""The summary figure of committed oracle results: mean need by position with its spread, the fits, D3's schedule.

Reads results files written by `python -m d3 oracle --prompts-file ... --out ...` and writes one panel per
model. A .png needs kaleido (pip install kaleido; it drives Chromium: BROWSER_PATH=/usr/bin/chromium on
Debian); anything else is written as HTML that loads plotly.js from its CDN, which keeps the file small.

Usage: python scripts/oracle_figure.py results/oracle_smollm2.json [results/oracle_gemma3.json ...]
                                       --out results/oracle_needs.png
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import plotly.graph_objects as go  # noqa: E402
from plotly.subplots import make_subplots  # noqa: E402

from d3.config import D3Config  # noqa: E402
from viz.oracle import needs_summary  # noqa: E402


def model_figure(result: dict, alpha: float) -> go.Figure:
    """needs_summary of one results file: D3's schedule at `alpha` (its core and drop order), both fits."""
    cfg = D3Config(alpha=alpha, core_head=result["core"][0], core_tail=result["core"][1],
                   drop_order=result["drop_order"])
    fits = {name: cfg.with_(alpha=f["alpha"], start=f["start"]) for name, f in result["alpha_fit"].items()}
    needs = result["oracle_depth"] if isinstance(result["oracle_depth"][0], list) else [result["oracle_depth"]]
    return needs_summary(needs, result["num_layers"], cfg, fits=fits, model=result["model"])


def combined(results: list[dict], alpha: float) -> go.Figure:
    """The per-model figures side by side, one legend entry per series (the first panel's)."""
    panels = [model_figure(r, alpha) for r in results]
    titles = [f"{r['model']} (L = {r['num_layers']}): {len(r['prompts'])} answers, {s['tokens']} tokens, "
              f"Spearman(need, position) = {s['spearman_need_vs_position']:.2f}"
              for r, s in ((r, r["summary"]["oracle_depth"]) for r in results)]
    fig = make_subplots(rows=1, cols=len(panels), subplot_titles=titles, horizontal_spacing=0.07)
    for col, (panel, result) in enumerate(zip(panels, results), start=1):
        for trace in panel.data:
            # The band and the mean mean the same in every panel; schedules and fits differ by model.
            shared = trace.meta["role"] in ("band", "mean")
            trace.showlegend = col == 1 or not shared
            if not shared:
                trace.name = f"{result['model']}: {trace.name}"
            fig.add_trace(trace, row=1, col=col)
        fig.update_xaxes(title_text="generated token (position i)", row=1, col=col)
        fig.update_yaxes(title_text="decoder layers", range=[0, panel.layout.yaxis.range[1]], row=1, col=col)
    first = panels[0].layout
    fig.update_layout(template=first.template, font=first.font, height=520, width=620 * len(panels) + 300,
                      legend=dict(orientation="v", y=1, x=1.02, yanchor="top", xanchor="left"),
                      margin=dict(l=70, r=20, t=90, b=60),
                      title=dict(text="What each token needs: the smallest D3 budget that keeps full depth's token"))
    for note in fig.layout.annotations:  # the panel titles: smaller than the figure's
        note.font = dict(size=14)
    return fig


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", nargs="+")
    parser.add_argument("--out", default="results/oracle_needs.png")
    parser.add_argument("--alpha", type=float, default=D3Config().alpha, help="D3's schedule drawn (default 0.99)")
    args = parser.parse_args(argv)
    fig = combined([json.loads(Path(p).read_text(encoding="utf-8")) for p in args.results], args.alpha)
    out = Path(args.out)
    if out.suffix == ".png":
        fig.write_image(out, scale=1)
    else:
        fig.write_html(out, include_plotlyjs="cdn")
    print(f"wrote {out} ({out.stat().st_size / 1e3:.0f} kB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
