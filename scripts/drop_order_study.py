"""Which layers can a model spare, and at what cost? Every drop order and baseline swept over alpha on generated test
questions, each setting's accuracy as a paired difference from full depth with its exact 95% interval, at the
depth it actually ran, with its measured speedup; the SUMMARY section and the README's numbers from the results.

Usage: python scripts/drop_order_study.py [--models smollm2-135m,gemma3-270m] [--test-limit 500] [--only PARTS]
Resumable: each model's results go to results/drop_order_<model>.json as every setting finishes; a rerun skips what
is there (calibrations are cached by d3.research.calibrate). Progress with the time left goes to stderr.
Parts: screen (full depth on validation, drops tasks the model cannot do), calibrate (on validation only), sweep
(test only), report (results/SUMMARY.md's "Drop order" sections and the README's table rows; no model needed).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from d3.cli import load_engine
from d3.config import FullConfig
from d3.research import calibrate as cal
from d3.research.answers import PrefilledQuestions
from d3.research.calibration_sets import CalibrationSet
from d3.research.gentasks import SYNTHETIC_TASKS, get_generation_task
from d3.research.study import NAMED_ORDERS, TARGETS, Eta, QuestionSet, paired_row, screen_tasks, settings, timing_pairs

VERSION = 2  # results of the paired, swept study (version 1 held one alpha per target depth, unpaired)
SHORT = {"smollm2-135m": "smollm2", "gemma3-270m": "gemma3"}
PLAN = (("agreement", 4), ("task", 4))  # (signal, greedy steps) on the kept tasks' validation questions


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def out_path(folder: Path, model: str) -> Path:
    return folder / f"drop_order_{SHORT.get(model, model)}.json"


def load(path: Path) -> dict:
    result = json.loads(path.read_text()) if path.is_file() else {}
    return result if result.get("version") == VERSION else {"version": VERSION}


def calibrations(engine, result: dict, tasks: list[str], val_limit: int, save) -> dict[str, dict]:
    """The plan's calibrated orders on the validation questions (cached), as D3Config fields by name."""
    cal_set = CalibrationSet(f"task:{'+'.join(tasks)}:{val_limit}", tasks=tuple(tasks), chat_template=False,
                             val_limit=val_limit)
    done = result.setdefault("calibrations", {})
    for signal, steps in PLAN:
        if signal not in done:
            t0 = time.perf_counter()
            c = cal.calibrate(engine, signal, cal_set, steps=steps,
                              progress=lambda d, t, w: print(f"\r{signal} [{d}/{t}] {w}   ", end="", file=sys.stderr))
            done[signal] = {"order": list(c.order), "steps": steps, "val_questions": val_limit * len(tasks),
                            "seconds": round(time.perf_counter() - t0, 1)}
            say(f"\ncalibrated by {signal}: {c.order[:8]} ({done[signal]['seconds']:.0f} s)")
            save()
    return {f"calibrated {s}": {"drop_order": "calibrated", "layer_order": tuple(c["order"])} for s, c in done.items()}


def sweep(engine, result: dict, tasks: list[str], orders: dict, args, save) -> None:
    """Full depth, then every setting not yet in the results, on the test questions only."""
    test = QuestionSet(engine, tasks, "test", limit=args.test_limit, batch=args.batch)
    first = get_generation_task(tasks[0])
    timing_q = PrefilledQuestions(engine, first, first.split("test")[:args.timing_questions], batch=args.timing_questions)
    result.update(test_sizes=test.sizes)
    rows = result.setdefault("settings", {})
    todo = settings(engine.num_layers, orders, [float(t) for t in args.targets.split(",")])
    eta = Eta(total=1 + len(todo), say=say, done=sum(1 for k in ["full depth", *todo] if k in rows))
    if "full depth" not in rows:
        full = test.run(FullConfig())
        rows["full depth"] = {"accuracy": round(full.accuracy, 5), "right": sum(full.correct), "asked": len(full.correct),
                              "mean_layers": full.mean_layers, "tokens": full.tokens, "seconds": round(full.seconds, 2),
                              "cpu_seconds": round(full.cpu_seconds, 2),
                              "qps": round(len(full.correct) / full.seconds, 3), "answers": list(full.answers),
                              "bits": "".join("1" if c else "0" for c in full.correct),
                              **timing_pairs(timing_q, FullConfig(), args.pairs)}
        save()
        eta.tick("full depth", full.seconds, f"{100 * full.accuracy:.1f}% of {len(full.correct)}, "
                 f"{rows['full depth']['qps']:.2f} questions/s; full against itself "
                 f"{rows['full depth']['measured_speedup']:.2f}x")
    from d3.research.study import Outcome

    ref = rows["full depth"]
    full = Outcome(tuple(b == "1" for b in ref["bits"]), tuple(ref["answers"]), ref["mean_layers"], ref["tokens"], ref["seconds"])
    for label, cfg in todo.items():
        if label in rows:
            continue
        t0 = time.perf_counter()
        row = paired_row(full, test.run(cfg), test.sizes)
        row.update(timing_pairs(timing_q, cfg, args.pairs), config=cfg.to_dict())
        rows[label] = row
        save()
        eta.tick(label, time.perf_counter() - t0, f"{row['mean_layers']:.2f} layers, accuracy "
                 f"{100 * row['diff']['diff']:+.1f} [{100 * row['diff']['low']:+.1f}, {100 * row['diff']['high']:+.1f}] "
                 f"pts, {row['measured_speedup']:.2f}x, {row['qps']:.2f} q/s")


