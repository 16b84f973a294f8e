"""Which layers can a model spare, and at what cost? D3 orders swept over alpha and start on generated test questions,
each setting's accuracy as a paired difference from full depth with its exact 95% interval beside the same-answer
rate (exact), at the depth it actually ran; the headline settings chosen on accuracy alone, then replicated on a
fresh seed's questions and timed per token against theory; the SUMMARY section and the README's rows from the results.

Usage: python scripts/drop_order_study.py [--models smollm2-135m,gemma3-270m] [--tasks gen_...] [--max-tasks N]
       [--test-limit 100] [--stage1 25] [--targets 0.97,0.93,0.88] [--starts 0,8] [--orders ...] [--only PARTS]
Tasks: generated ones with room (d3.research.gentasks.ROOMY_TASKS; a task without room is refused), screened per
model on validation (d3.research.study.screen_rule: full depth >= 70% of 32, task by task, resumable), the same
number of test questions for every kept task. Sequential: every setting answers the first --stage1 test questions
of each task; those whose paired interval can still show a loss of at most --go-on (3 points) answer the rest.
Headlines (per bound, 1 and 3 points): the fewest layers whose loss's 95% upper bound is within the bound; each is
answered again on --fresh-seed's test questions (as many per task) beside full depth there, and timed in
--pairs (>= 8) ABBA pairs per generated token, one thread both sides, on the first --timing-per-task test
questions of each task, after it was chosen.
Resumable: each model's results go to results/drop_order_<model>.json as every part finishes; a rerun (with the same
--tasks) skips what is there (calibrations are cached by d3.research.calibrate). Progress goes to stderr.
--jobs 2 measures two models at once, one process each. Parts: screen, calibrate (validation only), sweep (test
only, with the headlines' fresh seed and timing), report (results/SUMMARY.md's "Drop order" sections and the
README's rows; no model needed).
The 28-layer qwen2.5-coder-1.5b (needs the model from the `deep` branch), bounded at about 2 hours on an idle
2-core machine: see docs/drop_order.md ("The 28-layer model").
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from d3.cli import load_engine
from d3.config import FullConfig
from d3.research import calibrate as cal
from d3.research.answers import PrefilledQuestions
from d3.research.calibration_sets import CalibrationSet
from d3.research.gentasks import ROOM, ROOMY_TASKS, get_generation_task
from d3.research.stats import exact_difference
from d3.research.study import (
    COLLAPSE,
    GO_ON,
    NAMED_ORDERS,
    SCREEN_MIN,
    SCREEN_QUESTIONS,
    STARTS,
    TARGETS,
    TIMING_PAIRS,
    Eta,
    Outcome,
    QuestionSet,
    collapsed,
    curve_name,
    goes_on,
    paired_row,
    per_token_timing,
    same_run,
    screen_rule,
    screen_tasks,
    settings,
)

VERSION = 4  # 4: roomy tasks, screened at 80%, balanced, fresh seed, start axis, per-token timing; 3: the sequential, paired, swept study (2: every setting on every question; 1: one alpha per target, unpaired)
SHORT = {"smollm2-135m": "smollm2", "gemma3-270m": "gemma3", "qwen2.5-coder-1.5b": "qwen25coder"}
# (signal, greedy steps, validation questions per task) on the kept tasks. Each greedy step scores every flex layer
# left (24, 23, ... on SmolLM2), so one step, the order of the single drops, is what an hour allows: agreement
# (teacher-forced on full depth's own answers) on 40 questions per task, task (exact match, every question
# answered per candidate) on 25
PLAN = (("agreement", 1, 20),)


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def out_path(folder: Path, model: str) -> Path:
    return folder / f"drop_order_{SHORT.get(model, model)}.json"


def load(path: Path) -> dict:
    result = json.loads(path.read_text()) if path.is_file() else {}
    return result if result.get("version") == VERSION else {"version": VERSION}


def calibrations(engine, result: dict, tasks: list[str], scale: float, save, signals: set[str]) -> dict[str, dict]:
    """The plan's calibrated orders on the validation questions (cached), as D3Config fields by name; `scale`
    multiplies the plan's validation questions per task; only the plan's `signals` are measured (those measured
    before stay in the study)."""
    done = result.setdefault("calibrations", {})
    for sig_name, steps, per_task in PLAN:
        if sig_name not in signals:
            continue
        val_limit = max(1, round(per_task * scale))
        cal_set = CalibrationSet(f"task:{'+'.join(tasks)}:{val_limit}", tasks=tuple(tasks), chat_template=False,
                                 val_limit=val_limit)
        if sig_name not in done:
            t0, c0 = time.perf_counter(), time.process_time()
            c = cal.calibrate(engine, sig_name, cal_set, steps=steps,
                              progress=lambda d, t, w: print(f"\r{sig_name} [{d}/{t}] {w}   ", end="", file=sys.stderr))  # noqa: B023 (called within this iteration)
            done[sig_name] = {"order": list(c.order), "steps": steps, "val_questions": sum(len(get_generation_task(t).split("validation")[:val_limit]) for t in tasks),
                            "seconds": round(time.perf_counter() - t0, 1)}
            _cost(result, "calibrate", t0, c0)
            say(f"\ncalibrated by {sig_name}: {c.order[:8]} ({done[sig_name]['seconds']:.0f} s)")
            save()
    return {f"calibrated {s}": {"drop_order": "calibrated", "layer_order": tuple(c["order"])} for s, c in done.items()}


def _full_row(out: Outcome) -> dict:
    """Full depth's row: every test question's answer and right/wrong (the reference every setting pairs with)."""
    return {"accuracy": round(out.accuracy, 5), "right": sum(out.correct), "asked": len(out.correct),
            "mean_layers": out.mean_layers, "tokens": out.tokens, "seconds": round(out.seconds, 2),
            "cpu_seconds": round(out.cpu_seconds, 2),
            "qps": round(len(out.correct) / out.seconds, 3), "qps_cpu": round(len(out.correct) / out.cpu_seconds, 3),
            "answers": list(out.answers), "bits": "".join("1" if c else "0" for c in out.correct),
            "threads": _threads()}


def _threads() -> int:
    """Torch threads at the end of a row (a freed core adds one; its CPU seconds then count both threads)."""
    import torch

    return torch.get_num_threads()


def _reference(row: dict) -> Outcome:
    return Outcome(tuple(b == "1" for b in row["bits"]), tuple(row["answers"]), row["mean_layers"], row["tokens"],
                   row["seconds"], row["cpu_seconds"])


def _setting_row(cfg, first: QuestionSet, rest: QuestionSet, full: Outcome, args) -> dict:
    """One setting, sequentially: the first stage; the rest of the test questions only if its paired interval can
    still reach a loss of at most --go-on points."""
    n1 = len(first)
    head = first.run(cfg)
    stage1 = exact_difference(full.correct[:n1], head.correct).to_dict()
    if goes_on(stage1, args.go_on) and len(rest):
        out = head.join(rest.run(cfg))
        row = paired_row(full, out, [first.sizes, rest.sizes])
        row.update(stage=2)
    else:
        row = paired_row(full.head(n1), head, first.sizes)
        row.update(stage=1, stopped=bool(len(rest)))
    row.update(stage1=stage1, config=cfg.to_dict(), threads=_threads())
    return row


def sweep(engine, result: dict, tasks: list[str], orders: dict, args, save) -> dict:
    """Full depth, then every setting not yet in the results, on the test questions only, sequentially (a first
    stage of --stage1 questions per task for every setting; the rest for those that can still meet the bound).
    Returns the settings' configs by label."""
    t0, c0 = time.perf_counter(), time.process_time()
    first = QuestionSet(engine, tasks, "test", limit=min(args.stage1, args.test_limit), batch=args.batch)
    rest = QuestionSet(engine, tasks, "test", limit=args.test_limit, batch=args.batch, start=args.stage1,
                       keep=args.keep_rest)
    _cost(result, "prefill", t0, c0)
    say(f"{engine.name}: {len(first)} first-stage and {len(rest)} further test questions prefilled "
        f"({time.perf_counter() - t0:.0f} s)")
    design = {"stage1": args.stage1, "test_limit": args.test_limit, "go_on": args.go_on, "tasks": tasks}
    if result.get("design", design) != design and result.get("settings"):  # rows of another design never mix
        say(f"{engine.name}: the results on file were measured with {result['design']}; starting the sweep again")
        for key in ("settings", "curves_stopped", "fresh", "speed"):
            result.pop(key, None)
    sizes = [a + b for a, b in zip(first.sizes, rest.sizes)]
    if len(set(sizes)) > 1:
        raise SystemExit(f"{engine.name}: the tasks have unequal test questions {dict(zip(tasks, sizes))}: lower "
                         "--test-limit to the smallest (the design gives every task the same number)")
    result.update(test_sizes=sizes, design=design, stages=[first.sizes, rest.sizes], go_on=args.go_on,
                  collapse=COLLAPSE)
    rows = result.setdefault("settings", {})
    starts = [int(x) for x in args.starts.split(",")]
    baselines = [b for b in args.baselines.split(",") if b]
    todo = settings(engine.num_layers, orders, [float(t) for t in args.targets.split(",")], baselines, starts)
    eta = Eta(total=1 + len(todo), say=say, done=sum(1 for k in ["full depth", *todo] if k in rows))
    if "full depth" not in rows:
        t0, c0 = time.perf_counter(), time.process_time()
        full = first.run(FullConfig()).join(rest.run(FullConfig()))
        rows["full depth"] = _full_row(full)
        _cost(result, "sweep", t0, c0)
        save()
        eta.tick("full depth", full.seconds, f"{100 * full.accuracy:.1f}% of {len(full.correct)}, "
                 f"{rows['full depth']['qps']:.2f} questions/s ({rows['full depth']['qps_cpu']:.2f} per CPU-second)")
    full = _reference(rows["full depth"])
    stopped: dict[str, str] = result.setdefault("curves_stopped", {})
    tokens = max(get_generation_task(t).max_new_tokens for t in tasks)
    alike = {same_run(cfg, engine.num_layers, tokens): label for label, cfg in todo.items()
             if label in rows and "same_as" not in rows[label]}
    for label, cfg in todo.items():
        if label in rows:
            continue
        name = curve_name(label)
        if name in stopped:
            eta.skip()
            continue
        t0, c0 = time.perf_counter(), time.process_time()
        key = same_run(cfg, engine.num_layers, tokens)
        if key in alike:  # the same layers at every token as a setting already measured: the same answers
            row = {**rows[alike[key]], "config": cfg.to_dict(), "same_as": alike[key]}
        else:
            row = _setting_row(cfg, first, rest, full, args)
            alike[key] = label
        rows[label] = row
        if collapsed(row["stage1"]):
            stopped[name] = label
        _cost(result, "sweep", t0, c0)
        save()
        d, fid = row["diff"], row["fidelity"]
        eta.tick(label, time.perf_counter() - t0, f"{row['mean_layers']:.2f} layers, accuracy "
                 f"{100 * d['diff']:+.1f} [{100 * d['low']:+.1f}, {100 * d['high']:+.1f}] pts on {d['n']}, same answer "
                 f"{100 * fid['rate']:.0f}%" + ("" if row.get("stage", 2) == 2 else " (stopped after the first stage)")
                 + (f"; {name} collapsed: deeper cuts not run" if name in stopped else "")
                 + (f"; the same layers at every token as {row['same_as']}: its row" if "same_as" in row else ""))
    return todo


