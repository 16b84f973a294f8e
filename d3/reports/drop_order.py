"""The "Drop order" sections of results/SUMMARY.md and the README's rows, from the drop-order study's JSON
(scripts/drop_order_study.py, d3.research.study). Pure: a dict in, Markdown out.

Every accuracy figure is a paired difference from full depth on the same test questions with its exact 95%
interval (d3.research.stats), stated at the depth each setting actually ran; orders are compared at common depths
by linear interpolation along each order's curve (difference and interval bounds interpolated alike).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from d3.research.stats import exact_difference, replication

HEADING = "## Drop order"
BOUNDS = (0.01, 0.03)  # the headline's limits on the 95% upper bound of the accuracy loss
README_ROW = "| Drop-order study, "  # the README's results rows this report owns begin so (a comment would end the table)


def _pts(x: float) -> str:
    return f"{100 * x:+.1f}"


def _interval(d: dict[str, float]) -> str:
    return f"{_pts(d['diff'])} [{_pts(d['low'])}, {_pts(d['high'])}]"


def _name(label: str) -> tuple[str, float | None]:
    """"d3 bottom_up @0.93" -> ("d3 bottom_up", 0.93); "full depth" -> ("full depth", None)."""
    m = re.match(r"(.*) @([\d.]+)$", label)
    return (m.group(1), float(m.group(2))) if m else (label, None)


def setting_rows(study: dict[str, Any]) -> list[dict[str, Any]]:
    """Every measured setting but full depth, flattened: label, name, target, realized depth, paired diff, the
    same-answer rate (fidelity), full depth's accuracy on the same questions, and the theoretical speedups at its
    depth (the sweep times nothing: speed is measured for the headline settings only, after they are chosen)."""
    out = []
    settings = study.get("settings", {})
    full_bits = settings.get("full depth", {}).get("bits", "")
    L, fixed = study.get("num_layers", 0), study.get("fixed_cost_layers", 0.0)
    for label, row in settings.items():
        name, target = _name(label)
        if target is None or "diff" not in row:
            continue
        n = row.get("asked", row["diff"].get("n", 0))
        same_q = full_bits[:n]  # a stopped setting ran the first stage: the first n of full depth's answers
        out.append({"label": label, "name": name, "target": target, "layers": row["mean_layers"], **row["diff"],
                    "stage": row.get("stage", 2), "accuracy": row["accuracy"], "asked": n,
                    "full_same": same_q.count("1") / len(same_q) if len(same_q) == n and n else float("nan"),
                    "fidelity": row.get("fidelity"), "same_as": row.get("same_as"), "qps_cpu": row.get("qps_cpu"),
                    "theory_plain": L / row["mean_layers"] if row["mean_layers"] else float("nan"),
                    "theory_fixed": (L + fixed) / (row["mean_layers"] + fixed) if row["mean_layers"] else float("nan")})
    return out


def curves(study: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Per order or baseline, its settings sorted by realized depth (the curve of accuracy difference vs depth)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for r in setting_rows(study):
        out.setdefault(r["name"], []).append(r)
    return {k: sorted(v, key=lambda r: r["layers"]) for k, v in out.items()}


def at_depth(curve: list[dict[str, Any]], depth: float) -> dict[str, float] | None:
    """The curve's difference and interval bounds at `depth` layers, linearly interpolated between the two measured
    settings around it; None outside the depths it ran."""
    xs = np.array([r["layers"] for r in curve])
    if len(xs) == 0 or depth < xs.min() - 1e-9 or depth > xs.max() + 1e-9:
        return None
    return {k: float(np.interp(depth, xs, [r[k] for r in curve])) for k in ("diff", "low", "high")}


def common_depths(study: dict[str, Any]) -> list[float]:
    """Whole layer counts below L that at least two orders' curves cover."""
    cs = [c for n, c in curves(study).items() if n.startswith("d3 ")]
    L = study.get("num_layers", 0)
    depths = []
    for d in range(L - 1, 0, -1):
        if sum(at_depth(c, d) is not None for c in cs) >= 2:
            depths.append(float(d))
    return depths


