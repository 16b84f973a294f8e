"""What a sweep's results say: the headline, matched-depth and per-task tables, markdown (HTML: `viz.report`)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from d3.config import STRATEGIES
from d3.research.sweep.table import sidecar
from d3.trace import Trace

STRATEGY_ORDER = tuple(n for n in STRATEGIES if n != "full")
PPL_LIMIT = 0.01  # perplexity within 1% of full depth
ACC_LIMIT = 0.01  # task accuracy within 1 point of full depth (accuracy is a fraction)
PARETO_METRICS = ("agreement", "kl_teacher", "kl_free", "ppl_ratio", "accuracy")
TABLE_COLUMNS = ("strategy", "label", "target_depth", "mean_layers", "theoretical_speedup", "theoretical_speedup_fixed",
                 "measured_speedup", "decode_speedup", "agreement", "first_divergence", "kl_teacher", "kl_free",
                 "ppl_ratio", "accuracy", "accuracy_full", "chance")
MATCHED_COLUMNS = ("strategy", "label", "mean_layers", "theoretical_speedup_fixed", "measured_speedup", "agreement",
                   "first_divergence", "kl_teacher", "kl_free", "ppl_ratio", "accuracy")


# ---------------------------------------------------------------- reading


def load_records(csv_path: str | Path) -> list[dict[str, Any]]:
    """The sweep's sidecar records (layer traces and Fig. 3 block rows); [] if there are none."""
    path = sidecar(csv_path, "traces.jsonl")
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def task_frame(df: pd.DataFrame) -> pd.DataFrame:
    """Long table, one row per (setting, task): task, strategy, label, accuracy, accuracy_full, chance, n."""
    rows = []
    for _, r in df.iterrows():
        text = r.get("task_accuracy", "")
        per_task = json.loads(text) if isinstance(text, str) and text.strip() else {}
        for task, v in per_task.items():
            rows.append({"task": task, "strategy": r["strategy"], "label": r["label"], **v})
    return pd.DataFrame(rows, columns=["task", "strategy", "label", "accuracy", "accuracy_full", "chance", "n"])


