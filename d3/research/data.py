"""Benchmark tasks (BIG-bench JSON tasks, fetched from PyPI and cached) and real text for perplexity."""

from __future__ import annotations

import json
import os
import random
import string
import subprocess
import sys
import tarfile
import tempfile
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

BIGBENCH_VERSION = "1.0.0"
# assets/ sits beside the packages in a checkout (and an editable install); `pip install .` puts it in d3/assets.
_PACKAGE = Path(__file__).resolve().parent.parent  # d3/
_INSTALLED_ASSETS = _PACKAGE / "assets"
ASSETS = _INSTALLED_ASSETS if _INSTALLED_ASSETS.is_dir() else _PACKAGE.parent / "assets"
FETCH_HINT = "run `bash scripts/fetch_data.sh` (or `python -m d3 fetch-data`)"

Kind = Literal["multiple_choice", "exact_match"]


@dataclass(frozen=True)
class TaskInfo:
    """One benchmark task: where its task.json lives in the sdist, how it is scored, its chance level.

    chance: for multiple choice, mean of 1/len(choices) over the task's examples; for exact match, the
    share of examples whose answer is the task's most common answer (always answering it scores that).
    smollm2: accuracy of the embedded SmolLM2-135M-Instruct at full depth, zero-shot, on a sample of
    `smollm2_n` examples (see TASKS); None where not measured.
    """

    name: str
    path: str  # under bigbench/benchmark_tasks/ in the sdist, e.g. "logical_deduction/three_objects"
    kind: Kind
    chance: float
    summary: str
    smollm2: float | None = None
    smollm2_n: int = 0


def _task(name: str, path: str, kind: Kind, chance: float, summary: str,
          smollm2: float | None = None, n: int = 0) -> tuple[str, TaskInfo]:
    return name, TaskInfo(name, path, kind, chance, summary, smollm2, n)


# BIG-bench JSON tasks (BIG-Bench Hard is drawn from most of them). `smollm2` was measured on CPU for
# multiple choice by ranking the summed log-likelihood of format_answer(choice) after
# format_prompt(example, show_choices=False), for exact match by greedy decoding + score_exact.
# Chance levels are those of bigbench 1.0.0 (checked on the fetched files by tests/test_data.py).
TASKS: dict[str, TaskInfo] = dict([
    _task("movie_recommendation", "movie_recommendation", "multiple_choice", 0.25,
          "Which movie is similar to these four?", 0.673, 150),
    _task("ruin_names", "ruin_names", "multiple_choice", 0.2502,
          "Which edit of an artist or movie name is humorous?", 0.453, 150),
    _task("date_understanding", "date_understanding", "multiple_choice", 0.1719,
          "Date arithmetic in MM/DD/YYYY.", 0.240, 150),
    _task("general_knowledge", "general_knowledge", "multiple_choice", 0.1432,
          "Everyday general-knowledge questions (not in BBH).", 0.457, 70),
    _task("arithmetic_1_digit_addition", "arithmetic/1_digit_addition", "multiple_choice", 0.1579,
          "What is 3 plus 4? Choices include distractors such as 'banana' (not in BBH).", 0.310, 100),
    # At chance for SmolLM2-135M (these two measured with the options shown); kept for larger models.
    _task("hyperbaton", "hyperbaton", "multiple_choice", 0.5,
          "Which of two sentences has the correct adjective order?", 0.417, 60),
    _task("sports_understanding", "sports_understanding", "multiple_choice", 0.5,
          "Is a sentence about a sports player plausible?", 0.500, 60),
    _task("object_counting", "object_counting", "exact_match", 0.0940,
          "Count the objects of one kind in a list.", 0.0, 40),
    # Exact match, for answers generated after worked tokens (d3.research.gentasks; no `smollm2` here: its accuracy
    # depends on the few-shot format, which d3.research.gentasks owns).
    _task("arithmetic_1_digit_addition_em", "arithmetic/1_digit_addition", "exact_match", 0.1,
          "What is 3 plus 4? (generated answer)"),
    _task("arithmetic_1_digit_subtraction_em", "arithmetic/1_digit_subtraction", "exact_match", 0.18,
          "What is 7 minus 4? (generated answer)"),
    _task("arithmetic_2_digit_addition_em", "arithmetic/2_digit_addition", "exact_match", 0.018,
          "What is 80 plus 29? (generated answer)"),
    _task("arithmetic_2_digit_subtraction_em", "arithmetic/2_digit_subtraction", "exact_match", 0.032,
          "What is 61 minus 49? (generated answer)"),
    _task("arithmetic_1_digit_multiplication_em", "arithmetic/1_digit_multiplication", "exact_match", 0.19,
          "What is 7 times 8? (generated answer)"),
    _task("word_sorting", "word_sorting", "exact_match", 0.0005, "Sort a list of words alphabetically."),
])

