"""Speed checks against targets: our loop vs `model.generate`, D3 measured vs theoretical, tracing, load time."""
from __future__ import annotations

import cProfile
import io
import json
import pstats
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from d3.config import TRACE_OFF, D3Config, FullConfig, GenerationConfig, StrategyConfig, TraceConfig
from d3.schedule import alpha_for_mean_depth, planned_mean_layers, theoretical_speedup

TARGETS = {"full_vs_hf": 1.05, "d3_efficiency": 0.85, "trace_overhead": 1.2, "load_s": 5.0}
VARIANTS = ("hf", "full", "d3", "traced")
TRACE_ON = TraceConfig()  # what the app records by default: sublayer stats and top-5


def d3_two_thirds(num_layers: int, new_tokens: int) -> D3Config:
    """D3 at about 2/3 of the layers over `new_tokens` tokens (default core, start 0)."""
    return D3Config(alpha=alpha_for_mean_depth(2 / 3, num_layers, new_tokens))


# ---------------------------------------------------------------- one timed run of each variant


def _hf_run(engine: Any, prompt: str, new_tokens: int) -> tuple[float, list[int]]:
    """`model.generate`, greedy, exactly `new_tokens` tokens, on the same chat-rendered ids as our loop."""
    ids, mask = engine.encode([prompt])
    pad = engine.tokenizer.pad_token_id if engine.tokenizer.pad_token_id is not None else 0
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = engine.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens,
                                    min_new_tokens=new_tokens, do_sample=False, pad_token_id=pad)
    return time.perf_counter() - t0, out[0, ids.shape[1]:].tolist()


def _our_run(engine: Any, prompt: str, cfg: StrategyConfig, new_tokens: int, trace: TraceConfig) -> tuple[float, Any]:
    gen = GenerationConfig(max_new_tokens=new_tokens, stop_at_eos=False)
    t0 = time.perf_counter()
    result = engine.generate(prompt, cfg, gen, trace)
    return time.perf_counter() - t0, result


def _runners(engine: Any, d3: D3Config, new_tokens: int) -> dict[str, Callable[[str], tuple[float, Any]]]:
    return {
        "hf": lambda p: _hf_run(engine, p, new_tokens),
        "full": lambda p: _our_run(engine, p, FullConfig(), new_tokens, TRACE_OFF),
        "d3": lambda p: _our_run(engine, p, d3, new_tokens, TRACE_OFF),
        "traced": lambda p: _our_run(engine, p, FullConfig(), new_tokens, TRACE_ON),
    }


def interleaved(engine: Any, prompts: Sequence[str], new_tokens: int, repeats: int, d3: D3Config,
                progress: Callable[[str], None] | None = None) -> tuple[dict[str, list[float]], dict[str, Any]]:
    """Seconds per variant, one entry per (repeat, prompt) in the same order for every variant; and the
    first prompt's outputs (token ids for hf, traces for ours)."""
    runners = _runners(engine, d3, new_tokens)
    for name, run in runners.items():  # warm-up, untimed
        _hf_run(engine, prompts[0], 4) if name == "hf" else run(prompts[0])
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    first: dict[str, Any] = {}
    for r in range(repeats):
        order = VARIANTS[r % len(VARIANTS):] + VARIANTS[: r % len(VARIANTS)]  # rotate who goes first
        for i, prompt in enumerate(prompts):
            for name in order:
                seconds, out = runners[name](prompt)
                times[name].append(seconds)
                if r == 0 and i == 0:
                    first[name] = out
            if progress:
                progress(f"repeat {r + 1}/{repeats}, prompt {i + 1}/{len(prompts)}")
    return times, first


def parity(hf: Sequence[int], ours: Sequence[int], eos_ids: set[int]) -> dict[str, Any]:
    """Whether both loops picked the same tokens up to our first EOS (min_new_tokens makes HF suppress EOS, so
    the two continuations legitimately differ after it), and how many tokens that compared."""
    n = next((i for i, t in enumerate(ours) if t in eos_ids), len(ours))
    return {"parity_with_hf": list(hf[:n]) == list(ours[:n]), "parity_tokens": n}


def pair_median(numerator: Sequence[float], denominator: Sequence[float]) -> float:
    """Median of per-pair ratios numerator[k] / denominator[k]."""
    return statistics.median(a / b for a, b in zip(numerator, denominator))


# ---------------------------------------------------------------- load time


LOAD_CODE = """
import json, time
t0 = time.perf_counter()
from d3.models import load_model
t1 = time.perf_counter()
load_model({name!r}, device="cpu")
t2 = time.perf_counter()
print(json.dumps({{"import_s": t1 - t0, "load_s": t2 - t1}}))
"""


PROFILE_LOAD_CODE = """
import cProfile, pstats, io
from d3.models import load_model
prof = cProfile.Profile()
prof.enable()
load_model({name!r}, device="cpu")
prof.disable()
buf = io.StringIO()
pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats({top})
print(buf.getvalue())
"""


def profile_load(model: str, top: int = 25) -> str:
    """cProfile of a cache-warm load_model() in a fresh subprocess (after its imports), by cumulative time."""
    root = str(Path(__file__).resolve().parents[2])
    out = subprocess.run([sys.executable, "-c", PROFILE_LOAD_CODE.format(name=model, top=top)], cwd=root,
                         capture_output=True, text=True, check=True)
    return out.stdout


