"""Grid sweeps: D3 settings and baselines at matched mean depth, measured against full depth, one CSV row each.

`python -m d3 sweep` runs a `SweepSpec` grid over a prompt set and appends one tidy row per setting to a CSV
as soon as it is measured, so an interrupted sweep resumes: a rerun skips every setting whose key (a stable
hash of the setting and of everything that was measured with it) is already in the file.

Per setting: mean layers used, theoretical speedup with and without the LM-head fixed cost, measured speedup
against full depth (full depth and the method alternate on the same prompts; median over prompt x repeat
pairs), greedy agreement and first divergence, KL teacher-forced and free-running (`d3.compare.compare`),
perplexity of real text read under the schedule, and task accuracy where tasks are given.

Timing and quality runs compute exactly `max_new_tokens` steps (`stop_at_eos=False`), so every strategy is timed
on the same positions of its schedule. The engine stops recording a sequence's steps at its first EOS (while
still computing the remaining steps), so `mean_layers`, agreement and KL cover the tokens up to that EOS;
theoretical speedups use the planned mean over all computed steps (see `theoretical_columns`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from d3.config import (
    DROP_ORDERS,
    FILLS,
    TRACE_OFF,
    D3Config,
    EarlyExitConfig,
    FullConfig,
    GenerationConfig,
    SkipDecodeConfig,
    StrategyConfig,
    TraceConfig,
    UnifiedConfig,
)
from d3.schedule import alpha_for_mean_depth, plan, theoretical_speedup, unified_layers

Progress = Callable[[float, str], None]
BASELINES = ("skipdecode", "unified", "early_exit")
TASK_SCORINGS = ("loglik", "generate")
ASSETS = Path(__file__).resolve().parent.parent / "assets"
BUILTIN_PROMPTS = (
    "Explain in a few sentences why the sky looks blue during the day.",
    "List five tips for getting a good night's sleep.",
    "Write the opening paragraph of a short story about a lighthouse keeper who finds a message in a bottle.",
    "Write a short, polite email asking a colleague to move tomorrow's meeting to Friday.",
)

# The table, in order. Every row of every sweep has exactly these columns.
COLUMNS = (
    "key", "model", "num_layers", "strategy", "label", "params", "target_depth", "prompts", "new_tokens", "repeats",
    "mean_layers", "planned_mean_layers", "depth_fraction", "fixed_cost_layers",
    "theoretical_speedup", "theoretical_speedup_fixed", "measured_speedup", "measured_speedup_iqr",
    "decode_speedup", "full_tokens_per_s", "method_tokens_per_s", "timing_pairs",
    "agreement", "first_divergence", "kl_teacher", "kl_free", "filled_kv_error",
    "ppl", "ppl_full", "ppl_ratio", "ppl_tokens",
    "accuracy", "accuracy_full", "chance", "task_scoring", "task_accuracy", "seconds", "finished_at",
)
FLOAT_COLUMNS = tuple(c for c in COLUMNS if c not in (
    "key", "model", "strategy", "label", "params", "task_scoring", "task_accuracy", "finished_at",
    "num_layers", "prompts", "new_tokens", "repeats", "timing_pairs", "ppl_tokens"))
INT_COLUMNS = ("num_layers", "prompts", "new_tokens", "repeats", "timing_pairs", "ppl_tokens")
STRING_COLUMNS = ("key", "model", "strategy", "label", "params", "task_scoring", "task_accuracy", "finished_at")


def _check(ok: bool, name: str, value: Any, allowed: str) -> None:
    if not ok:
        raise ValueError(f"{name}={value!r} is not allowed: {name} must be {allowed}")


@dataclass(frozen=True)
class SweepSpec:
    """The grid and what is measured for it.

    depths: target mean depths (fraction of L over the generated tokens); every D3 variant and every baseline
      is tuned to each one (D3 by bisection on alpha, SkipDecode / Unified by picking the closest planned mean,
      early exit by calibrating its threshold on a full-depth run's confidences).
    alphas: extra D3 settings with an explicit alpha (default core, start, fill, order).
    cores / starts / fills / drop_orders: D3 variants. The first value of each is the base; unless `product`,
      the other values are run one at a time at `variants_at` depth only (a one-factor-at-a-time grid). With a
      nested drop order (middle_out, top_down, bottom_up) no later token reads a skipped entry, so fills make
      no difference there: when "strided" is among drop_orders, the other fills run with it instead.
    tasks: BIG-bench task names (d3.data.TASKS), `task_limit` examples each; scored by `task_scoring`:
      "loglik" picks the multiple-choice option with the highest summed log-likelihood under the schedule
      (exact-match tasks always use greedy generation + `score_exact`), "generate" uses greedy generation
      + `score_exact` for every task.
    ppl_chunks: how many windows of `d3.data.ppl_text()` (each `ppl_prefix` + `max_new_tokens` tokens) perplexity
      is measured on; 0 turns perplexity off.
    """

    model: str = "smollm2-135m"
    prompts: tuple[str, ...] = BUILTIN_PROMPTS
    max_new_tokens: int = 64
    repeats: int = 3
    depths: tuple[float, ...] = (0.85, 0.75, 2 / 3, 0.55)
    alphas: tuple[float, ...] = ()
    cores: tuple[tuple[int, int] | None, ...] = (None,)
    starts: tuple[int, ...] = (0,)
    fills: tuple[str, ...] = ("copy",)
    drop_orders: tuple[str, ...] = ("middle_out",)
    variants_at: float = 2 / 3
    product: bool = False
    baselines: tuple[str, ...] = BASELINES
    baseline_depths: tuple[float, ...] | None = None  # None: every depth
    early_exit_measures: tuple[str, ...] = ("softmax_gap",)
    early_exit_depths: tuple[float, ...] | None = None  # None: the baseline depths
    tasks: tuple[str, ...] = ()
    task_limit: int = 30
    task_scoring: str = "loglik"
    ppl_chunks: int = 4
    ppl_prefix: int = 32
    chat_template: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        _check(len(self.prompts) >= 1 and all(isinstance(p, str) and p.strip() for p in self.prompts), "prompts",
               self.prompts, "one or more non-empty strings")
        _check(isinstance(self.max_new_tokens, int) and 2 <= self.max_new_tokens <= 1024, "max_new_tokens",
               self.max_new_tokens, "an integer in [2, 1024]")
        _check(isinstance(self.repeats, int) and 1 <= self.repeats <= 50, "repeats", self.repeats, "an integer in [1, 50]")
        for d in (*self.depths, self.variants_at, *(self.baseline_depths or ()), *(self.early_exit_depths or ())):
            _check(0 < d <= 1, "depths", d, "fractions in (0, 1]")
        for a in self.alphas:
            _check(0 < a <= 1, "alphas", a, "numbers in (0, 1]")
        _check(len(self.cores) >= 1, "cores", self.cores, "at least one (head, tail) pair or None")
        for core in self.cores:
            _check(core is None or (len(core) == 2 and all(isinstance(x, int) and x >= 0 for x in core)), "cores",
                   core, "None or a (head, tail) pair of integers >= 0")
        _check(len(self.starts) >= 1 and all(isinstance(s, int) and s >= 0 for s in self.starts), "starts", self.starts,
               "one or more integers >= 0 (tokens)")
        _check(len(self.fills) >= 1 and all(f in FILLS for f in self.fills), "fills", self.fills, f"among {FILLS}")
        _check(len(self.drop_orders) >= 1 and all(o in DROP_ORDERS for o in self.drop_orders), "drop_orders",
               self.drop_orders, f"among {DROP_ORDERS}")
        _check(all(b in BASELINES for b in self.baselines), "baselines", self.baselines, f"among {BASELINES}")
        _check(self.task_scoring in TASK_SCORINGS, "task_scoring", self.task_scoring, f"one of {TASK_SCORINGS}")
        _check(isinstance(self.task_limit, int) and self.task_limit >= 1, "task_limit", self.task_limit, "an integer >= 1")
        _check(isinstance(self.ppl_chunks, int) and self.ppl_chunks >= 0, "ppl_chunks", self.ppl_chunks, "an integer >= 0")

    @property
    def gen(self) -> GenerationConfig:
        return GenerationConfig(max_new_tokens=self.max_new_tokens, stop_at_eos=False)

    def measured_with(self) -> dict[str, Any]:
        """Everything besides the strategy that a row's numbers depend on (part of every row's key)."""
        d = asdict(self)
        for name in ("depths", "alphas", "cores", "starts", "fills", "drop_orders", "variants_at", "product",
                     "baselines", "baseline_depths", "early_exit_measures", "early_exit_depths"):
            d.pop(name)
        return d


@dataclass(frozen=True)
class Setting:
    """One point of the grid: a strategy config, its label and the mean depth it was tuned to (None: untuned)."""

    label: str
    config: StrategyConfig
    target_depth: float | None = None


# ---------------------------------------------------------------- keys


def setting_key(spec: SweepSpec, model_name: str, setting: Setting) -> str:
    """A stable hash of the strategy config, the model and everything the row was measured with."""
    payload = {"model": model_name, "strategy": setting.config.to_dict(), "measured_with": spec.measured_with()}
    text = json.dumps(payload, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# ---------------------------------------------------------------- matching depths (pure)


def planned_mean_layers(cfg: StrategyConfig, num_layers: int, steps: int) -> float:
    """Mean planned layers over generated tokens 0..steps-1; token 0 comes from the full-depth prefill.

    NaN for early exit, whose depth is only known after running."""
    if isinstance(cfg, EarlyExitConfig):
        return float("nan")
    counts = [num_layers] + [len(plan(cfg, num_layers, i).run) for i in range(1, steps)]
    return sum(counts) / steps


def d3_for_depth(depth: float, num_layers: int, steps: int, *, core: tuple[int, int] | None = None, start: int = 0,
                 fill: str = "copy", drop_order: str = "middle_out") -> D3Config:
    """The D3 config of these variants whose planned mean depth is closest to `depth * L` (alpha by bisection)."""
    head, tail = core if core is not None else (None, None)
    alpha = alpha_for_mean_depth(depth, num_layers, steps, core_head=head, core_tail=tail, start=start)
    return D3Config(alpha=alpha, core_head=head, core_tail=tail, start=start, fill=fill, drop_order=drop_order)


def _closest(candidates: Iterable[StrategyConfig], target: float, num_layers: int, steps: int) -> StrategyConfig:
    return min(candidates, key=lambda c: abs(planned_mean_layers(c, num_layers, steps) - target))


def skipdecode_for_depth(depth: float, num_layers: int, steps: int, warmup: int = 1) -> SkipDecodeConfig:
    """SkipDecode with max:min = 2:1 (the paper's (22, 11) shape), linear over `steps`, closest planned mean."""
    target = depth * num_layers
    candidates = []
    for hi in range(max(1, warmup), num_layers + 1):
        lo = max(warmup, 1, round(hi / 2))
        candidates.append(SkipDecodeConfig(max_layers=hi, min_layers=min(lo, hi), warmup=warmup, horizon=steps))
    return _closest(candidates, target, num_layers, steps)


def unified_for_depth(depth: float, num_layers: int, steps: int) -> UnifiedConfig:
    """Unified Layer Skipping with the ratio whose kept layers give the closest planned mean."""
    target = depth * num_layers
    candidates = []
    for keep in range(2, num_layers + 1):
        ratio = round(num_layers / keep, 6)
        if 1 <= ratio <= 64 and len(unified_layers(num_layers, ratio)) >= min(2, num_layers):
            candidates.append(UnifiedConfig(ratio=ratio))
    return _closest(candidates, target, num_layers, steps)


def exit_layers(confidence: Sequence[float], min_exit: int, num_layers: int, threshold: float) -> int:
    """Layers a token would run under `threshold`, from the confidences measured after layers min_exit, min_exit+1..."""
    for k, c in enumerate(confidence):
        if c >= threshold:
            return min_exit + k
    return num_layers


def threshold_for_depth(profiles: Sequence[Sequence[float]], min_exit: int, num_layers: int, depth: float) -> float:
    """The early-exit threshold whose mean depth over `profiles` (one confidence list per token) is closest to
    `depth * L`; token 0 (the prefill) counts as full depth, like every strategy's."""
    target = depth * num_layers

    def mean_at(t: float) -> float:
        used = [num_layers] + [exit_layers(p, min_exit, num_layers, t) for p in profiles]
        return sum(used) / len(used)

    lo, hi = 1e-6, 1.0  # mean depth rises with the threshold
    for _ in range(40):
        mid = (lo + hi) / 2
        if mean_at(mid) < target:
            lo = mid
        else:
            hi = mid
    best = min((lo, hi), key=lambda t: abs(mean_at(t) - target))
    return float(f"{best:.4g}")


# ---------------------------------------------------------------- the grid


def _d3_label(cfg: D3Config, num_layers: int) -> str:
    head, tail = cfg.core(num_layers)
    return f"d3 α={_alpha_text(cfg.alpha)} core={head}+{tail} start={cfg.start} {cfg.fill} {cfg.drop_order}"


def _alpha_text(alpha: float) -> str:
    """Four decimals, or as many (up to 8) as it takes to tell an alpha below 1 from 1 (0.999999)."""
    for digits in range(4, 9):
        text = f"{alpha:.{digits}f}"
        if alpha == 1.0 or float(text) < 1.0:
            return text
    return repr(alpha)


def d3_settings(spec: SweepSpec, num_layers: int) -> list[Setting]:
    """D3 variants: base values at every depth; other values one at a time at `variants_at` (or the full product)."""
    T = spec.max_new_tokens
    axes = (spec.cores, spec.starts, spec.fills, spec.drop_orders)
    combos: list[tuple[float, tuple]] = []
    base = tuple(a[0] for a in axes)
    if spec.product:
        import itertools
        combos = [(d, c) for d in spec.depths for c in itertools.product(*axes)]
    else:
        combos = [(d, base) for d in spec.depths]
        paired = "strided" in spec.drop_orders and base[3] != "strided"
        for i, axis in enumerate(axes):
            for value in axis[1:]:
                combo = list(base)
                combo[i] = value
                if i == 2 and paired:  # fills only matter where layer sets are not nested: run them strided
                    combo[3] = "strided"
                combos.append((spec.variants_at, tuple(combo)))
    out = []
    for depth, (core, start, fill, order) in combos:
        cfg = d3_for_depth(depth, num_layers, T, core=core, start=start, fill=fill, drop_order=order)
        cfg.check_layers(num_layers)
        out.append(Setting(_d3_label(cfg, num_layers), cfg, depth))
    for alpha in spec.alphas:
        cfg = D3Config(alpha=alpha)
        out.append(Setting(_d3_label(cfg, num_layers), cfg, None))
    return _unique(out)


def _unique(settings: list[Setting]) -> list[Setting]:
    seen: set[str] = set()
    out = []
    for s in settings:
        k = json.dumps(s.config.to_dict(), sort_keys=True)
        if k not in seen:
            seen.add(k)
            out.append(s)
    return out


def planned_baselines(spec: SweepSpec, num_layers: int) -> list[Setting]:
    """SkipDecode and Unified Layer Skipping at each baseline depth (their depth is known before running)."""
    T = spec.max_new_tokens
    out = []
    for depth in spec.baseline_depths or spec.depths:
        if "skipdecode" in spec.baselines:
            cfg = skipdecode_for_depth(depth, num_layers, T)
            hi, lo = cfg.bounds(num_layers)
            out.append(Setting(f"skipdecode {hi}→{lo} over {cfg.horizon}", cfg, depth))
        if "unified" in spec.baselines:
            cfg = unified_for_depth(depth, num_layers, T)
            keep = len(unified_layers(num_layers, cfg.ratio))
            out.append(Setting(f"unified r={cfg.ratio:.3g} ({keep} layers)", cfg, depth))
    return _unique(out)


def early_exit_settings(spec: SweepSpec, num_layers: int, profiles: dict[str, tuple[list[list[float]], int]]) -> list[Setting]:
    """Early exit at each baseline depth, thresholds calibrated from `profiles` (measure -> (confidences, min_exit))."""
    out = []
    for depth in spec.early_exit_depths or spec.baseline_depths or spec.depths:
        for measure, (conf, min_exit) in profiles.items():
            t = threshold_for_depth(conf, min_exit, num_layers, depth)
            cfg = EarlyExitConfig(threshold=t, measure=measure)
            out.append(Setting(f"early_exit {measure}≥{t:g}", cfg, depth))
    return _unique(out)


def calibrate_early_exit(engine: Any, spec: SweepSpec) -> dict[str, tuple[list[list[float]], int]]:
    """Per measure: the confidence after every layer of every token of the first prompt, at (almost) full depth.

    threshold 1.0 almost never exits, so this records the whole confidence profile once; thresholds for any
    depth are then read off it (on the full-depth trajectory: the real run's depth is measured, not assumed)."""
    if "early_exit" not in spec.baselines:
        return {}
    out = {}
    gen = GenerationConfig(max_new_tokens=min(spec.max_new_tokens, 32), stop_at_eos=False)
    for measure in spec.early_exit_measures:
        cfg = EarlyExitConfig(threshold=1.0, measure=measure)
        trace = engine.generate(spec.prompts[0], cfg, gen, TRACE_OFF, chat_template=spec.chat_template)
        min_exit = min(cfg.min_layers, engine.num_layers)
        out[measure] = ([list(s.confidence) for s in trace.steps[1:]], min_exit)
    return out


def all_settings(spec: SweepSpec, engine: Any) -> list[Setting]:
    """Full depth first (the reference row), then D3, then the baselines."""
    L = engine.num_layers
    profiles = calibrate_early_exit(engine, spec)
    return [Setting("full depth", FullConfig(), 1.0), *d3_settings(spec, L), *planned_baselines(spec, L),
            *early_exit_settings(spec, L, profiles)]


# ---------------------------------------------------------------- measuring one setting


@dataclass
class References:
    """Full-depth results every setting is measured against (computed once per sweep)."""

    recorded: list[Any] = field(default_factory=list)  # d3.compare.Recorded per prompt
    ppl_chunks: list[list[int]] = field(default_factory=list)
    ppl_full: float = float("nan")
    examples: dict[str, list[Any]] = field(default_factory=dict)
    accuracy_full: dict[str, float] = field(default_factory=dict)


def timing(engine: Any, spec: SweepSpec, cfg: StrategyConfig) -> tuple[dict[str, Any], list[Any]]:
    """Full depth and `cfg` alternate on the same prompts (order flipped every repeat); medians of pair ratios.

    Both sides run with the same recorder (a log_softmax per step) so that the first repeat's method runs
    double as the free-running runs of `quality`. Returns the timing columns and those recorded runs."""
    from d3.compare import run_recorded

    ratios, decode_ratios, full_tps, method_tps = [], [], [], []
    first: list[Any] = []
    for r in range(spec.repeats):
        for prompt in spec.prompts:
            order = (FullConfig(), cfg) if r % 2 == 0 else (cfg, FullConfig())
            got = []
            for c in order:
                t0 = time.perf_counter()
                rec = run_recorded(engine, prompt, c, spec.gen, TRACE_OFF, chat_template=spec.chat_template)
                got.append((time.perf_counter() - t0, rec))
            (t_full, full), (t_method, method) = got if r % 2 == 0 else got[::-1]
            if r == 0:
                first.append(method)
            ratios.append(t_full / t_method)
            decode_ratios.append(_decode_seconds(full.trace) / max(_decode_seconds(method.trace), 1e-9))
            full_tps.append(len(full.trace.steps) / t_full)
            method_tps.append(len(method.trace.steps) / t_method)
    q1, q3 = np.percentile(ratios, [25, 75])
    return {"measured_speedup": statistics.median(ratios), "measured_speedup_iqr": float(q3 - q1),
            "decode_speedup": statistics.median(decode_ratios), "full_tokens_per_s": statistics.median(full_tps),
            "method_tokens_per_s": statistics.median(method_tps), "timing_pairs": len(ratios)}, first


def _decode_seconds(trace: Any) -> float:
    """Wall time of the decode steps, without the prefill (step 0)."""
    return sum(s.wall_ms for s in trace.steps[1:]) / 1000.0


def quality(engine: Any, spec: SweepSpec, cfg: StrategyConfig, refs: References,
            runs: Sequence[Any] | None = None) -> tuple[dict[str, Any], Any]:
    """Agreement, first divergence, KL (teacher-forced and free-running) and mean layers, averaged over prompts,
    and the first prompt's free-running trace. A run that never diverges counts max_new_tokens as its divergence.
    runs: the method's recorded free-running runs, one per prompt (from `timing`); run here when not given."""
    from d3.compare import compare

    if isinstance(cfg, FullConfig):
        layers = [r.trace.mean_layers for r in refs.recorded]
        return {"mean_layers": float(np.mean(layers)), "agreement": 1.0, "first_divergence": float(spec.max_new_tokens),
                "kl_teacher": 0.0, "kl_free": 0.0, "filled_kv_error": float("nan")}, refs.recorded[0].trace
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
            "kl_free": mean("kl_free_mean"), "filled_kv_error": mean("filled_kv_error")}, first


