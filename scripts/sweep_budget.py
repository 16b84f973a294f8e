"""The Sweep tab's default settings and tokens, chosen by measurement (issue 44, M4; figures in docs/speed.md).

On one model (the page's first, SmolLM2-135M, unless --model says otherwise) and while another visitor's default Live
run goes on beside it (the Generate handler, again and again: the second of D3_CONCURRENCY's two slots), this
measures the Sweep tab's own sweep (`explorer.sweep_tab.iter_small_sweep`, rows in the tab's order: the full-depth
reference runs, D3's rows, the baselines, full depth timed against itself last) with every setting of the tab's menu,
at each of `--tokens`, without a time limit, and records when each row was done. From that: the reference runs'
seconds and each row's, per token count. The default picked is the candidate whose D3 rows are predicted done
soonest (D3's rows come first, so the settings after them do not delay them: among equals, the most settings, then
the most tokens), the rest measured as the time allows (the tab says how many); "fits" says whether its D3 rows are
done within `--margin` of the tab's limit (SWEEP_MAX_S, 60 s):

    reference runs + the candidate's D3 rows  <=  margin * SWEEP_MAX_S

`--verify` then runs the tab's handler (`explorer.sweep_tab.stream_sweep`, with its limit) on the chosen default
beside the other run and records the note it ends with ("Measured k of n rows within the 60 s limit");
`--verify-only` picks again from the measurement already in `--json` and verifies that.

Usage (one model per process):
    nice -n 5 python scripts/sweep_budget.py --json results/sweep_budget/smollm2-135m.json
    nice -n 5 python scripts/sweep_budget.py --verify-only --json results/sweep_budget/smollm2-135m_verify.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

CANDIDATES = (  # preference order: the matched-depth comparison first, then fewer baselines, D3 always first
    ("d3_67", "skipdecode_67", "unified_67"),
    ("d3_85", "d3_67", "skipdecode_67"),
    ("d3_67", "skipdecode_67"),
    ("d3_67", "unified_67"),
    ("d3_67",),
)


def _pool(model: str) -> Any:
    from default_tokens import run_once

    from explorer.caps import Caps
    from explorer.page import tune_process
    from explorer.pool import ModelPool

    tune_process()  # as the server does
    pool = ModelPool(caps=Caps.from_env())
    pool.engine(model)
    run_once(pool, model, 4)  # warm: the first forward passes allocate (a cold first sweep read 35 s for 2 runs)
    return pool


class Beside:
    """Another visitor's default Live run on the same model, again and again, until stopped."""

    def __init__(self, pool: Any, model: str, count: int) -> None:
        from default_tokens import PAGE_MAX, run_once

        self.stop = threading.Event()
        self.runs = 0

        def other() -> None:
            while not self.stop.is_set():
                run_once(pool, model, PAGE_MAX, self.stop)
                self.runs += 1

        self.threads = [threading.Thread(target=other, daemon=True) for _ in range(count)]

    def __enter__(self) -> Beside:
        for t in self.threads:
            t.start()
        time.sleep(3.0 if self.threads else 0.0)  # past its prefill, decoding
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(600)


def measure_rows(pool: Any, model: str, tokens: int) -> dict[str, Any]:
    """Every menu setting swept in the tab's order, no limit: seconds to the reference and to each row."""
    from d3.models import KNOWN_MODELS
    from explorer import sweep_tab

    spec = sweep_tab.sweep_spec(model, sweep_tab.SWEEP_PROMPT, ["d3_67"], tokens,
                                KNOWN_MODELS[model].facts.chat_template, pool.caps)
    spec = _with_all_menu(spec)
    engine = pool.engine(model)
    started = time.monotonic()
    rows: list[dict[str, Any]] = []
    seen: set[str] = set()
    previous, done = 0.0, -1
    for df in sweep_tab.iter_small_sweep(engine, spec):
        now = time.monotonic() - started
        count = sweep_tab.measured_rows(df)
        if done < 0:
            rows.append({"label": "full-depth reference runs", "strategy": "reference", "seconds": round(now, 1)})
        elif count > done:
            new = [(label, k) for label, k in zip(df["label"], df["strategy"]) if k != "full" and label not in seen]
            label, strategy = new[0] if new else ("full depth against itself", "full-noise")
            seen.add(label)
            rows.append({"label": label, "strategy": strategy, "seconds": round(now - previous, 1)})
        if count > done:
            rows[-1]["done_at_s"] = round(now, 1)
            previous, done = now, count
    return {"tokens": tokens, "rows": rows, "total_s": round(time.monotonic() - started, 1),
            "load_avg": [round(x, 1) for x in os.getloadavg()]}


def _with_all_menu(spec: Any) -> Any:
    """The spec with every setting of the tab's menu (the tab's own request takes at most SWEEP_MAX_SETTINGS)."""
    from dataclasses import replace

    from explorer.sweep_tab import SWEEP_MATCHED_DEPTH, SWEEP_MENU

    depths = tuple(c.depth for c in SWEEP_MENU.values() if c.strategy == "d3")
    baselines = tuple(dict.fromkeys(c.strategy for c in SWEEP_MENU.values() if c.strategy != "d3"))
    return replace(spec, depths=depths, baselines=baselines, baseline_depths=(SWEEP_MATCHED_DEPTH,))


