"""The "Drop order" section of results/SUMMARY.md, from the drop-order study's JSON (scripts/drop_order_study.py).

Pure: a dict in, Markdown out. Which flex layers the model can spare, by which signal, and generation accuracy on
the test questions with every order at matched mean depth, full depth and the baselines beside.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

HEADING = "## Drop order"
TOLERANCE = 0.01  # the paper's criterion: within 1 point of full depth's accuracy


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _label_parts(label: str) -> tuple[str, int | None]:
    """"d3 bottom_up @28" -> ("d3 bottom_up", 28); "full depth" -> ("full depth", None)."""
    m = re.match(r"(.*) @(\d+)$", label)
    return (m.group(1), int(m.group(2))) if m else (label, None)


def accuracy_table(study: dict[str, Any]) -> str:
    """Rows: strategies (orders and baselines); columns: target depths; cells: test accuracy at measured layers."""
    sweep = study.get("sweep", {})
    depths = sorted({d for d in (_label_parts(k)[1] for k in sweep) if d is not None}, reverse=True)
    names: list[str] = []
    for key in sweep:
        name, depth = _label_parts(key)
        if depth is not None and name not in names:
            names.append(name)
    head = "| strategy | " + " | ".join(f"~{d} layers" for d in depths) + " |"
    lines = [head, "|---|" + "---|" * len(depths)]
    for name in names:
        cells = []
        for d in depths:
            row = sweep.get(f"{name} @{d}")
            cells.append("" if row is None else f"{_pct(row['accuracy'])} ({row['mean_layers']:.1f})")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def best_within(study: dict[str, Any]) -> dict[str, Any] | None:
    """The setting with the fewest measured layers whose test accuracy is within 1 point of full depth's."""
    sweep = study.get("sweep", {})
    full = sweep.get("full depth")
    if full is None:
        return None
    ok = [(v["mean_layers"], k, v) for k, v in sweep.items() if k != "full depth"
          and v["accuracy"] >= full["accuracy"] - TOLERANCE - 1e-12 and v["mean_layers"] < study["num_layers"] - 1e-9]
    if not ok:
        return None
    layers, label, row = min(ok, key=lambda t: (t[0], -t[2]["accuracy"]))
    return {"label": label, **row}


def best_per_depth(study: dict[str, Any]) -> list[str]:
    """For each target depth, the order with the best test accuracy."""
    out = []
    sweep = study.get("sweep", {})
    depths = sorted({d for d in (_label_parts(k)[1] for k in sweep) if d is not None}, reverse=True)
    for d in depths:
        rows = [(v["accuracy"], k) for k, v in sweep.items() if _label_parts(k)[1] == d and k.startswith("d3 ")]
        if rows:
            acc, key = max(rows)
            out.append(f"~{d} layers: {_label_parts(key)[0][3:]} ({_pct(acc)})")
    return out


def calibrations_table(study: dict[str, Any]) -> str:
    corr = study.get("spearman_single_vs_test_em", {})
    lines = ["| signal (calibration set) | order (first 10 dropped) | greedy steps | seconds | Spearman: single drops vs test EM |",
             "|---|---|---|---|---|"]
    for key, c in study.get("calibrations", {}).items():
        rho = corr.get(key)
        lines.append(f"| {c['signal']} ({c['calibration_set'].split(':')[0]}) | {' '.join(map(str, c['order'][:10]))} | "
                     f"{c['steps']} | {c['seconds']:.0f} | {'' if rho is None else f'{rho:+.2f}'} |")
    return "\n".join(lines)


def single_drop_line(study: dict[str, Any]) -> str:
    single = study.get("single_test", {})
    if not single:
        return ""
    full = single.get("full", {}).get("accuracy")
    drops = {int(k): v["accuracy"] for k, v in single.items() if k != "full"}
    ranked = sorted(drops, key=lambda k: -drops[k])
    kept = [k for k in ranked if full is not None and drops[k] >= full - TOLERANCE]
    return (f"Dropping one flex layer alone (test questions, free-running): full depth {_pct(full)}; "
            f"{len(kept)} of {len(drops)} layers can go within 1 point ({', '.join(map(str, kept)) or 'none'}); "
            f"the most harmful: {', '.join(f'{k} ({_pct(drops[k])})' for k in ranked[-4:][::-1])}.")


def section(study: dict[str, Any]) -> str:
    """The whole section, heading first."""
    full = study.get("sweep", {}).get("full depth")
    asked = full["asked"] if full else 0
    best = best_within(study)
    if best is None:
        head = "no setting that skips a layer stays within 1 point of full depth's test accuracy"
    else:
        head = (f"the fewest layers within 1 point of full depth: **{best['label']}**, {best['mean_layers']:.2f} of "
                f"{study['num_layers']} layers per answer token, {_pct(best['accuracy'])} (full depth "
                f"{_pct(full['accuracy'])})")
    parts = [
        f"{HEADING}: which layers {study['model']} can spare", "",
        f"Generation accuracy on the **test** questions only ({asked} questions of {', '.join(study['tasks'])}, "
        f"3-shot worked answers; the calibrations read the validation questions, chat prompts or prose, never "
        f"these). With {asked} questions a 95% interval is about ±{_half_width(full):.0f} points, so the 1-point "
        f"criterion is read on the point estimates. Made by `python scripts/drop_order_study.py`.", "",
        f"Headline: {head}.", "",
        "Best order at each depth: " + "; ".join(best_per_depth(study)) + ".", "",
        "### Calibrated orders", "", calibrations_table(study), "",
        single_drop_line(study), "",
        "### Test accuracy at matched mean depth (measured layers per answer token in brackets)", "",
        accuracy_table(study), "",
    ]
    return "\n".join(parts)


def _half_width(full: dict[str, Any] | None) -> float:
    if not full or "ci" not in full:
        return float("nan")
    low, high = full["ci"]
    return 100 * (high - low) / 2


def write_section(summary: str | Path, study: dict[str, Any]) -> Path:
    """Put the section into SUMMARY.md: replace this model's earlier "## Drop order" section, else append it."""
    path = Path(summary)
    text = path.read_text(encoding="utf-8") if path.is_file() else ""
    new = section(study)
    start = text.find(f"\n{HEADING}: which layers {study['model']} ")
    if start >= 0:
        end = text.find("\n## ", start + 1)
        text = text[:start] + "\n" + new + ("\n" + text[end + 1:] if end >= 0 else "\n")
    else:
        text = text.rstrip("\n") + "\n\n" + new + "\n"
    path.write_text(text, encoding="utf-8")
    return path