def ppl_chunks(engine: Any, spec: SweepSpec) -> list[list[int]]:
    """Consecutive windows of ppl_text() tokens, each `ppl_prefix` + `max_new_tokens` long."""
    from d3.data import ppl_text

    if spec.ppl_chunks == 0:
        return []
    ids = engine.tokenizer(ppl_text())["input_ids"]
    width = spec.ppl_prefix + spec.max_new_tokens
    chunks = [ids[i:i + width] for i in range(0, len(ids) - width + 1, width)]
    return chunks[: spec.ppl_chunks]


def chunked_perplexity(engine: Any, chunks: list[list[int]], cfg: StrategyConfig, prefix: int) -> float:
    """exp(mean NLL) over equal windows, each read under the schedule after a full-depth prefix."""
    from d3.compare import perplexity

    if not chunks:
        return float("nan")
    logs = [math.log(perplexity(engine, c, cfg, prefix_tokens=prefix, max_tokens=len(c) - prefix)) for c in chunks]
    return float(math.exp(np.mean(logs)))


# ---------------------------------------------------------------- tasks


def load_examples(spec: SweepSpec) -> dict[str, list[Any]]:
    from d3.data import load_task

    return {t: load_task(t, limit=spec.task_limit, seed=spec.seed) for t in spec.tasks}