# The tasks on which the embedded model is above chance: the default task set of a benchmark run.
DEFAULT_TASKS: tuple[str, ...] = (
    "movie_recommendation", "ruin_names", "date_understanding", "general_knowledge", "arithmetic_1_digit_addition")

# Real text for perplexity, fetched alongside the tasks: BBC articles from XSum as packaged by BIG-bench.
TEXT_SOURCES: dict[str, str] = {"xsum": "gem/xsum"}


@dataclass(frozen=True)
class Example:
    """One question. `input` includes the task's prefix; `choices` is empty for exact-match tasks.

    targets: every accepted answer (exact match may accept several, e.g. "three" and "3"; a few
    multiple-choice questions have several top-scoring choices); `target` is the first of them, and for
    multiple choice it is `choices[target_index]`.
    """

    task: str
    input: str
    choices: tuple[str, ...]
    target: str
    target_index: int | None
    targets: tuple[str, ...] = ()


def default_data_dir() -> Path:
    """`$D3_DATA_DIR`, else ~/.cache/d3-explorer/data."""
    env = os.environ.get("D3_DATA_DIR")
    return Path(env) if env else Path.home() / ".cache" / "d3-explorer" / "data"


def task_file(path: str, data_dir: str | Path | None = None) -> Path:
    """Where the task.json of sdist task `path` is cached."""
    return Path(data_dir or default_data_dir()) / "bigbench" / path / "task.json"


def _read_task_json(path: str, data_dir: str | Path | None) -> dict:
    file = task_file(path, data_dir)
    if not file.is_file():
        where = data_dir or default_data_dir()
        raise FileNotFoundError(f"BIG-bench task file {file} not found: {FETCH_HINT} to download "
                                f"bigbench=={BIGBENCH_VERSION} from PyPI into {where} (D3_DATA_DIR sets it)")
    return json.loads(file.read_text(encoding="utf-8"))


def _join(*parts: str) -> str:
    return "\n".join(p.strip() for p in parts if p and p.strip())


def _example(task: str, kind: Kind, raw: dict, prefix: str, input_prefix: str, rng: random.Random) -> Example:
    text = _join(prefix, input_prefix.strip() + " " + str(raw["input"]).strip())
    if kind == "multiple_choice":  # some files give both target_scores and target; the kind decides
        scores: dict[str, float] = raw["target_scores"]
        best = max(scores.values())
        correct = tuple(c for c, s in scores.items() if s == best)  # BIG-bench: the first one is the target
        choices = list(scores)
        rng.shuffle(choices)  # some tasks list the answer first
        return Example(task, text, tuple(choices), correct[0], choices.index(correct[0]), correct)
    answers = raw["target"] if isinstance(raw["target"], list) else [raw["target"]]
    targets = tuple(str(t) for t in answers)
    return Example(task, text, (), targets[0], None, targets)


def load_task(name: str, *, data_dir: str | Path | None = None, limit: int | None = None,
              seed: int = 0) -> list[Example]:
    """Examples of task `name` (a key of TASKS), in file order, or `limit` of them sampled with `seed`."""
    if name not in TASKS:
        raise ValueError(f"task={name!r} is not allowed: task must be one of {sorted(TASKS)}")
    if limit is not None and (not isinstance(limit, int) or limit < 0):
        raise ValueError(f"limit={limit!r} is not allowed: limit must be None or an int >= 0")
    info = TASKS[name]
    data = _read_task_json(info.path, data_dir)
    prefix = str(data.get("task_prefix", data.get("prefix", "")))
    input_prefix = str(data.get("example_input_prefix", ""))
    raws = list(enumerate(data["examples"]))
    if limit is not None and limit < len(raws):
        raws = sorted(random.Random(f"{seed}:{name}").sample(raws, limit))
    return [_example(name, info.kind, raw, prefix, input_prefix, random.Random(f"{seed}:{name}:{i}"))
            for i, raw in raws]


def chance_level(task: str | Sequence[Example]) -> float:
    """Chance accuracy: of a task by name (TASKS), or of these examples (as defined in TaskInfo)."""
    if isinstance(task, str):
        return TASKS[task].chance
    if not task:
        return 0.0
    if all(ex.choices for ex in task):
        return sum(1 / len(ex.choices) for ex in task) / len(task)
    majority, _ = Counter(normalize(ex.target) for ex in task).most_common(1)[0]
    return sum(majority in {normalize(t) for t in ex.targets or (ex.target,)} for ex in task) / len(task)


def format_answer(text: str) -> str:
    """The continuation that follows a prompt from format_prompt (what to score or to expect)."""
    return " " + text