def headlines(engine, result: dict, tasks: list[str], todo: dict, args, save) -> None:
    """The headline settings (per bound: the fewest layers whose loss's 95% upper bound is within it, else the
    closest), chosen on accuracy alone; then each is answered again on a fresh seed's test questions (as many per
    task as it ran) beside full depth there, and timed per generated token in ABBA pairs on the first
    --timing-per-task test questions of every task (questions whose accuracy is reported), after it was chosen."""
    from d3.reports.drop_order import BOUNDS, headline_pick

    picks = [headline_pick(result, b)[0] for b in BOUNDS]
    labels = list(dict.fromkeys(r["label"] for r in picks if r is not None))
    fresh = result.setdefault("fresh", {"seed": args.fresh_seed, "full": {}, "settings": {}})
    speed = result.setdefault("speed", {})
    sets: dict[int, QuestionSet] = {}
    for label in labels:
        row = result["settings"][label]
        per_task = row["asked"] // len(tasks)
        if label not in fresh["settings"]:
            t0, c0 = time.perf_counter(), time.process_time()
            if per_task not in sets:
                sets[per_task] = QuestionSet(engine, tasks, "test", limit=per_task, batch=args.batch,
                                             seed=args.fresh_seed)
            qs = sets[per_task]
            if str(per_task) not in fresh["full"]:
                fresh["full"][str(per_task)] = _full_row(qs.run(FullConfig()))
                save()
            ref = _reference(fresh["full"][str(per_task)])
            fresh["settings"][label] = {**paired_row(ref, qs.run(todo[label]), qs.sizes), "per_task_questions": per_task}
            _cost(result, "fresh seed", t0, c0)
            save()
            d = fresh["settings"][label]["diff"]
            say(f"fresh questions (seed {args.fresh_seed}), {label}: {100 * d['diff']:+.1f} [{100 * d['low']:+.1f}, "
                f"{100 * d['high']:+.1f}] pts on {d['n']}")
        if label not in speed:
            t0, c0 = time.perf_counter(), time.process_time()
            timing = [PrefilledQuestions(engine, get_generation_task(t),
                                         get_generation_task(t).split("test")[:args.timing_per_task],
                                         batch=args.timing_per_task) for t in tasks]
            speed[label] = per_token_timing(timing, todo[label], engine.num_layers, engine.fixed_cost_layers,
                                            pairs=args.pairs, threads=1)
            _cost(result, "timing", t0, c0)
            save()
            t = speed[label]
            say(f"speed, {label}: {t['ratio']:.3f}x [{t['low']:.3f}, {t['high']:.3f}] per token ({t['pairs']} ABBA "
                f"pairs, 1 thread), theory {t['theory_fixed']:.3f}x (LM head fixed) / {t['theory_plain']:.3f}x"
                + (f" FLAG: {t['flag']}" if t["flag"] else ""))