def _loglik_correct(engine: Any, cfg: StrategyConfig, example: Any, chat_template: bool) -> bool:
    """Pick the option whose tokens have the highest summed log-probability, read under the schedule.

    The prompt is prefilled once and shared by all options (`Engine.score_continuations`)."""
    from d3.data import format_answer, format_prompt

    tok = engine.tokenizer
    # The options stay out of the prompt: the embedded model is above chance on the chosen tasks only
    # when it ranks the answers without seeing them listed (see d3/data.py TASKS).
    prompt_ids = tok(format_prompt(example, show_choices=False))["input_ids"]
    options = [tok(format_answer(c), add_special_tokens=False)["input_ids"] or [tok.unk_token_id or 0]
               for c in example.choices]
    scores = engine.score_continuations(prompt_ids, options, cfg)
    return int(np.argmax(scores)) == example.target_index


def _generate_correct(engine: Any, cfg: StrategyConfig, examples: list[Any], batch: int = 8) -> list[bool]:
    """Greedy answers (up to the longest accepted answer + 4 tokens), scored by `score_exact` on the first line."""
    from d3.data import format_prompt, score_exact

    tok = engine.tokenizer
    out: list[bool] = []
    for i in range(0, len(examples), batch):
        part = examples[i:i + batch]
        longest = max(len(tok(" " + t, add_special_tokens=False)["input_ids"]) for ex in part for t in ex.targets or (ex.target,))
        gen = GenerationConfig(max_new_tokens=min(longest + 4, 256), stop_at_eos=True)
        traces = engine.generate_batch([tok(format_prompt(ex))["input_ids"] for ex in part], cfg, gen, TRACE_OFF)
        out += [score_exact(ex, t.text) for ex, t in zip(part, traces)]
    return out


