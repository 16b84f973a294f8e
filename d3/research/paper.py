"""The paper's protocol: alpha and start chosen on a validation split, then test-split exact match and speed."""

from __future__ import annotations

import csv
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol

from d3.config import D3Config, FullConfig, StrategyConfig

ALPHAS: tuple[float, ...] = (0.99, 0.993, 0.995, 0.997, 0.999)
START_FRACTIONS: tuple[float, ...] = (0.2, 0.4, 0.6, 0.8)
TOLERANCE_POINTS = 1.0  # the paper's criterion: within 1 exact-match point of full depth
CSV_COLUMNS = ("task", "n_val", "n_test", "alpha", "start", "drop_order", "layer_order", "full_em", "d3_em", "mean_layers", "num_layers",
               "theoretical_speedup", "full_s", "d3_s", "measured_speedup")
DROP_ORDER_CHOICES: tuple[str, ...] = ("middle_out", "bottom_up", "top_down", "task")
SELECTION_RULE = (
    "alpha, start and the drop order are chosen on the validation split: every alpha in the grid is paired with "
    "every start (a fraction of the mean full-depth output length, in tokens) and every drop order (middle_out, "
    "bottom_up, top_down, and `task`: the greedy order calibrated by exact match on that same validation split, "
    "d3.research.calibrate); among the settings whose validation exact match is within 1 point of full depth, the one with "
    "the fewest mean layers is kept (ties: higher exact match, then larger alpha); if none is within 1 point, the "
    "one with the best validation exact match.")


class PaperTask(Protocol):
    """What the protocol needs from a generation task with exact-match scoring."""

    name: str
    max_new_tokens: int

    def split(self, name: str) -> list[Any]:
        """The examples of split "validation" or "test" (disjoint, the same on every call)."""

    def prompt(self, example: Any) -> str:
        """The text the model continues."""

    def score(self, example: Any, generated: str) -> bool:
        """Whether the generated text answers the example exactly."""


# ---------------------------------------------------------------- built-in tasks


@lru_cache(maxsize=8)
def _shuffled_task(name: str, seed: int) -> tuple[Any, ...]:
    """A BIG-bench task's examples in a fixed shuffled order (read once: prompt() needs the shots every call)."""
    from d3.research.data import load_task

    examples = load_task(name)
    random.Random(f"paper:{seed}:{name}").shuffle(examples)
    return tuple(examples)


@dataclass(frozen=True)
class BigBenchExactMatch:
    """A BIG-bench exact-match task (d3.research.data), few-shot, its shots and two disjoint splits drawn with a fixed seed."""

    name: str = "object_counting"
    max_new_tokens: int = 8
    shots: int = 3
    val_size: int = 50
    seed: int = 0

    def _examples(self) -> list[Any]:
        return list(_shuffled_task(self.name, self.seed))

    def split(self, name: str) -> list[Any]:
        rest = self._examples()[self.shots:]
        return rest[:self.val_size] if name == "validation" else rest[self.val_size:]

    def prompt(self, example: Any) -> str:
        from d3.research.data import format_prompt

        return format_prompt(example, few_shot=self._examples()[:self.shots])

    def score(self, example: Any, generated: str) -> bool:
        from d3.research.data import score_exact

        return score_exact(example, generated)


@dataclass(frozen=True)
class Addition:
    """Two-digit addition, few-shot, generated with a fixed seed: a task small models answer above zero."""

    name: str = "addition"
    max_new_tokens: int = 6
    val_size: int = 50
    test_size: int = 200
    seed: int = 0
    shots: tuple[tuple[int, int], ...] = ((12, 7), (35, 21), (48, 16))

    def split(self, name: str) -> list[tuple[int, int]]:
        rng = random.Random(f"addition:{self.seed}")
        pairs: dict[tuple[int, int], None] = {}  # distinct questions, none of them a shot: the splits are disjoint sets
        while len(pairs) < self.val_size + self.test_size:
            pair = (rng.randint(10, 99), rng.randint(1, 99))
            if pair not in self.shots:
                pairs.setdefault(pair)
        pairs = list(pairs)  # type: ignore[assignment]
        return pairs[:self.val_size] if name == "validation" else pairs[self.val_size:]

    def prompt(self, example: tuple[int, int]) -> str:
        shots = [f"Q: What is {a} plus {b}?\nA: {a + b}" for a, b in self.shots]
        return "\n\n".join([*shots, f"Q: What is {example[0]} plus {example[1]}?\nA:"])

    def score(self, example: tuple[int, int], generated: str) -> bool:
        first = next((w for w in generated.split() if w.strip()), "")
        return first.strip(".,") == str(sum(example))