def task_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per-task accuracy beside its chance level: a "chance" row, a "full depth" row, then one row per setting
    (sweep order); one column per task, each cell "accuracy (difference from full depth in points)"."""
    tasks = task_frame(df)
    if tasks.empty:
        return pd.DataFrame()
    order = list(dict.fromkeys(tasks["task"]))
    first = tasks.drop_duplicates("task").set_index("task")
    rows = [{"setting": "chance", **{t: f"{first.loc[t, 'chance']:.1%}" for t in order}},
            {"setting": f"full depth (n per task: {', '.join(str(int(first.loc[t, 'n'])) for t in order)})",
             **{t: f"{first.loc[t, 'accuracy_full']:.1%}" for t in order}}]
    for label, group in tasks[tasks["strategy"] != "full"].groupby("label", sort=False):
        by_task = group.set_index("task")
        rows.append({"setting": label, **{t: f"{by_task.loc[t, 'accuracy']:.1%} "
                                             f"({(by_task.loc[t, 'accuracy'] - by_task.loc[t, 'accuracy_full']) * 100:+.1f})"
                                          for t in order if t in by_task.index}})
    return pd.DataFrame(rows, columns=["setting", *order])


# ---------------------------------------------------------------- the headline


def _full_row(df: pd.DataFrame) -> pd.Series | None:
    full = df[df["strategy"] == "full"]
    return full.iloc[0] if len(full) else None


def within_limits(df: pd.DataFrame) -> pd.Series:
    """True where perplexity is within 1% of full depth and task accuracy within 1 point of full depth.

    A limit whose metric was not measured (NaN in every row) is not applied; a NaN in a measured metric fails."""
    ok = pd.Series(True, index=df.index)
    if df["ppl_ratio"].notna().any():
        ok &= df["ppl_ratio"] <= 1 + PPL_LIMIT
    if df["accuracy"].notna().any():
        ok &= df["accuracy"] >= df["accuracy_full"] - ACC_LIMIT - 1e-12
    return ok


def skips_layers(df: pd.DataFrame) -> pd.Series:
    """True for rows whose schedule skips at least one layer somewhere (theoretical speedup above 1)."""
    return df["theoretical_speedup_fixed"] > 1 + 1e-9


def best_within_limits(df: pd.DataFrame, strategy: str) -> dict[str, Any] | None:
    """The setting of `strategy` with the largest measured speedup among those within the quality limits that
    skip at least one layer somewhere."""
    skips = skips_layers(df)  # a setting that skips nothing has only timing noise to offer
    rows = df[(df["strategy"] == strategy) & within_limits(df) & skips]
    if rows.empty:
        return None
    best = rows.loc[rows["measured_speedup"].idxmax()]
    return _summary(best)


def closest_to_full(df: pd.DataFrame, strategy: str) -> dict[str, Any] | None:
    """The setting of `strategy` with the lowest perplexity ratio (the least quality lost), None if none has one."""
    rows = df[(df["strategy"] == strategy) & df["ppl_ratio"].notna() & skips_layers(df)]
    return None if rows.empty else _summary(rows.loc[rows["ppl_ratio"].idxmin()])


def _summary(row: pd.Series) -> dict[str, Any]:
    keys = ("label", "mean_layers", "measured_speedup", "theoretical_speedup", "theoretical_speedup_fixed",
            "ppl_ratio", "agreement", "kl_free", "accuracy", "accuracy_full")
    return {k: (row[k] if isinstance(row[k], str) else _num(row[k])) for k in keys if k in row}


def _noise(full: Any) -> float | None:
    """What full depth timed against itself read: `self_speedup` (its `measured_speedup` is 1.00 by definition);
    older tables without that column kept the raw ratio in `measured_speedup`."""
    if full is None:
        return None
    own = _num(full.get("self_speedup"))
    return own if own is not None else _num(full["measured_speedup"])


def _num(x: Any) -> float | None:
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(x) else x


def matched_table(df: pd.DataFrame) -> pd.DataFrame:
    """Every non-full setting with a target depth, grouped by that depth (deepest first), D3 first in each group."""
    runs = df[(df["strategy"] != "full") & df["target_depth"].notna()].copy()
    runs["_order"] = runs["strategy"].map({s: i for i, s in enumerate(STRATEGY_ORDER)}).fillna(len(STRATEGY_ORDER))
    runs = runs.sort_values(["target_depth", "_order"], ascending=[False, True], kind="stable")
    return runs[["target_depth", *MATCHED_COLUMNS]].reset_index(drop=True)


def _d3_at(group: pd.DataFrame) -> pd.Series | None:
    """The D3 row of a depth group: the first one (the base variant; variants come after it in sweep order)."""
    d3 = group[group["strategy"] == "d3"]
    return d3.iloc[0] if len(d3) else None


# metric -> (higher is better, words)
LOSS_METRICS: dict[str, tuple[bool, str]] = {
    "measured_speedup": (True, "measured speedup"),
    "ppl_ratio": (False, "perplexity ratio"),
    "agreement": (True, "token agreement"),
    "kl_free": (False, "free-running KL"),
    "accuracy": (True, "task accuracy"),
}


def where_d3_loses(df: pd.DataFrame) -> list[str]:
    """Plain sentences: at each matched depth, every metric on which a baseline that skips layers beats D3's
    base setting."""
    out = []
    for depth, group in matched_table(df).groupby("target_depth", sort=False):
        d3 = _d3_at(group)
        if d3 is None:
            continue
        # a baseline tuned to this depth that skips nothing (its grid has no closer setting) is full depth
        others = group[(group["strategy"] != "d3") & skips_layers(group)]
        for _, other in others.iterrows():
            for metric, (higher, words) in LOSS_METRICS.items():
                a, b = _num(d3[metric]), _num(other[metric])
                if a is None or b is None:
                    continue
                margin = 0.02 * abs(a) if metric == "measured_speedup" else 1e-9  # speed within 2% is a tie (noise)
                if (b > a + margin) if higher else (b < a - margin):
                    out.append(f"at {depth:.0%} depth, {other['label']} beats D3 ({d3['label']}) on {words}: "
                               f"{_fmt(b, metric)} vs {_fmt(a, metric)}")
    return out


def accuracy_by_depth(matched: pd.DataFrame) -> list[str]:
    """One line per matched depth: the task accuracy of each strategy's first setting that skips layers there."""
    lines = []
    runs = matched[skips_layers(matched) & matched["accuracy"].notna()]
    for depth, group in runs.groupby("target_depth", sort=False):
        firsts = group.drop_duplicates("strategy")
        if len(firsts) > 1:
            lines.append(f"at {depth:.0%} depth: " + ", ".join(f"{r['strategy']} {r['accuracy']:.1%}"
                                                            for _, r in firsts.iterrows()))
    return lines