def _cost(result: dict, part: str, t0: float, c0: float) -> None:
    """Add this part's wall and process CPU seconds to the run's cost (summed over resumed runs)."""
    cost = result.setdefault("cost", {}).setdefault(part, {"wall_s": 0.0, "cpu_s": 0.0})
    cost["wall_s"] = round(cost["wall_s"] + time.perf_counter() - t0, 1)
    cost["cpu_s"] = round(cost["cpu_s"] + time.process_time() - c0, 1)


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
    roomless = [t for t in args.tasks.split(",") if not getattr(get_generation_task(t), "has_room", False)]
    if roomless:
        raise SystemExit(f"tasks {roomless} have no room to redraw (question space under {ROOM} times what a seed "
                         f"draws): --tasks takes generated tasks with room, {', '.join(ROOMY_TASKS)}")
    screen = result.setdefault("screen", {})
    for task in args.tasks.split(","):  # task by task, saved after each (resumable)
        if task not in screen:
            t0, c0 = time.perf_counter(), time.process_time()
            screen.update(screen_tasks(engine, [task], args.screen, batch=args.batch, say=say))
            _cost(result, "screen", t0, c0)
            save()
    result["screen_rule"] = {"questions": args.screen, "min": SCREEN_MIN}
    for v in screen.values():  # the rule as it stands now (a task the screen stopped early was not fully asked)
        v["kept"] = v["asked"] >= args.screen and screen_rule(v["validation_accuracy"], v["chance"])
    tasks = [t for t in args.tasks.split(",") if result["screen"][t]["kept"]][:args.max_tasks or None]
    say(f"{model}: tasks kept {tasks}; dropped {[t for t, v in result['screen'].items() if not v['kept']]}")
    result["tasks"] = tasks
    orders = {o: {"drop_order": o} for o in NAMED_ORDERS}
    shipped = cal.MEASURED.get(engine.name, {}).get(tuple(result["core"]))
    if shipped:  # the order the page starts on for this model: is it as good as the study's own?
        orders["shipped order"] = {"drop_order": "calibrated", "layer_order": tuple(shipped)}
    if "calibrate" in parts:
        orders.update(calibrations(engine, result, tasks, args.val_scale, save, set(args.signals.split(","))))
    orders = {k: v for k, v in orders.items() if k in args.orders.split(",")}
    if "sweep" in parts:
        todo = sweep(engine, result, tasks, orders, args, save)
        result["fixed_cost_layers"] = engine.fixed_cost_layers
        headlines(engine, result, tasks, todo, args, save)
    result["test_limit"] = args.test_limit
    save()
    return path