def _generation_tasks() -> dict[str, Callable[[], PaperTask]]:
    """d3.research.gentasks' tasks (worked answers, the answer stated last): the paper's setting of long generated answers."""
    from d3.research.gentasks import GENERATION_TASKS

    return {name: (lambda task=task: task) for name, task in GENERATION_TASKS.items()}


TASKS: dict[str, Callable[[], PaperTask]] = {"addition": Addition, "object_counting": BigBenchExactMatch,
                                              **_generation_tasks()}


def get_task(name: str) -> PaperTask:
    if name not in TASKS:
        raise ValueError(f"task {name!r} is not known: tasks are {', '.join(TASKS)}")
    return TASKS[name]()


# ---------------------------------------------------------------- measuring one split under one strategy


@dataclass(frozen=True)
class Outcome:
    """One question under one strategy: correct or not, tokens generated, layers summed over them."""

    index: int
    correct: bool
    tokens: int
    layers: int


@dataclass(frozen=True)
class Scored:
    """A strategy on a split: exact match in points, mean layers per generated token, mean output length."""

    strategy: StrategyConfig
    em: float
    mean_layers: float
    mean_tokens: float
    outcomes: tuple[Outcome, ...] = field(default=(), repr=False)


def run_batch(engine: Any, task: PaperTask, batch: Sequence[tuple[int, Any]], strategy: StrategyConfig,
              chat_template: bool) -> tuple[list[Outcome], float]:
    """Greedy answers for a batch of (index, example), each up to the end of its reply (the blank line before the
    next question, or end of sequence; decoding stops once every reply has ended, as a stop string does in a
    serving pipeline): the outcomes and the wall-clock seconds."""
    from d3.research.sweep.generation import answer_batch

    answers, timed = answer_batch(engine, task, [ex for _, ex in batch], strategy, chat_template=chat_template)
    return [Outcome(i, a.correct, a.tokens, a.layers) for (i, _), a in zip(batch, answers)], timed.seconds


def batches(items: Sequence[Any], size: int) -> list[list[Any]]:
    return [list(items[i:i + size]) for i in range(0, len(items), size)]


def summarize(strategy: StrategyConfig, outcomes: Sequence[Outcome]) -> Scored:
    outcomes = tuple(sorted(outcomes, key=lambda o: o.index))
    tokens = sum(o.tokens for o in outcomes)
    em = 100.0 * sum(o.correct for o in outcomes) / max(len(outcomes), 1)
    return Scored(strategy, em, sum(o.layers for o in outcomes) / max(tokens, 1), tokens / max(len(outcomes), 1),
                  outcomes)


# ---------------------------------------------------------------- the selection rule


def select(full: Scored, candidates: Sequence[Scored], tolerance: float = TOLERANCE_POINTS) -> Scored:
    """The paper's rule (SELECTION_RULE): fewest mean layers within `tolerance` points of full depth."""
    if not candidates:
        raise ValueError("select needs at least one candidate setting")
    alpha = lambda s: getattr(s.strategy, "alpha", 1.0)  # noqa: E731
    within = [c for c in candidates if c.em >= full.em - tolerance - 1e-9]
    if within:
        return min(within, key=lambda c: (round(c.mean_layers, 9), -c.em, -alpha(c)))
    return max(candidates, key=lambda c: (c.em, -c.mean_layers, alpha(c)))


def start_steps(mean_tokens: float, fractions: Sequence[float]) -> list[int]:
    """Start steps from fractions of the expected output length, deduplicated, in order."""
    steps = [int(round(f * mean_tokens)) for f in fractions]
    return sorted(set(steps))