def _fmt(x: float | None, metric: str = "") -> str:
    if x is None:
        return "n/a"
    if "speedup" in metric:
        return f"{x:.2f}x"
    if metric in ("agreement", "accuracy"):
        return f"{x:.1%}"
    return f"{x:.4f}" if abs(x) < 10 else f"{x:.1f}"


def headline(df: pd.DataFrame) -> dict[str, Any]:
    """The numbers a reader wants first, plus `text`, the same as a markdown paragraph list.

    best: per strategy, the largest measured speedup with perplexity within 1% and accuracy within 1 point
      of full depth (None where no setting qualifies); matched: every strategy side by side at each target
      depth; losses: where a baseline beats D3 at matched depth; noise: full depth timed against itself."""
    full = _full_row(df)
    best = {s: best_within_limits(df, s) for s in STRATEGY_ORDER if (df["strategy"] == s).any()}
    matched = matched_table(df)
    result = {
        "best": best,
        "closest": {s: closest_to_full(df, s) for s in best},
        "matched": matched.to_dict(orient="records"),
        "losses": where_d3_loses(df),
        "noise": _noise(full),
        "accuracy_flat": bool(df["accuracy"].notna().any() and (df["accuracy"] - df["accuracy_full"]).abs().max() < 1e-12),
        "ppl_full": _num(full["ppl"]) if full is not None else None,
        "accuracy_full": _num(full["accuracy"]) if full is not None else None,
        "accuracy_by_depth": accuracy_by_depth(matched),
        "limits": f"perplexity within {PPL_LIMIT:.0%} of full depth, task accuracy within {ACC_LIMIT * 100:.0f} point",
    }
    result["text"] = headline_text(result)
    return result


def headline_text(h: dict[str, Any]) -> str:
    """Markdown bullet list of a `headline` dict."""
    lines = [f"Limits: {h['limits']} (a limit is skipped when its metric was not measured)."]
    for strategy, b in h["best"].items():
        if b is None:
            c = h.get("closest", {}).get(strategy)
            near = (f" Least perplexity loss: {c['label']} at {c['mean_layers']:.1f} layers, perplexity ratio "
                    f"{_fmt(c.get('ppl_ratio'))}, {c['measured_speedup']:.2f}x measured." if c else "")
            lines.append(f"- **{strategy}**: no setting stays within the limits.{near}")
            continue
        theo = b.get("theoretical_speedup_fixed")
        eff = f", {b['measured_speedup'] / theo:.0%} of its theoretical {theo:.2f}x (LM head counted)" if theo else ""
        acc = f", accuracy {b['accuracy']:.1%} (full {b['accuracy_full']:.1%})" if b.get("accuracy") is not None else ""
        lines.append(f"- **{strategy}**: {b['measured_speedup']:.2f}x measured{eff}, at {b['mean_layers']:.1f} layers, "
                     f"perplexity ratio {_fmt(b.get('ppl_ratio'))}{acc} ({b['label']}).")
    if h.get("accuracy_flat"):
        lines.append("- Task accuracy equals full depth in every setting. The prompt always runs at full depth, so "
                     "an answer decided by its first token is decided by the full-depth prefill: with short direct "
                     "answers this metric cannot separate the strategies (the paper's BBH runs use chain-of-thought, "
                     "where the answer comes many decoded tokens later).")
    if h.get("accuracy_by_depth"):
        lines.append(f"- Task accuracy at matched depth (full depth {h['accuracy_full']:.1%}; each strategy's first "
                     "setting at that depth):")
        lines += [f"  - {line}" for line in h["accuracy_by_depth"]]
    if h.get("noise") is not None:
        lines.append(f"- Timing noise: full depth against itself measured {h['noise']:.2f}x.")
    paper = h["best"].get("d3")
    if paper is None or paper["measured_speedup"] < 1.5:
        got = "no setting" if paper is None else f"at best {paper['measured_speedup']:.2f}x"
        lines.append(f"- D3 does not reach the paper's operating point (about 1.5x at under 1% loss): {got}.")
    if h["losses"]:
        lines.append("- Where D3 loses at matched depth:")
        lines += [f"  - {x}" for x in h["losses"]]
    else:
        lines.append("- At matched depth no baseline beats D3 on any measured metric.")
    return "\n".join(lines)


