"""Tasks answered by generation, BBH-style: few-shot worked answers, the answer read out of the generated text.

The paper measures D3 on generated answers (BBH and GSM8K exact match, chain-of-thought prompts), so the depth
of later tokens counts. Here every shot answers in words first and states the answer last ("... So the answer
is 109."), so the model writes its own worked tokens under the schedule before the answer, and the answer's
tokens come at decayed depth. The questions, the answers and the shots come from the BIG-bench files that
`python -m d3 fetch-data` caches (`d3.research.data.TASKS`); the worked answers of the shots are written from each shot
by a rule, as BBH's chain-of-thought exemplars were written by hand. Pure Python: no torch.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

from d3.research.data import Example, chance_level, load_task, normalize

STOP = "\n\n"  # the shots are separated by a blank line: an answer ends where the next question would begin
_ANSWER = re.compile(r"answer is\s*([^\n]*?)\s*\.?\s*(?:$|\n)", re.IGNORECASE)
_ARITHMETIC = re.compile(r"What is (-?\d+) (plus|minus|times|divided by) (-?\d+)\?")
_NUMBER_WORDS = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
                 "sixteen seventeen eighteen nineteen twenty").split()


def answer_text(generated: str) -> str:
    """The answer a generated reply states: the text up to the first blank line, then what follows the first
    "answer is" in it (without a final period); the reply's first line if it never says "answer is"."""
    reply = generated.split(STOP, 1)[0]
    match = _ANSWER.search(reply + "\n")
    if match:
        return match.group(1).strip()
    return next((line.strip() for line in reply.splitlines() if line.strip()), "")


def is_correct(example: Example, generated: str) -> bool:
    """Exact match of the stated answer against any accepted answer, after `d3.research.data.normalize`."""
    return normalize(answer_text(generated)) in {normalize(t) for t in example.targets or (example.target,)}


# ---------------------------------------------------------------- worked answers for the shots


def worked_arithmetic(example: Example) -> str:
    """"What is 80 plus 29?" -> "80 plus 29 is 109. So the answer is 109."."""
    m = _ARITHMETIC.search(example.input)
    if not m:
        raise ValueError(f"not an arithmetic question: {example.input!r}")
    a, op, b = m.groups()
    return f"{a} {op} {b} is {example.target}. So the answer is {example.target}."


def _items(question: str) -> list[str] | None:
    """"I have a flute, a piano, and a violin. How many ..." -> ["a flute", "a piano", "a violin"]; None when
    any item is not a single thing ("two cats"), so a shot never needs arithmetic the rule cannot write."""
    head = question.split(". How many", 1)[0]
    if not head.startswith("I have "):
        return None
    parts = [p.strip() for p in re.split(r",\s*(?:and\s+)?|\s+and\s+", head[len("I have "):]) if p.strip()]
    return parts if parts and all(p.split()[0] in ("a", "an") for p in parts) else None


def _counts(example: Example) -> set[int]:
    """The accepted answers of a counting question as numbers ("three" and "3" -> {3})."""
    out = set()
    for t in example.targets or (example.target,):
        t = t.strip().lower()
        out |= {int(t)} if t.isdigit() else {_NUMBER_WORDS.index(t)} if t in _NUMBER_WORDS else set()
    return out


def worked_counting(example: Example) -> str:
    """"I have a flute, a piano ..." -> "Counting them: a flute (1), a piano (2), ... So the answer is 3."."""
    items = _items(example.input)
    if items is None or len(items) not in _counts(example):
        raise ValueError(f"not a question whose every object is counted once: {example.input!r}")
    listed = ", ".join(f"{item} ({k})" for k, item in enumerate(items, 1))
    return f"Counting them: {listed}. So the answer is {len(items)}."


def worked_sorting(example: Example) -> str:
    """"List: stick gelatine" -> "In alphabetical order: gelatine stick. So the answer is gelatine stick."."""
    return f"In alphabetical order: {example.target}. So the answer is {example.target}."


# ---------------------------------------------------------------- the tasks


@dataclass(frozen=True)
class GenerationTask:
    """A BIG-bench exact-match task asked few-shot with worked answers; `split` gives disjoint question sets.

    worked: writes a shot's worked answer; can_shoot: whether an example can serve as a shot (its rule applies);
    keep: which examples are asked at all (e.g. short word lists); max_new_tokens: room for the worked answer.
    """

    name: str
    source: str  # a key of d3.research.data.TASKS
    worked: Callable[[Example], str]
    max_new_tokens: int
    summary: str
    shots: int = 3
    val_size: int = 50
    seed: int = 0
    can_shoot: Callable[[Example], bool] = lambda ex: True
    keep: Callable[[Example], bool] = lambda ex: True

    def _pool(self) -> tuple[tuple[Example, ...], tuple[Example, ...]]:
        return _shots_and_rest(self)

    def shot_examples(self) -> tuple[Example, ...]:
        return self._pool()[0]

    def split(self, name: str) -> list[Example]:
        """"validation" (the first `val_size` questions after the shots) or "test" (the rest), disjoint."""
        rest = list(self._pool()[1])
        return rest[:self.val_size] if name == "validation" else rest[self.val_size:]

    def questions(self, limit: int | None = None) -> list[Example]:
        """Every question but the shots' (validation first), or the first `limit` of them."""
        rest = list(self._pool()[1])
        return rest if limit is None else rest[:limit]

    def prompt(self, example: Example) -> str:
        blocks = [f"Q: {s.input}\nA: {self.worked(s)}" for s in self.shot_examples()]
        return STOP.join([*blocks, f"Q: {example.input}\nA:"])

    def score(self, example: Example, generated: str) -> bool:
        return is_correct(example, generated)

    def chance(self, examples: list[Example]) -> float:
        """Accuracy of always giving the most common answer of these questions (the zero line)."""
        return chance_level(examples)