def task_accuracy(engine: Any, spec: SweepSpec, cfg: StrategyConfig, examples: dict[str, list[Any]]) -> dict[str, float]:
    """Accuracy per task (prompts are plain text `format_prompt`, no chat template, as a base-model eval)."""
    acc = {}
    for task, exs in examples.items():
        if spec.task_scoring == "loglik" and all(ex.choices for ex in exs):
            correct = [_loglik_correct(engine, cfg, ex, False) for ex in exs]
        else:
            correct = _generate_correct(engine, cfg, exs)
        acc[task] = float(np.mean(correct)) if correct else float("nan")
    return acc


def _scoring_note(spec: SweepSpec, examples: dict[str, list[Any]]) -> str:
    if not examples:
        return ""
    if spec.task_scoring == "generate":
        return "greedy generation + score_exact"
    kinds = {("loglik" if all(ex.choices for ex in exs) else "generate") for exs in examples.values()}
    return "option log-likelihood under the schedule" if kinds == {"loglik"} else \
        "option log-likelihood (multiple choice); greedy generation + score_exact (exact match)"


# ---------------------------------------------------------------- rows


def references(engine: Any, spec: SweepSpec, progress: Progress | None = None) -> References:
    """Full-depth runs every setting is compared with: one recorded generation per prompt, perplexity, accuracy."""
    from d3.compare import run_recorded

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
        refs.accuracy_full = task_accuracy(engine, spec, FullConfig(), refs.examples)
    return refs


