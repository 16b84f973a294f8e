"""Which layers can this model spare? Calibrate drop orders with every signal, then score single-layer removals
free-running on the test questions and rank-correlate each signal's single-drop scores with them.

Usage: python scripts/drop_order_study.py [--model smollm2-135m] [--out results/drop_order_smollm2.json]
Resumable: calibrations are cached (`d3.research.calibrate`), and the single-drop test scores are kept in --out as they come.
The generation-accuracy sweep with every order at matched depth is `python -m d3 sweep --task-mode generate
--task-split test --drop-orders ...` (see the README's "Drop order" section for the command).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import pandas as pd

from d3.research import calibrate as cal
from d3.cli import load_engine
from d3.config import StaticSkipConfig
from d3.research.gentasks import DEFAULT_GENERATION_TASKS, get_generation_task
from d3.research.answers import PrefilledQuestions
from d3.config import D3Config, FullConfig
from d3.research.sweep.generation import wilson
from d3.research.sweep.grid import d3_for_depth, skipdecode_for_depth, unified_for_depth

# (signal, calibration set, greedy steps): the rest of each order follows by single-drop score.
PLAN = (("agreement", "prompts", None), ("task", "task", 5), ("agreement", "task", 4), ("perplexity", "text", 6))
NAMED_ORDERS = ("middle_out", "bottom_up", "top_down")
DEPTHS = (29, 28, 27, 26, 24)  # target mean layers per answer token (of 30), matched over ANSWER_TOKENS
ANSWER_TOKENS = 20  # a worked answer's length in tokens (about 19 on SmolLM2), the span D3's decay is matched over


def _set(kind: str, tasks: tuple[str, ...]) -> cal.CalibrationSet:
    return {"prompts": cal.prompts_set, "text": cal.text_set}.get(kind, lambda: cal.task_set(tasks))()


class TestQuestions:
    """The test questions of the tasks, prefilled once (d3.research.answers)."""

    def __init__(self, engine, tasks) -> None:
        self.sets = [PrefilledQuestions(engine, get_generation_task(n), get_generation_task(n).split("test")) for n in tasks]

    def run(self, strategy) -> dict:
        answers = [q.answer(strategy) for q in self.sets]
        right = sum(sum(a.correct) for a in answers)
        asked = sum(len(a.correct) for a in answers)
        tokens = [len(a.correct) for a in answers]
        layers = sum(a.mean_layers * n for a, n in zip(answers, tokens)) / sum(tokens)  # per-task means, question-weighted
        low, high = wilson(right, asked)
        return {"right": right, "asked": asked, "accuracy": right / asked, "ci": [round(low, 4), round(high, 4)],
                "mean_layers": round(layers, 3), "per_task": [round(a.accuracy, 4) for a in answers]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--out", default="results/drop_order_smollm2.json")
    p.add_argument("--tasks", default=",".join(DEFAULT_GENERATION_TASKS))
    p.add_argument("--depths", default=",".join(map(str, DEPTHS)), help="target mean layers per answer token")
    p.add_argument("--plan", default="", help="calibrations as signal/set/steps, comma-separated (default: PLAN)")
    p.add_argument("--only", default="", help="comma-separated parts: calibrate,single,sweep,report")
    p.add_argument("--summary", default="results/SUMMARY.md", help="where the report part writes its section")
    args = p.parse_args()
    args.device, args.dtype = "auto", "float32"
    tasks = tuple(t for t in args.tasks.split(",") if t)
    parts = set(args.only.split(",")) if args.only else {"calibrate", "single", "sweep", "report"}
    out = Path(args.out)
    result = json.loads(out.read_text()) if out.is_file() else {}
    if parts == {"report"}:
        from d3.reports.drop_order import write_section

        print(f"wrote {write_section(args.summary, result)}", file=sys.stderr)
        return 0
    engine = load_engine(args)
    L = engine.num_layers
    head, tail = cal.D3Config().core(L)
    flex = list(range(head, L - tail))
    result.update(model=engine.name, num_layers=L, core=[head, tail], tasks=list(tasks))
    save = lambda: out.write_text(json.dumps(result, indent=1))  # noqa: E731
    if "calibrate" in parts:
        result.setdefault("calibrations", {})
        plan = PLAN if not args.plan else [(a, b, int(c)) for a, b, c in (x.split("/") for x in args.plan.split(","))]
        for signal, kind, steps in plan:
            t0 = time.perf_counter()
            c = cal.calibrate(engine, signal, _set(kind, tasks), steps=steps,
                              progress=lambda d, t, w: print(f"\r{signal}/{kind} [{d}/{t}] {w}   ", end="", file=sys.stderr))
            print(f"\n{c.name}: {c.order[:8]} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
            result["calibrations"][f"{signal}/{kind}"] = c.to_dict()
            save()
    test = TestQuestions(engine, tasks) if parts & {"single", "sweep"} else None
    if "single" in parts:
        single = result.setdefault("single_test", {})
        if "full" not in single:
            single["full"] = test.run(FullConfig())
        for layer in flex:
            if str(layer) not in single:
                t0 = time.perf_counter()
                single[str(layer)] = test.run(StaticSkipConfig(skip=(layer,)))
                print(f"drop {layer}: {single[str(layer)]['accuracy']:.3f} ({time.perf_counter() - t0:.0f} s)",
                      file=sys.stderr)
                save()
        em = pd.Series({int(k): v["accuracy"] for k, v in single.items() if k != "full"})
        corr = {}
        for key, c in result.get("calibrations", {}).items():
            scores = pd.Series({int(k): v for k, v in c["single"].items()})
            sign = 1 if cal.HIGHER_IS_BETTER[c["signal"]] else -1
            corr[key] = round(float((sign * scores).corr(em, method="spearman")), 3)
        result["spearman_single_vs_test_em"] = corr
        save()
        print(json.dumps(corr), file=sys.stderr)
    if "sweep" in parts:
        sweep = result.setdefault("sweep", {})
        orders = {o: {"drop_order": o} for o in NAMED_ORDERS}
        for key, c in result.get("calibrations", {}).items():
            orders[f"calibrated {key}"] = {"drop_order": "calibrated", "layer_order": tuple(c["order"])}
        settings = {"full depth": FullConfig()}
        for depth in (int(d) for d in args.depths.split(",")):
            for name, fields in orders.items():
                cfg = d3_for_depth(depth / L, L, ANSWER_TOKENS)
                settings[f"d3 {name} @{depth}"] = D3Config(alpha=cfg.alpha, **fields)
            settings[f"unified @{depth}"] = unified_for_depth(depth / L, L, ANSWER_TOKENS)
            settings[f"skipdecode @{depth}"] = skipdecode_for_depth(depth / L, L, ANSWER_TOKENS)
        for label, cfg in settings.items():
            if label in sweep:
                continue
            t0 = time.perf_counter()
            sweep[label] = {**test.run(cfg), "config": {k: (list(v) if isinstance(v, tuple) else v)
                                                        for k, v in cfg.to_dict().items()}}
            print(f"{label}: {sweep[label]['accuracy']:.3f} at {sweep[label]['mean_layers']:.2f} layers "
                  f"({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
            save()
    if "report" in parts:
        from d3.reports.drop_order import write_section

        print(f"wrote {write_section(args.summary, result)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
