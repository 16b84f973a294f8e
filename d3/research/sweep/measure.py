"""One row of the sweep: timing against full depth, agreement and KL, perplexity and task accuracy for one setting."""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from d3.compare import Recorded, compare, perplexity, run_recorded
from d3.config import TRACE_OFF, FullConfig, StrategyConfig, TraceConfig
from d3.research.data import chance_level, ppl_text
from d3.research.stats import bootstrap_difference, exact_difference
from d3.research.sweep.spec import Progress, Setting, SweepSpec
from d3.research.sweep.tasks import accuracy_of, load_examples, scoring_note, task_correct
from d3.schedule import planned_mean_layers, theoretical_speedup


@dataclass
class References:
    """Full-depth results every setting is measured against (computed once per sweep)."""

    recorded: list[Recorded] = field(default_factory=list)  # one per prompt
    ppl_chunks: list[list[int]] = field(default_factory=list)
    ppl_full: float = float("nan")
    examples: dict[str, list[Any]] = field(default_factory=dict)
    accuracy_full: dict[str, float] = field(default_factory=dict)
    correct_full: dict[str, list[bool]] = field(default_factory=dict)  # per task, per question


def timing(engine: Any, spec: SweepSpec, cfg: StrategyConfig) -> tuple[dict[str, Any], list[Any]]:
    """Full depth and `cfg` alternate on the same prompts, the order flipped with every pair (not every repeat, so
    one repeat over two prompts is balanced too), after one untimed run of `cfg`; medians of pair ratios, spread.

    Both sides run with the same recorder (a log_softmax per step) so that the first repeat's method runs
    double as the free-running runs of `quality`. Full depth against itself reads 1.00 by definition: its
    measured ratio is kept as `self_speedup` (the timing noise), with its spread.
    Returns the timing columns and those recorded runs."""
    ratios, decode_ratios, full_tps, method_tps = [], [], [], []
    first: list[Any] = []
    run_recorded(engine, spec.prompts[0], cfg, spec.gen, TRACE_OFF, chat_template=spec.chat_template)  # warm-up
    pair = 0
    for r in range(spec.repeats):
        for prompt in spec.prompts:
            flip = pair % 2 == 1
            pair += 1
            order = (cfg, FullConfig()) if flip else (FullConfig(), cfg)
            got = []
            for c in order:
                t0 = time.perf_counter()
                rec = run_recorded(engine, prompt, c, spec.gen, TRACE_OFF, chat_template=spec.chat_template)
                got.append((time.perf_counter() - t0, rec))
            (t_full, full), (t_method, method) = got[::-1] if flip else got
            if r == 0:
                first.append(method)
            ratios.append(t_full / t_method)
            decode_ratios.append(_decode_seconds(full.trace) / max(_decode_seconds(method.trace), 1e-9))
            full_tps.append(len(full.trace.steps) / t_full)
            method_tps.append(len(method.trace.steps) / t_method)
    q1, q3 = np.percentile(ratios, [25, 75])
    measured = statistics.median(ratios)
    is_full = isinstance(cfg, FullConfig)
    return {"measured_speedup": 1.0 if is_full else measured, "self_speedup": measured if is_full else float("nan"),
            "measured_speedup_iqr": float(q3 - q1), "measured_speedup_min": min(ratios),
            "measured_speedup_max": max(ratios), "decode_speedup": 1.0 if is_full else statistics.median(decode_ratios),
            "full_tokens_per_s": statistics.median(full_tps), "method_tokens_per_s": statistics.median(method_tps),
            "timing_pairs": len(ratios)}, first


def _decode_seconds(trace: Any) -> float:
    """Wall time of the decode steps, without the prefill (step 0)."""
    return sum(s.wall_ms for s in trace.steps[1:]) / 1000.0


