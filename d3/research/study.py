"""The drop-order study: every order (and baseline) swept over alpha and start on the test questions, each setting
read as a paired difference from full depth on the same questions beside its same-answer rate, at the depth it
actually ran.

Tasks are screened on validation questions only (`screen_rule`: a task full depth cannot do is dropped), orders are
calibrated on validation questions only (d3.research.calibrate), and only the test questions are scored here. Each
setting's row keeps its per-question right/wrong bits, so any two settings can be paired later (d3.research.stats).
Timing: full depth and a headline setting alternate (ABBA) on the reported questions, per generated token, one
thread on both sides; the median ratio with a distribution-free interval, beside the theoretical bounds.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from d3.config import D3Config, FullConfig, StrategyConfig
from d3.research.answers import Answers, PrefilledQuestions
from d3.research.gentasks import answer_text, get_generation_task
from d3.research.stats import exact_difference, exact_rate, median_interval, replication, speed_flag  # noqa: F401
from d3.research.sweep.grid import d3_for_depth, skipdecode_for_depth, unified_for_depth
from d3.schedule import plan, planned_mean_layers, theoretical_speedup

ANSWER_TOKENS = 20  # a worked answer's length in tokens, the span alpha's planned mean depth is set over
NAMED_ORDERS = ("middle_out", "bottom_up")
TARGETS = (0.97, 0.93, 0.88)  # planned mean depth as a fraction of L over ANSWER_TOKENS at start 0: the alpha grid
STARTS = (0, 8)  # D3's start: tokens 0..start run at full depth; start > 0 is gentler than "a layer from token 1"
TIMING_PAIRS = 8  # ABBA pairs per timed setting (at least 8)
GO_ON = 0.03  # a setting goes on past the first stage while its interval's upper end is at least -GO_ON (3 points)
COLLAPSE = 0.2  # an order whose first-stage accuracy falls 20 points below full depth is not run at deeper cuts


@dataclass(frozen=True)
class Outcome:
    """One strategy on the test questions: per-question right/wrong, stated answers, layers and time."""

    correct: tuple[bool, ...]
    answers: tuple[str, ...]
    mean_layers: float
    tokens: int
    seconds: float
    cpu_seconds: float = float("nan")  # this process's CPU time (all its threads): the cost on an idle machine

    @property
    def accuracy(self) -> float:
        return sum(self.correct) / max(len(self.correct), 1)

    def join(self, other: Outcome) -> Outcome:
        """This outcome's questions, then `other`'s (a first stage and the rest)."""
        tokens = self.tokens + other.tokens
        layers = (self.mean_layers * self.tokens + other.mean_layers * other.tokens) / max(tokens, 1)
        return Outcome(self.correct + other.correct, self.answers + other.answers, layers, tokens,
                       self.seconds + other.seconds, self.cpu_seconds + other.cpu_seconds)

    def head(self, n: int) -> Outcome:
        """The first `n` questions' answers (times and layers are the whole run's: only for pairing)."""
        return Outcome(self.correct[:n], self.answers[:n], self.mean_layers, self.tokens, self.seconds, self.cpu_seconds)


class QuestionSet:
    """The questions `start:limit` of each task's split, prefilled once (keep) or per run; `run` answers them
    under a strategy, task after task."""

    def __init__(self, engine: Any, tasks: Sequence[str], split: str = "test", limit: int | None = None,
                 batch: int = 32, start: int = 0, keep: bool = True, seed: int | None = None) -> None:
        """seed: the generated tasks' seed (None: each task's own, 0); another seed draws fresh questions."""
        self.tasks = tuple(tasks)
        objects = [question_task(t, seed) for t in self.tasks]
        splits = [task.split(split)[:limit][start:] for task in objects]
        self.sets = [PrefilledQuestions(engine, task, part, batch=batch, keep=keep)
                     for task, part in zip(objects, splits) if part]
        self.sizes = [len(part) for part in splits]

    def __len__(self) -> int:
        return sum(self.sizes)

    def run(self, strategy: StrategyConfig) -> Outcome:
        t0, c0 = time.perf_counter(), time.process_time()
        parts: list[Answers] = [s.answer(strategy) for s in self.sets]
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
        tokens = sum(p.tokens for p in parts)
        layers = sum(p.mean_layers * p.tokens for p in parts) / max(tokens, 1)
        return Outcome(tuple(c for p in parts for c in p.correct), tuple(answer_text(t) for p in parts for t in p.texts),
                       layers, tokens, seconds, cpu)


def question_task(name: str, seed: int | None = None) -> Any:
    """A generation task by name, drawn with `seed` (None: its own); only a generated task can be redrawn."""
    task = get_generation_task(name)
    if seed is None:
        return task
    if not hasattr(task, "with_seed"):
        raise ValueError(f"task {name!r} cannot be drawn with another seed: only generated tasks (gen_*) can")
    return task.with_seed(seed)


def per_token_timing(questions: Sequence[PrefilledQuestions], strategy: StrategyConfig, num_layers: int,
                     fixed_cost_layers: float, pairs: int = TIMING_PAIRS, threads: int = 1) -> dict[str, Any]:
    """Full depth and `strategy` answer the same questions in ABBA order (`pairs` pairs, at least 8), each run's
    decode time divided by the tokens it generated; the ratio of full depth's seconds per token to the strategy's,
    per pair: median, a distribution-free interval (order statistics), and the theoretical bounds at the depth the
    strategy ran (the LM head as fixed cost, and no fixed cost at all) with `speed_flag`'s verdict. Both sides run
    with `threads` torch threads (set here, restored after)."""
    import torch

    if pairs < 8:
        raise ValueError(f"pairs must be at least 8 (ABBA, for an interval on the median): got {pairs}")
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        ratios, layers, tokens = [], [], {}
        for i in range(pairs):
            sides = ((FullConfig(), "full"), (strategy, "setting"))
            per_token = {}
            for cfg, side in (sides if i % 2 == 0 else sides[::-1]):
                t0 = time.perf_counter()
                parts = [q.answer(cfg) for q in questions]
                seconds = time.perf_counter() - t0
                n = sum(p.tokens for p in parts)
                per_token[side], tokens[side] = seconds / max(n, 1), n
                if side == "setting":
                    layers.append(sum(p.mean_layers * p.tokens for p in parts) / max(n, 1))
            ratios.append(per_token["full"] / per_token["setting"])
    finally:
        torch.set_num_threads(before)
    median, low, high, coverage = median_interval(ratios)
    depth = statistics.mean(layers)
    fixed = theoretical_speedup([depth], num_layers, fixed_cost_layers)
    plain = theoretical_speedup([depth], num_layers)
    return {"ratio": round(median, 4), "low": round(low, 4), "high": round(high, 4), "coverage": round(coverage, 4),
            "ratios": [round(r, 4) for r in ratios], "pairs": pairs, "threads": threads,
            "questions": sum(len(q.examples) for q in questions), "tokens_full": tokens["full"],
            "tokens_setting": tokens["setting"], "mean_layers": round(depth, 3),
            "theory_fixed": round(fixed, 4), "theory_plain": round(plain, 4), "fixed_cost_layers": fixed_cost_layers,
            "flag": speed_flag(low, fixed, plain)}


def paired_row(full: Outcome, out: Outcome, sizes: Sequence[int] | Sequence[Sequence[int]]) -> dict[str, Any]:
    """A setting's row against full depth: accuracy, its paired difference (exact McNemar), the same-answer rate
    (fidelity, exact), realized depth, per-task accuracy, and the per-question bits for later pairings.

    sizes: questions per task, in the order answered; or one such list per stage (stage after stage)."""
    same = [a == b for a, b in zip(full.answers, out.answers)]
    stages = [list(sizes)] if sizes and isinstance(sizes[0], int) else [list(st) for st in sizes]  # type: ignore[arg-type]
    right, asked, k = [0] * len(stages[0]), [0] * len(stages[0]), 0
    for stage in stages:
        for t, n in enumerate(stage):
            right[t] += sum(out.correct[k:k + n])
            asked[t] += n
            k += n
    per_task = [round(r / max(n, 1), 4) for r, n in zip(right, asked)]
    return {"accuracy": round(out.accuracy, 5), "right": sum(out.correct), "asked": len(out.correct),
            "diff": exact_difference(full.correct, out.correct).to_dict(),
            "fidelity": exact_rate(same).to_dict(),
            "mean_layers": round(out.mean_layers, 3), "tokens": out.tokens, "seconds": round(out.seconds, 2),
            "cpu_seconds": round(out.cpu_seconds, 2),
            "qps": round(len(out.correct) / max(out.seconds, 1e-9), 3),
            "qps_cpu": round(len(out.correct) / max(out.cpu_seconds, 1e-9), 3), "per_task": per_task,
            "bits": "".join("1" if c else "0" for c in out.correct)}


def settings(num_layers: int, orders: dict[str, dict[str, Any]], targets: Sequence[float],
             baselines: Sequence[str] = ("unified", "skipdecode"), starts: Sequence[int] = (0,)) -> dict[str, StrategyConfig]:
    """The sweep: each order at each start and target's alpha, and each baseline at the target; labelled
    "name @0.93" ("name s8 @0.93" at start 8). A target whose config plans full depth (alpha 1), or repeats the same
    curve's config at an earlier target (the grid is coarse for few layers; SkipDecode's shape does not move with
    it), is left out."""
    out: dict[str, StrategyConfig] = {}
    for target in targets:
        alpha = d3_for_depth(target, num_layers, ANSWER_TOKENS).alpha
        made = {f"d3 {name}{f' s{st}' if st else ''}": D3Config(alpha=alpha, start=st, **fields)
                for name, fields in orders.items() for st in starts}
        for base in baselines:
            made[base] = (unified_for_depth if base == "unified" else skipdecode_for_depth)(target, num_layers,
                                                                                            ANSWER_TOKENS)
        for name, cfg in made.items():
            full = planned_mean_layers(cfg, num_layers, ANSWER_TOKENS) >= num_layers - 1e-9
            seen = any(curve_name(k) == name and v == cfg for k, v in out.items())
            if not (full or seen):
                out[f"{name} @{target:g}"] = cfg
    return out


def same_run(cfg: StrategyConfig, num_layers: int, tokens: int) -> tuple[Any, ...]:
    """What decides a setting's answers: the layers every token up to `tokens` runs, and how skipped layers are
    filled. Two settings alike in this (two orders that drop the same layers for as long as a reply lasts) compute
    the same thing, so the study runs one and reads the other's row from it."""
    return (tuple(plan(cfg, num_layers, step) for step in range(tokens)), getattr(cfg, "fill", None))