def winners(study: dict[str, Any]) -> list[str]:
    """At each common depth, the order with the best interpolated difference, and whether its interval clears
    every other order's (its lower bound above their upper bounds: unpaired, so conservative)."""
    lines = []
    cs = {n: c for n, c in curves(study).items() if n.startswith("d3 ")}
    for d in common_depths(study):
        vals = {n: v for n, c in cs.items() if (v := at_depth(c, d)) is not None}
        best = max(vals, key=lambda n: vals[n]["diff"])
        rest = [v for n, v in vals.items() if n != best]
        clear = all(vals[best]["low"] > v["high"] for v in rest)
        second = max((n for n in vals if n != best), key=lambda n: vals[n]["diff"])
        lines.append(f"{d:.0f} layers: **{best[3:]}** {_interval(vals[best])} pts, next {second[3:]} "
                     f"{_interval(vals[second])}; {'survives' if clear else 'does not survive'} the intervals")
    return lines


def headline_pick(study: dict[str, Any], bound: float) -> tuple[dict[str, Any] | None, bool]:
    """(the setting the headline names, whether it meets `bound`), chosen on accuracy alone: of the settings that
    answered every test question, the one running the fewest layers per token whose accuracy loss has a 95% upper
    bound <= `bound`; else the closest to it (the highest lower end). None when none skips a layer. Speed plays no
    part (it is measured after the choice, so no noisy timing is picked for being high)."""
    rows = [r for r in setting_rows(study) if r["layers"] < study["num_layers"] - 1e-9]  # those that skip a layer
    ok = [r for r in rows if -r["low"] <= bound + 1e-12 and r["stage"] == 2]
    if ok:
        return min(ok, key=lambda r: (r["layers"], -r["diff"])), True
    return (max(rows, key=lambda r: (r["low"], -r["layers"])), False) if rows else (None, False)


def _fidelity(f: dict[str, Any] | None) -> str:
    return f"{100 * f['rate']:.1f}% [{100 * f['low']:.1f}, {100 * f['high']:.1f}]" if f else "n/a"


def speed_text(t: dict[str, Any] | None) -> str:
    """A timed setting's per-token speedup beside its theoretical bounds, flagged (never bold) when above them."""
    if not t:
        return "speed not measured"
    flag = f" — FLAG: {t['flag']} beyond its interval (a timing artefact, not a speedup)" if t.get("flag") else ""
    return (f"speed {t['ratio']:.3f}x [{t['low']:.3f}, {t['high']:.3f}] per generated token ({t['pairs']} ABBA pairs, "
            f"{t['threads']} thread each side, {t['questions']} reported test questions, timed after the choice); "
            f"theory at {t['mean_layers']:.2f} layers {t['theory_fixed']:.3f}x with the LM head as fixed cost, "
            f"{t['theory_plain']:.3f}x with none{flag}")


def fresh_text(study: dict[str, Any], label: str, bound: float) -> str:
    """"fresh questions: ..." for a headline setting: its paired difference on a new seed's questions, and whether
    the headline replicates there."""
    fresh = study.get("fresh", {})
    row = fresh.get("settings", {}).get(label)
    if not row:
        return "fresh questions: not run"
    per = row.get("per_task_questions")
    full = fresh.get("full", {}).get(str(per), {})
    verdict = replication(bound, study["settings"][label]["diff"], row["diff"])
    return (f"fresh questions (seed {fresh.get('seed')}, {row['diff']['n']} new test questions, full depth "
            f"{100 * full.get('accuracy', float('nan')):.1f}% there): {_interval(row['diff'])} pts, same answer "
            f"{_fidelity(row.get('fidelity'))}: **{verdict}**")


def headline(study: dict[str, Any], bound: float) -> str:
    """The fewest layers whose loss has a 95% upper bound <= `bound` (or "none" and the closest), with its
    fidelity, its speed beside theory, and its fresh-seed replication."""
    r, met = headline_pick(study, bound)
    if r is None:
        return "no setting that skips a layer measured yet"
    label = r["label"]
    tail = (f"accuracy {_interval(r)} pts on {r['asked']} questions (full depth {100 * r['full_same']:.1f}% on them), "
            f"same answer as full depth {_fidelity(r['fidelity'])}; {speed_text(study.get('speed', {}).get(label))}; "
            f"{fresh_text(study, label, bound)}")
    if met:
        return (f"fewest layers with the loss's 95% upper bound <= {100 * bound:.0f} point(s): **{label}** at "
                f"{r['layers']:.2f} of {study['num_layers']} layers per token, {tail}")
    return (f"loss bound <= {100 * bound:.0f} point(s): **none**; the closest is {label} at {r['layers']:.2f} layers "
            f"(loss up to {-100 * r['low']:.1f} points), {tail}")