def quality(engine: Any, spec: SweepSpec, cfg: StrategyConfig, refs: References,
            runs: Sequence[Any] | None = None) -> tuple[dict[str, Any], Any]:
    """Agreement, first divergence, KL (teacher-forced and free-running) and mean layers, averaged over prompts,
    and the first prompt's free-running trace. A run that never diverges counts max_new_tokens as its divergence.
    runs: the method's recorded free-running runs, one per prompt (from `timing`); run here when not given."""
    if isinstance(cfg, FullConfig):
        layers = [r.trace.mean_layers for r in refs.recorded]
        return {"mean_layers": float(np.mean(layers)), "agreement": 1.0, "first_divergence": float(spec.max_new_tokens),
                "kl_teacher": 0.0, "kl_free": 0.0, "filled_kv_error": float("nan"),
                **agreement_interval([1.0] * len(spec.prompts))}, refs.recorded[0].trace
    rows, first = [], None
    runs = list(runs) if runs else [None] * len(spec.prompts)
    for prompt, full, skip in zip(spec.prompts, refs.recorded, runs):
        c = compare(engine, prompt, cfg, spec.gen, TRACE_OFF, chat_template=spec.chat_template, full=full, skip=skip)
        first = first or c.skip
        s = c.summary()
        s["first_divergence"] = c.tokens.compared if s["first_divergence"] is None else s["first_divergence"]
        rows.append(s)
    mean = lambda k: float(np.nanmean([r[k] for r in rows])) if any(np.isfinite(r[k]) for r in rows) else float("nan")
    return {"mean_layers": mean("mean_layers"), "agreement": mean("agreement"),
            "first_divergence": mean("first_divergence"), "kl_teacher": mean("kl_teacher_mean"),
            "kl_free": mean("kl_free_mean"), "filled_kv_error": mean("filled_kv_error"),
            **agreement_interval([r["agreement"] for r in rows])}, first


def agreement_interval(per_prompt: Sequence[float]) -> dict[str, float]:
    """The mean agreement's 95% interval, a paired bootstrap over prompts (full depth agrees with itself on every
    one: the difference from 1). A prompt's tokens are not independent (once a run diverges it seldom returns),
    so prompts are the unit; one prompt gives no interval (NaN)."""
    if len(per_prompt) < 2:
        return {"agreement_low": float("nan"), "agreement_high": float("nan")}
    d = bootstrap_difference([1.0] * len(per_prompt), list(per_prompt))
    mean = float(np.mean(per_prompt))  # the same number the row states (1 + d.diff may round differently)
    return {"agreement_low": min(1.0 + d.low, mean), "agreement_high": max(1.0 + d.high, mean)}


def accuracy_difference(full: dict[str, list[bool]], method: dict[str, list[bool]]) -> dict[str, float]:
    """Accuracy of the method minus full depth's on the same questions (all tasks pooled), with its exact paired
    95% interval (McNemar, `d3.research.stats.exact_difference`); NaN without task questions."""
    a = [c for t in full for c in full[t]]
    b = [c for t in full for c in method.get(t, [])]
    if not a or len(a) != len(b):
        return {"diff": float("nan"), "diff_low": float("nan"), "diff_high": float("nan")}
    d = exact_difference(a, b)
    return {"diff": d.diff, "diff_low": d.low, "diff_high": d.high}


def ppl_chunks(engine: Any, spec: SweepSpec) -> list[list[int]]:
    """Consecutive windows of ppl_text() tokens, each `ppl_prefix` + `max_new_tokens` long."""
    if spec.ppl_chunks == 0:
        return []
    ids = engine.tokenizer(ppl_text())["input_ids"]
    width = spec.ppl_prefix + spec.max_new_tokens
    chunks = [ids[i:i + width] for i in range(0, len(ids) - width + 1, width)]
    return chunks[: spec.ppl_chunks]


def chunked_perplexity(engine: Any, chunks: list[list[int]], cfg: StrategyConfig, prefix: int) -> float:
    """exp(mean NLL) over equal windows, each read under the schedule after a full-depth prefix."""
    if not chunks:
        return float("nan")
    logs = [math.log(perplexity(engine, c, cfg, prefix_tokens=prefix, max_tokens=len(c) - prefix)) for c in chunks]
    return float(math.exp(np.mean(logs)))