def grid(alphas: Sequence[float], starts: Sequence[int], core: tuple[int | None, int | None] = (None, None),
         orders: Sequence[dict[str, Any]] = ({"drop_order": "middle_out"},)) -> list[D3Config]:
    """Every (drop order, alpha, start); `orders` are D3Config fields (drop_order, and layer_order if calibrated)."""
    return [D3Config(alpha=a, start=s, core_head=core[0], core_tail=core[1], **o) for o in orders for a in alphas
            for s in starts]


def order_choices(engine: Any, task: PaperTask, words: Sequence[str], settings: RunSettings,
                  log: Callable[[str], None] = lambda _: None) -> list[dict[str, Any]]:
    """The drop orders the validation grid tries: named orders as they are, `task` calibrated on the validation split."""
    out: list[dict[str, Any]] = []
    for word in words:
        if word != "task":
            out.append({"drop_order": word})
            continue
        from d3.research.calibrate import calibrate, paper_task_set

        cal = calibrate(engine, "task", paper_task_set(task, settings.val_limit), steps=settings.calibrate_steps)
        log(f"{task.name}: task-calibrated order on the validation split {cal.order[:8]}… ({cal.seconds:.0f} s)")
        out.append({"drop_order": "calibrated", "layer_order": cal.order})
    return out


# ---------------------------------------------------------------- result rows and the table


@dataclass(frozen=True)
class PaperRow:
    """One task's line of the paper's table."""

    task: str
    n_val: int
    n_test: int
    alpha: float
    start: int
    drop_order: str
    layer_order: str  # a calibrated order's layers, space-separated ("" for a named order)
    full_em: float
    d3_em: float
    mean_layers: float
    num_layers: int
    theoretical_speedup: float
    full_s: float
    d3_s: float

    @property
    def measured_speedup(self) -> float:
        return self.full_s / self.d3_s if self.d3_s > 0 else float("nan")

    def as_dict(self) -> dict[str, Any]:
        return {c: getattr(self, c) for c in CSV_COLUMNS}


def table(rows: Sequence[PaperRow]) -> str:
    """The paper's layout: task | full EM | D3 EM | layers used / L | theoretical speedup | measured speedup."""
    w = max([18, *(len(r.task) for r in rows)])  # task names as wide as the longest
    head = f"{'task':<{w}} {'full EM':>8} {'D3 EM':>8} {'layers used / L':>16} {'theor. speedup':>15} {'measured':>9}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r.task:<{w}} {r.full_em:8.2f} {r.d3_em:8.2f} {f'{r.mean_layers:.2f} / {r.num_layers}':>16} "
                     f"{r.theoretical_speedup:14.2f}x {r.measured_speedup:8.2f}x")
    lines.append(f"(alpha, start, drop order per task: "
                 f"{', '.join(f'{r.task} {r.alpha:g}, {r.start}, {r.drop_order}' for r in rows)}; "
                 f"EM in points on {', '.join(str(r.n_test) for r in rows)} test questions)")
    return "\n".join(lines)


def write_csv(rows: Sequence[PaperRow], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        for r in rows:
            writer.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.as_dict().items()})
    return path


# ---------------------------------------------------------------- data-parallel runs


class Shards:
    """This process's share of the questions under `accelerate launch` (one process: all of them)."""

    def __init__(self, cpu: bool = False) -> None:
        from accelerate import PartialState

        # cpu=True lets processes started by torchrun (`accelerate launch --multi_gpu`) meet over gloo on a
        # machine without GPUs; accelerate's own `--cpu` launcher starts one process unless mpirun is set up.
        self.state = PartialState(cpu=cpu)

    @property
    def is_main(self) -> bool:
        return bool(self.state.is_main_process)

    @property
    def count(self) -> int:
        return int(self.state.num_processes)

    def mine(self, items: Sequence[Any]) -> list[Any]:
        with self.state.split_between_processes(list(items)) as part:
            return list(part)

    def gather(self, objects: list[Any]) -> list[Any]:
        """Every process's objects, on every process (so all of them make the same selection)."""
        if self.count == 1:
            return list(objects)
        from accelerate.utils import gather_object

        return list(gather_object(objects))