@lru_cache(maxsize=16)
def _shots_and_rest(task: GenerationTask) -> tuple[tuple[Example, ...], tuple[Example, ...]]:
    """The task's questions in a fixed shuffled order: the first `shots` that can serve as shots, and the rest."""
    examples = [ex for ex in load_task(task.source) if task.keep(ex)]
    random.Random(f"gentask:{task.seed}:{task.name}").shuffle(examples)
    shots: list[Example] = []
    for ex in examples:
        if len(shots) == task.shots:
            break
        if task.can_shoot(ex):
            shots.append(ex)
    rest = tuple(ex for ex in examples if ex not in shots)
    return tuple(shots), rest


def _short_list(ex: Example) -> bool:
    return len(ex.input.split("List:", 1)[-1].split()) <= 4


GENERATION_TASKS: dict[str, GenerationTask] = {t.name: t for t in (
    GenerationTask("arithmetic_1_digit_addition", "arithmetic_1_digit_addition_em", worked_arithmetic, 32,
                   "What is 3 plus 4? (BIG-bench arithmetic; 100 questions)", val_size=20),
    GenerationTask("arithmetic_1_digit_subtraction", "arithmetic_1_digit_subtraction_em", worked_arithmetic, 32,
                   "What is 7 minus 4? (BIG-bench arithmetic; 100 questions)", val_size=20),
    GenerationTask("arithmetic_2_digit_addition", "arithmetic_2_digit_addition_em", worked_arithmetic, 32,
                   "What is 80 plus 29? (BIG-bench arithmetic)"),
    GenerationTask("arithmetic_2_digit_subtraction", "arithmetic_2_digit_subtraction_em", worked_arithmetic, 32,
                   "What is 61 minus 49? (BIG-bench arithmetic)"),
    GenerationTask("arithmetic_1_digit_multiplication", "arithmetic_1_digit_multiplication_em", worked_arithmetic, 32,
                   "What is 7 times 8? (BIG-bench arithmetic; 100 questions)", val_size=20),
    GenerationTask("object_counting_worked", "object_counting", worked_counting, 64,
                   "I have a flute, a piano, and two cats. How many musical instruments do I have? (BBH)",
                   can_shoot=lambda ex: len(_items(ex.input) or ()) in _counts(ex)),
    GenerationTask("word_sorting", "word_sorting", worked_sorting, 40,
                   "Sort 2 to 4 words alphabetically (BBH word sorting, lists of at most 4 words)", keep=_short_list),
)}



# ---------------------------------------------------------------- generated questions (no download)

_WORDS = {"+": "plus", "-": "minus", "*": "times"}
_THINGS = {"fruits": "apple banana pear plum peach orange grape lemon mango cherry".split(),
           "animals": "cat dog cow horse goat rabbit owl eagle sheep duck".split(),
           "musical instruments": "flute piano violin drum trumpet guitar harp cello oboe banjo".split()}
_SORT_WORDS = ("apple river stone cloud tiger window garden pencil silver orange candle mirror button forest "
               "ladder basket rocket violin hammer island jacket kitten lemon marble needle parrot quilt saddle "
               "tunnel wagon yellow zebra anchor bridge cactus dragon engine feather").split()


def arithmetic_question(op: str, digits: int, second_digits: int | None = None) -> Callable[[random.Random], Example]:
    """"What is 47 times 3?": the first operand of `digits` digits (0-9 or 10-99), the second of `second_digits`
    (default the same); subtraction never goes below 0."""
    span = {1: (0, 9), 2: (10, 99)}
    (lo, hi), (lo2, hi2) = span[digits], span[second_digits or digits]

    def make(rng: random.Random) -> Example:
        a, b = rng.randint(lo, hi), rng.randint(lo2, hi2)
        a, b = (max(a, b), min(a, b)) if op == "-" else (a, b)
        value = a + b if op == "+" else a - b if op == "-" else a * b
        return Example("synthetic", f"What is {a} {_WORDS[op]} {b}?", (), str(value), None, (str(value),))
    return make


