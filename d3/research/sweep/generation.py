"""Generation accuracy, the paper's measure: each setting answers the generation tasks (`d3.research.gentasks`) greedily,
its stated answers are scored by exact match, and its speed is timed on those answers against full depth.

`python -m d3 sweep --task-mode generate` runs the same grid as the sweep (D3 and the baselines at matched mean
depth, `d3.research.sweep.grid`) and appends one row per setting to its own CSV (`GEN_COLUMNS`), so a rerun resumes.
Per setting and task, the first `spec.repeats` batches are answered by full depth and by the setting in turn
(which goes first alternates), and measured speedup is full depth's seconds over the setting's on them: time to
answer, so a setting whose replies run on past where full depth's end pays for it. step_speedup is the same
ratio per decode step (what skipping layers saves, apart from reply length). The other batches are answered by
the setting alone. Full depth's answers to every question are computed once.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd

from d3.config import TRACE_OFF, FullConfig, GenerationConfig, StrategyConfig
from d3.research.gentasks import STOP, GenerationTask, answer_text, get_generation_task
from d3.research.stats import bootstrap_difference, exact_difference
from d3.research.sweep.grid import all_settings
from d3.research.sweep.spec import Progress, Setting, SweepSpec, setting_key
from d3.schedule import theoretical_speedup

GEN_COLUMNS = (
    "key", "model", "num_layers", "strategy", "label", "params", "target_depth", "tasks", "questions",
    "mean_layers", "mean_tokens", "theoretical_speedup", "theoretical_speedup_fixed", "measured_speedup",
    "step_speedup", "timing_batches", "accuracy", "accuracy_full", "chance", "ci_low", "ci_high",
    "diff", "diff_low", "diff_high", "same_answer", "same_answer_low", "same_answer_high", "task_accuracy",
    "seconds", "finished_at",
)
BATCH = 8


@dataclass(frozen=True)
class Answer:
    """One question answered under one strategy: the stated answer, whether it is right, tokens and layers used
    up to the end of the reply (the blank line that would start the next question)."""

    stated: str
    correct: bool
    tokens: int
    layers: int


def reply(trace: Any, eos_ids: set[int]) -> tuple[str, int, int]:
    """A trace's reply: its text up to and including the token that completes it (the text reaches STOP, or an
    end-of-sequence token, which is not part of the text), with the tokens and layers it took."""
    text, tokens, layers = "", 0, 0
    for step in trace.steps:
        tokens, layers = tokens + 1, layers + step.n_layers
        if step.token_id in eos_ids:
            break
        text += step.text
        if STOP in text:
            break
    return text, tokens, layers


@dataclass(frozen=True)
class Timed:
    """A batch's wall-clock seconds and the decode steps it ran (a step decodes one token of every row)."""

    seconds: float
    steps: int


def answer_batch(engine: Any, task: Any, examples: Sequence[Any], strategy: StrategyConfig, *,
                 chat_template: bool = False) -> tuple[list[Answer], Timed]:
    """Greedy replies to a batch of questions, stopped once every reply is complete; the answers and the time.

    task: anything with `prompt(example)`, `score(example, reply)` and `max_new_tokens` (a GenerationTask, or
    one of d3.research.paper's tasks), whose few-shot prompt separates questions by a blank line."""
    gen = GenerationConfig(max_new_tokens=task.max_new_tokens)
    started, steps = time.perf_counter(), 0
    traces: list[Any] = []
    prompts = [task.prompt(ex) for ex in examples]
    for traces in engine.run(prompts, strategy, gen, TRACE_OFF, chat_template=chat_template):
        steps += 1
        if all(STOP in t.text or any(s.token_id in engine.eos_ids for s in t.steps) for t in traces):
            break  # the rows still generating past their reply would only cost time
    timed = Timed(time.perf_counter() - started, steps)
    answers = []
    for ex, trace in zip(examples, traces):
        text, tokens, layers = reply(trace, engine.eos_ids)
        answers.append(Answer(answer_text(text), task.score(ex, text), tokens, layers))
    return answers, timed