def per_task(study: dict[str, Any], label: str) -> str:
    """A setting's paired difference from full depth task by task, with exact intervals, on the questions it ran:
    the headline pools the tasks, weighted by their questions, and a pooled gain can hide a task that loses."""
    full, row = study["settings"]["full depth"]["bits"], study["settings"][label]["bits"]
    tasks = study.get("tasks", [])
    spans: dict[str, list[int]] = {t: [] for t in tasks}
    k = 0
    for stage in study.get("stages") or [study.get("test_sizes", [])]:
        for t, n in zip(tasks, stage):
            spans[t].extend(range(k, k + n))
            k += n
    parts = []
    for t in tasks:
        asked = [i for i in spans[t] if i < len(row)]
        if asked:
            d = exact_difference([full[i] == "1" for i in asked], [row[i] == "1" for i in asked])
            parts.append(f"{t} {d.points()} on {len(asked)}")
    return "; ".join(parts)


def paired_orders(study: dict[str, Any], within: float = 0.1) -> list[str]:
    """Two D3 orders that ran the same depth (within `within` layers): the better one's paired difference over the
    other on the same questions, with its exact interval (finer than comparing their intervals against full depth)."""
    runs = [(k, v) for k, v in study.get("settings", {}).items() if k.startswith("d3 ") and "bits" in v]
    lines = []
    for i, (ka, a) in enumerate(runs):
        for kb, b in runs[i + 1:]:
            if abs(a["mean_layers"] - b["mean_layers"]) <= within:
                n = min(len(a["bits"]), len(b["bits"]))  # a stopped setting ran the first stage only
                # the better one on the questions both ran (a first stage's mix of tasks is not the whole set's)
                ahead = a["bits"][:n].count("1") >= b["bits"][:n].count("1")
                (kw, w), (kl, lo) = ((ka, a), (kb, b)) if ahead else ((kb, b), (ka, a))
                d = exact_difference([c == "1" for c in lo["bits"][:n]], [c == "1" for c in w["bits"][:n]])
                verdict = "beyond the interval" if d.low > 0 else "within the interval: not resolved"
                lines.append(f"{kw} over {kl} at {w['mean_layers']:.2f} / {lo['mean_layers']:.2f} layers: "
                             f"{d.points()} on {n} questions ({verdict})")
    return lines


def matched_table(study: dict[str, Any]) -> str:
    """Orders and baselines at common depths: interpolated difference [interval] in points."""
    depths = common_depths(study)
    if not depths:
        return "No whole layer count is covered by two orders' curves (each order's settings are in the table below)."
    lines = ["| order | " + " | ".join(f"{d:.0f} layers" for d in depths) + " |", "|---|" + "---|" * len(depths)]
    for name, c in curves(study).items():
        cells = [_interval(v) if (v := at_depth(c, d)) else "" for d in depths]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def settings_table(study: dict[str, Any]) -> str:
    """Every setting as measured: realized depth, questions, accuracy beside full depth's on the same questions,
    paired difference, same answer as full depth, and the theoretical speedup at its depth."""
    lines = ["| setting (target depth) | layers run | questions | accuracy | full depth on the same questions | "
             "vs full depth, pts [95%] | same answer [95%] | theory (LM head fixed / none) |",
             "|---|---|---|---|---|---|---|---|"]
    full = study.get("settings", {}).get("full depth")
    if full:
        lines.append(f"| full depth | {full['mean_layers']:.2f} | {full['asked']} | {100 * full['accuracy']:.1f}% | "
                     f"{100 * full['accuracy']:.1f}% | 0 | 100% | 1.00 / 1.00 |")
    for r in sorted(setting_rows(study), key=lambda r: (r["name"], -r["layers"])):
        stage = "" if r["stage"] == 2 else " (first stage)"
        alike = f" (the same layers at every token as {r['same_as']}: its row)" if r.get("same_as") else ""
        lines.append(f"| {r['label']}{alike} | {r['layers']:.2f} | {r['asked']}{stage} | {100 * r['accuracy']:.1f}% | "
                     f"{100 * r['full_same']:.1f}% | {_interval(r)} | {_fidelity(r['fidelity'])} | "
                     f"{r['theory_fixed']:.3f} / {r['theory_plain']:.3f} |")
    return "\n".join(lines)