def _article(word: str) -> str:
    return f"an {word}" if word[0] in "aeiou" else f"a {word}"


def counting_question(rng: random.Random) -> Example:
    """"I have an apple, a pear, and a plum. How many fruits do I have?" (2 to 6 different things of one kind)."""
    kind = rng.choice(sorted(_THINGS))
    items = [_article(w) for w in rng.sample(_THINGS[kind], rng.randint(2, 6))]
    listed = f"{items[0]} and {items[1]}" if len(items) == 2 else ", ".join(items[:-1]) + f", and {items[-1]}"
    n = len(items)
    return Example("synthetic", f"I have {listed}. How many {kind} do I have?", (), str(n), None,
                   (str(n), _NUMBER_WORDS[n]))


def sorting_question(rng: random.Random) -> Example:
    """"Sort the following words alphabetically: List: stone apple river" (3 or 4 different words)."""
    words = rng.sample(_SORT_WORDS, rng.randint(3, 4))
    target = " ".join(sorted(words))
    return Example("synthetic", f"Sort the following words alphabetically: List: {' '.join(words)}", (), target,
                   None, (target,))


@dataclass(frozen=True)
class SyntheticTask(GenerationTask):
    """A generated task: seeded distinct questions, the first `shots` with different answers as shots, then `val_size` validation
    and `test_size` test questions, all distinct (fewer where the task has fewer questions: 1-digit arithmetic
    has 100, split evenly after the shots)."""

    make: Callable[[random.Random], Example] | None = None
    val_size: int = 500
    test_size: int = 500

    def _pool(self) -> tuple[tuple[Example, ...], tuple[Example, ...]]:
        return _generated(self)

    def split(self, name: str) -> list[Example]:
        if name not in ("validation", "test"):
            raise ValueError(f"split {name!r} is not a split: splits are validation, test")
        rest = list(self._pool()[1])
        k = min(self.val_size, len(rest) // 2)
        return rest[:k] if name == "validation" else rest[k:k + self.test_size]


@lru_cache(maxsize=32)
def _generated(task: SyntheticTask) -> tuple[tuple[Example, ...], tuple[Example, ...]]:
    """Distinct questions drawn with the task's seed until enough, or until 20 draws in a row bring nothing new."""
    rng = random.Random(f"synthetic:{task.seed}:{task.name}")
    want = task.shots + task.val_size + task.test_size
    seen: dict[str, Example] = {}
    misses = 0
    while len(seen) < want and misses < 20 * want:
        ex = task.make(rng)  # type: ignore[misc]
        misses = misses + 1 if ex.input in seen else 0
        seen.setdefault(ex.input, ex)
    examples = list(seen.values())
    shots: list[Example] = []
    for ex in examples:  # shots with different answers, so that no answer is taught as the usual one
        if len(shots) < task.shots and ex.target not in {s.target for s in shots}:
            shots.append(ex)
    return tuple(shots), tuple(ex for ex in examples if ex not in shots)


def _synthetic_tasks() -> list[SyntheticTask]:
    tasks = []
    for digits in (1, 2):
        for op, word in (("+", "addition"), ("-", "subtraction"), ("*", "multiplication")):
            tasks.append(SyntheticTask(f"gen_{digits}_digit_{word}", "synthetic", worked_arithmetic, 32,
                                       f"What is a {_WORDS[op]} b? ({digits}-digit, generated)",
                                       make=arithmetic_question(op, digits)))
    for op, word in (("+", "addition"), ("*", "multiplication")):  # between the two: 900 questions each
        tasks.append(SyntheticTask(f"gen_2_by_1_digit_{word}", "synthetic", worked_arithmetic, 32,
                                   f"What is 47 {_WORDS[op]} 3? (2-digit by 1-digit, generated)",
                                   make=arithmetic_question(op, 2, 1)))
    tasks.append(SyntheticTask("gen_counting", "synthetic", worked_counting, 64,
                               "I have an apple, a pear, and a plum. How many fruits do I have? (generated)",
                               make=counting_question))
    tasks.append(SyntheticTask("gen_word_sorting", "synthetic", worked_sorting, 40,
                               "Sort 3 or 4 words alphabetically (generated)", make=sorting_question))
    return tasks


GENERATION_TASKS.update({t.name: t for t in _synthetic_tasks()})
SYNTHETIC_TASKS: tuple[str, ...] = tuple(t.name for t in _synthetic_tasks())


def get_generation_task(name: str) -> GenerationTask:
    if name not in GENERATION_TASKS:
        raise ValueError(f"task {name!r} is not a generation task: tasks are {', '.join(GENERATION_TASKS)}")
    return GENERATION_TASKS[name]

# The tasks on which the embedded SmolLM2-135M answers measurably above its zero line at full depth (the default
# task set of `sweep --task-mode generate`); measured on 48 questions each, see the README.
DEFAULT_GENERATION_TASKS: tuple[str, ...] = ("arithmetic_1_digit_addition", "arithmetic_1_digit_multiplication")
