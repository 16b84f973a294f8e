"""The real-work study's report: from the per-problem records (results/realwork_<bench>.jsonl) to each setting's row
against full depth on the same problems (pass@1, the paired difference with its exact interval, fidelity, mean
layers, the theoretical bounds, the measured speedup where timed), the loss by position (where the first changed
token falls; pass@1 by answer length), one plotly figure, results/realwork_<bench>.json and results/SUMMARY.md's
opening section. No model is loaded."""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from d3.research.realwork import first_change
from d3.research.stats import exact_difference, exact_rate
from d3.schedule import theoretical_speedup

NUM_LAYERS = 28
FIXED_COST_LAYERS = 4.986849303078707  # Qwen2.5-Coder-1.5B's LM head in decoder layers (results/drop_order_qwen25coder.json)
PUBLISHED = {"humaneval": ("70.7", "Qwen2.5-Coder-1.5B-Instruct's HumanEval in its technical report (chat format, "
                           "full-precision weights)")}
TOTALS = {"humaneval": 164, "gsm_symbolic": 60}  # GSM-Symbolic: 60 problems of Reasoning Gym seed 2026
LENGTH_BINS = (0, 40, 80, 120, 400)  # full depth's answer length in tokens, for pass@1 by length
SUMMARY_START = "<!-- realwork:start -->"
SUMMARY_END = "<!-- realwork:end -->"


def records(path: Path) -> list[dict[str, Any]]:
    """The records of a results file (a line cut by a kill is skipped); a problem answered twice keeps its first."""
    out, seen = [], set()
    if not path.is_file():
        return []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            continue
        key = (r["setting"], r["pid"])
        if key not in seen:
            seen.add(key)
            out.append(r)
    return out