def cost_lines(study: dict[str, Any]) -> list[str]:
    """What the run cost (wall and this process's CPU seconds per part, summed over resumed runs), the design of
    its stages, where curves stopped, and throughput at full depth and under D3."""
    cost = study.get("cost", {})
    lines = []
    if cost:
        parts = ", ".join(f"{k} {v['cpu_s'] / 60:.1f} CPU-min ({v['wall_s'] / 60:.1f} min wall)" for k, v in cost.items())
        cpu = sum(v["cpu_s"] for v in cost.values())
        wall = sum(v["wall_s"] for v in cost.values())
        threads = max((r.get("threads", 1) for r in study.get("settings", {}).values()), default=1)
        how = "one torch thread" + (f", {threads} once the other model's process ended" if threads > 1 else "")
        lines.append(f"Cost: {cpu / 60:.1f} CPU-minutes of this process ({how}), {wall / 60:.1f} minutes of "
                     f"wall time: {parts}")
    stages = study.get("stages")
    if stages:
        lines.append(f"Sequential design: every setting answered the first {sum(stages[0])} test questions; those whose "
                     f"interval there still allowed a loss of at most {100 * study.get('go_on', 0.03):.0f} points went on "
                     f"to all {sum(stages[0]) + sum(stages[1])}; the others report their interval on the first stage")
    for name, label in study.get("curves_stopped", {}).items():
        lines.append(f"{name}: lost {100 * study.get('collapse', 0.2):.0f} points or more at {label}; its deeper cuts "
                     "were not run (its curve stops there)")
    full = study.get("settings", {}).get("full depth")
    rows = [r for r in setting_rows(study) if r.get("qps_cpu")]
    if full and rows:
        best = max(rows, key=lambda r: r["qps_cpu"])
        lines.append(f"Throughput: full depth {full['qps']:.2f} questions/s ({full.get('qps_cpu', float('nan')):.2f} per "
                     f"CPU-second); D3 settings {min(r['qps_cpu'] for r in rows):.2f}-{best['qps_cpu']:.2f} per CPU-second "
                     f"(fastest {best['label']})")
    return lines


def section(study: dict[str, Any]) -> str:
    """The whole section for one model, heading first."""
    full = study.get("settings", {}).get("full depth", {})
    screen = study.get("screen", {})
    told = "; ".join(f"{t} {100 * v['validation_accuracy']:.0f}%{'' if v['kept'] else ' (dropped)'}"
                     + (f" (space {v['space']:,})" if v.get("space") else "") for t, v in screen.items())
    partial = study.get("partial")
    parts = [
        f"{HEADING}: which layers {study['model']} can spare", "",
        *([f"**Partial run**: {partial}", ""] if partial else []),
        f"Test questions only: {full.get('asked', 0)} ({', '.join(f'{t} {n}' for t, n in zip(study.get('tasks', []), study.get('test_sizes', [])))}; "
        "the same number per task, so every pooled figure weighs the tasks equally), generated "
        "(`d3.research.gentasks`, 3-shot worked answers, each task's question space at least 20 times what a seed "
        f"draws). Screen ({screen_text(study)}): {told}. Full depth on test: "
        f"{100 * full.get('accuracy', float('nan')):.1f}%. Every difference is paired on the same questions with its "
        "exact 95% interval (McNemar, `d3.research.stats`), beside the same-answer rate with its exact interval; "
        "depths are the layers per generated token each setting actually ran. The exact interval is conditional on "
        "the discordant questions: with none it is [0, 0] whatever the number of questions, so read each with its "
        "questions and its same-answer rate. Made by "
        "`python scripts/drop_order_study.py`.", "",
        *(f"- Headline: {headline(study, b)}." for b in BOUNDS),
        *(f"  Per task ({label}; equal weights): {per_task(study, label)}." for label in _headline_labels(study)), "",
        *(f"- {line}." for line in cost_lines(study)), "",
        "Which order wins at each depth (interpolated along each order's curve):", "",
        *(f"- {w}" for w in winners(study) or ["no depth is covered by two orders' curves"]), "",
        "Orders that ran the same depth, paired on the same questions:", "",
        *(f"- {line}" for line in paired_orders(study) or ["none ran within 0.1 layers of another"]), "",
        "### At common depths (accuracy difference from full depth, points [95%], interpolated)", "",
        matched_table(study), "",
        "### Every setting as measured", "", settings_table(study), "",
    ]
    return "\n".join(parts)