SCREEN_QUESTIONS = 32  # validation questions per task that full depth answers in the screen
SCREEN_MIN = 0.7  # a task is kept for a model when full depth answers at least this share of them


def screen_rule(accuracy: float, chance: float) -> bool:
    """Whether a task is kept for a model: full depth answers at least SCREEN_MIN (70%) of the screen's validation
    questions, and 20 points more than always giving the most common answer. Why: a setting's loss is measured in
    questions full depth got right and the setting got wrong; a weak model (the last study's 34% task) flips answers
    both ways, so its "gains" are noise that widens every interval, while on a task full depth does at 70% or more
    at most 30% of the questions can flip to right, and a loss shows as lost questions with few gains to hide it.
    (80% was the first rule; SmolLM2-135M passed no task with room at 80%, its best 75%: docs/drop_order.md.)"""
    return accuracy >= SCREEN_MIN - 1e-12 and accuracy >= chance + 0.2 - 1e-12


def screen_tasks(engine: Any, tasks: Sequence[str], limit: int = SCREEN_QUESTIONS, batch: int = 32,
                 say: Callable[[str], None] = lambda line: None, step: int = 16) -> dict[str, dict[str, Any]]:
    """Each task's full-depth accuracy on its first `limit` validation questions, and whether `screen_rule` keeps
    it. Answered `step` questions at a time; a task stops early once even all-right answers on the rest could not
    reach SCREEN_MIN (its accuracy is then over the questions asked, and it is dropped)."""
    out = {}
    for name in tasks:
        t0 = time.perf_counter()
        task = get_generation_task(name)
        val = task.split("validation")[:limit]
        right = asked = 0
        while asked < len(val):
            part = val[asked:asked + step]
            right += sum(PrefilledQuestions(engine, task, part, batch=batch).answer(FullConfig()).correct)
            asked += len(part)
            if right + len(val) - asked < SCREEN_MIN * len(val) - 1e-9:  # cannot reach it any more
                break
        acc, chance = right / max(asked, 1), task.chance(val[:asked])
        out[name] = {"validation_accuracy": round(acc, 4), "chance": round(chance, 4), "asked": asked,
                     "kept": asked == len(val) and screen_rule(acc, chance), "space": getattr(task, "space_size", None)}
        say(f"{name}: {100 * acc:.0f}% at full depth on {asked} validation questions "
            f"({'kept' if out[name]['kept'] else 'dropped'}; {time.perf_counter() - t0:.0f} s)")
    return out