def _block(example: Example, show_choices: bool) -> str:
    options = f"\nOptions: {'; '.join(example.choices)}" if example.choices and show_choices else ""
    return f"Q: {example.input}{options}\nA:"


def format_prompt(example: Example, *, few_shot: Sequence[Example] = (), show_choices: bool = True) -> str:
    """A plain-text prompt ending in "A:", so the answer (format_answer) comes next; shots answered first.

    show_choices=False leaves out the "Options:" line (plain continuation scoring, as in BIG-bench tasks
    with append_choices_to_input false).
    """
    shots = [_block(s, show_choices) + format_answer(s.target) for s in few_shot]
    return "\n\n".join([*shots, _block(example, show_choices)])


_PUNCT = str.maketrans("", "", string.punctuation)


def normalize(text: str) -> str:
    """First non-empty line, lowercased, punctuation removed, whitespace collapsed."""
    line = next((ln for ln in text.strip().splitlines() if ln.strip()), "")
    return " ".join(line.lower().translate(_PUNCT).split())


def score_exact(example: Example, generated_text: str) -> bool:
    """Whether the generated answer matches an accepted answer after `normalize`."""
    return normalize(generated_text) in {normalize(t) for t in example.targets or (example.target,)}


@dataclass(frozen=True)
class ExamplePrompt:
    """One example prompt shipped in assets/prompts.json."""

    title: str
    prompt: str


def example_prompts(path: Path | None = None) -> tuple[ExamplePrompt, ...]:
    """The example prompts of assets/prompts.json, in file order (the page's examples, the sweep's and bench's prompts)."""
    rows = json.loads((path or ASSETS / "prompts.json").read_text(encoding="utf-8"))
    return tuple(ExamplePrompt(title=str(r["title"]), prompt=str(r["prompt"])) for r in rows)


def ppl_text() -> str:
    """The shipped real passage (assets/ppl_text.txt) without its '#' source header."""
    lines = (ASSETS / "ppl_text.txt").read_text(encoding="utf-8").splitlines()
    while lines and (lines[0].startswith("#") or not lines[0].strip()):
        lines.pop(0)
    return "\n".join(lines).strip() + "\n"


def _members(paths: Iterable[str]) -> dict[str, str]:
    """Sdist member name -> task path, for the task.json of each task path."""
    root = f"bigbench-{BIGBENCH_VERSION}/bigbench/benchmark_tasks"
    return {f"{root}/{p}/task.json": p for p in paths}


def fetch(tasks: Iterable[str] | None = None, data_dir: str | Path | None = None) -> Path:
    """Download the bigbench sdist from PyPI (no install, no deps) and extract these tasks' task.json.

    Idempotent: returns at once when every file is already there. The sdist stays in `data_dir`.
    """
    names = list(TASKS) if tasks is None else list(tasks)
    unknown = [t for t in names if t not in TASKS]
    if unknown:
        raise ValueError(f"tasks={unknown!r} is not allowed: tasks must be among {sorted(TASKS)}")
    out = Path(data_dir or default_data_dir())
    paths = [TASKS[t].path for t in names] + list(TEXT_SOURCES.values())
    if all(task_file(p, out).is_file() for p in paths):
        return out
    out.mkdir(parents=True, exist_ok=True)
    sdist = out / f"bigbench-{BIGBENCH_VERSION}.tar.gz"
    if not sdist.is_file():
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                        "--dest", str(out), f"bigbench=={BIGBENCH_VERSION}"], check=True)
    wanted = _members(paths)
    with tarfile.open(sdist, "r:gz") as tar:
        for member in tar:
            if member.name in wanted and member.isfile():
                target = task_file(wanted.pop(member.name), out)
                target.parent.mkdir(parents=True, exist_ok=True)
                with tempfile.NamedTemporaryFile(dir=target.parent, delete=False) as tmp:
                    tmp.write(tar.extractfile(member).read())  # type: ignore[union-attr]
                os.replace(tmp.name, target)  # atomic: a crash never leaves a half-written task.json
    if wanted:
        raise FileNotFoundError(f"{sdist.name} has no {sorted(wanted)}")
    return out


def _main(argv: Sequence[str]) -> int:
    """`python -m d3.research.data paths` lists sdist members to extract; `python -m d3.research.data fetch [DIR]` fetches."""
    if argv[:1] == ["paths"]:
        print("\n".join(_members([i.path for i in TASKS.values()] + list(TEXT_SOURCES.values()))))
        return 0
    if argv[:1] == ["fetch"]:
        print(fetch(data_dir=argv[1] if len(argv) > 1 else None))
        return 0
    print("usage: python -m d3.research.data {paths | fetch [DATA_DIR]}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