def measure(engine: Any, spec: SweepSpec, setting: Setting, refs: References, key: str) -> tuple[dict[str, Any], Any]:
    """One table row for one setting, and the first prompt's trace under it."""
    from d3.data import chance_level

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
    acc = refs.accuracy_full if isinstance(cfg, FullConfig) else (
        task_accuracy(engine, spec, cfg, refs.examples) if refs.examples else {})
    per_task = {t: {"accuracy": acc[t], "accuracy_full": refs.accuracy_full[t], "chance": chance_level(refs.examples[t]),
                    "n": len(refs.examples[t])} for t in acc}
    row.update({"accuracy": _mean([v["accuracy"] for v in per_task.values()]),
                "accuracy_full": _mean([v["accuracy_full"] for v in per_task.values()]),
                "chance": _mean([v["chance"] for v in per_task.values()]),
                "task_scoring": _scoring_note(spec, refs.examples), "task_accuracy": json.dumps(per_task, sort_keys=True)})
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


# ---------------------------------------------------------------- files


def read_results(path: str | Path):  # -> pandas.DataFrame
    """The sweep table with its column types; an empty table with every column if the file is absent."""
    import pandas as pd

    path = Path(path)
    if not path.is_file() or path.stat().st_size == 0:
        return pd.DataFrame({c: pd.Series(dtype=_dtype(c)) for c in COLUMNS})
    df = pd.read_csv(path, dtype={c: "object" for c in STRING_COLUMNS})
    for c in FLOAT_COLUMNS:
        df[c] = pd.to_numeric(df[c], errors="coerce").astype("float64")
    for c in INT_COLUMNS:
        df[c] = pd.to_numeric(df[c], errors="coerce").fillna(0).astype("int64")
    for c in STRING_COLUMNS:
        df[c] = df[c].astype("object").where(df[c].notna(), "").astype(str)
    return df.drop_duplicates("key", keep="last").reset_index(drop=True)


