"""Tasks answered by generation, BBH-style: few-shot worked answers, the answer read out of the generated text.

The paper measures D3 on generated answers (BBH and GSM8K exact match, chain-of-thought prompts), so the depth
of later tokens counts. Here every shot answers in words first and states the answer last ("... So the answer
is 109."), so the model writes its own worked tokens under the schedule before the answer, and the answer's
tokens come at decayed depth. The questions, the answers and the shots come from the BIG-bench files that
`python -m d3 fetch-data` caches (`d3.research.data.TASKS`); the worked answers of the shots are written from each shot
by a rule, as BBH's chain-of-thought exemplars were written by hand. Pure Python: no torch.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

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

    def shot_text(self, shot: Example) -> str:
        """A shot's worked answer (the text after "A:")."""
        return self.worked(shot)

    def prompt(self, example: Example) -> str:
        blocks = [f"Q: {s.input}\nA: {self.shot_text(s)}" for s in self.shot_examples()]
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
#
# A generated task draws its questions uniformly from a question space whose size it states (`space`). A study
# draws `drawn` = shots + validation + test questions of one seed; a task has room when its space holds at least
# ROOM times that, so a new seed draws fresh questions (two seeds share about drawn / space of them, under 5%).
# 1-digit arithmetic (100 questions, 55 for subtraction) and 2-by-1-digit arithmetic (900) have no room: every seed
# draws the same population. They stay for the page's scenarios and the tests; the drop-order study refuses them.

ROOM = 20  # a task has room when its question space is at least ROOM times what one seed draws from it
Draw = Callable[[random.Random], "tuple[Example, str]"]  # one question, uniform over a stratum, and its worked answer


@dataclass(frozen=True)
class Space:
    """A question space as strata of known size, each drawn uniformly; a stratum is picked with probability
    proportional to its size, so every question of the space is equally likely."""

    parts: tuple[tuple[int, Draw], ...]

    @property
    def size(self) -> int:
        return sum(n for n, _ in self.parts)

    def draw(self, rng: random.Random) -> tuple[Example, str]:
        k = rng.randrange(self.size)
        for n, draw in self.parts:
            if k < n:
                return draw(rng)
            k -= n
        raise AssertionError("unreachable: k < size")


def _q(question: str, answer: str, *also: str) -> Example:
    return Example("synthetic", question, (), answer, None, (answer, *also))


def _from(records: list[Any], make: Callable[..., tuple[Example, str]]) -> tuple[int, Draw]:
    """A stratum that is an explicit list of records (tuples of a question's parts), drawn uniformly."""
    frozen = tuple(records)
    return len(frozen), lambda rng: make(*rng.choice(frozen))


_WORDS = {"+": "plus", "-": "minus", "*": "times"}
_SPAN = {1: (0, 9), 2: (10, 99)}


def _arithmetic(a: int, op: str, b: int) -> tuple[Example, str]:
    value = a + b if op == "+" else a - b if op == "-" else a * b
    return (_q(f"What is {a} {_WORDS[op]} {b}?", str(value)),
            f"{a} {_WORDS[op]} {b} is {value}. So the answer is {value}.")


def arithmetic_space(op: str, digits: int, second_digits: int | None = None) -> Space:
    """"What is 47 times 3?": the first operand of `digits` digits (0-9 or 10-99), the second of `second_digits`
    (default the same); subtraction never goes below 0 (a >= b)."""
    (lo, hi), (lo2, hi2) = _SPAN[digits], _SPAN[second_digits or digits]
    pairs = [(a, op, b) for a in range(lo, hi + 1) for b in range(lo2, hi2 + 1) if op != "-" or a >= b]
    return Space((_from(pairs, _arithmetic),))


