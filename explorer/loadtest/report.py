"""What the load test found: counts, latencies, memory, cross-talk, and the verdict against its targets."""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from explorer.loadtest.client import Outcome, Tokens, is_prefix


@dataclass
class Report:
    """The figures the load test prints (and writes with --json)."""

    model: str
    planned: dict[str, int] = field(default_factory=dict)
    completed: dict[str, int] = field(default_factory=dict)
    errors: Counter = field(default_factory=Counter)
    crosstalk: int = 0
    crosstalk_examples: list[str] = field(default_factory=list)
    latency_s: dict[str, dict[str, float]] = field(default_factory=dict)
    rss_mib: dict[str, float] = field(default_factory=dict)
    rss_series_mib: list[float] = field(default_factory=list)
    max_in_flight: int = 0
    distinct_references: int = 0  # different seeds must give different tokens, or cross-talk could hide
    server_tracebacks: int = 0
    server_log_tail: str = ""  # kept when the server logged a traceback
    timed_out: bool = False
    wall_s: float = 0.0
    failures: list[str] = field(default_factory=list)

    @property
    def rss_growth_pct(self) -> float:
        base, end = self.rss_mib.get("after_warmup", float("nan")), self.rss_mib.get("end", float("nan"))
        return (end - base) / base * 100 if base > 0 else float("nan")

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["errors"] = dict(self.errors)
        data["rss_growth_pct"] = self.rss_growth_pct
        return data


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"n": 0, "p50": float("nan"), "p95": float("nan"), "max": float("nan")}
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, max(0, round(0.95 * len(ordered)) - 1))]
    return {"n": len(values), "p50": statistics.median(ordered), "p95": p95, "max": ordered[-1]}


def check(report: Report, outcome: Outcome, reference: Tokens | None, who: str) -> None:
    """Count the outcome; a finished run whose tokens differ from its solo reference is cross-talk."""
    if outcome.error:
        report.errors[outcome.error] += 1
        return
    if reference is None:
        report.errors["no solo reference to check against"] += 1
        return
    exported_ok = outcome.exported is None or outcome.exported == reference.d3
    streamed_ok = all(is_prefix(t, reference) for t in outcome.streamed)
    if outcome.tokens != reference or not exported_ok or not streamed_ok:
        report.crosstalk += 1
        if len(report.crosstalk_examples) < 5:
            report.crosstalk_examples.append(f"{who}: seed {outcome.spec.seed}: got {outcome.tokens} "
                                             f"(export {outcome.exported}), solo run gave {reference}")


def judge(report: Report, max_growth: float) -> None:
    if report.completed.get("references", 0) > 1 and report.distinct_references < 2:
        report.failures.append("every solo run gave the same tokens: cross-talk would not show")
    if report.crosstalk:
        report.failures.append(f"{report.crosstalk} run(s) differ from their solo reference (cross-talk)")
    if report.errors:
        report.failures.append(f"{sum(report.errors.values())} error(s): {dict(report.errors)}")
    if report.server_tracebacks:
        report.failures.append(f"{report.server_tracebacks} traceback(s) in the server log")
    for phase, planned in report.planned.items():
        if report.completed.get(phase, 0) < planned:
            report.failures.append(f"{phase}: {report.completed.get(phase, 0)} of {planned} completed"
                                   + (" (time limit reached)" if report.timed_out else ""))
    growth = report.rss_growth_pct
    if not growth < max_growth:  # NaN (never measured) fails too
        report.failures.append(f"server RSS grew {growth:.1f}% after the warm-up (target < {max_growth}%)")


def _latency_text(d: dict[str, float] | None) -> str:
    if not d or not d["n"]:
        return "n/a"
    return f"p50 {d['p50']:.2f} s, p95 {d['p95']:.2f} s, max {d['max']:.2f} s (n={d['n']})"


def render(report: Report) -> str:
    lat, rss = report.latency_s, report.rss_mib
    lines = [
        f"model: {report.model}    wall time: {report.wall_s:.0f} s"
        + ("    TIME LIMIT REACHED" if report.timed_out else ""),
        f"requests completed: solo references {report.completed.get('references', 0)}, "
        f"concurrent {report.completed.get('concurrent', 0)}/{report.planned['concurrent']} "
        f"(max {report.max_in_flight} in flight), in a row {report.completed.get('endurance', 0)}/"
        f"{report.planned['endurance']}",
        f"errors: {sum(report.errors.values())}" + (f" {dict(report.errors)}" if report.errors else ""),
        f"cross-talk (streamed tokens or export differ from the solo run): {report.crosstalk}    "
        f"(distinct solo outputs: {report.distinct_references} of {report.completed.get('references', 0)})",
        *[f"  {e}" for e in report.crosstalk_examples],
        f"latency, concurrent: {_latency_text(lat.get('concurrent'))}",
        f"latency, in a row:   {_latency_text(lat.get('endurance'))}",
        "server RSS (MiB): " + ", ".join(f"{k} {v:.1f}" for k, v in rss.items()),
        f"RSS growth after warm-up: {report.rss_growth_pct:+.2f}%    series every 10 runs: {report.rss_series_mib}",
        f"tracebacks in the server log: {report.server_tracebacks}",
        *([report.server_log_tail] if report.server_log_tail else []),
        "RESULT: " + ("PASS" if not report.failures else "FAIL\n  " + "\n  ".join(report.failures)),
    ]
    return "\n".join(lines)