def write_curves(study: dict, path: Path) -> Path:
    """An HTML page with the two curves: accuracy difference vs layers run, and vs measured speedup."""
    from d3.reports.drop_order import curve_points
    from viz.results import paired_curves

    L = study["num_layers"]
    figs = [paired_curves(curve_points(study, "layers"), x="layers", x_title=f"mean layers run per token (of {L})",
                          title=f"{study['model']}: accuracy against depth actually run")]
    body = "\n".join(f.to_html(full_html=False, include_plotlyjs=i == 0) for i, f in enumerate(figs))  # plotly.js once
    path.write_text(f"<!doctype html><meta charset='utf-8'><title>Drop order: {study['model']}</title>\n{body}\n",
                    encoding="utf-8")
    return path


def child_argv(argv: list[str], model: str, parts: list[str]) -> list[str]:
    """This run's command line for one model and the measuring parts only (no --models, --only or --jobs)."""
    out, skip = [], False
    for _i, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in ("--models", "--only", "--jobs"):
            skip = "=" not in arg
            continue
        out.append(arg)
    return [*out, "--models", model, "--only", ",".join(parts), "--jobs", "1"]


FREED = getattr(signal, "SIGUSR1", None)  # the parent's word to a child: another model's process ended


def take_a_freed_core(*_: object) -> None:
    """A core came free (the parent's FREED signal): one more torch thread, up to the machine's cores. Nothing is
    printed here: a signal can land while this process is writing to stderr."""
    import torch

    torch.set_num_threads(min(torch.get_num_threads() + 1, os.cpu_count() or 1))