@dataclass(frozen=True)
class RunSettings:
    """How a task is run: grid, split sizes, batch size, prompt format."""

    alphas: tuple[float, ...] = ALPHAS
    start_fractions: tuple[float, ...] = START_FRACTIONS
    drop_orders: tuple[str, ...] = DROP_ORDER_CHOICES
    calibrate_steps: int = 6  # greedy removals of the task-calibrated order (the rest by single-drop score)
    limit: int | None = None
    val_limit: int | None = None
    batch_size: int = 8
    chat_template: bool = False


def measure(engine: Any, task: PaperTask, items: Sequence[tuple[int, Any]], strategy: StrategyConfig,
            shards: Shards, settings: RunSettings) -> Scored:
    """Exact match and layers of `strategy` over (index, example) items, each process on its shard."""
    outcomes: list[Outcome] = []
    for batch in batches(shards.mine(items), settings.batch_size):
        outcomes += run_batch(engine, task, batch, strategy, settings.chat_template)[0]
    return summarize(strategy, shards.gather(outcomes))


def timed_test(engine: Any, task: PaperTask, items: Sequence[tuple[int, Any]], d3: D3Config, shards: Shards,
               settings: RunSettings) -> tuple[Scored, Scored, float, float]:
    """Full depth and D3 on the same test batches, interleaved (alternating which runs first, so drift in the
    machine's speed falls on both), after one untimed warm-up batch each (the first test batch). Seconds are summed over processes."""
    mine = batches(shards.mine(items), settings.batch_size)
    if mine:  # a whole batch: on a GPU the first call at a new batch shape pays for kernel selection
        for strategy in (FullConfig(), d3):
            run_batch(engine, task, mine[0], strategy, settings.chat_template)
    full_out: list[Outcome] = []
    d3_out: list[Outcome] = []
    seconds = {"full": 0.0, "d3": 0.0}
    for k, batch in enumerate(mine):
        order = [("full", FullConfig(), full_out), ("d3", d3, d3_out)]
        for name, strategy, sink in (order if k % 2 == 0 else order[::-1]):
            outs, took = run_batch(engine, task, batch, strategy, settings.chat_template)
            sink += outs
            seconds[name] += took
    times = shards.gather([(seconds["full"], seconds["d3"])])
    return (summarize(FullConfig(), shards.gather(full_out)), summarize(d3, shards.gather(d3_out)),
            sum(t[0] for t in times), sum(t[1] for t in times))


def _indexed(examples: Sequence[Any], limit: int | None) -> list[tuple[int, Any]]:
    return list(enumerate(examples[:limit] if limit is not None else examples))


def run_task(engine: Any, task: PaperTask, shards: Shards, settings: RunSettings,
             log: Callable[[str], None] = lambda _: None) -> PaperRow:
    """The protocol on one task: validation grid, the selection rule, then the timed test split."""
    val = _indexed(task.split("validation"), settings.val_limit)
    test = _indexed(task.split("test"), settings.limit)
    if not val or not test:
        raise ValueError(f"task {task.name}: the validation and test splits must not be empty")
    full_val = measure(engine, task, val, FullConfig(), shards, settings)
    starts = start_steps(full_val.mean_tokens, settings.start_fractions)
    log(f"{task.name}: full depth on {len(val)} validation questions: EM {full_val.em:.2f}, "
        f"{full_val.mean_tokens:.1f} tokens per answer; starts {starts}")
    scored = []
    for cfg in grid(settings.alphas, starts, orders=order_choices(engine, task, settings.drop_orders, settings, log)):
        scored.append(measure(engine, task, val, cfg, shards, settings))
        log(f"  {cfg.drop_order} alpha {cfg.alpha:g} start {cfg.start}: EM {scored[-1].em:.2f}, "
            f"{scored[-1].mean_layers:.2f} layers")
    chosen = select(full_val, scored).strategy
    assert isinstance(chosen, D3Config)
    full, d3, full_s, d3_s = timed_test(engine, task, test, chosen, shards, settings)
    from d3.schedule import theoretical_speedup

    layers = " ".join(map(str, chosen.layer_order)) if isinstance(chosen.layer_order, tuple) else ""
    return PaperRow(task.name, len(val), len(test), chosen.alpha, chosen.start, chosen.drop_order, layers, full.em,
                    d3.em, d3.mean_layers, engine.num_layers, theoretical_speedup([d3.mean_layers], engine.num_layers),
                    full_s, d3_s)