def _dtype(column: str) -> str:
    return "float64" if column in FLOAT_COLUMNS else "int64" if column in INT_COLUMNS else "object"


def append_row(path: str | Path, row: dict[str, Any]) -> None:
    """Append one row to the CSV (header first if the file is new), flushed before returning."""
    import pandas as pd

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    new = not path.is_file() or path.stat().st_size == 0
    frame = pd.DataFrame([{c: row.get(c, float("nan")) for c in COLUMNS}], columns=list(COLUMNS))
    with open(path, "a", encoding="utf-8", newline="") as fh:
        frame.to_csv(fh, header=new, index=False)
        fh.flush()


def sidecar(path: str | Path, suffix: str) -> Path:
    """results/x.csv -> results/x.<suffix>."""
    path = Path(path)
    return path.with_name(path.stem + "." + suffix)


def slim_trace(trace: Any) -> dict[str, Any]:
    """A trace without per-step stats, top-k or attention: enough for the layers-vs-step view."""
    d = trace.to_dict()
    for step in d["steps"]:
        for k in ("stats", "attention", "topk", "logit_lens", "confidence"):
            step.pop(k, None)
    d["prompt_stats"] = {"tokens": [], "stats": {}}
    return d


def block_rows(traces: Sequence[Any]) -> list[dict[str, Any]]:
    """One row per (trace, layer): mean attention / MLP change over the trace's generated tokens (Fig. 3 data)."""
    from d3.trace import LAYER_STATS

    rows = []
    for i, trace in enumerate(traces):
        means = {}
        for name in LAYER_STATS:
            values = trace.stat(name)[1:]  # decode steps; step 0 is the prefill's last position
            with np.errstate(all="ignore"):
                means[name] = np.nanmean(values, axis=0) if len(values) else np.full(trace.num_layers, np.nan)
        for layer in range(trace.num_layers):
            rows.append({"trace": i, "layer": layer, **{k: _json_float(v[layer]) for k, v in means.items()}})
    return rows