def load_time(model: str, repeats: int = 2) -> dict[str, float]:
    """Cache-warm load in fresh subprocesses: one untimed warm-up (converts and fills the OS cache), then
    `repeats` timed ones; medians of load_model() alone and of imports + load."""
    root = str(Path(__file__).resolve().parents[2])
    runs = []
    for _ in range(repeats + 1):
        out = subprocess.run([sys.executable, "-c", LOAD_CODE.format(name=model)], cwd=root, capture_output=True,
                             text=True, check=True)
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    timed = runs[1:]
    return {"load_s": statistics.median(r["load_s"] for r in timed),
            "import_plus_load_s": statistics.median(r["import_s"] + r["load_s"] for r in timed)}


# ---------------------------------------------------------------- results


def results(engine: Any, times: dict[str, list[float]], first: dict[str, Any], d3: D3Config,
            load: dict[str, float] | None) -> dict[str, Any]:
    """Ratios, theoretical speedups and target checks from the timings."""
    d3_trace, full_trace = first["d3"], first["full"]
    new_tokens = len(first["hf"])
    # the planned depth over every computed step: the engine stops recording at EOS but keeps computing
    depth = planned_mean_layers(d3, engine.num_layers, new_tokens)
    theo = theoretical_speedup([depth], engine.num_layers)
    theo_fixed = theoretical_speedup([depth], engine.num_layers, engine.fixed_cost_layers)
    speedup = pair_median(times["full"], times["d3"])
    out: dict[str, Any] = {
        "model": engine.name, "num_layers": engine.num_layers, "fixed_cost_layers": engine.fixed_cost_layers,
        "pairs": len(times["full"]), "d3_alpha": d3.alpha, "d3_mean_layers": depth,
        "d3_recorded_mean_layers": d3_trace.mean_layers, "new_tokens": new_tokens,
        "full_vs_hf": pair_median(times["full"], times["hf"]),
        **parity(first["hf"], full_trace.token_ids, engine.eos_ids),
        "d3_speedup": speedup, "d3_theoretical": theo, "d3_theoretical_fixed": theo_fixed,
        "d3_efficiency": speedup / theo_fixed, "d3_efficiency_vs_plain": speedup / theo,
        "trace_overhead": pair_median(times["traced"], times["full"]),
        "tokens_per_s": {v: statistics.median(new_tokens / t for t in ts) for v, ts in times.items()},
    }
    if load:
        out.update(load)
    out["ok"] = {
        "full_vs_hf": out["full_vs_hf"] <= TARGETS["full_vs_hf"],
        "d3_efficiency": out["d3_efficiency"] >= TARGETS["d3_efficiency"],
        "trace_overhead": out["trace_overhead"] <= TARGETS["trace_overhead"],
        **({"load_s": out["load_s"] < TARGETS["load_s"]} if load else {}),
    }
    return out


def table(res: dict[str, Any]) -> str:
    """The compact text table the CLI prints."""
    ok = lambda k: "ok" if res["ok"].get(k) else "MISSED"
    lines = [
        f"model {res['model']} · {res['num_layers']} layers · LM head = {res['fixed_cost_layers']:.1f} layers · "
        f"{res['pairs']} (prompt, repeat) pairs, medians of per-pair ratios",
        f"{'check':44} {'value':>9} {'target':>8}  status",
        f"{'(a) our full depth / model.generate':44} {res['full_vs_hf']:>8.3f}x {'<=1.05':>8}  {ok('full_vs_hf')}"
        f"  (same tokens as HF: {res['parity_with_hf']}, first {res['parity_tokens']})",
        f"{'(b) D3 speedup over full depth, measured':44} {res['d3_speedup']:>8.3f}x {'':>8}  "
        f"(alpha {res['d3_alpha']}, {res['d3_mean_layers']:.1f}/{res['num_layers']} layers)",
        f"{'    theoretical, LM head as fixed cost':44} {res['d3_theoretical_fixed']:>8.3f}x",
        f"{'    theoretical, decoder layers only':44} {res['d3_theoretical']:>8.3f}x",
        f"{'    measured / theoretical (LM head counted)':44} {res['d3_efficiency']:>9.3f} {'>=0.85':>8}  {ok('d3_efficiency')}",
        f"{'    measured / theoretical (layers only)':44} {res['d3_efficiency_vs_plain']:>9.3f}",
        f"{'(c) tracing on / off (full depth)':44} {res['trace_overhead']:>8.3f}x {'<=1.2':>8}  {ok('trace_overhead')}",
    ]
    if "load_s" in res:
        lines.append(f"{'(d) cache-warm load_model(), subprocess':44} {res['load_s']:>8.2f}s {'<5':>8}  {ok('load_s')}"
                     f"  (with imports: {res['import_plus_load_s']:.2f}s)")
    tps = " · ".join(f"{k} {v:.1f}" for k, v in res["tokens_per_s"].items())
    lines.append(f"tokens/s (median): {tps}")
    return "\n".join(lines)


def profile(run: Callable[[], Any], top: int = 15) -> str:
    """cProfile of one call, the `top` functions by own time."""
    prof = cProfile.Profile()
    prof.enable()
    run()
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).strip_dirs().sort_stats("tottime").print_stats(top)
    return buf.getvalue()


def profile_misses(engine: Any, res: dict[str, Any], prompt: str, d3: D3Config, new_tokens: int) -> dict[str, str]:
    """A profile of the variant behind each missed target (load time is profiled separately, by hand)."""
    runners = _runners(engine, d3, new_tokens)
    which = {"full_vs_hf": "full", "d3_efficiency": "d3", "trace_overhead": "traced"}
    return {k: profile(lambda v=v: runners[v](prompt)) for k, v in which.items() if not res["ok"].get(k, True)}
