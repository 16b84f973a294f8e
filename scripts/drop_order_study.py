"""Which layers can this model spare? Calibrate drop orders with every signal, then score single-layer removals
free-running on the test questions and rank-correlate each signal's single-drop scores with them.

Usage: python scripts/drop_order_study.py [--model smollm2-135m] [--out results/drop_order_smollm2.json]
Resumable: calibrations are cached (`d3.calibrate`), and the single-drop test scores are kept in --out as they come.
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

from d3 import calibrate as cal
from d3.cli import load_engine
from d3.config import StaticSkipConfig
from d3.gentasks import DEFAULT_GENERATION_TASKS, get_generation_task
from d3.sweep.generation import answer_batch

# (signal, calibration set, greedy steps): the rest of each order follows by single-drop score.
PLAN = (("agreement", "prompts", None), ("task", "task", 6), ("agreement", "task", 4), ("perplexity", "text", 6))


def _set(kind: str, tasks: tuple[str, ...]) -> cal.CalibrationSet:
    return {"prompts": cal.prompts_set, "text": cal.text_set}.get(kind, lambda: cal.task_set(tasks))()


def test_accuracy(engine, tasks, removed: tuple[int, ...], batch: int = 32) -> tuple[int, int]:
    """(right, asked) on the test questions with `removed` skipped after the first token."""
    right = asked = 0
    for name in tasks:
        task = get_generation_task(name)
        questions = task.split("test")
        for i in range(0, len(questions), batch):
            answers, _ = answer_batch(engine, task, questions[i:i + batch], StaticSkipConfig(skip=removed))
            right, asked = right + sum(a.correct for a in answers), asked + len(answers)
    return right, asked


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--out", default="results/drop_order_smollm2.json")
    p.add_argument("--tasks", default=",".join(DEFAULT_GENERATION_TASKS))
    p.add_argument("--only", default="", help="comma-separated parts: calibrate,single")
    args = p.parse_args()
    args.device, args.dtype = "auto", "float32"
    tasks = tuple(t for t in args.tasks.split(",") if t)
    parts = set(args.only.split(",")) if args.only else {"calibrate", "single"}
    out = Path(args.out)
    result = json.loads(out.read_text()) if out.is_file() else {}
    engine = load_engine(args)
    L = engine.num_layers
    head, tail = cal.D3Config().core(L)
    flex = list(range(head, L - tail))
    result.update(model=engine.name, num_layers=L, core=[head, tail], tasks=list(tasks))
    save = lambda: out.write_text(json.dumps(result, indent=1))  # noqa: E731
    if "calibrate" in parts:
        result.setdefault("calibrations", {})
        for signal, kind, steps in PLAN:
            t0 = time.perf_counter()
            c = cal.calibrate(engine, signal, _set(kind, tasks), steps=steps,
                              progress=lambda d, t, w: print(f"\r{signal}/{kind} [{d}/{t}] {w}   ", end="", file=sys.stderr))
            print(f"\n{c.name}: {c.order[:8]} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
            result["calibrations"][f"{signal}/{kind}"] = c.to_dict()
            save()
    if "single" in parts:
        single = result.setdefault("single_test", {})
        if "full" not in single:
            single["full"] = test_accuracy(engine, tasks, ())
        for layer in flex:
            if str(layer) not in single:
                t0 = time.perf_counter()
                single[str(layer)] = test_accuracy(engine, tasks, (layer,))
                print(f"drop {layer}: {single[str(layer)]} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
                save()
        em = pd.Series({int(k): r / n for k, (r, n) in single.items() if k != "full"})
        corr = {}
        for key, c in result.get("calibrations", {}).items():
            scores = pd.Series({int(k): v for k, v in c["single"].items()})
            sign = 1 if cal.HIGHER_IS_BETTER[c["signal"]] else -1
            corr[key] = round(float((sign * scores).corr(em, method="spearman")), 3)
        result["spearman_single_vs_test_em"] = corr
        save()
        print(json.dumps(corr), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