def run_model(model: str, args, parts: set[str]) -> Path:
    path = out_path(Path(args.out_dir), model)
    result = load(path)
    save = lambda: path.write_text(json.dumps(result, indent=1))  # noqa: E731
    if args.partial is not None and path.is_file():
        result.update(partial=args.partial) if args.partial else result.pop("partial", None)
        save()
    if not parts & {"screen", "calibrate", "sweep"}:
        return path
    args.model, args.device, args.dtype = model, "auto", "float32"
    engine = load_engine(args)
    result.update(model=engine.name, num_layers=engine.num_layers, core=list(cal.D3Config().core(engine.num_layers)),
                  started=result.get("started", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())))
    if "screen" not in result:
        say(f"{model}: full depth on {args.screen} validation questions per task ...")
        result["screen"] = screen_tasks(engine, args.tasks.split(","), args.screen, batch=args.batch, say=say)
        save()
    tasks = [t for t, v in result["screen"].items() if v["kept"]]
    say(f"{model}: tasks kept {tasks}; dropped {[t for t, v in result['screen'].items() if not v['kept']]}")
    result["tasks"] = tasks
    orders = {o: {"drop_order": o} for o in NAMED_ORDERS}
    if "calibrate" in parts:
        orders.update(calibrations(engine, result, tasks, args.val_limit, save))
    if "sweep" in parts:
        sweep(engine, result, tasks, orders, args, save)
    result["test_limit"] = args.test_limit
    save()
    return path


def write_curves(study: dict, path: Path) -> Path:
    """An HTML page with the two curves: accuracy difference vs layers run, and vs measured speedup."""
    from d3.reports.drop_order import curve_points
    from viz.results import paired_curves

    L = study["num_layers"]
    figs = [paired_curves(curve_points(study, "layers"), x="layers", x_title=f"mean layers run per token (of {L})",
                          title=f"{study['model']}: accuracy against depth actually run"),
            paired_curves(curve_points(study, "speedup"), x="speedup", x_title="measured speedup (ABBA pairs, median)",
                          title=f"{study['model']}: accuracy against measured speedup")]
    body = "\n".join(f.to_html(full_html=False, include_plotlyjs=i == 0) for i, f in enumerate(figs))  # plotly.js once
    path.write_text(f"<!doctype html><meta charset='utf-8'><title>Drop order: {study['model']}</title>\n{body}\n",
                    encoding="utf-8")
    return path


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="smollm2-135m,gemma3-270m")
    p.add_argument("--tasks", default=",".join(SYNTHETIC_TASKS), help="candidate tasks (screened on validation)")
    p.add_argument("--screen", type=int, default=48, help="validation questions per task for the screen")
    p.add_argument("--val-limit", type=int, default=100, help="validation questions per task for calibration")
    p.add_argument("--test-limit", type=int, default=500, help="test questions per task")
    p.add_argument("--targets", default=",".join(map(str, TARGETS)), help="planned mean depths (fractions of L)")
    p.add_argument("--pairs", type=int, default=3, help="ABBA timing pairs per setting")
    p.add_argument("--timing-questions", type=int, default=16)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--out-dir", default="results")
    p.add_argument("--summary", default="results/SUMMARY.md")
    p.add_argument("--readme", default="README.md")
    p.add_argument("--partial", default=None, help="mark the results as a partial run, described so ('' unmarks)")
    p.add_argument("--only", default="", help="comma-separated parts: screen,calibrate,sweep,report")
    args = p.parse_args()
    parts = set(args.only.split(",")) if args.only else {"screen", "calibrate", "sweep", "report"}
    started = time.perf_counter()
    paths = [run_model(m, args, parts) for m in args.models.split(",") if m]
    if "report" in parts:
        from d3.reports.drop_order import write_readme, write_section

        studies = [s for s in (load(p) for p in paths) if s.get("settings")]  # measured with this version
        for study, path in ((s, out_path(Path(args.out_dir), s["model"])) for s in studies):
            say(f"wrote {write_section(args.summary, study)} and {write_curves(study, path.with_suffix('.html'))}")
        say(f"wrote {write_readme(args.readme, studies)}")
    say(f"done in {(time.perf_counter() - started) / 60:.1f} min")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
