"""What a generation-accuracy sweep says (`d3.research.sweep.generation`): exact match on generated answers beside its zero
line and its 95% interval, at matched mean depth, and the paper's criterion: the largest measured speedup
within 1 point of full depth's accuracy. Markdown for results/SUMMARY.md; pure pandas."""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

from d3.config import STRATEGIES
from d3.reports.sweep import STRATEGY_ORDER, markdown_table

POINTS = 1.0  # the paper's criterion: within 1 exact-match point of full depth
HEADING = "Generation accuracy"
STRATEGY_NAMES = {name: cls.short for name, cls in STRATEGIES.items()}


def _skips(df: pd.DataFrame) -> pd.Series:
    """Rows whose setting skipped layers on the answers (full depth and settings that never skip are out)."""
    return (df["strategy"] != "full") & (df["mean_layers"] < df["num_layers"] - 1e-9)


def within_points(df: pd.DataFrame, points: float = POINTS) -> pd.Series:
    """Rows whose accuracy loss is at most `points`: read on the paired interval's upper bound of the loss where
    the table has one (`diff_low`), on the point estimate in tables from before it."""
    loss = -df["diff_low"] if "diff_low" in df and df["diff_low"].notna().all() else df["accuracy_full"] - df["accuracy"]
    return loss * 100 <= points + 1e-9


def best_within(df: pd.DataFrame, strategy: str, points: float = POINTS) -> dict[str, Any] | None:
    """The row of `strategy` with the largest measured speedup among those within `points` of full depth."""
    ok = df[(df["strategy"] == strategy) & _skips(df) & within_points(df, points)]
    return None if ok.empty else ok.loc[ok["measured_speedup"].idxmax()].to_dict()


def _full(df: pd.DataFrame) -> dict[str, Any] | None:
    full = df[df["strategy"] == "full"]
    return None if full.empty else full.iloc[0].to_dict()


def headline_lines(df: pd.DataFrame) -> list[str]:
    """The criterion's answer per strategy, full depth's accuracy with its interval and zero line, timing noise."""
    full = _full(df)
    if full is None:
        return ["No full-depth row: nothing to compare against."]
    lines = [f"Full depth: {_acc(full)} on {int(full['questions'])} questions ({full['tasks']}); always giving "
             f"the most common answer scores {full['chance']:.1%}. Timing noise: full depth against itself "
             f"{full['measured_speedup']:.2f}x."]
    best = {s: best_within(df, s) for s in STRATEGY_ORDER if (df["strategy"] == s).any()}
    d3 = best.get("d3")
    lines.append(f"**Largest measured speedup within {POINTS:g} point of full-depth generation accuracy: "
                 + (f"{d3['measured_speedup']:.2f}x for D3** ({d3['label']}, {d3['mean_layers']:.1f}/"
                    f"{int(d3['num_layers'])} layers per answer token, accuracy {_acc(d3)})."
                    if d3 else "none for D3**: every D3 setting that skips layers loses more than that."))
    for strategy, b in best.items():
        if strategy != "d3":
            lines.append(f"{STRATEGY_NAMES[strategy]}: " + (
                f"{b['measured_speedup']:.2f}x ({b['label']}, {b['mean_layers']:.1f} layers, accuracy {_acc(b)})."
                if b else "no setting that skips layers stays within the criterion."))
    return lines


def _acc(row: dict[str, Any]) -> str:
    return f"{row['accuracy']:.1%} [{row['ci_low']:.1%}, {row['ci_high']:.1%}]"


def matched_table(df: pd.DataFrame) -> pd.DataFrame:
    """Every setting, strategies side by side at each target depth: accuracy, its interval, the difference from
    full depth in points, answers that equal full depth's, layers and speed."""
    rows = []
    for _, r in df.sort_values("target_depth", ascending=False, kind="stable").iterrows():
        rows.append({"target_depth": r["target_depth"], "strategy": r["strategy"], "label": r["label"],
                     "mean_layers": r["mean_layers"], "theoretical_speedup_fixed": r["theoretical_speedup_fixed"],
                     "measured_speedup": r["measured_speedup"], "per-step speedup": r["step_speedup"],
                     "accuracy": f"{r['accuracy']:.1%}",
                     "95% interval": f"{r['ci_low']:.1%}-{r['ci_high']:.1%}",
                     "vs full, points [paired 95%]": _paired(r),
                     "zero line": f"{r['chance']:.1%}", "same answer as full": f"{r['same_answer']:.0%}",
                     "questions": int(r["questions"])})
    return pd.DataFrame(rows)


def _paired(r: Any) -> str:
    """The paired difference from full depth in points with its exact interval; the bare difference in tables
    from before the paired columns."""
    if "diff_low" in r and pd.notna(r["diff_low"]):
        return f"{100 * r['diff']:+.1f} [{100 * r['diff_low']:+.1f}, {100 * r['diff_high']:+.1f}]"
    return f"{(r['accuracy'] - r['accuracy_full']) * 100:+.1f}"


def task_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per task: a zero-line row, full depth, then each setting (accuracy and its difference in points)."""
    per = [(r["label"], r["strategy"], json.loads(r["task_accuracy"])) for _, r in df.iterrows()]
    if not per:
        return pd.DataFrame()
    tasks = list(per[0][2])
    first = per[0][2]
    rows = [{"setting": "most common answer", **{t: f"{first[t]['chance']:.1%}" for t in tasks}},
            {"setting": f"full depth (n: {', '.join(str(first[t]['n']) for t in tasks)})",
             **{t: f"{first[t]['accuracy_full']:.1%}" for t in tasks}}]
    for label, strategy, acc in per:
        if strategy != "full":
            rows.append({"setting": label, **{t: _cell(acc[t]) for t in tasks if t in acc}})
    return pd.DataFrame(rows, columns=["setting", *tasks])


def _cell(acc: dict[str, float]) -> str:
    return f"{acc['accuracy']:.1%} ({(acc['accuracy'] - acc['accuracy_full']) * 100:+.1f})"


def generation_markdown(df: pd.DataFrame, *, title: str = "") -> str:
    """The SUMMARY.md section: its heading starts with "Generation accuracy"."""
    model = df["model"].iloc[0] if len(df) else "?"
    parts = [f"## {HEADING} ({title or model}): exact match on generated answers", "",
             "Each question is asked few-shot with worked answers (d3/research/gentasks.py): the model writes its own "
             "tokens under the schedule before it states the answer, which is read out of the text and scored by "
             "exact match. Accuracy is pooled over the tasks, with its 95% Wilson interval; its difference from full "
             "depth is paired on the same questions, with the exact 95% (McNemar) interval, and the criterion reads "
             "that interval's bound on the loss (d3/research/stats.py); the zero line is "
             "always giving the most common answer. Measured speedup: full depth and the setting answer the same "
             "batches in turn, in one process.", ""]
    parts += [f"- {line}" for line in headline_lines(df)]
    parts += ["", "### At matched mean depth", "",
              markdown_table(matched_table(df), matched_table(df).columns, digits=3), ""]
    tasks = task_table(df)
    if not tasks.empty:
        parts += ["### Per task", "", "Accuracy per task (difference from full depth in points).", "",
                  markdown_table(tasks, tasks.columns), ""]
    return "\n".join(parts)
