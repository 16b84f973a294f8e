"""D3 on real work: HumanEval (and GSM-Symbolic) answered greedily under full depth, D3 with three orders and two
starts, SkipDecode, Unified Layer Skipping and early exit; every problem's reply, verdict and layers appended to a
JSONL file as each batch finishes, so the run is resumable (a rerun skips the problems already there).

Usage:
  nice -n 10 python scripts/realwork_study.py run --bench humaneval --stages "full@all;d3 calibrated a0.998@40;..."
  nice -n 10 python scripts/realwork_study.py speed --bench humaneval --timed "d3 calibrated a0.998" --threads 1
  nice -n 19 python scripts/realwork_study.py verify --bench humaneval --dtype float32   (the shortcut on the records)
  nice -n 10 python scripts/realwork_study.py throughput --bench humaneval --batch 8 --threads 2   (batched vs one at a time)
  python scripts/realwork_study.py rescore   (score again the records whose tests hit the first sandbox's wall clock)
  python scripts/realwork_study.py report [--bench humaneval]          (no model: the rows, SUMMARY and the figure)

A stage is LABEL@N: the setting LABEL on the first N problems of the benchmark's seeded shuffle (--seed; "all": every
problem; "full": the problems full depth has answered so far). Consecutive stages on the same N go batch by batch,
each batch prefilled once for all of them (every setting runs the prompt at full depth, so the prefill is the same);
"|" between stages ends such a group. The shuffle's order is fixed, so a stage with a larger
N later extends a smaller one's problems, and two settings run on the same N are paired on the same problems. LABEL
is one of:
  full                             full depth
  d3 ORDER aALPHA [sSTART]         D3 (ORDER: calibrated = the shipped order of the model, calibrated on the generated
                                   arithmetic tasks' validation questions, never on a benchmark problem;
                                   middle_out; bottom_up), alpha ALPHA, start START tokens at full depth
  skipdecode DEPTH / unified DEPTH SkipDecode / Unified Layer Skipping at a planned mean depth of DEPTH (a fraction of
                                   L) over --horizon tokens
  early_exit DEPTH                 CALM-style early exit (softmax gap), its threshold set for a mean depth of DEPTH on
                                   full depth's confidences over a prompt that is not a benchmark problem
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from d3.config import D3Config, EarlyExitConfig, FullConfig, StrategyConfig  # noqa: E402

ORDERS = {"calibrated": {"drop_order": "calibrated", "layer_order": "measured"},
          "middle_out": {"drop_order": "middle_out"}, "bottom_up": {"drop_order": "bottom_up"}}
# Not a benchmark problem: the confidence profile early exit's threshold is read from.
EARLY_EXIT_PROMPT = ('def moving_average(values: list, window: int) -> list:\n    """Return the moving averages of '
                     'values over each run of `window` consecutive items."""\n')


def say(line: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)


def results_path(folder: Path, bench: str) -> Path:
    return folder / f"realwork_{bench}.jsonl"


def forced_results_path(path: Path) -> Path:
    """Where each setting's pass over full depth's replies is recorded: realwork_<bench>_forced.jsonl."""
    return path.with_name(path.name.replace(".jsonl", "_forced.jsonl"))


