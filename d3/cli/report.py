"""`python -m d3 report`: the HTML report, the headline and a markdown summary from a sweep's CSV."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from d3.cli.common import CliError, check_input_file, check_output_file
from d3.config import STRATEGIES
from d3.reports.sweep import headline, summary_markdown
from d3.research.sweep.table import read_results


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser("report", help="HTML report and headline from a sweep's CSV")
    p.add_argument("--results", required=True, help="the sweep's CSV")
    p.add_argument("--out", default="report.html")
    p.add_argument("--title", default=None)
    p.add_argument("--summary", default=None, help="also write a markdown summary here")
    p.add_argument("--generation", default=None, help="a generation-accuracy sweep's CSV (`sweep --task-mode "
                   "generate`): its section is added to the summary and its headline printed")
    p.set_defaults(func=main)
    return p


def main(args: argparse.Namespace) -> int:
    check_input_file(args.results, "--results", f"run `python -m d3 sweep --out {args.results}` first")
    check_output_file(args.out, "--out")
    if args.summary:
        check_output_file(args.summary, "--summary")
    if args.generation:
        check_input_file(args.generation, "--generation",
                         f"run `python -m d3 sweep --task-mode generate --out {args.generation}` first")
    check_sweep_results(args.results)
    gen, generation, criterion = _generation(args.generation)
    out = write_report(args.results, args.out, title=args.title, generation=gen)
    df = read_results(args.results)
    if args.summary:
        text = summary_markdown(df, title=args.title or "Sweep summary", extra_headline=criterion)
        Path(args.summary).write_text(text + ("\n" + generation if generation else ""), encoding="utf-8")
    print(headline(df)["text"])
    if generation:
        print("\n" + generation.split("\n### ")[0].strip())
    print(f"\nwrote {out} ({out.stat().st_size / 1e6:.1f} MB)")
    return 0


def write_report(results: str | Path, out: str | Path, *, title: str | None = None, generation: Any = None) -> Path:
    """The HTML report of the sweep CSV `results` (and of a generation sweep's table), written to `out`: the tables
    and headline from `d3.reports`, drawn by `viz.report`. The engine never imports viz: this command, which wires
    the two together, loads it only when it writes a report."""
    from d3.reports import generation as gen_report
    from d3.reports import sweep as rep
    from viz.report import GenerationParts, ReportParts, write_html

    df = read_results(results)
    records = rep.load_records(results)
    parts = ReportParts(
        results=df, context=rep.context_text(df), headline=rep.headline(df)["text"], matched=rep.matched_table(df),
        matched_columns=rep.MATCHED_COLUMNS, tasks=rep.task_frame(df), task_table=rep.task_table(df),
        table_columns=rep.TABLE_COLUMNS, traces=rep.layer_traces(records, df), blocks=rep.block_frame(records),
        metrics=rep.PARETO_METRICS, accuracy_limit=rep.ACC_LIMIT,
        generation=None if generation is None else GenerationParts(
            gen_report.HEADING, gen_report.headline_lines(generation), gen_report.matched_table(generation),
            generation))
    return write_html(parts, out, title=title or f"D3 sweep: {Path(results).name}")


# What makes a CSV a sweep's results (d3.research.sweep.table.COLUMNS): a row per setting, with these at least.
SWEEP_KEY_COLUMNS = ("key", "strategy", "label", "params", "mean_layers", "measured_speedup")


def check_sweep_results(path: str) -> None:
    """Refuse, in one line and before any report is written, a --results file that is not a sweep's CSV (another
    CSV, JSON, broken text) or holds no full-depth row, or whose traces file is not JSON lines: a report of it
    would claim what nothing measured."""
    import pandas as pd

    hint = f"run `python -m d3 sweep --out {path}` first"
    try:
        head = pd.read_csv(path, nrows=1000, dtype=str)
    except (ValueError, UnicodeDecodeError, pd.errors.ParserError) as err:
        raise CliError(f"--results {path} is not a sweep's CSV ({str(err).splitlines()[0][:80]}): {hint}") from None
    missing = [c for c in SWEEP_KEY_COLUMNS if c not in head.columns]
    if missing:
        raise CliError(f"--results {path} is not a sweep's CSV: it has no {', '.join(missing)} column: {hint}")
    unknown = sorted(set(head["strategy"].dropna()) - set(STRATEGIES))
    if unknown:
        raise CliError(f"--results {path} names strategies a sweep never writes ({', '.join(unknown)[:80]}): {hint}")
    if "full" not in set(head["strategy"]):
        raise CliError(f"--results {path} has no full-depth row, the reference every figure is measured against: {hint}")
    traces = read_results_sidecar(path)
    if traces.is_file():
        for number, line in enumerate(traces.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            try:
                if line.strip():
                    json.loads(line)
            except ValueError:
                raise CliError(f"{traces} line {number} is not JSON: remove the file or run the sweep again") from None


def read_results_sidecar(path: str) -> Path:
    from d3.research.sweep.table import sidecar

    return sidecar(path, "traces.jsonl")


def _generation(path: str | None) -> tuple[Any, str, list[str]]:
    """A generation sweep's table, its summary section and its headline line (None, "", [] without one)."""
    if not path:
        return None, "", []
    from d3.reports.generation import generation_markdown, headline_lines
    from d3.research.sweep.generation import read_generation

    gen = read_generation(path)
    criterion = "Generation accuracy (the paper's measure, section below): " + headline_lines(gen)[1].replace("**", "")
    return gen, generation_markdown(gen), [criterion]
