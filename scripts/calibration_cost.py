"""What an agreement calibration's scored removal costs, side by side in one run: full depth held as what KL needs
under a linear head (`d3.teacher_forced`: sum p log p, pW, pb per position) against full depth's log-probs
(kept where small, else read out again at every score, as before). Both score the same removals, alternated
(ABBA); prints the CPU seconds per removal, their ratio, and that the scores agree.

Usage: python scripts/calibration_cost.py [--model gemma3-270m] [--tasks gen_1_digit_addition,...] [--per-task 40]
       [--layers 4,9,12]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from d3.cli import load_engine  # noqa: E402
from d3.research.calibrate import _own_answers  # noqa: E402
from d3.research.calibration_sets import CalibrationSet  # noqa: E402


def timed(forced, removed: tuple[int, ...]) -> tuple[float, float, float]:
    """CPU seconds of one scored removal (nothing reused from an earlier one), its agreement and KL."""
    for part in forced.parts:
        part._base = None
    c0 = time.process_time()
    score = forced.score(removed, "agreement")
    return time.process_time() - c0, score.value, score.kl


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="gemma3-270m")
    p.add_argument("--tasks", default="gen_1_digit_addition,gen_1_digit_multiplication,gen_counting")
    p.add_argument("--per-task", type=int, default=40)
    p.add_argument("--layers", default="4,9,12", help="single removals to score")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    args.device, args.dtype = "auto", "float32"
    engine = load_engine(args)
    tasks = tuple(args.tasks.split(","))
    cal_set = CalibrationSet("cost", tasks=tasks, chat_template=False, val_limit=args.per_task)
    summary = _own_answers(engine, cal_set, 64)
    real = engine.adapter.linear_head
    engine.adapter.linear_head = lambda: None  # the log-probs way, as before
    try:
        reference = _own_answers(engine, cal_set, 64)
    finally:
        engine.adapter.linear_head = real
    positions = sum(part.positions_scored for part in summary.parts)
    print(f"{engine.name}: {positions} scored positions over {len(tasks)} tasks x {args.per_task} validation questions, "
          f"vocabulary {engine.adapter.model.lm_head.out_features}")
    costs: dict[str, list[float]] = {"summary": [], "log-probs": []}
    for layer in (int(x) for x in args.layers.split(",")):
        order = (("summary", summary), ("log-probs", reference))
        got = {}
        for name, forced in (*order, *order[::-1]):  # ABBA
            seconds, value, kl = timed(forced, (layer,))
            costs[name].append(seconds)
            got[name] = (value, kl)
        (a, ka), (b, kb) = got["summary"], got["log-probs"]
        print(f"without layer {layer}: agreement {a:.5f} / {b:.5f}, KL {ka:.6f} / {kb:.6f} (summary / log-probs)")
    s, r = statistics.median(costs["summary"]), statistics.median(costs["log-probs"])
    print(f"CPU seconds per scored removal (median of {len(costs['summary'])}): summary {s:.2f}, log-probs {r:.2f}: "
          f"{r / s:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