def in_parallel(models: list[str], parts: list[str], jobs: int) -> None:
    """Each model measured in its own process, `jobs` at a time, their progress lines prefixed by the model; when
    one ends with no model left to start, the longest-running other process is given its core (FREED)."""
    import subprocess
    import threading

    def relay(model: str, stream) -> None:
        for line in stream:
            say(f"[{SHORT.get(model, model)}] {line.rstrip()}")

    pending, running = list(models), []
    while pending or running:
        while pending and len(running) < jobs:
            model = pending.pop(0)
            child = subprocess.Popen([sys.executable, __file__, *child_argv(sys.argv[1:], model, parts)],
                                     stderr=subprocess.PIPE, text=True)
            threading.Thread(target=relay, args=(model, child.stderr), daemon=True).start()
            running.append((model, child))
        time.sleep(1)
        for model, child in list(running):
            if child.poll() is not None:
                running.remove((model, child))
                if child.returncode:
                    raise SystemExit(f"{model}: the study stopped (exit {child.returncode}); rerun to resume")
                if not pending and running and FREED is not None:
                    heir, process = running[0]
                    process.send_signal(FREED)
                    say(f"{SHORT.get(model, model)} is done: its core goes to {SHORT.get(heir, heir)}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="smollm2-135m,gemma3-270m", help="comma-separated; the report's across-models "
                   "section compares the last with the others (name the largest last)")
    p.add_argument("--tasks", default=",".join(ROOMY_TASKS), help="candidate tasks (screened on validation)")
    p.add_argument("--max-tasks", type=int, default=0, help="at most this many of the kept tasks, in --tasks order "
                   "(0: all); each costs the same number of test questions")
    p.add_argument("--screen", type=int, default=SCREEN_QUESTIONS, help="validation questions per task for the screen")
    p.add_argument("--val-scale", type=float, default=1.0, help="multiplies the validation questions per task each "
                   "calibration of the plan reads (agreement 100, task 50)")
    p.add_argument("--test-limit", type=int, default=100, help="test questions per task (the same for every task)")
    p.add_argument("--targets", default=",".join(map(str, TARGETS)), help="planned mean depths (fractions of L)")
    p.add_argument("--signals", default=",".join(s for s, _, _ in PLAN), help="the plan's calibrations to measure")
    p.add_argument("--threads", type=int, default=1, help="torch threads (per model)")
    p.add_argument("--jobs", type=int, default=1, help="models measured at once, each in its own process (one per "
                   "core: 2 on a 2-core machine); the report follows once every model is done")
    p.add_argument("--starts", default=",".join(map(str, STARTS)), help="D3 starts to sweep (tokens at full depth)")
    p.add_argument("--orders", default="middle_out,bottom_up,calibrated agreement",
                   help="orders swept: middle_out, bottom_up, shipped order (the page's), calibrated agreement")
    p.add_argument("--baselines", default="", help="baselines to sweep beside the orders (unified,skipdecode)")
    p.add_argument("--fresh-seed", type=int, default=1, help="the seed whose questions replicate each headline")
    p.add_argument("--stage1", type=int, default=25, help="first-stage test questions per task (every setting)")
    p.add_argument("--go-on", type=float, default=GO_ON, help="a setting answers the rest of the test questions "
                   "while its first-stage interval allows a loss this small (fraction: 0.03 = 3 points)")
    p.add_argument("--keep-rest", action="store_true", help="hold the further questions' prefill (memory) instead "
                   "of running their few own tokens again per setting")
    p.add_argument("--pairs", type=int, default=TIMING_PAIRS, help="ABBA timing pairs per headline setting (>= 8)")
    p.add_argument("--timing-per-task", type=int, default=16, help="test questions per task timed per headline")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--out-dir", default="results")
    p.add_argument("--summary", default="results/SUMMARY.md")
    p.add_argument("--readme", default="README.md")
    p.add_argument("--partial", default=None, help="mark the results as a partial run, described so ('' unmarks)")
    p.add_argument("--only", default="", help="comma-separated parts: screen,calibrate,sweep,report")
    args = p.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    if FREED is not None:
        signal.signal(FREED, take_a_freed_core)
    parts = set(args.only.split(",")) if args.only else {"screen", "calibrate", "sweep", "report"}
    started = time.perf_counter()
    models = [m for m in args.models.split(",") if m]
    measured = parts & {"screen", "calibrate", "sweep"}
    if args.jobs > 1 and len(models) > 1 and measured:
        in_parallel(models, sorted(measured), args.jobs)
        paths = [out_path(Path(args.out_dir), m) for m in models]
    else:
        paths = [run_model(m, args, parts) for m in models]
    if "report" in parts:
        from d3.reports.drop_order import write_across, write_readme, write_section

        studies = [s for s in (load(p) for p in paths) if s.get("settings")]  # measured with this version
        for study, path in ((s, out_path(Path(args.out_dir), s["model"])) for s in studies):
            say(f"wrote {write_section(args.summary, study)} and {write_curves(study, path.with_suffix('.html'))}")
        say(f"wrote {write_across(args.summary, studies)} (across models) and {write_readme(args.readme, studies)}")
    say(f"done in {(time.perf_counter() - started) / 60:.1f} min")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