def screen_text(study: dict[str, Any]) -> str:
    """The screen's rule as the study recorded it (d3.research.study.screen_rule)."""
    rule = study.get("screen_rule")
    if not rule:
        return "rule not recorded"
    return (f"full depth on {rule['questions']} validation questions per task; a task is kept for the model when it "
            f"answers at least {100 * rule['min']:.0f}% of them and 20 points more than the most common answer")


def _headline_labels(study: dict[str, Any]) -> list[str]:
    """The settings the headlines name, each once, where the study has full depth's answers to pair them with."""
    if "bits" not in study.get("settings", {}).get("full depth", {}):
        return []
    picks = [headline_pick(study, b)[0] for b in BOUNDS]
    return list(dict.fromkeys(r["label"] for r in picks if r is not None and "bits" in study["settings"][r["label"]]))


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


def readme_rows(studies: list[dict[str, Any]]) -> str:
    """The README's results rows, one short line per model: at 1 and 3 points, the fewest layers whose accuracy loss
    has a 95% upper bound within it, with its fresh-seed verdict and its per-token speed beside theory (the full
    headline, with intervals: results/SUMMARY.md)."""
    rows = []
    for s in studies:
        full = s.get("settings", {}).get("full depth", {})
        tag = " (partial run)" if s.get("partial") else ""
        tasks = len(s.get("tasks", []))
        rows.append(f"{README_ROW}{s['model']}{tag}: fewest layers with a loss bound (95%, paired, "
                    f"{full.get('asked', 0)} test questions, {tasks} task{'s' if tasks != 1 else ''}) | "
                    f"{_both_bounds(s)} "
                    "| [results/SUMMARY.md](results/SUMMARY.md) |")
    return "\n".join(rows)


def _both_bounds(study: dict[str, Any]) -> str:
    """The short headline at each bound, the second as "the same" when it names the same setting."""
    first, second = (headline_pick(study, bound) for bound in BOUNDS)
    if first[1] and first == second:
        return f"{short_headline(study, BOUNDS[0])}; <= {100 * BOUNDS[1]:.0f} pt: the same"
    return f"{short_headline(study, BOUNDS[0])}; {short_headline(study, BOUNDS[1])}"


def short_headline(study: dict[str, Any], bound: float) -> str:
    """`headline` in a few words: "<= 1 pt: d3 ... at 28.44 of 30 layers, -0.8 [-0.8, +0.8] pts, fresh: replicates,
    0.96x per token (theory 1.05-1.06x)", or "<= 1 pt: none"; a speed above theory carries its flag."""
    r, met = headline_pick(study, bound)
    points = f"<= {100 * bound:.0f} pt"
    if r is None or not met:
        return f"{points}: none"
    fresh = study.get("fresh", {}).get("settings", {}).get(r["label"])
    speed = study.get("speed", {}).get(r["label"])
    text = f"{points}: {r['label']} at {r['layers']:.2f} of {study['num_layers']} layers, {_interval(r)} pts"
    if fresh:
        text += f", fresh questions {_interval(fresh['diff'])} ({replication(bound, r, fresh['diff'])})"
    if speed:
        text += (f", {speed['ratio']:.2f}x [{speed['low']:.2f}, {speed['high']:.2f}] per token (theory "
                 f"{speed['theory_fixed']:.2f}-{speed['theory_plain']:.2f}x)"
                 + (f", FLAG: {speed['flag']}" if speed["flag"] else ""))
    return text


def write_readme(readme: str | Path, studies: list[dict[str, Any]]) -> Path:
    """Replace the README's study rows (lines beginning with README_ROW) by fresh ones, where the first of them
    stood; the README is left alone when it has none."""
    path = Path(readme)
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    at = [i for i, line in enumerate(lines) if line.startswith(README_ROW)]
    if not at:
        return path
    kept = [line for line in lines if not line.startswith(README_ROW)]
    kept[at[0]:at[0]] = [readme_rows(studies) + "\n"]
    path.write_text("".join(kept), encoding="utf-8")
    return path


