"""Task accuracy under a schedule: BIG-bench examples scored by option log-likelihood or greedy generation."""

from __future__ import annotations

from typing import Any

import numpy as np

from d3.config import TRACE_OFF, GenerationConfig, StrategyConfig
from d3.research.data import format_answer, format_prompt, load_task, score_exact
from d3.research.sweep.spec import SweepSpec


def load_examples(spec: SweepSpec) -> dict[str, list[Any]]:
    return {t: load_task(t, limit=spec.task_limit, seed=spec.seed) for t in spec.tasks}


def _loglik_correct(engine: Any, cfg: StrategyConfig, example: Any, chat_template: bool) -> bool:
    """Pick the option whose tokens have the highest summed log-probability, read under the schedule.

    The prompt is prefilled once and shared by all options (`Engine.score_continuations`)."""
    tok = engine.tokenizer
    # The options stay out of the prompt: the embedded model is above chance on the chosen tasks only
    # when it ranks the answers without seeing them listed (see d3/research/data.py TASKS).
    prompt_ids = tok(format_prompt(example, show_choices=False))["input_ids"]
    options = [tok(format_answer(c), add_special_tokens=False)["input_ids"] or [tok.unk_token_id or 0]
               for c in example.choices]
    scores = engine.score_continuations(prompt_ids, options, cfg)
    return int(np.argmax(scores)) == example.target_index


def _generate_correct(engine: Any, cfg: StrategyConfig, examples: list[Any], batch: int = 8) -> list[bool]:
    """Greedy answers (up to the longest accepted answer + 4 tokens), scored by `score_exact` on the first line."""
    tok = engine.tokenizer
    out: list[bool] = []
    for i in range(0, len(examples), batch):
        part = examples[i:i + batch]
        longest = max(len(tok(" " + t, add_special_tokens=False)["input_ids"]) for ex in part for t in ex.targets or (ex.target,))
        gen = GenerationConfig(max_new_tokens=min(longest + 4, 256), stop_at_eos=True)
        traces = engine.generate_batch([tok(format_prompt(ex))["input_ids"] for ex in part], cfg, gen, TRACE_OFF)
        out += [score_exact(ex, t.text) for ex, t in zip(part, traces)]
    return out


def task_correct(engine: Any, spec: SweepSpec, cfg: StrategyConfig, examples: dict[str, list[Any]]) -> dict[str, list[bool]]:
    """Right or wrong per question, per task (prompts are plain text `format_prompt`, no chat template, as a
    base-model eval): the bits a paired difference between two strategies reads."""
    out = {}
    for task, exs in examples.items():
        if spec.task_scoring == "loglik" and all(ex.choices for ex in exs):
            out[task] = [bool(_loglik_correct(engine, cfg, ex, False)) for ex in exs]
        else:
            out[task] = [bool(c) for c in _generate_correct(engine, cfg, exs)]
    return out


def accuracy_of(correct: dict[str, list[bool]]) -> dict[str, float]:
    """Accuracy per task from `task_correct`'s bits."""
    return {task: float(np.mean(bits)) if bits else float("nan") for task, bits in correct.items()}


def task_accuracy(engine: Any, spec: SweepSpec, cfg: StrategyConfig, examples: dict[str, list[Any]]) -> dict[str, float]:
    """Accuracy per task (see `task_correct`)."""
    return accuracy_of(task_correct(engine, spec, cfg, examples))


def scoring_note(spec: SweepSpec, examples: dict[str, list[Any]]) -> str:
    if not examples:
        return ""
    if spec.task_scoring == "generate":
        return "greedy generation + score_exact"
    kinds = {("loglik" if all(ex.choices for ex in exs) else "generate") for exs in examples.values()}
    return "option log-likelihood under the schedule" if kinds == {"loglik"} else \
        "option log-likelihood (multiple choice); greedy generation + score_exact (exact match)"
