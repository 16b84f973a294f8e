"""Report: headline logic on synthetic tables, the Pareto front it draws, and the HTML it writes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from d3.cli import report as report_cli
from d3.cli.report import write_report
from d3.reports import sweep as report
from d3.research.sweep import COLUMNS, table
from viz import report as viz_report


def _row(strategy: str, label: str, depth: float, speed: float, ppl_ratio: float, acc: float | None = None, *,
         agreement: float = 0.9, kl: float = 0.1, layers: float = 20.0) -> dict:
    row = {c: np.nan for c in COLUMNS}
    row.update(key=label, model="m", num_layers=30, strategy=strategy, label=label, params="{}", target_depth=depth,
               prompts=2, new_tokens=8, repeats=1, timing_pairs=2, ppl_tokens=16, mean_layers=layers, measured_speedup=speed,
               theoretical_speedup=30 / layers, theoretical_speedup_fixed=38 / (layers + 8), ppl_ratio=ppl_ratio,
               ppl=10 * ppl_ratio, agreement=agreement, kl_teacher=kl, kl_free=kl, task_scoring="",
               task_accuracy="", finished_at="")
    if acc is not None:
        row.update(accuracy=acc, accuracy_full=0.60, chance=0.5,
                   task_accuracy=json.dumps({"t1": {"accuracy": acc, "accuracy_full": 0.6, "chance": 0.5, "n": 10},
                                             "t2": {"accuracy": acc - 0.1, "accuracy_full": 0.5, "chance": 0.5, "n": 10}}))
    return row


def synthetic(with_accuracy: bool = True) -> pd.DataFrame:
    a = (lambda x: x) if with_accuracy else (lambda x: None)
    rows = [
        _row("full", "full depth", 1.0, 1.0, 1.0, a(0.60), agreement=1.0, kl=0.0, layers=30),
        _row("d3", "d3 slow ok", 0.9, 1.10, 1.005, a(0.60), layers=27),
        _row("d3", "d3 fast ok", 0.8, 1.30, 1.009, a(0.595), layers=24),
        _row("d3", "d3 faster, ppl too high", 2 / 3, 1.50, 1.02, a(0.60), layers=20),
        _row("d3", "d3 faster, accuracy too low", 0.5, 1.70, 1.001, a(0.55), layers=15),
        _row("skipdecode", "sd", 0.8, 1.35, 1.30, a(0.40), agreement=0.5, layers=24),
        _row("unified", "uni", 0.8, 1.32, 1.004, a(0.62), agreement=0.95, layers=24),
        _row("early_exit", "ee", 2 / 3, 0.70, 2.0, a(0.50), agreement=0.2, layers=21),
    ]
    return pd.DataFrame(rows, columns=list(COLUMNS))


def test_headline_picks_the_fastest_setting_within_both_limits() -> None:
    h = report.headline(synthetic())
    assert h["best"]["d3"]["label"] == "d3 fast ok"
    assert h["best"]["unified"]["label"] == "uni"
    assert h["best"]["skipdecode"] is None and h["best"]["early_exit"] is None
    assert "no setting stays within the limits" in h["text"]
    assert h["noise"] == 1.0


def test_a_setting_that_skips_nothing_is_never_the_headline() -> None:
    df = pd.concat([synthetic(), pd.DataFrame([_row("d3", "d3 alpha 1", 0.97, 1.4, 1.0, 0.6, layers=30)])],
                   ignore_index=True)
    assert report.headline(df)["best"]["d3"]["label"] == "d3 fast ok"  # 1.4x there is timing noise


def test_headline_flags_accuracy_that_never_moves() -> None:
    df = synthetic()
    assert not report.headline(df)["accuracy_flat"]
    df["accuracy"] = df["accuracy_full"]
    h = report.headline(df)
    assert h["accuracy_flat"] and "cannot separate the strategies" in h["text"]


def test_without_accuracy_only_the_perplexity_limit_applies() -> None:
    h = report.headline(synthetic(with_accuracy=False))
    assert h["best"]["d3"]["label"] == "d3 faster, accuracy too low"  # the accuracy limit is not applied


def test_headline_says_plainly_where_d3_loses() -> None:
    h = report.headline(synthetic())
    at80 = [x for x in h["losses"] if x.startswith("at 80% depth")]
    assert any("uni beats D3" in x and "perplexity ratio" in x for x in at80)
    assert any("uni beats D3" in x and "task accuracy" in x for x in at80)
    assert any("sd beats D3" in x and "measured speedup" in x for x in at80)  # 1.35 vs 1.30 is beyond noise
    assert not any("sd beats D3" in x and "perplexity" in x for x in at80)
    assert "D3 does not reach the paper's operating point" in h["text"]
    assert "Where D3 loses" in h["text"]


def test_a_baseline_that_skips_nothing_is_not_a_loss_for_d3() -> None:
    df = pd.concat([synthetic(), pd.DataFrame([_row("unified", "uni r=1", 0.8, 1.31, 1.0, 0.6, agreement=1.0, kl=0.0,
                                                    layers=30)])], ignore_index=True)
    losses = report.headline(df)["losses"]
    assert not any("uni r=1 beats D3" in x for x in losses)
    assert any("uni beats D3" in x for x in losses)  # the skipping baseline at that depth still counts


def test_headline_lists_task_accuracy_of_every_strategy_at_each_matched_depth() -> None:
    h = report.headline(synthetic())
    assert h["accuracy_by_depth"] == ["at 80% depth: d3 59.5%, skipdecode 40.0%, unified 62.0%",
                                      "at 67% depth: d3 60.0%, early_exit 50.0%"]  # 90% and 50%: D3 alone, no line
    assert "Task accuracy at matched depth (full depth 60.0%" in h["text"]
    assert report.headline(synthetic(with_accuracy=False))["accuracy_by_depth"] == []


def test_matched_table_groups_by_depth_with_d3_first() -> None:
    m = report.matched_table(synthetic())
    assert "full" not in set(m["strategy"])
    group = m[m["target_depth"] == 0.8]
    assert list(group["strategy"]) == ["d3", "skipdecode", "unified"]
    assert list(m["target_depth"]) == sorted(m["target_depth"], reverse=True)


def test_task_frame_expands_per_task_accuracy() -> None:
    tasks = report.task_frame(synthetic())
    assert set(tasks["task"]) == {"t1", "t2"} and len(tasks) == 2 * len(synthetic())
    assert tasks.loc[(tasks["label"] == "uni") & (tasks["task"] == "t1"), "accuracy"].item() == 0.62


def test_task_table_puts_chance_beside_each_accuracy_and_the_difference_in_points() -> None:
    table = report.task_table(synthetic())
    assert list(table.columns) == ["setting", "t1", "t2"]
    assert table.iloc[0].tolist() == ["chance", "50.0%", "50.0%"]
    assert table.iloc[1]["setting"].startswith("full depth") and table.iloc[1]["t1"] == "60.0%"
    uni = table[table["setting"] == "uni"].iloc[0]
    assert uni["t1"] == "62.0% (+2.0)" and uni["t2"] == "52.0% (+2.0)"
    assert len(table) == 2 + len(synthetic()) - 1  # chance, full depth, then every non-full setting
    assert report.task_table(synthetic(with_accuracy=False)).empty
    md = report.summary_markdown(synthetic())
    assert "## Task accuracy beside chance" in md and "| uni | 62.0% (+2.0) | 52.0% (+2.0) |" in md
    assert "Task accuracy beside chance" not in report.summary_markdown(synthetic(with_accuracy=False))


def _dominated(points: np.ndarray, i: int, higher: bool) -> bool:
    s = np.array([1.0, 1.0 if higher else -1.0])
    p = points * s
    return any((p[j] >= p[i]).all() and (p[j] > p[i]).any() for j in range(len(p)) if j != i)


@pytest.mark.parametrize("metric", ["ppl_ratio", "agreement", "accuracy"])
def test_report_pareto_front_is_exactly_the_non_dominated_settings(metric: str) -> None:
    df = synthetic()
    figs = dict(viz_report.pareto_figures(df, report.PARETO_METRICS, report.ACC_LIMIT))
    fig = figs[f"{metric.replace('_', ' ')} vs measured speedup"]
    front = next(t for t in fig.data if (t.meta or {}).get("role") == "front")
    pts = df[["measured_speedup", metric]].to_numpy()
    higher = metric != "ppl_ratio"
    expected = {i for i in range(len(df)) if not _dominated(pts, i, higher)}
    assert set(front.meta["index"]) == expected
    assert sorted(zip(front.x, front.y)) == sorted(map(tuple, pts[sorted(expected)]))
    assert any((t.meta or {}).get("role") == "target" for t in fig.data)  # the paper's operating point


def test_report_html_is_self_contained_with_every_figure(tmp_path: Path) -> None:
    csv = tmp_path / "x.csv"
    synthetic().to_csv(csv, index=False)
    from d3.trace import TokenStep, Trace

    steps = [TokenStep(step=i, token_id=1, text="a", layers_run=tuple(range(30 - i)), filled=(), planned=30 - i,
                       entropy=0.0, wall_ms=1.0) for i in range(4)]
    trace = Trace(model="m", num_layers=30, strategy={"strategy": "d3"}, prompt="p", core=(3, 3), steps=tuple(steps))
    block = [{"trace": 0, "layer": l, "attn_cos": 0.9, "attn_dist": 0.1 * l, "mlp_cos": 0.8, "mlp_dist": 0.2,
              "hidden_norm": 1.0} for l in range(30)]
    with open(table.sidecar(csv, "traces.jsonl"), "w") as fh:
        fh.write(json.dumps({"kind": "block", "key": "full depth", "rows": block}) + "\n")
        fh.write(json.dumps({"kind": "layers", "key": "d3 fast ok", "label": "d3 fast ok",
                             "trace": table.slim_trace(trace)}) + "\n")
    out = write_report(csv, tmp_path / "r.html")
    text = out.read_text()
    assert text.count("<script type='text/javascript'>") == 1  # plotly.js once
    assert "<script src" not in text and "<link" not in text  # nothing fetched from elsewhere
    n_figs = len(re.findall(r"Plotly\.newPlot\(", text))
    assert n_figs == 5 + 1 + 1 + 1 + 1  # five Pareto views, per-task delta, layers vs step, Fig. 1's grids, block change
    for heading in ("Headline", "Accuracy difference per task", "Layers vs step", "Which layers each token ran",
                    "Change per block across layers",
                    "At matched mean depth", "Task accuracy beside chance", "All settings"):
        assert heading in text, heading
    assert "d3 fast ok" in text and "<table" in text


def test_report_cli_prints_headline(tmp_path: Path, capsys) -> None:
    import argparse

    csv = tmp_path / "x.csv"
    synthetic(with_accuracy=False).to_csv(csv, index=False)
    parser = argparse.ArgumentParser()
    report_cli.add_parser(parser.add_subparsers())
    args = parser.parse_args(["report", "--results", str(csv), "--out", str(tmp_path / "r.html"),
                              "--summary", str(tmp_path / "s.md")])
    assert args.func(args) == 0
    printed = capsys.readouterr().out
    assert "d3" in printed and "wrote" in printed and (tmp_path / "r.html").is_file()
    md = (tmp_path / "s.md").read_text()
    assert "## At matched mean depth" in md and "| target_depth | strategy |" in md
    assert md.count("\n| ") >= len(synthetic()) * 2 - 1  # matched rows + every setting


def test_committed_results_are_modest_complete_and_summarised() -> None:
    root = Path(__file__).resolve().parent.parent / "results"
    csv = root / "smollm2_sweep.csv"
    assert csv.stat().st_size < 1_000_000
    df = table.read_results(csv)
    assert set(COLUMNS) <= set(df.columns) and df["key"].is_unique
    assert set(df["strategy"]) == {"full", "d3", "skipdecode", "unified", "early_exit"}
    tasks = report.task_frame(df)
    assert len(tasks) == 5 * len(df) and tasks["chance"].between(0.05, 0.5).all()  # chance beside every accuracy
    full = df[df["strategy"] == "full"].iloc[0]
    assert full["accuracy"] > full["chance"]  # the model is above chance on the task set as a whole
    summary = (root / "SUMMARY.md").read_text(encoding="utf-8")
    assert report.headline(df)["text"] in summary  # the committed summary is the one these results give


def test_committed_unified_rows_were_measured_with_even_spacing() -> None:
    """The committed Unified rows ran the default schedule (kept layers evenly spaced), not the old integer rule."""
    df = table.read_results(Path(__file__).resolve().parent.parent / "results" / "smollm2_sweep.csv")
    unified = [json.loads(p) for p in df.loc[df["strategy"] == "unified", "params"]]
    assert len(unified) == 3 and all(p.get("spacing") == "even" for p in unified)


def test_committed_generation_accuracy_is_summarised() -> None:
    """The committed generation sweep: every strategy at matched depth, the paper's criterion in SUMMARY.md's
    headline and a section whose heading starts with "Generation accuracy", each accuracy beside its zero line."""
    from d3.reports.generation import generation_markdown, headline_lines
    from d3.research.sweep.generation import read_generation

    root = Path(__file__).resolve().parent.parent / "results"
    gen = read_generation(root / "smollm2_generation.csv")
    assert set(gen["strategy"]) == {"full", "d3", "skipdecode", "unified", "early_exit"} and gen["key"].is_unique
    full = gen[gen["strategy"] == "full"].iloc[0]
    assert full["questions"] >= 150 and full["accuracy"] > full["chance"] + 0.2  # measurably above its zero line
    assert (gen["ci_low"] <= gen["accuracy"]).all() and (gen["accuracy"] <= gen["ci_high"]).all()
    summary = (root / "SUMMARY.md").read_text(encoding="utf-8")
    assert generation_markdown(gen) in summary and "\n## Generation accuracy" in summary
    criterion = headline_lines(gen)[1].replace("**", "")
    assert criterion in summary.split("## At matched mean depth")[0]  # in the headline, beside perplexity's