def wilson(correct: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a proportion (95% by default); (nan, nan) for n = 0."""
    if n == 0:
        return float("nan"), float("nan")
    p = correct / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass
class TaskRun:
    """One setting on one task: its answers, and seconds of it and of full depth on the timed batches."""

    answers: list[Answer]
    method: Timed = Timed(0.0, 0)
    full: Timed = Timed(0.0, 0)
    timed: int = 0


def run_task(engine: Any, task: GenerationTask, examples: Sequence[Any], strategy: StrategyConfig, timed: int) -> TaskRun:
    """`strategy` on every question, full depth beside it on the first `timed` batches (order alternating)."""
    run = TaskRun([])
    for k, start in enumerate(range(0, len(examples), BATCH)):
        batch = examples[start:start + BATCH]
        if k < timed:
            order = ("full", "method") if k % 2 == 0 else ("method", "full")
            for who in order:
                answers, took = answer_batch(engine, task, batch, strategy if who == "method" else FullConfig())
                if who == "method":
                    run.answers += answers
                    run.method = _add(run.method, took)
                else:
                    run.full = _add(run.full, took)
            run.timed += 1
        else:
            run.answers += answer_batch(engine, task, batch, strategy)[0]
    return run


def _add(a: Timed, b: Timed) -> Timed:
    return Timed(a.seconds + b.seconds, a.steps + b.steps)


def load_questions(spec: SweepSpec) -> dict[str, tuple[GenerationTask, list[Any]]]:
    """Each task of `spec` with its first `task_limit` questions (validation questions first, shots excluded), or
    with task_split "test", its first `task_limit` test questions (never a validation one)."""
    def pick(task: GenerationTask) -> list[Any]:
        return task.questions(spec.task_limit) if spec.task_split == "all" else task.split("test")[:spec.task_limit]

    return {name: (task, pick(task)) for name, task in ((n, get_generation_task(n)) for n in spec.tasks)}


def measure_setting(engine: Any, spec: SweepSpec, setting: Setting, key: str,
                    questions: dict[str, tuple[GenerationTask, list[Any]]],
                    reference: dict[str, list[Answer]]) -> dict[str, Any]:
    """One CSV row: accuracy with its Wilson interval and zero line, mean layers, measured speedup."""
    started = time.perf_counter()
    runs = {name: run_task(engine, task, exs, setting.config, spec.repeats) for name, (task, exs) in questions.items()}
    answers = [a for r in runs.values() for a in r.answers]
    ref = [a for name in runs for a in reference[name]]
    tokens = sum(a.tokens for a in answers)
    layers = sum(a.layers for a in answers) / max(tokens, 1)
    correct, n = sum(a.correct for a in answers), len(answers)
    low, high = wilson(correct, n)
    paired = exact_difference([a.correct for a in ref], [a.correct for a in answers])  # same questions, same order
    same = bootstrap_difference([1.0] * n, [float(a.stated == b.stated) for a, b in zip(answers, ref)])
    per_task = {name: _task_summary(runs[name].answers, reference[name], task.chance(exs))
                for name, (task, exs) in questions.items()}
    full = _sum(r.full for r in runs.values())
    method = _sum(r.method for r in runs.values())
    L, fixed = engine.num_layers, engine.fixed_cost_layers
    return {
        "key": key, "model": engine.name, "num_layers": L, "strategy": setting.config.name, "label": setting.label,
        "params": json.dumps(setting.config.to_dict(), sort_keys=True), "target_depth": setting.target_depth,
        "tasks": ",".join(questions), "questions": n, "mean_layers": layers, "mean_tokens": tokens / max(n, 1),
        "theoretical_speedup": theoretical_speedup([layers], L),
        "theoretical_speedup_fixed": theoretical_speedup([layers], L, fixed),
        "measured_speedup": full.seconds / method.seconds if method.seconds > 0 else float("nan"),
        "step_speedup": (full.seconds / full.steps) / (method.seconds / method.steps) if method.steps and full.steps
        else float("nan"),
        "timing_batches": sum(r.timed for r in runs.values()),
        "accuracy": correct / max(n, 1), "accuracy_full": sum(a.correct for a in ref) / max(len(ref), 1),
        "chance": sum(v["chance"] * v["n"] for v in per_task.values()) / max(n, 1), "ci_low": low, "ci_high": high,
        "diff": paired.diff, "diff_low": paired.low, "diff_high": paired.high,
        "same_answer": 1 + same.diff, "same_answer_low": 1 + same.low, "same_answer_high": 1 + same.high,
        "task_accuracy": json.dumps(per_task, sort_keys=True), "seconds": time.perf_counter() - started,
        "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def _sum(parts: Any) -> Timed:
    total = Timed(0.0, 0)
    for part in parts:
        total = _add(total, part)
    return total


def _task_summary(answers: Sequence[Answer], full: Sequence[Answer], chance: float) -> dict[str, float]:
    n = len(answers)
    return {"accuracy": sum(a.correct for a in answers) / max(n, 1), "accuracy_full": sum(a.correct for a in full) / max(n, 1),
            "chance": chance, "n": n}


def read_generation(path: str | Path) -> pd.DataFrame:
    """The generation sweep's table (every GEN_COLUMNS column); empty if the file is absent."""
    path = Path(path)
    if not path.is_file() or path.stat().st_size == 0:
        return pd.DataFrame(columns=list(GEN_COLUMNS))
    df = pd.read_csv(path, dtype={"key": str, "label": str, "params": str, "task_accuracy": str, "tasks": str})
    # A column added after a file was written reads as missing (NaN), not as an error.
    return df.drop_duplicates("key", keep="last").reset_index(drop=True).reindex(columns=list(GEN_COLUMNS))


def append(path: Path, row: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    new = not path.is_file() or path.stat().st_size == 0
    frame = pd.DataFrame([row], columns=list(GEN_COLUMNS))
    if not new and pd.read_csv(path, nrows=0).columns.tolist() != list(GEN_COLUMNS):  # written before a column was added
        frame, new = pd.concat([read_generation(path), frame], ignore_index=True), True
        path.write_text("", encoding="utf-8")
    frame.to_csv(path, mode="a", header=new, index=False)


def run_generation_sweep(spec: SweepSpec, out: str | Path, *, engine: Any, progress: Progress | None = None,
                         limit: int | None = None) -> pd.DataFrame:
    """Measure every setting of `spec`'s grid not already in `out` (at most `limit` new ones) on its generation
    tasks; returns the whole table."""
    out, report = Path(out), progress or (lambda f, d: None)
    done = set(read_generation(out)["key"])
    keyed = [(setting_key(spec, engine.name, s), s) for s in all_settings(spec, engine)]
    todo = [(k, s) for k, s in keyed if k not in done][: limit if limit is not None else None]
    report(0.0, f"{len(keyed) - len(todo)} of {len(keyed)} settings already done")
    if todo:
        questions = load_questions(spec)
        report(0.0, "full depth answers every question")
        reference = {name: run_task(engine, task, exs, FullConfig(), 0).answers for name, (task, exs) in questions.items()}
        for i, (key, setting) in enumerate(todo):
            report(i / len(todo), f"{setting.label} ({i + 1}/{len(todo)})")
            append(out, measure_setting(engine, spec, setting, key, questions, reference))
        report(1.0, f"{len(todo)} settings measured")
    return read_generation(out)