def _json_float(x: Any) -> float | None:
    x = float(x)
    return None if math.isnan(x) else round(x, 6)


def append_jsonl(path: Path, record: dict[str, Any]) -> None:
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(record) + "\n")


def write_json(csv_path: str | Path) -> Path:
    """The finished table as JSON records next to the CSV (NaN as null)."""
    out = sidecar(csv_path, "json")
    df = read_results(csv_path)
    out.write_text(df.to_json(orient="records", indent=1, force_ascii=False), encoding="utf-8")
    return out


# ---------------------------------------------------------------- the sweep


def run_sweep(spec: SweepSpec, out: str | Path, *, engine: Any = None, progress: Progress | None = None,
              limit: int | None = None) -> Any:
    """Measure every setting of `spec` not already in `out` (at most `limit` new ones), row by row.

    Returns the whole table (old and new rows). `progress(fraction, desc)` is called as settings finish."""
    engine = engine if engine is not None else _load_engine(spec.model)
    out = Path(out)
    done = set(read_results(out)["key"])
    settings = all_settings(spec, engine)
    keyed = [(setting_key(spec, engine.name, s), s) for s in settings]
    todo = [(k, s) for k, s in keyed if k not in done][: limit if limit is not None else None]
    report = progress or (lambda f, d: None)
    report(0.0, f"{len(keyed) - len([k for k, _ in keyed if k not in done])} of {len(keyed)} settings already done")
    if todo:
        refs = references(engine, spec, progress)
        traces_path = sidecar(out, "traces.jsonl")
        if keyed[0][0] not in done:  # the full-depth row carries the Fig. 3 data
            append_jsonl(traces_path, {"kind": "block", "key": keyed[0][0], "rows": block_rows([r.trace for r in refs.recorded])})
        for i, (key, setting) in enumerate(todo):
            report(i / len(todo), f"{setting.label} ({i + 1}/{len(todo)})")
            row, first = measure(engine, spec, setting, refs, key)
            append_row(out, row)
            append_jsonl(traces_path, {"kind": "layers", "key": key, "label": setting.label, "trace": slim_trace(first)})
        report(1.0, f"{len(todo)} settings measured")
    write_json(out)
    return read_results(out)


def _load_engine(name: str) -> Any:
    from d3.engine import Engine
    from d3.models import get_model

    return Engine.from_loaded(get_model(name))


# ---------------------------------------------------------------- CLI


def load_prompts(count: int, path: Path | None = None) -> tuple[str, ...]:
    """The first `count` prompts of assets/prompts.json (or the built-in list if the file is missing)."""
    path = path or ASSETS / "prompts.json"
    prompts = [p["prompt"] for p in json.loads(path.read_text())] if path.is_file() else list(BUILTIN_PROMPTS)
    return tuple(prompts[:count])