def references(engine: Any, spec: SweepSpec, progress: Progress | None = None) -> References:
    """Full-depth runs every setting is compared with: one recorded generation per prompt, perplexity, accuracy."""
    refs = References()
    stats = TraceConfig(enabled=True, sublayer_stats=True, top_k=0)  # sublayer stats feed the Fig. 3 view
    engine.generate(spec.prompts[0], FullConfig(), spec.gen, TRACE_OFF, chat_template=spec.chat_template)  # warm-up
    for i, prompt in enumerate(spec.prompts):
        if progress:
            progress(0.0, f"full-depth reference {i + 1}/{len(spec.prompts)}")
        refs.recorded.append(run_recorded(engine, prompt, FullConfig(), spec.gen, stats, chat_template=spec.chat_template))
    refs.ppl_chunks = ppl_chunks(engine, spec)
    refs.ppl_full = chunked_perplexity(engine, refs.ppl_chunks, FullConfig(), spec.ppl_prefix)
    refs.examples = load_examples(spec) if spec.tasks else {}
    if refs.examples:
        if progress:
            progress(0.0, "full-depth task accuracy")
        refs.correct_full = task_correct(engine, spec, FullConfig(), refs.examples)
        refs.accuracy_full = accuracy_of(refs.correct_full)
    return refs


def measure_row(engine: Any, spec: SweepSpec, setting: Setting, refs: References, key: str) -> tuple[dict[str, Any], Any]:
    """One table row for one setting, and the first prompt's trace under it."""
    t0 = time.perf_counter()
    cfg, L, T = setting.config, engine.num_layers, spec.max_new_tokens
    row: dict[str, Any] = {"key": key, "model": engine.name, "num_layers": L, "strategy": cfg.name,
                           "label": setting.label, "params": json.dumps(cfg.to_dict(), sort_keys=True),
                           "target_depth": setting.target_depth if setting.target_depth is not None else float("nan"),
                           "prompts": len(spec.prompts), "new_tokens": T, "repeats": spec.repeats,
                           "planned_mean_layers": planned_mean_layers(cfg, L, T),
                           "fixed_cost_layers": engine.fixed_cost_layers}
    timed, runs = timing(engine, spec, cfg)
    scores, first = quality(engine, spec, cfg, refs, runs)
    row.update(scores)
    row["depth_fraction"] = row["mean_layers"] / L
    row.update(theoretical_columns(row["planned_mean_layers"], row["mean_layers"], L, engine.fixed_cost_layers))
    row.update(timed)
    ppl = refs.ppl_full if isinstance(cfg, FullConfig) else chunked_perplexity(engine, refs.ppl_chunks, cfg, spec.ppl_prefix)
    row.update({"ppl": ppl, "ppl_full": refs.ppl_full, "ppl_ratio": ppl / refs.ppl_full if refs.ppl_chunks else float("nan"),
                "ppl_tokens": len(refs.ppl_chunks) * T})
    correct = refs.correct_full if isinstance(cfg, FullConfig) else (
        task_correct(engine, spec, cfg, refs.examples) if refs.examples else {})
    acc = accuracy_of(correct)
    row.update(accuracy_difference(refs.correct_full, correct))
    per_task = {t: {"accuracy": acc[t], "accuracy_full": refs.accuracy_full[t], "chance": chance_level(refs.examples[t]),
                    "n": len(refs.examples[t])} for t in acc}
    row.update({"accuracy": _mean([v["accuracy"] for v in per_task.values()]),
                "accuracy_full": _mean([v["accuracy_full"] for v in per_task.values()]),
                "chance": _mean([v["chance"] for v in per_task.values()]),
                "task_scoring": scoring_note(spec, refs.examples), "task_accuracy": json.dumps(per_task, sort_keys=True)})
    row["seconds"] = time.perf_counter() - t0
    row["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    return row, first


def theoretical_columns(planned: float, measured: float, num_layers: int, fixed: float) -> dict[str, float]:
    """Theoretical speedups from the depth actually computed: the planned mean over all max_new_tokens steps
    where the schedule is fixed (the engine keeps computing after an EOS but stops recording steps, so the
    recorded mean can cover fewer tokens than were timed), the recorded mean for early exit."""
    depth = planned if math.isfinite(planned) else measured
    return {"theoretical_speedup": theoretical_speedup([depth], num_layers),
            "theoretical_speedup_fixed": theoretical_speedup([depth], num_layers, fixed)}


def _mean(values: list[float]) -> float:
    return float(np.mean(values)) if values else float("nan")