def _addition_steps(a: int, b: int) -> tuple[Example, str]:
    """"47 plus 25: 40 plus 20 is 60, 7 plus 5 is 12, 60 plus 12 is 72. So the answer is 72."."""
    tens, ones = (a // 10 + b // 10) * 10, a % 10 + b % 10
    steps = f"{a // 10 * 10} plus {b // 10 * 10} is {tens}, {a % 10} plus {b % 10} is {ones}, {tens} plus {ones} is {a + b}"
    return _q(f"What is {a} plus {b}?", str(a + b)), f"{a} plus {b}: {steps}. So the answer is {a + b}."


_NAMES = "Sam Ann Tom Mia Ben Eva Max Zoe Leo Amy Dan Ivy".split()
_OBJECTS = "apples pens books coins cards stamps shells marbles cookies stickers".split()


def _story(name: str, thing: str, a: int, b: int, c: int | None) -> tuple[Example, str]:
    """A word problem: `a` things, `b` more (b < 0: gives |b| away), then `c` given away (two steps) or not."""
    got = f"{name} gets {b} more {thing}." if b > 0 else f"{name} gives away {-b} {thing}."
    first = a + b
    steps = f"{a} plus {b} is {first}." if b > 0 else f"{a} minus {-b} is {first}."
    text = f"{name} has {a} {thing}. {got}"
    value = first
    if c is not None:
        text += f" Then {name} gives away {c} {thing}."
        value = first - c
        steps += f" {first} minus {c} is {value}."
    return (_q(f"{text} How many {thing} does {name} have now?", str(value)),
            f"{steps} So the answer is {value}.")


def word_problem_space(two_steps: bool) -> Space:
    """"Sam has 4 apples. Sam gets 3 more apples. [Then Sam gives away 2 apples.] How many apples does Sam have
    now?": 12 names x 10 things x the numbers (1-digit; a result never below 0)."""
    numbers = [(a, b) for a in range(2, 10) for b in range(2, 10)] + [(a, -b) for a in range(2, 10) for b in range(1, a)]
    records: list[tuple[str, str, int, int, int | None]]
    if two_steps:
        records = [(n, t, a, b, c) for n in _NAMES for t in _OBJECTS for a in range(2, 10) for b in range(2, 10)
                   for c in range(1, min(9, a + b - 1) + 1)]
    else:
        records = [(n, t, a, b, None) for n in _NAMES for t in _OBJECTS for a, b in numbers]
    return Space((_from(records, _story),))


def _digits(k: int, distinct: bool) -> tuple[int, Callable[[random.Random], list[str]]]:
    """Lists of `k` digits (distinct or not), uniform: 10**k or 10!/(10-k)! of them."""
    size = math.perm(10, k) if distinct else 10 ** k
    return size, (lambda rng: [str(d) for d in rng.sample(range(10), k)]) if distinct else \
        (lambda rng: [str(rng.randrange(10)) for _ in range(k)])


def list_space(kind: str, lengths: tuple[int, ...]) -> Space:
    """Digit lists: "copy" ("Repeat the list: 7 3 9 2"), "reverse", or "sort" (distinct digits, smallest first)."""
    ask = {"copy": "Repeat the list", "reverse": "Reverse the list", "sort": "Sort from smallest to largest"}[kind]
    how = {"copy": "Copying it", "reverse": "Reading it from the end", "sort": "In order"}[kind]

    def stratum(k: int) -> tuple[int, Draw]:
        size, digits = _digits(k, distinct=kind == "sort")

        def draw(rng: random.Random) -> tuple[Example, str]:
            items = digits(rng)
            out = " ".join(items if kind == "copy" else items[::-1] if kind == "reverse" else sorted(items))
            return _q(f"{ask}: {' '.join(items)}", out), f"{how}: {out}. So the answer is {out}."
        return size, draw
    return Space(tuple(stratum(k) for k in lengths))


_THINGS = {"fruits": "apple banana pear plum peach orange grape lemon mango cherry".split(),
           "animals": "cat dog cow horse goat rabbit owl eagle sheep duck".split(),
           "musical instruments": "flute piano violin drum trumpet guitar harp cello oboe banjo".split()}
_SORT_WORDS = ("apple river stone cloud tiger window garden pencil silver orange candle mirror button forest "
               "ladder basket rocket violin hammer island jacket kitten lemon marble needle parrot quilt saddle "
               "tunnel wagon yellow zebra anchor bridge cactus dragon engine feather").split()


def _article(word: str) -> str:
    return f"an {word}" if word[0] in "aeiou" else f"a {word}"


def counting_space() -> Space:
    """"I have an apple, a pear, and a plum. How many fruits do I have?": 2 to 6 different things of one kind, in
    any order (3 kinds x sum of 10!/(10-k)!)."""
    def stratum(kind: str, k: int) -> tuple[int, Draw]:
        def draw(rng: random.Random) -> tuple[Example, str]:
            items = [_article(w) for w in rng.sample(_THINGS[kind], k)]
            listed = f"{items[0]} and {items[1]}" if k == 2 else ", ".join(items[:-1]) + f", and {items[-1]}"
            ex = _q(f"I have {listed}. How many {kind} do I have?", str(k), _NUMBER_WORDS[k])
            return ex, worked_counting(ex)
        return math.perm(len(_THINGS[kind]), k), draw
    return Space(tuple(stratum(kind, k) for kind in sorted(_THINGS) for k in range(2, 7)))


def word_sorting_space() -> Space:
    """"Sort the following words alphabetically: List: stone apple river": 3 or 4 different words of 40."""
    def stratum(k: int) -> tuple[int, Draw]:
        def draw(rng: random.Random) -> tuple[Example, str]:
            words = rng.sample(_SORT_WORDS, k)
            ex = _q(f"Sort the following words alphabetically: List: {' '.join(words)}", " ".join(sorted(words)))
            return ex, worked_sorting(ex)
        return math.perm(len(_SORT_WORDS), k), draw
    return Space((stratum(3), stratum(4)))


def words_space(kind: str, lengths: tuple[int, ...]) -> Space:
    """Lists of different words of 40: "copy" ("Repeat the words: stone apple river") or "last" ("What is the
    last word of: stone apple river?")."""
    def stratum(k: int) -> tuple[int, Draw]:
        def draw(rng: random.Random) -> tuple[Example, str]:
            words = " ".join(rng.sample(_SORT_WORDS, k))
            if kind == "copy":
                return _q(f"Repeat the words: {words}", words), f"Copying them: {words}. So the answer is {words}."
            last = words.split()[-1]
            return (_q(f"What is the last word of: {words}?", last),
                    f"The words are {words}; the last one is {last}. So the answer is {last}.")
        return math.perm(len(_SORT_WORDS), k), draw
    return Space(tuple(stratum(k) for k in lengths))


def _larger(a: int, b: int) -> tuple[Example, str]:
    big, small = max(a, b), min(a, b)
    return (_q(f"Which is larger, {a} or {b}?", str(big)),
            f"{big} is more than {small}. So the answer is {big}.")


def compare_space() -> Space:
    """"Which is larger, 347 or 382?": two different 3-digit numbers."""
    def draw(rng: random.Random) -> tuple[Example, str]:
        a, b = rng.sample(range(100, 1000), 2)
        return _larger(a, b)
    return Space(((900 * 899, draw),))


# (bigger unit, smaller unit, how many of the smaller make one bigger, the amounts asked)
_UNITS = (("meter", "centimeters", 100, range(2, 1000)), ("centimeter", "millimeters", 10, range(2, 1000)),
          ("kilometer", "meters", 1000, range(2, 1000)), ("kilogram", "grams", 1000, range(2, 1000)),
          ("dollar", "cents", 100, range(2, 1000)), ("hour", "minutes", 60, range(2, 13)),
          ("minute", "seconds", 60, range(2, 13)), ("day", "hours", 24, range(2, 13)),
          ("week", "days", 7, range(2, 13)), ("year", "months", 12, range(2, 13)))


def _convert(big: str, small: str, factor: int, n: int) -> tuple[Example, str]:
    value = n * factor
    return (_q(f"How many {small} are in {n} {big}s?", str(value)),
            f"1 {big} is {factor} {small}, so {n} {big}s is {n} times {factor}, {value} {small}. So the answer is {value}.")


def unit_space() -> Space:
    """"How many centimeters are in 7 meters?": metric units and money for 2-999, time for 2-12."""
    return Space((_from([(big, small, f, n) for big, small, f, ns in _UNITS for n in ns], _convert),))


_MONTHS = ("January February March April May June July August September October November December").split()


def _date(month: str, day: int, k: int) -> tuple[Example, str]:
    """k > 0: the date k days after; k < 0: |k| days before (always within the month)."""
    to = day + k
    word, op = ("after", "plus") if k > 0 else ("before", "minus")
    return (_q(f"What is the date {abs(k)} days {word} {month} {day}?", f"{month} {to}"),
            f"{day} {op} {abs(k)} is {to}, so it is {month} {to}. So the answer is {month} {to}.")


def date_space() -> Space:
    """"What is the date 5 days after March 12?": 2-9 days after or before, within the month (days 1-28)."""
    records = [(m, d, k) for m in _MONTHS for d in range(1, 29) for k in range(2, 10) if d + k <= 28]
    records += [(m, d, -k) for m in _MONTHS for d in range(1, 29) for k in range(2, 10) if d - k >= 1]
    return Space((_from(records, _date),))


def _next(n: int, step: int) -> tuple[Example, str]:
    word, op = ("after", "plus") if step > 0 else ("before", "minus")
    return (_q(f"What number comes {word} {n}?", str(n + step)),
            f"{n} {op} 1 is {n + step}. So the answer is {n + step}.")


def successor_space() -> Space:
    """"What number comes after 4799?" (or before): 4-digit numbers."""
    return Space((_from([(n, 1) for n in range(1000, 9999)] + [(n, -1) for n in range(1001, 10000)], _next),))


@dataclass(frozen=True)
class SyntheticTask(GenerationTask):
    """A generated task: seeded distinct questions drawn uniformly from `space`; the first `shots` with different
    answers as shots, then `val_size` validation and `test_size` test questions, all distinct (fewer where the
    space has fewer: 1-digit arithmetic has 100, split evenly after the shots). `with_seed` draws another set."""

    space: Space | None = None
    val_size: int = 60
    test_size: int = 150

    def _pool(self) -> tuple[tuple[Example, ...], tuple[Example, ...]]:
        return _generated(self)[:2]

    @property
    def space_size(self) -> int:
        return self.space.size if self.space else 0

    @property
    def drawn(self) -> int:
        """Questions one seed draws: shots, validation and test."""
        return self.shots + self.val_size + self.test_size

    @property
    def has_room(self) -> bool:
        """The space holds at least ROOM times what one seed draws, so another seed draws fresh questions."""
        return self.space_size >= ROOM * self.drawn

    def with_seed(self, seed: int) -> SyntheticTask:
        return replace(self, seed=seed)

    def shot_text(self, shot: Example) -> str:
        return _generated(self)[2].get(shot.input) or self.worked(shot)

    def split(self, name: str) -> list[Example]:
        if name not in ("validation", "test"):
            raise ValueError(f"split {name!r} is not a split: splits are validation, test")
        rest = list(self._pool()[1])
        k = min(self.val_size, len(rest) // 2)
        return rest[:k] if name == "validation" else rest[k:k + self.test_size]


@lru_cache(maxsize=64)
def _generated(task: SyntheticTask) -> tuple[tuple[Example, ...], tuple[Example, ...], dict[str, str]]:
    """Distinct questions drawn with the task's seed until enough, or until 20 draws in a row per question wanted
    bring nothing new (a space smaller than a seed's draw is then all drawn); and the shots' worked answers."""
    rng = random.Random(f"synthetic:{task.seed}:{task.name}")
    want = task.drawn
    seen: dict[str, tuple[Example, str]] = {}
    misses = 0
    while len(seen) < want and misses < 20 * want:
        ex, worked = task.space.draw(rng)  # type: ignore[union-attr]
        misses = misses + 1 if ex.input in seen else 0
        seen.setdefault(ex.input, (ex, worked))
    examples = [ex for ex, _ in seen.values()]
    shots: list[Example] = []
    for ex in examples:  # shots with different answers, so that no answer is taught as the usual one
        if len(shots) < task.shots and ex.target not in {s.target for s in shots}:
            shots.append(ex)
    return tuple(shots), tuple(ex for ex in examples if ex not in shots), {s.input: seen[s.input][1] for s in shots}


def _synthetic_tasks() -> list[SyntheticTask]:
    def task(name: str, space: Space, summary: str, tokens: int = 40) -> SyntheticTask:
        return SyntheticTask(name, "synthetic", worked_arithmetic, tokens, summary, space=space)

    tasks = []
    for digits in (1, 2):
        for op, word in (("+", "addition"), ("-", "subtraction"), ("*", "multiplication")):
            tasks.append(task(f"gen_{digits}_digit_{word}", arithmetic_space(op, digits),
                              f"What is a {_WORDS[op]} b? ({digits}-digit, generated)", 32))
    for op, word in (("+", "addition"), ("*", "multiplication")):  # between the two: 900 questions each
        tasks.append(task(f"gen_2_by_1_digit_{word}", arithmetic_space(op, 2, 1),
                          f"What is 47 {_WORDS[op]} 3? (2-digit by 1-digit, generated)", 32))
    tasks += [
        task("gen_2_digit_addition_steps",
             Space((_from([(a, b) for a in range(10, 100) for b in range(10, 100)], _addition_steps),)),
             "What is 47 plus 25? (2-digit, worked by tens and ones)", 64),
        task("gen_word_problems", word_problem_space(False),
             "Sam has 4 apples. Sam gets 3 more apples. How many apples does Sam have now? (one step)"),
        task("gen_two_step_problems", word_problem_space(True),
             "Sam has 4 apples, gets 3 more, then gives away 2: how many now? (two steps)", 48),
        task("gen_copy_list", list_space("copy", (4, 5, 6)), "Repeat the list: 7 3 9 2 (4-6 digits)"),
        task("gen_copy_words", words_space("copy", (3, 4, 5)), "Repeat the words: stone apple river (3-5 words)"),
        task("gen_last_word", words_space("last", (3, 4, 5)), "What is the last word of: stone apple river?"),
        task("gen_compare_numbers", compare_space(), "Which is larger, 347 or 382? (3-digit)"),
        task("gen_reverse_list", list_space("reverse", (3, 4, 5)), "Reverse the list: 7 3 9 (3-5 digits)"),
        task("gen_sort_numbers", list_space("sort", (4, 5)), "Sort from smallest to largest: 7 3 9 2 (4-5 digits)"),
        task("gen_counting", counting_space(),
             "I have an apple, a pear, and a plum. How many fruits do I have? (generated)", 64),
        task("gen_word_sorting", word_sorting_space(), "Sort 3 or 4 words alphabetically (generated)"),
        task("gen_unit_conversion", unit_space(), "How many centimeters are in 7 meters? (generated)", 56),
        task("gen_dates", date_space(), "What is the date 5 days after March 12? (generated)", 48),
        task("gen_next_number", successor_space(), "What number comes after 4799? (or before; generated)"),
    ]
    return tasks


GENERATION_TASKS.update({t.name: t for t in _synthetic_tasks()})
SYNTHETIC_TASKS: tuple[str, ...] = tuple(t.name for t in _synthetic_tasks())
# the generated tasks with room to redraw (the drop-order study's candidates)
ROOMY_TASKS: tuple[str, ...] = tuple(t.name for t in _synthetic_tasks() if t.has_room)

def get_generation_task(name: str) -> GenerationTask:
    if name not in GENERATION_TASKS:
        raise ValueError(f"task {name!r} is not a generation task: tasks are {', '.join(GENERATION_TASKS)}")
    return GENERATION_TASKS[name]

# The tasks on which the embedded SmolLM2-135M answers measurably above its zero line at full depth (the default
# task set of `sweep --task-mode generate`); measured on 48 questions each, see the README.
DEFAULT_GENERATION_TASKS: tuple[str, ...] = ("arithmetic_1_digit_addition", "arithmetic_1_digit_multiplication")