def goes_on(first: dict[str, Any], bound: float = GO_ON) -> bool:
    """After the first stage: can the setting still show a loss of at most `bound`? (its interval reaches it)"""
    return first["high"] >= -bound - 1e-12


def collapsed(first: dict[str, Any], limit: float = COLLAPSE) -> bool:
    """The first stage lost `limit` or more: deeper cuts of the same order are not run."""
    return first["diff"] <= -limit + 1e-12


def curve_name(label: str) -> str:
    """"d3 bottom_up @0.93" -> "d3 bottom_up": the order (or baseline) a setting's label belongs to."""
    return label.rsplit(" @", 1)[0]


@dataclass
class Eta:
    """Progress with an estimate of the time left, from the mean time of the settings run so far."""

    total: int
    say: Callable[[str], None]
    done: int = 0
    spent: list[float] = field(default_factory=list)

    def skip(self, n: int = 1) -> None:
        """Settings that will not run (an order's deeper cuts after it collapsed)."""
        self.total -= n

    def tick(self, label: str, seconds: float, line: str) -> None:
        self.done += 1
        self.spent.append(seconds)
        left = (self.total - self.done) * statistics.mean(self.spent)
        self.say(f"[{self.done}/{self.total}] {label}: {line} ({seconds:.0f} s; about {left / 60:.0f} min left)")