def by_setting(recs: Sequence[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for r in recs:
        out.setdefault(r["setting"], {})[r["pid"]] = r
    return out


def curve(label: str) -> str:
    """"d3 calibrated a0.998 s32" -> "d3 calibrated s32"; "skipdecode 0.9" -> "skipdecode"."""
    words = label.split()
    if words[0] == "d3":
        return " ".join(w for w in words if not re.fullmatch(r"a[0-9.]+", w))
    return words[0]


def seconds(recs: Sequence[dict[str, Any]]) -> float:
    """Wall time the records' batches took: per batch, the time its last recorded reply ended."""
    ends: dict[str, float] = {}
    for r in recs:
        ends[r["batch_id"]] = max(ends.get(r["batch_id"], 0.0), r["elapsed"])
    return sum(ends.values())


def cpu_seconds(recs: Sequence[dict[str, Any]]) -> float:
    """CPU time the records took: a freely decoded batch's is its last reply's (each record counts from the batch's
    start); a record settled by the shortcut carries its own share of its pass."""
    ends: dict[str, float] = {}
    shares = 0.0
    for r in recs:
        if r.get("via") == "forced":
            shares += r.get("cpu_elapsed", 0.0)
        else:
            ends[r["batch_id"]] = max(ends.get(r["batch_id"], 0.0), r.get("cpu_elapsed", 0.0))
    return shares + sum(ends.values())


def full_row(full: dict[str, dict[str, Any]]) -> dict[str, Any]:
    recs = list(full.values())
    rate = exact_rate([r["passed"] for r in recs]).to_dict()
    tokens = sum(r["tokens"] for r in recs)
    secs = seconds(recs)
    return {"label": "full", "curve": "full", "n": len(recs), "passed": sum(r["passed"] for r in recs),
            "pass_at_1": rate, "mean_layers": NUM_LAYERS, "tokens": tokens,
            "mean_tokens": round(tokens / max(len(recs), 1), 1),
            "median_tokens": statistics.median(r["tokens"] for r in recs) if recs else 0,
            "tokens_per_s": round(tokens / max(secs, 1e-9), 2), "max_new_tokens": recs[0].get("max_new_tokens"),
            "dtype": recs[0].get("dtype"), "at_cap": sum(r["tokens"] >= (r.get("max_new_tokens") or 10**9) for r in recs)}


def setting_row(label: str, rows: dict[str, dict[str, Any]], full: dict[str, dict[str, Any]],
                forced: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """A setting against full depth on the problems both answered. `forced`: pid -> the setting's pass over full
    depth's reply (the shortcut), which says for every problem it read whether the reply changes and where, before
    the changed ones are answered: `pending` lists the changed problems not answered yet (pass@1 and the paired
    difference then cover the answered problems only: `complete` says whether any is left)."""
    forced = {p: f for p, f in (forced or {}).items() if p in full}
    pids = [p for p in rows if p in full]
    pending = sorted(p for p, f in forced.items() if p not in rows)
    mine, ref = [rows[p] for p in pids], [full[p] for p in pids]
    tokens = sum(r["tokens"] for r in mine)
    layers = sum(r["layers"] for r in mine) / max(tokens, 1)
    changes = [first_change(a["ids"], b["ids"]) for a, b in zip(ref, mine)]
    secs, ref_secs, ref_tokens = seconds(mine), seconds(ref), sum(r["tokens"] for r in ref)
    return {"label": label, "curve": curve(label), "config": mine[0]["config"] if mine else {}, "n": len(pids),
            "passed": sum(r["passed"] for r in mine), "full_passed": sum(r["passed"] for r in ref),
            "pass_at_1": exact_rate([r["passed"] for r in mine]).to_dict() if mine else None,
            "diff": exact_difference([r["passed"] for r in ref], [r["passed"] for r in mine]).to_dict() if mine else None,
            "fidelity": exact_rate([a["completion"] == b["completion"] for a, b in zip(ref, mine)]).to_dict() if mine else None,
            "mean_layers": round(layers, 3), "depth": round(layers / NUM_LAYERS, 4), "tokens": tokens,
            "theory_fixed": round(theoretical_speedup([layers], NUM_LAYERS, FIXED_COST_LAYERS), 4) if mine else None,
            "theory_plain": round(theoretical_speedup([layers], NUM_LAYERS), 4) if mine else None,
            # not a controlled timing (other jobs share the machine; batches differ): the ABBA timing is `speed`
            "batch_speedup": round((ref_secs / max(ref_tokens, 1)) / max(secs / max(tokens, 1), 1e-12), 3)
            if mine else None,
            "first_changes": [c for c in changes],
            "lost": [p for p, a, b in zip(pids, ref, mine) if a["passed"] and not b["passed"]],
            "won": [p for p, a, b in zip(pids, ref, mine) if b["passed"] and not a["passed"]],
            "pending": pending, "complete": not pending,
            "forced": {"n": len(forced), "same": sum(bool(f["settled"]) for f in forced.values()),
                       "first_changes": [f["first_change"] for f in forced.values()],
                       "pids": sorted(forced)} if forced else None}


def by_length(full: dict[str, dict[str, Any]], rows: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """pass@1 of full depth and of the setting by full depth's answer length (tokens), on the problems both ran."""
    out = []
    for lo, hi in zip(LENGTH_BINS, LENGTH_BINS[1:]):
        pids = [p for p in rows if p in full and lo <= full[p]["tokens"] < hi]
        if pids:
            out.append({"bin": f"{lo}-{hi - 1}", "n": len(pids),
                        "full": sum(full[p]["passed"] for p in pids) / len(pids),
                        "setting": sum(rows[p]["passed"] for p in pids) / len(pids),
                        "same": sum(full[p]["completion"] == rows[p]["completion"] for p in pids) / len(pids)})
    return out


def report(recs: Sequence[dict[str, Any]], speed: dict[str, Any] | None = None,
           forced: Sequence[dict[str, Any]] = (), scopes: dict[str, set[str]] | None = None) -> dict[str, Any]:
    """Full depth's row and each setting's (`forced`: the shortcut's passes over full depth's replies). `scopes`:
    label -> the problems a setting's stage covers, where it ran on part of the benchmark only (its row, pairs and
    pending problems are read on those; records outside, from an earlier plan, are left out)."""
    groups = by_setting(recs)
    if "full" not in groups:
        return {"settings": [], "full": None}
    full = groups["full"]
    passes = by_setting(forced)
    for label, pids in (scopes or {}).items():
        for table in (groups, passes):
            if label in table:
                table[label] = {p: r for p, r in table[label].items() if p in pids}
    labels = [k for k in groups if k != "full"] + [k for k in passes if k not in groups]
    rows = [setting_row(label, groups.get(label, {}), full, passes.get(label)) for label in labels]
    for row in rows:
        row["by_length"] = by_length(full, groups.get(row["label"], {}))
        if speed and row["label"] in speed:
            row["speed"] = speed[row["label"]]
    rows.sort(key=lambda r: (r["curve"], -r["mean_layers"]))
    return {"full": full_row(full), "settings": rows, "headline": headlines(rows),
            "full_passed_by_pid": {p: bool(r["passed"]) for p, r in full.items()}}


def headlines(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per bound (1 and 3 points): the fewest layers whose paired loss's 95% upper bound... here the point estimate
    and the interval's lower end are both within the bound (a loss of at most the bound that the data cannot rule
    out being larger is said so)."""
    out: dict[str, Any] = {}
    rows = [r for r in rows if r.get("complete", True)]  # a setting with changed problems still to answer: not yet
    for bound in (0.01, 0.03):
        ok = [r for r in rows if r["diff"] and r["diff"]["low"] >= -bound - 1e-12]
        best = min(ok, key=lambda r: r["mean_layers"], default=None)
        point = [r for r in rows if r["diff"] and r["diff"]["diff"] >= -bound - 1e-12]
        best_point = min(point, key=lambda r: r["mean_layers"], default=None)
        out[f"{round(bound * 100)}pt"] = {"bounded": best["label"] if best else None,
                                          "point": best_point["label"] if best_point else None}
    return out


def figure(rep: dict[str, Any], bench: str) -> Any:
    """One plotly figure: the frontier (paired difference vs mean layers, one line per order or baseline), where
    the first changed token falls (histogram over problems, every D3 setting that changed something), and pass@1
    by full depth's answer length (full depth and each calibrated D3 setting)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=3, subplot_titles=(
        "pass@1 change vs full depth (paired, 95% exact)", "first changed token (problems)",
        "pass@1 by full depth's answer length"))
    curves: dict[str, list[dict[str, Any]]] = {}
    for r in rep["settings"]:
        if r["diff"] and r.get("complete", True):
            curves.setdefault(r["curve"], []).append(r)
    for name, rs in curves.items():
        rs = sorted(rs, key=lambda r: r["mean_layers"])
        fig.add_trace(go.Scatter(
            x=[r["mean_layers"] for r in rs], y=[100 * r["diff"]["diff"] for r in rs], mode="lines+markers", name=name,
            error_y=dict(type="data", symmetric=False, array=[100 * (r["diff"]["high"] - r["diff"]["diff"]) for r in rs],
                         arrayminus=[100 * (r["diff"]["diff"] - r["diff"]["low"]) for r in rs]),
            text=[f"{r['label']}: {r['passed']}/{r['n']} (full {r['full_passed']}/{r['n']}), same reply "
                  f"{r['fidelity']['same']}/{r['n']}" for r in rs], hoverinfo="text+x+y"), row=1, col=1)
    for r in rep["settings"]:
        if r["curve"].startswith("d3"):
            fo = r.get("forced")  # the pass over full depth's replies says where, for every problem it read
            changes, n = (fo["first_changes"], fo["n"]) if fo and fo["n"] >= r["n"] else (r["first_changes"], r["n"])
            xs = [c for c in changes if c is not None]
            if xs:
                fig.add_trace(go.Histogram(x=xs, name=f"{r['label']} ({len(xs)} of {n} changed)", opacity=0.6,
                                           xbins=dict(start=0, size=10), legendgroup="hist", visible=True
                                           if r["curve"] == "d3 calibrated" else "legendonly"), row=1, col=2)
    shown = [r for r in rep["settings"] if r["curve"] == "d3 calibrated" and r.get("complete", True) and r["n"]]
    if shown:
        bins = [b["bin"] for b in shown[0]["by_length"]]
        fig.add_trace(go.Bar(x=bins, y=[100 * b["full"] for b in shown[0]["by_length"]], name="full depth",
                             text=[f"n={b['n']}" for b in shown[0]["by_length"]]), row=1, col=3)
        for r in shown:
            fig.add_trace(go.Bar(x=[b["bin"] for b in r["by_length"]], y=[100 * b["setting"] for b in r["by_length"]],
                                 name=f"{r['label']} ({r['mean_layers']:.1f} layers)"), row=1, col=3)
    fig.update_xaxes(title_text=f"mean layers per generated token (of {NUM_LAYERS})", row=1, col=1)
    fig.update_yaxes(title_text="points", row=1, col=1)
    fig.update_xaxes(title_text="token position of the first change", row=1, col=2)
    fig.update_xaxes(title_text="full depth's answer length (tokens)", row=1, col=3)
    fig.update_yaxes(title_text="pass@1 (%)", row=1, col=3)
    fig.update_layout(title=f"D3 on real work: {bench}, qwen2.5-coder-1.5b", barmode="group", height=520,
                      width=1500)
    return fig


def headline_text(rep: dict[str, Any]) -> str:
    """The headline in words: the largest theoretical speedup (LM head as fixed cost) among the settings answered
    on every problem they were read on whose paired loss is at most 1 and at most 3 points, and whether any beats
    1.1x within 1 point; measured speedups only where timed."""
    done = [r for r in rep["settings"] if r.get("complete", True) and r["diff"]]
    if not done:
        return "**Headline**: none yet. No setting has been answered on all its problems."
    parts = []
    for bound in (1, 3):
        ok = [r for r in done if r["diff"]["diff"] >= -bound / 100 - 1e-12]
        best = max(ok, key=lambda r: r["theory_fixed"], default=None)
        timed = [r for r in ok if r.get("speed")]
        fastest = max(timed, key=lambda r: r["speed"]["ratio"], default=None)
        parts.append(f"within {bound} point{'s' if bound > 1 else ''} (paired point estimate): "
                     + (f"{best['label']}, {best['mean_layers']:.2f} of {NUM_LAYERS} layers, theory "
                        f"{best['theory_fixed']:.2f}x (n={best['n']})" if best else "no setting")
                     + (f", measured {fastest['speed']['ratio']:.2f}x ({fastest['label']})" if fastest
                        else ", no measured (ABBA) speedup yet"))
    return "**Headline** (" + "; ".join(parts) + "). " + _verdict(done)


def _verdict(done: list[dict[str, Any]]) -> str:
    """Whether any setting beats 1.1x in theory within 1 point; if none keeps the answers at all, the deepest one."""
    keep = [r for r in done if r["diff"]["diff"] >= -0.01 - 1e-12]
    beats = [r for r in keep if r["theory_fixed"] >= 1.1]
    if beats:
        return (f"{len(beats)} setting(s) at 1.1x or more in theory within 1 point: "
                + ", ".join(r["label"] for r in beats) + " (the intervals say how far that holds).")
    if keep:
        return ("Nothing beats 1.1x within 1 point, not even in theory: the settings that keep the answers run at "
                f"least {min(r['mean_layers'] for r in keep):.2f} of {NUM_LAYERS} layers.")
    deepest = max(done, key=lambda r: r["mean_layers"])
    return ("Nothing beats 1.1x within 1 point, not even in theory: no setting answered so far keeps the answers "
            f"within 1 point (the deepest, {deepest['label']}, runs {deepest['mean_layers']:.2f} of {NUM_LAYERS} "
            f"layers and loses {-100 * deepest['diff']['diff']:.1f} points).")


def pct(x: float) -> str:
    return f"{100 * x:.1f}"


def diff_text(d: dict[str, Any]) -> str:
    return f"{100 * d['diff']:+.1f} [{100 * d['low']:+.1f}, {100 * d['high']:+.1f}]"


def table(rep: dict[str, Any]) -> list[str]:
    f = rep["full"]
    lines = ["| setting | problems | mean layers (of 28) | pass@1 | vs full depth, paired (points, 95% exact) | "
             "lost / won | same reply as full depth | theory (LM head fixed / none) | measured per token (ABBA) |",
             "|---|---|---|---|---|---|---|---|---|",
             f"| full depth | {f['n']} | 28 | {f['passed']}/{f['n']} = {pct(f['pass_at_1']['rate'])}% "
             f"[{pct(f['pass_at_1']['low'])}, {pct(f['pass_at_1']['high'])}] | | | | 1 / 1 | 1 |"]
    for r in sorted(rep["settings"], key=lambda r: -r["mean_layers"]):
        sp = r.get("speed")
        speed = f"{sp['ratio']:.2f}x [{sp['low']:.2f}, {sp['high']:.2f}]" if sp else "not timed"
        fo = r.get("forced")
        same = f"{fo['same']}/{fo['n']}" if fo and fo["n"] >= r["n"] else (
            f"{r['fidelity']['same']}/{r['n']}" if r["fidelity"] else "")
        if r.get("complete", True) and r["diff"]:
            lines.append(f"| {r['label']} | {r['n']} | {r['mean_layers']:.2f} ({pct(r['depth'])}%) | "
                         f"{r['passed']}/{r['n']} (full {r['full_passed']}/{r['n']}) | {diff_text(r['diff'])} | "
                         f"{r['diff']['lost']} / {r['diff']['won']} | {same} | {r['theory_fixed']:.2f}x / "
                         f"{r['theory_plain']:.2f}x | {speed} |")
            continue
        # the changed problems not answered yet: pass@1 lies between all of them failing and all passing
        n, k = r["n"] + len(r["pending"]), len(r["pending"])
        layers = f"{r['mean_layers']:.2f} on the {r['n']} answered" if r["n"] else "pending"
        lines.append(f"| {r['label']} | {r['n']} of {n} answered ({k} changed, pending) | {layers} | between "
                     f"{r['passed']}/{n} and {r['passed'] + k}/{n} (full {_full_passed(rep, r)}/{n}) "
                     f"| pending | pending | {same} | | {speed} |")
    return lines


def _full_passed(rep: dict[str, Any], r: dict[str, Any]) -> int:
    """Full depth's passes on the problems a setting's row covers, answered or pending."""
    return int(r["full_passed"] + sum(rep["full_passed_by_pid"].get(p, False) for p in r["pending"]))


RUN_SCRIPTS = {"humaneval": Path("scripts/realwork_run.sh"), "gsm_symbolic": Path("scripts/realwork_run_gsm.sh")}


def planned_stages(bench: str) -> dict[str, int | None]:
    """The settings the benchmark's run script answers (its SETTINGS lines), in its order: label -> the number of
    problems of the seeded shuffle it runs on (LABEL@N; None: every problem, "@all" or no "@")."""
    script = RUN_SCRIPTS.get(bench)
    if script is None or not script.is_file():
        return {}
    text = ";".join(re.findall(r'^SETTINGS\+?="([^"]*)"', script.read_text(encoding="utf-8"), flags=re.M))
    out: dict[str, int | None] = {}
    for word in (w.strip() for w in re.split(r"[;|]", text) if w.strip()):  # "|" ends a group, ";" joins one
        label, _, n = word.partition("@")
        out[label.strip()] = int(n) if n.strip().isdigit() else None
    return out


def planned_settings(bench: str) -> list[str]:
    """The settings the benchmark's run script answers, in its order."""
    return list(planned_stages(bench))


def stage_scopes(bench: str) -> dict[str, set[str]]:
    """label -> the problems its stage covers, for the settings run on the first N problems only (the others cover
    every problem full depth answered)."""
    stages = {label: n for label, n in planned_stages(bench).items() if n is not None}
    if not stages:
        return {}
    from d3.research.realwork import BENCHMARKS

    problems = BENCHMARKS[bench]()
    return {label: {p.pid for p in problems.subset(n)} for label, n in stages.items()}


def write_all(folder: Path, benches: Sequence[str], summary: Path = Path("results/SUMMARY.md"),
              docs: Path = Path("docs")) -> None:
    reps = {}
    for bench in benches:
        recs = records(folder / f"realwork_{bench}.jsonl")
        speed_file = folder / f"realwork_{bench}_speed.json"
        speed = json.loads(speed_file.read_text()) if speed_file.is_file() else None
        rep = report(recs, speed, records(folder / f"realwork_{bench}_forced.jsonl"), stage_scopes(bench))
        check_file = folder / f"realwork_{bench}_shortcut_check.json"
        if check_file.is_file():
            check = json.loads(check_file.read_text())
            rep["shortcut_check"] = {k: v for k, v in check.items() if k != "rows"}
        rep["planned"] = planned_settings(bench)
        passes = records(folder / f"realwork_{bench}_forced.jsonl")
        by = by_setting(recs)
        minutes = {"full": cpu_seconds(list(by.get("full", {}).values())) / 60,
                   # a record the shortcut settled costs its share of a pass: counted once, with the passes
                   "settings": sum(cpu_seconds([r for r in v.values() if r.get("via") != "forced"])
                                   for k, v in by.items() if k != "full") / 60,
                   "passes": sum(r.get("cpu_elapsed", 0.0) for r in passes) / 60,
                   "check": rep.get("shortcut_check", {}).get("cpu_s", 0.0) / 60}
        rep["cpu_minutes"] = {**{k: round(v, 1) for k, v in minutes.items()}, "total": round(sum(minutes.values()), 1)}
        if rep["full"] is None:
            continue
        reps[bench] = rep
        slim = {**rep, "settings": [{k: v for k, v in r.items() if k != "first_changes"} | {
            "first_changes": r["first_changes"]} for r in rep["settings"]]}
        (folder / f"realwork_{bench}.json").write_text(json.dumps(slim, indent=1))
        fig = figure(rep, bench)
        (docs / f"realwork_{bench}.html").write_text(fig.to_html(include_plotlyjs="cdn", full_html=True),
                                                     encoding="utf-8")
    if reps:
        write_summary(summary, reps)


def summary_section(reps: dict[str, dict[str, Any]]) -> str:
    out = [SUMMARY_START, "# D3 on real work (issue 42)", ""]
    for bench, rep in reps.items():
        f = rep["full"]
        pub = PUBLISHED.get(bench)
        out.append(f"## {bench}: qwen2.5-coder-1.5b, greedy")
        out.append("")
        total = TOTALS.get(bench)
        if total and f["n"] < total:
            out.append(f"**Partial** (the run is resumable and goes on: `bash {RUN_SCRIPTS[bench]}`): full depth "
                       f"on {f['n']} of {total} problems so far, each setting on the problems listed by its row; "
                       "intervals this wide say only where the data cannot yet tell. Settings are paired with full "
                       "depth on the same problems only.")
            out.append("")
        out.append(f"Full depth: **{f['passed']}/{f['n']} = {pct(f['pass_at_1']['rate'])}%** "
                   f"[{pct(f['pass_at_1']['low'])}, {pct(f['pass_at_1']['high'])}] (exact 95%), "
                   f"answers {f['mean_tokens']} tokens on average (median {f['median_tokens']}), computed in "
                   f"{f['dtype']}, at most {f['max_new_tokens']} new tokens ({f['at_cap']} replies reached it)"
                   + (f"; published: {pub[0]} ({pub[1]}). Ours: raw completion of the prompt (no chat template), "
                      "Q4_K_M weights, greedy, the body cut at the first line at column 0." if pub else "."))
        out.append("")
        out.extend(table(rep))
        out.append("")
        out.append(headline_text(rep))
        out.append("")
        cpu = rep.get("cpu_minutes")
        if cpu:
            out.append(f"CPU time so far: {cpu['total']:.0f} CPU-minutes (full depth {cpu['full']:.0f}, the settings "
                       f"{cpu['settings']:.0f} answering freely, their passes over full depth's replies {cpu['passes']:.0f}, the "
                       f"shortcut's check {cpu['check']:.0f}), float32 on 2 threads of a shared 2-core machine.")
            out.append("")
        check = rep.get("shortcut_check")
        if check:
            out.append(f"Settings are read over full depth's replies in one pass (the shortcut, docs/realwork.md): checked "
                       f"on the {check['records']} records written by free decoding on {check['problems']} problems, "
                       f"{'every one identical' if check['all_identical'] else 'NOT all identical'} (where each "
                       "setting first changes full depth's reply, with which token; each reply picked whole with its "
                       f"layers): results/realwork_{bench}_shortcut_check.json.")
            out.append("")
        missing = [label for label in rep.get("planned", []) if label not in {r["label"] for r in rep["settings"]}]
        if missing:
            out.append(f"Not run yet ({len(missing)} settings of {RUN_SCRIPTS[bench]}): " + ", ".join(missing) + ".")
            out.append("")
        out.append(f"Figure: [docs/realwork_{bench}.html](../docs/realwork_{bench}.html). Method, prompt, caveats: "
                   "[docs/realwork.md](../docs/realwork.md).")
        out.append("")
    out.append(SUMMARY_END)
    return "\n".join(out)


def write_summary(path: Path, reps: dict[str, dict[str, Any]]) -> Path:
    """Put (or replace) the real-work section at the top of results/SUMMARY.md."""
    text = path.read_text(encoding="utf-8") if path.is_file() else ""
    section = summary_section(reps)
    if SUMMARY_START in text and SUMMARY_END in text:
        head, rest = text.split(SUMMARY_START, 1)
        text = head + section + rest.split(SUMMARY_END, 1)[1]
    else:
        text = section + "\n\n" + text
    path.write_text(text, encoding="utf-8")
    return path