def curve_points(study: dict[str, Any], x: str) -> dict[str, list[dict[str, float]]]:
    """Per order or baseline, its settings as points for `viz.results.paired_curves` (x: "layers" or "speedup")."""
    return {name: [{x: r[x], "diff": r["diff"], "low": r["low"], "high": r["high"]} for r in c]
            for name, c in curves(study).items()}


def _share(row: dict[str, Any], num_layers: int) -> float:
    return row["layers"] / num_layers


def across_models(studies: list[dict[str, Any]], subject: str | None = None, bound: float = BOUNDS[1]) -> list[str]:
    """Whether `subject` (a model's name; default the last study: the largest model, named last) keeps its answers
    at a share of its depth the other models cannot, in lines: its headline at `bound` as a share of its layers,
    beside each other model's own headline share and, for that model, the measured setting closest at or below the
    subject's share with its interval (a loss bound beyond `bound` there is what "cannot" means; a share it never
    ran at is said to be unmeasured, not claimed)."""
    measured = [s for s in studies if s.get("settings")]
    if len(measured) < 2:
        return []
    named = [s for s in measured if s["model"] == subject]
    deep = named[0] if named else measured[-1]
    pick, met = headline_pick(deep, bound)
    points = f"{100 * bound:.0f} points"
    if pick is None or not met:
        return [f"{deep['model']} ({deep['num_layers']} layers): no setting kept its accuracy loss's 95% upper bound "
                f"within {points}, so no depth is claimed for it"]
    share = _share(pick, deep["num_layers"])
    lines = [f"{deep['model']} ({deep['num_layers']} layers) keeps its answers within {points} at "
             f"{pick['layers']:.2f} of {deep['num_layers']} layers per token ({100 * share:.1f}% of its depth, "
             f"{deep['num_layers'] - pick['layers']:.2f} layers skipped): {pick['label']}, {_interval(pick)} pts, "
             f"same answer {_fidelity(pick['fidelity'])}"]
    for s in measured:
        if s is deep:
            continue
        L = s["num_layers"]
        own, own_met = headline_pick(s, bound)
        own_text = (f"its own fewest within {points}: {own['layers']:.2f} of {L} ({100 * _share(own, L):.1f}%)"
                    if own is not None and own_met else f"no setting within {points}")
        rows = [r for r in setting_rows(s) if _share(r, L) <= share + 1e-9]
        if not rows:
            lines.append(f"{s['model']} ({L} layers): {own_text}; never run at {100 * share:.1f}% of its depth or "
                         "fewer, so whether it could is not measured")
            continue
        deepest = max(r["layers"] for r in rows)  # the best order among those within half a layer of it
        near = max((r for r in rows if r["layers"] >= deepest - 0.5), key=lambda r: (r["low"], r["layers"]))
        kept = -near["low"] <= bound + 1e-12 and near["stage"] == 2
        lines.append(f"{s['model']} ({L} layers): {own_text}; its closest setting at or below "
                     f"{100 * share:.1f}%, {near['label']} at {near['layers']:.2f} ({100 * _share(near, L):.1f}%), "
                     f"{_interval(near)} pts on {near['asked']} questions: "
                     + ("**keeps it too**" if kept else f"**not within {points}** (its loss may reach {-100 * near['low']:.1f})"))
    return lines


ACROSS = f"{HEADING} across models"


def write_across(summary: str | Path, studies: list[dict[str, Any]], subject: str | None = None) -> Path:
    """Put the `across_models` section into SUMMARY.md (replacing its earlier self); nothing when it has no lines."""
    lines = across_models(studies, subject)
    path = Path(summary)
    if not lines:
        return path
    text = path.read_text(encoding="utf-8") if path.is_file() else ""
    new = (f"{ACROSS}\n\nAt the 3-point bound, as a share of each model's depth (paired 95% intervals; the settings "
           "and their fresh-seed replication are in each model's section):\n\n" + "\n".join(f"- {x}" for x in lines) + "\n")
    start = text.find(f"\n{ACROSS}\n")
    if start >= 0:
        end = text.find("\n## ", start + 1)
        text = text[:start] + "\n" + new + ("\n" + text[end + 1:] if end >= 0 else "")
    else:
        text = text.rstrip("\n") + "\n\n" + new
    path.write_text(text, encoding="utf-8")
    return path