def markdown_table(df: pd.DataFrame, columns: Iterable[str], digits: int = 4) -> str:
    """A GitHub markdown table (no tabulate dependency); floats to `digits` significant digits, NaN as "–"."""
    cols = [c for c in columns if c in df]

    def cell(x: Any) -> str:
        if isinstance(x, (float, np.floating)):
            return "–" if math.isnan(x) else f"{x:.{digits}g}"
        return str(x).replace("|", "\\|")

    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in df[cols].itertuples(index=False)]
    return "\n".join(lines)


def summary_markdown(df: pd.DataFrame, *, title: str = "Sweep summary", extra_headline: Iterable[str] = ()) -> str:
    """Headline (plus `extra_headline` bullets, e.g. the generation-accuracy criterion), the matched-depth table
    and every setting, as markdown (for results/SUMMARY.md)."""
    h = headline(df)
    text = "\n".join([h["text"], *(f"- {line}" for line in extra_headline)])
    parts = [f"# {title}", "", context_text(df), "", "## Headline", "", text, "",
             "## At matched mean depth", "", markdown_table(matched_table(df), ("target_depth", *MATCHED_COLUMNS)), ""]
    tasks = task_table(df)
    if not tasks.empty:
        parts += ["## Task accuracy beside chance", "", "Accuracy per task (difference from full depth in points).", "",
                  markdown_table(tasks, tasks.columns), ""]
    parts += ["## All settings", "", markdown_table(df, TABLE_COLUMNS), ""]
    return "\n".join(parts)


# ---------------------------------------------------------------- the sidecar records


def layer_traces(records: Iterable[dict[str, Any]], df: pd.DataFrame, depth: float = 2 / 3) -> dict[str, Trace]:
    """label -> Trace: full depth and, per strategy, the setting whose target depth is closest to `depth`."""
    by_key = {r["key"]: r for r in records if r.get("kind") == "layers"}
    chosen = {}
    for strategy in ("full", *STRATEGY_ORDER):
        rows = df[(df["strategy"] == strategy) & df["key"].isin(by_key)]
        if rows.empty:
            continue
        row = rows.loc[(rows["target_depth"].fillna(1.0) - depth).abs().idxmin()]
        chosen[row["label"]] = Trace.from_dict(by_key[row["key"]]["trace"])
    return chosen


def block_frame(records: Iterable[dict[str, Any]]) -> pd.DataFrame:
    """The Fig. 3 rows (one per prompt and layer) of the last block record."""
    blocks = [r for r in records if r.get("kind") == "block"]
    return pd.DataFrame(blocks[-1]["rows"]) if blocks else pd.DataFrame()


def context_text(df: pd.DataFrame) -> str:
    """One paragraph: what was measured and how."""
    if df.empty:
        return "No results yet."
    r = df.iloc[0]
    scoring = next((s for s in df["task_scoring"] if isinstance(s, str) and s), "")
    bits = [f"model {r['model']} ({int(r['num_layers'])} layers)", f"{int(r['prompts'])} prompts",
            f"{int(r['new_tokens'])} new tokens (greedy, no stop at EOS)", f"{int(r['repeats'])} timing repeats",
            f"LM head = {r['fixed_cost_layers']:.1f} layers of fixed cost"]
    if scoring:
        bits.append(f"tasks scored by {scoring}")
    return ("; ".join(bits) + ". Measured speedup: full depth and the method alternate on the same prompts in one "
            "process, median over prompt × repeat pairs, generate() wall time including the prefill.")