def predict(measured: dict[str, Any], choice: tuple[str, ...]) -> dict[str, float]:
    """Seconds into the tab's sweep of `choice` (at the measured token count) when its D3 rows are done and when all
    its rows are (the reference runs, D3's rows, the baselines, full depth timed against itself)."""
    from explorer.sweep_tab import SWEEP_MENU

    rows = measured["rows"]
    reference = rows[0]["seconds"]  # the reference runs (the first table: the reference row alone)
    settings = [r for r in rows[1:] if r["strategy"] != "full-noise"]
    d3_keys = [k for k, v in SWEEP_MENU.items() if v.strategy == "d3"]
    d3_rows = [r for r in settings if r["strategy"] == "d3"]
    seconds = {}
    for key, c in SWEEP_MENU.items():
        match = d3_rows[d3_keys.index(key):d3_keys.index(key) + 1] if c.strategy == "d3" else \
            [r for r in settings if r["strategy"] == c.strategy]
        seconds[key] = match[0]["seconds"] if match else max(r["seconds"] for r in settings)
    noise = next((r["seconds"] for r in rows if r["strategy"] == "full-noise"), max(seconds.values()))
    d3_done = reference + sum(seconds[k] for k in choice if SWEEP_MENU[k].strategy == "d3")
    return {"d3_done_s": round(d3_done, 1),
            "all_done_s": round(reference + sum(seconds[k] for k in choice) + noise, 1)}


def choose(measured: list[dict[str, Any]], budget_s: float) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every candidate's predictions at every measured token count, and the one picked: its D3 rows done soonest
    (to a second), then the most settings, then the most tokens; "fits": done within `budget_s`."""
    table = [{"settings": list(c), "tokens": m["tokens"], **predict(m, c)} for c in CANDIDATES for m in measured]
    for row in table:
        row["fits"] = row["d3_done_s"] <= budget_s
    best = min(table, key=lambda r: (round(r["d3_done_s"]), -len(r["settings"]), -r["tokens"]))
    return table, best


def verify(pool: Any, model: str, settings: list[str], tokens: int) -> dict[str, Any]:
    """The tab's handler on `settings` at `tokens`, with its limit, beside the other run: the note it ends with."""
    import re

    from d3.models import KNOWN_MODELS
    from explorer import sweep_tab

    started = time.monotonic()
    out: tuple[Any, ...] = ()
    for out in sweep_tab.stream_sweep(pool, model, KNOWN_MODELS[model].facts.chat_template, sweep_tab.SWEEP_PROMPT, settings,
                                      tokens, progress=lambda *a, **k: None):
        pass
    named = dict(zip(sweep_tab.SWEEP_OUTPUTS, out))
    table = named["sweep_table"]
    note = named["sweep_note"]
    counted = re.search(r"Measured (\d+) of (\d+) rows", note)
    return {"settings": settings, "tokens": tokens,
            "seconds": round(time.monotonic() - started, 1), "strategies": table["strategy"].tolist(),
            "measured": int(counted[1]) if counted else None, "planned": int(counted[2]) if counted else None,
            "note": note, "load_avg": [round(x, 1) for x in os.getloadavg()]}


def main(argv: list[str] | None = None) -> int:
    from explorer.sweep_tab import SWEEP_MAX_S

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--tokens", type=int, nargs="+", default=[16, 8], help="token counts to measure (16 8)")
    parser.add_argument("--beside", type=int, default=1, help="other default Live runs beside it (1)")
    parser.add_argument("--margin", type=float, default=0.75, help="share of the 60 s limit a default may use (0.75)")
    parser.add_argument("--verify", action="store_true", help="then run the tab's defaults through its handler")
    parser.add_argument("--verify-only", action="store_true", help="only that")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)
    import torch

    pool = _pool(args.model)
    report: dict[str, Any] = {"model": args.model, "beside": args.beside, "threads": torch.get_num_threads(),
                              "limit_s": SWEEP_MAX_S, "margin": args.margin}
    if args.verify_only and args.json and args.json.is_file():
        report = {**json.loads(args.json.read_text(encoding="utf-8")), **report}
    with Beside(pool, args.model, args.beside) as beside:
        if not args.verify_only:
            report["measured"] = [measure_rows(pool, args.model, t) for t in sorted(args.tokens, reverse=True)]
        if report.get("measured"):
            report["predictions"], report["chosen"] = choose(report["measured"], args.margin * SWEEP_MAX_S)
            print(json.dumps(report["chosen"]), flush=True)
        if args.verify or args.verify_only:
            from explorer.sweep_tab import SWEEP_DEFAULT, SWEEP_DEFAULT_TOKENS

            chosen = report.get("chosen") or {"settings": list(SWEEP_DEFAULT), "tokens": SWEEP_DEFAULT_TOKENS}
            report["verify"] = verify(pool, args.model, list(chosen["settings"]), int(chosen["tokens"]))
            print(json.dumps(report["verify"]), flush=True)
        report["other_runs_beside"] = beside.runs
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1, default=lambda o: asdict(o)) + "\n", encoding="utf-8")
    print(json.dumps(report.get("predictions"), indent=None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