def _floats(text: str) -> tuple[float, ...]:
    """"0.85,2/3" -> (0.85, 0.666...)."""
    from fractions import Fraction

    return tuple(float(Fraction(x.strip())) for x in text.split(",") if x.strip())


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def _cores(text: str) -> tuple[tuple[int, int] | None, ...]:
    """"default,0+0,2+2" -> (None, (0, 0), (2, 2))."""
    out: list[tuple[int, int] | None] = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        if part == "default":
            out.append(None)
        else:
            head, tail = part.split("+")
            out.append((int(head), int(tail)))
    return tuple(out)


def _words(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def _task_names(text: str) -> tuple[str, ...]:
    """Comma-separated task names; "default" stands for the tasks the embedded model is above chance on."""
    from d3.data import DEFAULT_TASKS

    names = _words(text)
    return DEFAULT_TASKS if names == ("default",) else names


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register `sweep` on an argparse subparsers object."""
    p = subparsers.add_parser("sweep", help="run a grid of D3 settings and baselines at matched depth",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--out", default="results/sweep.csv", help="CSV appended row by row; a rerun resumes")
    p.add_argument("--prompts", type=int, default=4, help="how many prompts of assets/prompts.json")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3, help="timing repeats (full depth and method alternate)")
    p.add_argument("--depths", default="0.85,0.75,2/3,0.55", help="target mean depths, fractions of L")
    p.add_argument("--alphas", default="", help="extra D3 settings with explicit alpha")
    p.add_argument("--cores", default="default", help="D3 core splits, e.g. default,0+0,4+4")
    p.add_argument("--starts", default="0", help="D3 start values in tokens, e.g. 0,16")
    p.add_argument("--fills", default="copy", help="D3 fills among copy,propagate,none")
    p.add_argument("--drop-orders", default="middle_out", help=f"D3 drop orders among {','.join(DROP_ORDERS)}")
    p.add_argument("--variants-at", default="2/3", help="depth at which the non-base D3 variants run")
    p.add_argument("--product", action="store_true", help="full product of the D3 axes at every depth")
    p.add_argument("--baselines", default=",".join(BASELINES))
    p.add_argument("--baseline-depths", default="", help="depths for baselines (default: --depths)")
    p.add_argument("--early-exit-measures", default="softmax_gap", help="softmax_gap,cosine")
    p.add_argument("--early-exit-depths", default="", help="depths for early exit (default: baseline depths)")
    p.add_argument("--tasks", default="", help="BIG-bench tasks (d3.data.TASKS), comma separated; 'default' for "
                   "d3.data.DEFAULT_TASKS, the ones the embedded model is above chance on")
    p.add_argument("--task-limit", type=int, default=30)
    p.add_argument("--task-scoring", default="loglik", choices=TASK_SCORINGS)
    p.add_argument("--ppl-chunks", type=int, default=4)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: leave torch's default)")
    p.add_argument("--limit", type=int, default=None, help="measure at most this many new settings, then stop")
    p.add_argument("--no-chat-template", action="store_true")
    p.set_defaults(func=main)
    return p


def spec_from_args(args: argparse.Namespace) -> SweepSpec:
    return SweepSpec(
        model=args.model, prompts=load_prompts(args.prompts), max_new_tokens=args.new_tokens, repeats=args.repeats,
        depths=_floats(args.depths), alphas=_floats(args.alphas), cores=_cores(args.cores), starts=_ints(args.starts),
        fills=_words(args.fills), drop_orders=_words(args.drop_orders), variants_at=_floats(args.variants_at)[0],
        product=args.product, baselines=_words(args.baselines),
        baseline_depths=_floats(args.baseline_depths) or None, early_exit_measures=_words(args.early_exit_measures),
        early_exit_depths=_floats(args.early_exit_depths) or None,
        tasks=_task_names(args.tasks), task_limit=args.task_limit, task_scoring=args.task_scoring,
        ppl_chunks=args.ppl_chunks, chat_template=not args.no_chat_template)


def tqdm_progress() -> tuple[Progress, Callable[[], None]]:
    """A progress(fraction, desc) callback drawing a tqdm bar, and a function that closes the bar."""
    from tqdm import tqdm

    bar = tqdm(total=1000, unit="‰", bar_format="{l_bar}{bar}| {elapsed}<{remaining}")

    def update(fraction: float, desc: str) -> None:
        bar.set_description_str(desc[:60])
        bar.n = int(round(fraction * 1000))
        bar.refresh()

    return update, bar.close


def main(args: argparse.Namespace, engine: Any = None) -> int:
    if args.threads:
        import torch
        torch.set_num_threads(args.threads)
    spec = spec_from_args(args)
    progress, close = tqdm_progress()
    try:
        df = run_sweep(spec, args.out, engine=engine, progress=progress, limit=args.limit)
    finally:
        close()
    print(f"{len(df)} rows in {args.out} (JSON: {sidecar(args.out, 'json')})")
    return 0