def read_records(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut by a kill: its problem runs again
                continue
    return out


def strategy(label: str, engine, horizon: int) -> StrategyConfig:
    """The config a stage's label names (see the module's docstring)."""
    from d3.research.sweep.grid import skipdecode_for_depth, threshold_for_depth, unified_for_depth

    words = label.split()
    if words == ["full"]:
        return FullConfig()
    L = engine.num_layers
    if words[0] == "d3":
        fields = dict(ORDERS[words[1]])
        alpha = next(float(w[1:]) for w in words if w.startswith("a"))
        start = next((int(w[1:]) for w in words[2:] if w.startswith("s")), 0)
        return D3Config(alpha=alpha, start=start, **fields)
    depth = float(words[1])
    if words[0] == "skipdecode":
        return skipdecode_for_depth(depth, L, horizon)
    if words[0] == "unified":
        return unified_for_depth(depth, L, horizon)
    if words[0] == "early_exit":
        from d3.config import TRACE_OFF, GenerationConfig

        probe = EarlyExitConfig(threshold=1.0)
        trace = engine.generate(EARLY_EXIT_PROMPT, probe, GenerationConfig(max_new_tokens=48, stop_at_eos=False),
                                TRACE_OFF, chat_template=False)
        profiles = [list(s.confidence) for s in trace.steps[1:]]
        return EarlyExitConfig(threshold=threshold_for_depth(profiles, probe.min_layers, L, depth))
    raise SystemExit(f"unknown setting {label!r}")


def run(args) -> None:
    import torch

    from d3.cli import load_engine
    from d3.research.realwork import BENCHMARKS, answer_forced, answer_many

    torch.set_num_threads(args.threads)
    bench = BENCHMARKS[args.bench]()
    if args.max_new_tokens:  # the same budget for every setting: only fair while no full-depth reply reached it
        bench = dataclasses.replace(bench, max_new_tokens=args.max_new_tokens)
    path = results_path(Path(args.out_dir), bench.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    args.model, args.device = args.model, "cpu"
    t0 = time.perf_counter()
    engine = load_engine(args)
    say(f"{engine.name} loaded in {engine.adapter.layers[0].self_attn.q_proj.weight.dtype} "
        f"({time.perf_counter() - t0:.0f} s); {bench.name}: {len(bench.problems)} problems -> {path}")
    groups: list[tuple[str, list[str]]] = []  # consecutive stages on the same problems share each batch's prefill
    for part in args.stages.split("|"):  # "|" ends a group even where the next stage is on the same problems
        last = None
        for label, _, n in (s.strip().rpartition("@") for s in part.split(";") if s.strip()):
            if last == n:
                groups[-1][1].append(label)
            else:
                groups.append((n, [label]))
            last = n
    dtype = str(engine.adapter.layers[0].self_attn.q_proj.weight.dtype).removeprefix("torch.")
    for n, labels in groups:
        if n == "full":  # the problems full depth has answered so far: a setting paired on all of them
            answered = {r["pid"] for r in read_records(path) if r["setting"] == "full"}
            problems = [p for p in bench.problems if p.pid in answered]
        else:
            problems = bench.subset(None if n == "all" else int(n), args.seed)
        records = read_records(path)
        todo = {label: {p.pid for p in problems} - {r["pid"] for r in records if r["setting"] == label}
                for label in labels}
        labels = [label for label in labels if todo[label]]
        if not labels:
            say(f"{', '.join(todo)}: {len(problems)} problems already answered")
            continue
        cfgs = {label: engine.resolve(strategy(label, engine, args.horizon)) for label in labels}
        for label in labels:
            say(f"{label}: {len(todo[label])} of {len(problems)} problems to answer ({cfgs[label].describe()})")
        started = time.perf_counter()

        def append(label: str, record: dict) -> None:
            meta = {"bench": bench.name, "setting": label, "config": cfgs[label].to_dict(), "model": engine.name,  # noqa: B023 (called within this iteration)
                    "dtype": dtype, "threads": torch.get_num_threads(), "seed": args.seed,
                    "max_new_tokens": bench.max_new_tokens}
            with path.open("a", encoding="utf-8") as f:
                f.write(json.dumps({**meta, **record}) + "\n")
            say(f"  {label}: {record['pid']} {'passed' if record['passed'] else 'failed'}, {record['tokens']} tokens, "
                f"{record['mean_layers']:.2f} layers, {record['elapsed']:.0f} s into its batch of {record['batch']}"
                + (f" ({record['via']})" if "via" in record else ""))

        free = [label for label in labels if label == "full" or not args.shortcut]
        if free:  # only the problems still to answer are decoded (a resumed run forms its batches from them)
            left = [p for p in problems if any(p.pid in todo[k] for k in free)]
            answer_many(engine, bench, left, {k: cfgs[k] for k in free}, args.batch, append, todo)
        rest = [label for label in labels if label not in free]
        if rest:  # the shortcut: each setting read over full depth's replies, only the problems it changes answered
            full = {r["pid"]: r for r in read_records(path) if r["setting"] == "full"}
            missing = sorted({p.pid for p in problems} - set(full))
            if missing:
                say(f"  {len(missing)} of these problems have no full-depth reply yet: left for a later run")
            forced_path = forced_results_path(path)
            forced_done: dict[str, dict[str, dict]] = {}
            for row in read_records(forced_path):
                forced_done.setdefault(row["setting"], {})[row["pid"]] = row

            def forced(label: str, row: dict) -> None:
                with forced_path.open("a", encoding="utf-8") as f:  # noqa: B023 (called within this iteration)
                    f.write(json.dumps({"setting": label, "config": cfgs[label].to_dict(), **row}) + "\n")  # noqa: B023 (called within this iteration)
                say(f"  {label}: {row['pid']} read over full depth's reply: "
                    + ("the same reply" if row["settled"] else f"first change at token {row['first_change']}"
                       if row["first_change"] is not None else f"a close call ({row['min_margin']:.4f})"))

            answer_forced(engine, bench, problems, {k: cfgs[k] for k in rest}, full, args.batch, append, todo,
                          forced, forced_done)
        say(f"{', '.join(labels)}: done in {(time.perf_counter() - started) / 60:.1f} min")


class _Timed:
    """A few problems as `d3.research.study.per_token_timing` wants them: answer(cfg) -> tokens and mean layers."""

    def __init__(self, engine, bench, problems) -> None:
        self.engine, self.bench, self.examples = engine, bench, list(problems)

    def answer(self, cfg):
        from types import SimpleNamespace

        from d3.research.realwork import answer_batch

        replies = answer_batch(self.engine, [p.prompt for p in self.examples], cfg, self.bench.max_new_tokens,
                               self.bench.stop)
        tokens = sum(len(r.ids) for r in replies)
        return SimpleNamespace(tokens=tokens, mean_layers=sum(sum(r.layers) for r in replies) / max(tokens, 1))


def speed(args) -> None:
    """Per generated token, full depth against each --timed setting in ABBA pairs (--pairs, at least 8), the same
    --threads on both sides, on the first --timing-problems problems of the shuffle, answered as one batch."""
    import torch

    from d3.cli import load_engine
    from d3.research.realwork import BENCHMARKS
    from d3.research.study import per_token_timing

    torch.set_num_threads(args.threads)
    bench = BENCHMARKS[args.bench]()
    if args.max_new_tokens:  # the timed replies' budget (per-token timing needs no whole answer)
        bench = dataclasses.replace(bench, max_new_tokens=args.max_new_tokens)
    path = Path(args.out_dir) / f"realwork_{bench.name}_speed.json"
    done = json.loads(path.read_text()) if path.is_file() else {}
    args.device = "cpu"
    engine = load_engine(args)
    timed = [_Timed(engine, bench, bench.subset(args.timing_problems, args.seed))]
    for label in [s.strip() for s in args.timed.split(";") if s.strip()]:
        if label in done:
            continue
        cfg = engine.resolve(strategy(label, engine, args.horizon))
        t0 = time.perf_counter()
        done[label] = {**per_token_timing(timed, cfg, engine.num_layers, engine.fixed_cost_layers, pairs=args.pairs,
                                          threads=args.threads), "problems": [p.pid for p in timed[0].examples],
                       "max_new_tokens": bench.max_new_tokens, "load_1min": round(os.getloadavg()[0], 1)}
        path.write_text(json.dumps(done, indent=1))
        t = done[label]
        say(f"speed, {label}: {t['ratio']:.3f}x [{t['low']:.3f}, {t['high']:.3f}] per token, theory "
            f"{t['theory_fixed']:.3f}x / {t['theory_plain']:.3f}x ({time.perf_counter() - t0:.0f} s)")


def throughput(args) -> None:
    """What batching buys: full depth on the first --batch problems of the shuffle, answered as one padded batch and
    one problem at a time, alternately (batch, single, single, batch: --pairs rounds of ABBA), the same --threads;
    generated tokens per second of each, their ratio, and whether both wrote the same tokens for every problem.
    Written to results/realwork_<bench>_throughput.json."""
    import statistics

    import torch

    from d3.cli import load_engine
    from d3.research.realwork import BENCHMARKS, answer_batch

    torch.set_num_threads(args.threads)
    bench = BENCHMARKS[args.bench]()
    if args.max_new_tokens:
        bench = dataclasses.replace(bench, max_new_tokens=args.max_new_tokens)
    problems = sorted(bench.subset(args.batch, args.seed), key=lambda p: len(p.prompt))
    args.device = "cpu"
    engine = load_engine(args)
    full = FullConfig()

    def batched() -> tuple[float, list[tuple[int, ...]]]:
        t0 = time.perf_counter()
        replies = answer_batch(engine, [p.prompt for p in problems], full, bench.max_new_tokens, bench.stop)
        return time.perf_counter() - t0, [tuple(r.ids) for r in replies]

    def single() -> tuple[float, list[tuple[int, ...]]]:
        t0, ids = time.perf_counter(), []
        for p in problems:
            ids += [tuple(r.ids) for r in answer_batch(engine, [p.prompt], full, bench.max_new_tokens, bench.stop)]
        return time.perf_counter() - t0, ids

    runs: dict[str, list[float]] = {"batched": [], "single": []}
    replies: dict[str, list[tuple[int, ...]]] = {}
    for k in range(max(args.pairs, 1)):
        for name in ("batched", "single", "single", "batched") if k % 2 == 0 else ("single", "batched", "batched", "single"):
            secs, ids = (batched if name == "batched" else single)()
            runs[name].append(secs)
            replies.setdefault(name, ids)
            say(f"throughput: {name} {secs:.1f} s")
    tokens = sum(len(r) for r in replies["batched"])
    med = {name: statistics.median(v) for name, v in runs.items()}
    out = {"bench": bench.name, "problems": [p.pid for p in problems], "threads": args.threads, "tokens": tokens,
           "rounds": args.pairs, "seconds": runs, "tokens_per_s": {n: round(tokens / m, 3) for n, m in med.items()},
           "gain": round(med["single"] / med["batched"], 3), "same_tokens": replies["batched"] == replies["single"],
           "model": engine.name, "load_1min": os.getloadavg()[0]}
    path = Path(args.out_dir) / f"realwork_{bench.name}_throughput.json"
    path.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    say(f"throughput: batch of {len(problems)} {out['gain']:.2f}x one at a time ({out['tokens_per_s']}), same tokens: "
        f"{out['same_tokens']} -> {path}")


def rescore(args) -> None:
    """Score again, with the sandbox as it is now, every record whose tests timed out on the wall clock (the first
    sandbox's only limit, which a loaded machine hit on correct programs); the file is rewritten in place (a record
    appended meanwhile by a running study is lost, and answered again when the study resumes)."""
    from d3.research.realwork import BENCHMARKS

    bench = BENCHMARKS[args.bench]()
    by_id = {p.pid: p for p in bench.problems}
    path = results_path(Path(args.out_dir), bench.name)
    lines = path.read_text(encoding="utf-8").splitlines()
    out, changed = [], 0
    for line in lines:
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            continue
        if r["status"] in ("timed out", "timed out (wall clock)"):
            passed, why = bench.score(by_id[r["pid"]], r["completion"])
            say(f"{r['setting']} {r['pid']}: {r['status']} -> {why}")
            r.update(passed=passed, status=why, rescored=True)
            changed += 1
        out.append(json.dumps(r))
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n".join(out) + "\n", encoding="utf-8")
    tmp.replace(path)
    say(f"{changed} records scored again")


def verify(args) -> None:
    """The shortcut checked on the records already there (written by free decoding): for every problem, each
    setting read over full depth's reply must leave it exactly where its recorded reply does, with the recorded
    reply's token there (or never, where the replies are the same), and every setting read over its own recorded
    reply must pick every token of it with the recorded layers. Written to results/realwork_<bench>_shortcut_check.json."""
    import torch

    from d3.cli import load_engine
    from d3.config import strategy_from_dict
    from d3.research.realwork import BENCHMARKS, first_change, forced_batch

    torch.set_num_threads(args.threads)
    bench = BENCHMARKS[args.bench]()
    path = results_path(Path(args.out_dir), bench.name)
    out = path.with_name(f"realwork_{bench.name}_shortcut_check.json")
    recs = [r for r in read_records(path) if r.get("via") is None]  # the freely decoded ones only
    full = {r["pid"]: r for r in recs if r["setting"] == "full"}
    by_id = {p.pid: p for p in bench.problems}
    args.device = "cpu"
    engine = load_engine(args)
    rows, t0, c0 = [], time.perf_counter(), time.process_time()
    tried = {r["pid"] for r in recs if r["setting"] != "full"}  # problems some setting answered besides full depth
    recs = [r for r in recs if r["pid"] in tried]
    pids = sorted(tried & set(full), key=lambda pid: len(by_id[pid].prompt))
    for i in range(0, len(pids), args.batch):
        part = [by_id[pid] for pid in pids[i:i + args.batch]]
        mine = [r for r in recs if r["pid"] in {p.pid for p in part}]
        labels = sorted({r["setting"] for r in mine})
        cfgs = {label: engine.resolve(strategy_from_dict(next(r["config"] for r in mine if r["setting"] == label)))
                for label in labels}
        over_full = forced_batch(engine, part, [full[p.pid]["ids"] for p in part], cfgs)
        for r in mine:
            k = next(j for j, p in enumerate(part) if p.pid == r["pid"])
            f = over_full[r["setting"]][k]
            want = first_change(full[r["pid"]]["ids"], r["ids"])
            got = f.first_change(full[r["pid"]]["ids"])
            same_place = got == want and (want is None or f.predicted[want] == r["ids"][want])
            own = f if r["ids"] == full[r["pid"]]["ids"] else \
                forced_batch(engine, [part[k]], [r["ids"]], {r["setting"]: cfgs[r["setting"]]})[r["setting"]][0]
            layers = [n for n, c in r["layer_steps"] for _ in range(c)]
            rows.append({"setting": r["setting"], "pid": r["pid"], "tokens": r["tokens"], "recorded_first_change": want,
                         "forced_first_change": got, "same_place_and_token": same_place,
                         "own_reply_reproduced": own.predicted == tuple(r["ids"]), "own_layers_reproduced":
                         list(own.layers) == layers, "min_margin_own": round(min(own.margin), 5)})
            say(f"verify {r['setting']} {r['pid']}: first change recorded {want}, forced {got}; own reply "
                f"{'reproduced' if rows[-1]['own_reply_reproduced'] else 'NOT reproduced'}")
    ok = all(x["same_place_and_token"] and x["own_reply_reproduced"] and x["own_layers_reproduced"] for x in rows)
    result = {"records": len(rows), "problems": len(pids), "all_identical": ok,
              "settings": sorted({x["setting"] for x in rows}), "cpu_s": round(time.process_time() - c0, 1),
              "wall_s": round(time.perf_counter() - t0, 1), "model": engine.name,
              "dtype": str(engine.adapter.layers[0].self_attn.q_proj.weight.dtype).removeprefix("torch."),
              "rows": rows}
    out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    say(f"shortcut check: {len(rows)} records, all identical: {ok} -> {out}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("part", choices=["run", "speed", "rescore", "report", "verify", "throughput"])
    p.add_argument("--bench", default="humaneval")
    p.add_argument("--model", default="qwen2.5-coder-1.5b")
    p.add_argument("--dtype", default="auto", help="auto: the model's own (bfloat16 for qwen2.5-coder-1.5b)")
    p.add_argument("--stages", default="full@all")
    p.add_argument("--seed", type=int, default=0, help="the seeded shuffle the stages' first N problems come from")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--max-new-tokens", type=int, default=0, help="the reply budget for every setting (0: the "
                   "benchmark's, 300 for HumanEval); lower only where no full-depth reply reached it")
    p.add_argument("--horizon", type=int, default=100, help="tokens SkipDecode's and Unified's planned depth is set over")
    p.add_argument("--out-dir", default="results")
    p.add_argument("--shortcut", action=argparse.BooleanOptionalAction, default=True,
                   help="settings other than full depth: read each over full depth's reply in one pass and answer "
                   "freely only the problems where it changes (default); --no-shortcut answers every problem freely")
    p.add_argument("--timed", default="", help="speed: settings (labels, ';'-separated) timed against full depth")
    p.add_argument("--pairs", type=int, default=8, help="speed: ABBA pairs per setting (at least 8)")
    p.add_argument("--timing-problems", type=int, default=2, help="speed: problems answered per timed run")
    args = p.parse_args()
    if args.part == "run":
        run(args)
    elif args.part == "speed":
        speed(args)
    elif args.part == "throughput":
        throughput(args)
    elif args.part == "rescore":
        rescore(args)
    elif args.part == "verify":
        verify(args)
    else:
        from d3.research.realwork_report import write_all

        write_all(Path(args.out_dir), args.bench.split(","))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
