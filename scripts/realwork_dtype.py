"""Which dtype for qwen2.5-coder-1.5b, measured on benchmark prompts: each dtype in its own process (so two copies are
never held at once) answers the same HumanEval problems greedily at full depth (padded batches, the real-work
harness); then each dtype's replies are compared with float32's (tokens kept before the first difference, replies
equal), its pass@1 and its tokens/s on this CPU. Each dtype also checks, on its first problem, that the harness's
full depth equals `Engine.generate` in that dtype (the same tokens).

Usage: nice -n 10 python scripts/realwork_dtype.py [--problems 16] [--dtypes float32,bfloat16,float16] [--threads 2]
       [--reference results/realwork_humaneval.jsonl]
With --reference, float32's replies are read from the real-work study's full-depth records (float32, same harness)
instead of measured again, and the problems are the --problems shortest prompts of the study's first stage (the
first 20 problems of its seeded shuffle, all answered at full depth in float32).
Results: results/realwork_dtype.json (per dtype: every problem's ids, verdict, timing), resumable per dtype.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

OUT = Path("results/realwork_dtype.json")


def pick(n: int, reference: str) -> list:
    from d3.research.realwork import humaneval

    bench = humaneval()
    if not reference:
        return bench.subset(n, seed=0)
    # the shortest prompts among the study's first stage (full@20 of the same seeded shuffle)
    return sorted(bench.subset(20, seed=0), key=lambda p: len(p.prompt))[:n]


def measure(dtype: str, n: int, threads: int, batch: int, reference: str = "", cap: int = 0) -> dict:
    import torch

    from d3.config import TRACE_OFF, FullConfig, GenerationConfig
    from d3.engine import Engine
    from d3.models import load_model
    from d3.research.realwork import answer, humaneval

    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    engine = Engine.from_loaded(load_model("qwen2.5-coder-1.5b", dtype=dtype))
    load_s = time.perf_counter() - t0
    bench = humaneval()
    if cap:
        import dataclasses

        bench = dataclasses.replace(bench, max_new_tokens=cap)
    problems = pick(n, reference)
    t0, c0 = time.perf_counter(), time.process_time()
    recs = answer(engine, bench, problems, FullConfig(), batch=batch)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    first = min(problems, key=lambda p: len(p.prompt))  # answered in the first batch
    mine = next(r for r in recs if r["pid"] == first.pid)
    trace = engine.generate(first.prompt, FullConfig(), GenerationConfig(max_new_tokens=len(mine["ids"])), TRACE_OFF,
                            chat_template=False)
    return {"dtype": dtype, "load_s": round(load_s, 1), "seconds": round(seconds, 1), "cpu_seconds": round(cpu, 1),
            "tokens": sum(r["tokens"] for r in recs), "threads": threads, "batch": batch,
            "tokens_per_s": round(sum(r["tokens"] for r in recs) / seconds, 3),
            "generate_equal": {"pid": first.pid, "tokens": len(mine["ids"]),
                               "equal": list(trace.token_ids) == list(mine["ids"])},
            "records": [{k: r[k] for k in ("pid", "passed", "status", "ids", "tokens", "completion")} for r in recs]}


def reference_records(reference: str) -> dict:
    """float32's replies from the study's full-depth records (as `measure` would have recorded them)."""
    from d3.research.realwork_report import seconds

    recs = [json.loads(line) for line in Path(reference).read_text().splitlines() if line.strip()] \
        if Path(reference).is_file() else []
    full = [r for r in recs if r["setting"] == "full" and r["dtype"] == "float32"]
    return {"dtype": "float32", "source": reference, "generate_equal": None, "batch": full[0]["batch"] if full else None,
            "tokens_per_s": round(sum(r["tokens"] for r in full) / max(seconds(full), 1e-9), 3),
            "records": [{k: r[k] for k in ("pid", "passed", "status", "ids", "tokens", "completion")} for r in full]}


def compare(result: dict) -> dict:
    """Per dtype, on the problems every measured dtype answered: pass@1, replies equal to float32's, tokens kept
    before the first difference, tokens/s, and whether full depth equalled `Engine.generate`."""
    from d3.research.realwork import first_change

    measured = {d: r for d, r in result.items() if isinstance(r, dict) and "records" in r}
    common = set.intersection(*({x["pid"] for x in r["records"]} for r in measured.values()))
    ref = {r["pid"]: r for r in measured["float32"]["records"]}
    out = {}
    for dtype, res in measured.items():
        mine = [r for r in res["records"] if r["pid"] in common]
        changes = [first_change(ref[r["pid"]]["ids"], r["ids"]) for r in mine]
        out[dtype] = {"problems": len(mine), "pass_at_1": sum(r["passed"] for r in mine),
                      "replies_equal_to_float32": sum(c is None for c in changes),
                      "tokens_before_first_difference": [len(r["ids"]) if c is None else c for r, c in zip(mine, changes)],
                      "tokens": [r["tokens"] for r in mine], "tokens_per_s": res["tokens_per_s"],
                      "batch": res.get("batch"), "generate_equal": res.get("generate_equal")}
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--problems", type=int, default=16)
    p.add_argument("--dtypes", default="float32,bfloat16,float16")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=0, help="the reply budget (0: HumanEval's 300; the same "
                   "as the reference's)")
    p.add_argument("--reference", default="", help="the study's JSONL: float32's replies read from its full depth")
    p.add_argument("--one", default="", help=argparse.SUPPRESS)  # internal: measure one dtype, print JSON
    args = p.parse_args()
    if args.one:
        print(json.dumps(measure(args.one, args.problems, args.threads, args.batch, args.reference,
                                 args.max_new_tokens)))
        return 0
    result = json.loads(OUT.read_text()) if OUT.is_file() else {}
    if result.get("problems", args.problems) != args.problems:
        result = {}
    result["problems"] = args.problems
    for dtype in args.dtypes.split(","):
        if dtype in result:
            continue
        print(f"[{time.strftime('%H:%M:%S')}] {dtype}: measuring", file=sys.stderr, flush=True)
        out = subprocess.run([sys.executable, __file__, "--one", dtype, "--problems", str(args.problems), "--threads",
                              str(args.threads), "--batch", str(args.batch), "--reference", args.reference,
                              "--max-new-tokens", str(args.max_new_tokens)],
                             capture_output=True, text=True)
        if out.returncode:
            print(out.stderr[-3000:], file=sys.stderr)
            return out.returncode
        result[dtype] = json.loads(out.stdout.strip().splitlines()[-1])
        OUT.write_text(json.dumps(result))
        print(f"[{time.strftime('%H:%M:%S')}] {dtype}: {result[dtype]['tokens_per_s']} tokens/s, "
              f"generate equal: {result[dtype]['generate_equal']}", file=sys.stderr, flush=True)
    if args.reference:  # read at the end: the study may have answered them meanwhile
        result["float32"] = reference_records(args.reference)
    if "float32" in result and result["float32"]["records"]:
        result["comparison"] = compare(result)
        OUT.write_text(json.dumps(result))
        print(json.dumps(result["comparison"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
