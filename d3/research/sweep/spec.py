"""What a sweep measures: the frozen `SweepSpec`, one grid `Setting`, the key of its row, the prompt set."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from d3.config import (
    BASELINES,
    DEFAULT_MODEL,
    DROP_ORDERS,
    FILLS,
    D3Config,
    GenerationConfig,
    StrategyConfig,
    _check,
    check_params,
    drop_order_fields,
    param,
    params,
)
from d3.research.data import ASSETS, example_prompts

TASK_SPLITS = ("all", "test")
MIN_SWEEP_TOKENS = 2  # a sweep's runs: at least two tokens, so that one is decoded past the prefill's
MAX_REPEATS = 50  # timing repeats of one setting (the bench's too)

Progress = Callable[[float, str], None]
TASK_SCORINGS = ("loglik", "generate")
TASK_MODES = ("score", "generate")
BUILTIN_PROMPTS = (
    "Explain in a few sentences why the sky looks blue during the day.",
    "List five tips for getting a good night's sleep.",
    "Write the opening paragraph of a short story about a lighthouse keeper who finds a message in a bottle.",
    "Write a short, polite email asking a colleague to move tomorrow's meeting to Friday.",
)


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
    tasks: BIG-bench task names (d3.research.data.TASKS), `task_limit` examples each; scored by `task_scoring`:
      "loglik" picks the multiple-choice option with the highest summed log-likelihood under the schedule
      (exact-match tasks always use greedy generation + `score_exact`), "generate" uses greedy generation
      + `score_exact` for every task.
    task_mode: "score" (the sweep: speed and quality on prompts, tasks scored by `task_scoring`) or "generate"
      (generation accuracy, `d3.research.sweep.generation`: `tasks` are `d3.research.gentasks` tasks answered in full by greedy
      generation, `task_limit` questions each, timed against full depth on `repeats` batches per task;
      `max_new_tokens` is then the answer length the depths are matched over).
    ppl_chunks: how many windows of `d3.research.data.ppl_text()` (each `ppl_prefix` + `max_new_tokens` tokens) perplexity
      is measured on; 0 turns perplexity off.
    """

    model: str = DEFAULT_MODEL
    prompts: tuple[str, ...] = BUILTIN_PROMPTS
    # The scalar fields declare their range once (d3.config's `Param`): the spec checks them with it, and
    # `python -m d3 sweep` makes its flags from it (type, range or choices, default, help).
    max_new_tokens: int = field(default=64, metadata={"param": replace(
        params(GenerationConfig)["max_new_tokens"].narrowed(lo=MIN_SWEEP_TOKENS),
        help="tokens each run computes (stop_at_eos off); with --task-mode generate, the answer length depths are "
             "matched over")})
    repeats: int = param(3, "Repeats", "timing repeats (full depth and method alternate)", lo=1, hi=MAX_REPEATS,
                         integer=True)
    depths: tuple[float, ...] = (0.85, 0.75, 2 / 3, 0.55)
    alphas: tuple[float, ...] = ()
    cores: tuple[tuple[int, int] | None, ...] = (None,)
    starts: tuple[int, ...] = (0,)
    fills: tuple[str, ...] = ("copy",)
    drop_orders: tuple[str, ...] = ("middle_out",)
    variants_at: float = param(2 / 3, "Variants at", "depth at which the non-base D3 variants run (a fraction of L)",
                               lo=0, hi=1, lo_open=True)
    product: bool = False
    baselines: tuple[str, ...] = BASELINES
    baseline_depths: tuple[float, ...] | None = None  # None: every depth
    early_exit_measures: tuple[str, ...] = ("softmax_gap",)
    early_exit_depths: tuple[float, ...] | None = None  # None: the baseline depths
    tasks: tuple[str, ...] = ()
    task_limit: int = param(30, "Task limit", "questions per task", lo=1, integer=True)
    task_scoring: str = param("loglik", "Task scoring", "loglik: the multiple-choice option with the highest "
                              "log-likelihood; generate: greedy generation and exact match", choices=TASK_SCORINGS)
    task_mode: str = param("score", "Task mode", "score: speed and quality on prompts, tasks scored by "
                           "--task-scoring; generate: generation accuracy (the paper's measure) on d3.research."
                           "gentasks tasks, answered in full by greedy generation, scored by exact match, each "
                           "setting timed against full depth on --repeats batches per task", choices=TASK_MODES)
    # generate mode: "test" asks only the test questions (the validation split is for choosing)
    task_split: str = param("all", "Task split", "generate mode: all questions (validation first) or only the test "
                            "split", choices=TASK_SPLITS)
    ppl_chunks: int = param(4, "Perplexity chunks", "windows of prose perplexity is measured on (0: off)", lo=0,
                            integer=True)
    ppl_prefix: int = 32
    chat_template: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        _check(len(self.prompts) >= 1 and all(isinstance(p, str) and p.strip() for p in self.prompts), "prompts",
               self.prompts, "one or more non-empty strings")
        # The strategy and generation fields are checked by their registry Param (d3.config), narrowed where a
        # sweep allows less; a list is checked value by value, the error naming the list.
        check_params(self)  # the scalar fields, each against its Param
        for d in (*self.depths, *(self.baseline_depths or ()), *(self.early_exit_depths or ())):
            _check(0 < d <= 1, "depths", d, "fractions in (0, 1]")
        d3 = params(D3Config)
        for a in self.alphas:
            d3["alpha"].check("alphas", a)
        _check(len(self.cores) >= 1, "cores", self.cores, "at least one (head, tail) pair or None")
        for core in self.cores:
            _check(core is None or (isinstance(core, tuple) and len(core) == 2), "cores", core,
                   "None or a (head, tail) pair")
            for side in core or ():
                d3["core_head"].check("cores", side)
        _check(len(self.starts) >= 1, "starts", self.starts, "one or more " + d3["start"].allowed())
        for s in self.starts:
            d3["start"].check("starts", s)
        _check(len(self.fills) >= 1, "fills", self.fills, f"among {FILLS}")
        for f in self.fills:  # the fills a sweep compares (FILL_VARIANTS' copy_any_type is the CLI's and the API's)
            _check(f in FILLS and d3["fill"].ok(f), "fills", f, f"among {FILLS}")
        _check(len(self.drop_orders) >= 1, "drop_orders", self.drop_orders, f"among {DROP_ORDERS}")
        for word in self.drop_orders:
            drop_order_fields(word)  # calibrated, calibrated:NAME or a named order; the error names the word
        _check(all(b in BASELINES for b in self.baselines), "baselines", self.baselines, f"among {BASELINES}")
        if self.task_mode == "generate":
            from d3.research.gentasks import GENERATION_TASKS

            _check(len(self.tasks) >= 1 and all(t in GENERATION_TASKS for t in self.tasks), "tasks", self.tasks,
                   f"one or more of {', '.join(GENERATION_TASKS)} (generation tasks)")
        else:
            from d3.research.data import TASKS

            _check(all(t in TASKS for t in self.tasks), "tasks", self.tasks,
                   f"among {', '.join(sorted(TASKS))} (BIG-bench tasks), or 'default'")

    @property
    def gen(self) -> GenerationConfig:
        return GenerationConfig(max_new_tokens=self.max_new_tokens, stop_at_eos=False)

    def measured_with(self) -> dict[str, Any]:
        """Everything besides the strategy that a row's numbers depend on (part of every row's key)."""
        d = asdict(self)
        for name in ("depths", "alphas", "cores", "starts", "fills", "drop_orders", "variants_at", "product",
                     "baselines", "baseline_depths", "early_exit_measures", "early_exit_depths"):
            d.pop(name)
        if d["task_mode"] == "score":  # the field came later: rows measured before it keep their keys
            d.pop("task_mode")
        if d["task_split"] == "all":  # so did this one
            d.pop("task_split")
        return d


@dataclass(frozen=True)
class Setting:
    """One point of the grid: a strategy config, its label and the mean depth it was tuned to (None: untuned)."""

    label: str
    config: StrategyConfig
    target_depth: float | None = None


def setting_key(spec: SweepSpec, model_name: str, setting: Setting) -> str:
    """A stable hash of the strategy config, the model and everything the row was measured with."""
    payload = {"model": model_name, "strategy": setting.config.to_dict(), "measured_with": spec.measured_with()}
    text = json.dumps(payload, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def prompt_count(path: Path | None = None) -> int:
    """How many prompts `load_prompts` can give (assets/prompts.json, or the built-in list)."""
    return len(load_prompts(10**6, path))


def load_prompts(count: int, path: Path | None = None) -> tuple[str, ...]:
    """The first `count` prompts of assets/prompts.json (or the built-in list if the file is missing)."""
    path = path or ASSETS / "prompts.json"
    prompts = [p.prompt for p in example_prompts(path)] if path.is_file() else list(BUILTIN_PROMPTS)
    return tuple(prompts[:count])
