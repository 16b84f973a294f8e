"""What a calibration signal reads: chat prompts, prose, or a generation task's validation questions."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from d3.config import Param
from d3.research.data import ASSETS, ppl_text

# Tokens per prompt a calibration generates (agreement) or reads on (perplexity): its range and default, said once
# (`d3.research.calibrate.calibrate` checks with it, `python -m d3 calibrate --tokens` is made from it).
TOKENS = Param("Tokens", "generated (agreement) or continuation (perplexity) tokens per prompt", lo=2, hi=256,
               integer=True, default=32)

DEFAULT_PROMPTS = ASSETS / "prompts.json"


@dataclass(frozen=True)
class CalibrationSet:
    """What a signal reads: chat prompts (agreement), prose (perplexity) or a task's validation split.

    name: how results are cached and named ("prompts:prompts.json", "task:arithmetic_1_digit_addition", ...)."""

    name: str
    prompts: tuple[str, ...] = ()
    chat_template: bool = True
    tasks: tuple[str, ...] = ()
    text: str = ""
    task_objects: tuple[Any, ...] = ()  # tasks that are not d3.research.gentasks' (d3.research.paper's), with their validation questions
    val_limit: int | None = None


def _digest(*parts: str) -> str:
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:8]


def prompts_set(path: str | Path | None = None) -> CalibrationSet:
    """A prompt file: JSON (a list of strings or of {"prompt": ...}) or plain text, one prompt per line."""
    path = Path(path) if path else DEFAULT_PROMPTS
    raw = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        items = json.loads(raw)
        prompts = [x["prompt"] if isinstance(x, dict) else x for x in items]
    else:
        prompts = [line for line in raw.splitlines() if line.strip()]
    if not prompts or not all(isinstance(p, str) and p.strip() for p in prompts):
        raise ValueError(f"{path} holds no prompts: give a JSON list of strings / {{'prompt': ...}} or one prompt per line")
    return CalibrationSet(f"prompts:{path.name}:{_digest(*prompts)}", tuple(prompts))


def prompt_set(prompt: str, chat_template: bool = True) -> CalibrationSet:
    """One prompt (the page's)."""
    if not prompt.strip():
        raise ValueError("prompt is empty: type some text to calibrate on")
    return CalibrationSet(f"prompt:{_digest(prompt, str(chat_template))}", (prompt,), chat_template)


def task_set(tasks: Sequence[str]) -> CalibrationSet:
    """Generation tasks (`d3.research.gentasks`); every signal reads their validation split only, never the test split."""
    from d3.research.gentasks import get_generation_task

    for t in tasks:
        get_generation_task(t)
    return CalibrationSet("task:" + "+".join(tasks), tasks=tuple(tasks), chat_template=False)


def paper_task_set(task: Any, val_limit: int | None = None) -> CalibrationSet:
    """Any task with `split("validation")`, `prompt`, `score` and `max_new_tokens` (d3.research.paper's): its first
    `val_limit` validation questions."""
    suffix = f":{val_limit}" if val_limit is not None else ""
    return CalibrationSet(f"task:{task.name}{suffix}", tasks=(task.name,), chat_template=False, task_objects=(task,),
                          val_limit=val_limit)


def text_set(path: str | Path | None = None) -> CalibrationSet:
    """Prose for perplexity: a text file, or the shipped passage (assets/ppl_text.txt)."""
    text = Path(path).read_text(encoding="utf-8") if path else ppl_text()
    if not text.strip():
        raise ValueError(f"{path} is empty: give a file of prose")
    return CalibrationSet(f"text:{Path(path).name if path else 'ppl_text.txt'}:{_digest(text)}", text=text)


def default_set(signal: str) -> CalibrationSet:
    from d3.research.gentasks import DEFAULT_GENERATION_TASKS

    return {"agreement": prompts_set, "perplexity": text_set}.get(signal, lambda: task_set(DEFAULT_GENERATION_TASKS))()


def task_prompts(cal_set: CalibrationSet) -> list[tuple[Any, Any]]:
    """(task, example) for every validation question of the set's tasks."""
    from d3.research.gentasks import get_generation_task

    tasks = cal_set.task_objects or tuple(map(get_generation_task, cal_set.tasks))
    return [(task, ex) for task in tasks for ex in task.split("validation")[:cal_set.val_limit]]


