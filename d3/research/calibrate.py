"""Which layers can this model spare? Layer importance and calibrated (greedy, nested) drop orders.

The paper leaves the order in which D3 drops its flex layers open. Here it is measured per model and per kind of
text, by one of three signals, each scoring a set of removed layers S:

- agreement (SWIFT's "matchness"): the share of the model's own full-depth next tokens that stay top-1 when the
  generated tokens run through the kept layers only (teacher-forced; the prompt at full depth), KL beside it.
- perplexity (SLEB): the NLL of real prose's continuation (the text's first part read at full depth as the prompt).
- task (TALE): exact match on a generation task's validation split, answered free-running with S removed.

Greedy and nested: step k removes the flex layer whose removal, on top of the k - 1 already removed, hurts the
signal least. The order is the removal order (the rest ranked by their single-drop score after `steps`), so D3 at a
budget of L - k drops exactly its first k: a nested order, as `d3.schedule` needs.

For a fixed removal, D3's decode equals one teacher-forced parallel pass (`d3.teacher_forced`); the task signal
prefills each question once and answers it under every candidate (`d3.research.answers`). What each signal reads:
`d3.research.calibration_sets`.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from d3.config import TRACE_OFF, D3Config, FullConfig, GenerationConfig, StaticSkipConfig
from d3.orders import (  # noqa: F401  (what a calibration is and where it is kept: part of this module's API)
    CALIBRATION_ENV,
    CHAT_ORDERS,
    HIGHER_IS_BETTER,
    MEASURED,
    SIGNALS,
    UNITS,
    Calibration,
    cached,
    calibration_path,
    calibration_root,
    read_calibration,
    resolve,
)
from d3.research import ShouldStop, stop_if
from d3.research.calibration_sets import (  # noqa: F401  (the sets are part of this module's API)
    TOKENS,
    CalibrationSet,
    default_set,
    paper_task_set,
    prompt_set,
    prompts_set,
    task_prompts,
    task_set,
    text_set,
)
from d3.teacher_forced import Batches, Score, TeacherForced

log = logging.getLogger(__name__)
Progress = Callable[[int, int, str], None]  # (done, total, what) after each scored removal
Announce = Callable[[str], None]  # one line saying what the calibration will cost, before its removals start


def announce_to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def removals(flex: int, steps: int) -> int:
    """Scored removals of a greedy nested order over `flex` layers with `steps` greedy steps."""
    steps = max(1, min(steps, flex))
    return sum(flex - k for k in range(steps))


def cost_line(count: int, seconds_each: float) -> str:
    total = count * seconds_each
    when = f"{total / 60:.1f} min" if total >= 60 else f"{total:.0f} s"
    return (f"calibration: {count} scored removals x {seconds_each:.2f} s each (measured on full depth) = about {when}; "
            f"fewer with --steps (steps=)")


# ------------------------------------------------------------------ greedy nested removal


def _rank(score: Score, higher: bool) -> tuple[float, float]:
    """Sort key, best first: the signal, then the lower KL (ties are common on few tokens)."""
    kl = score.kl if not math.isnan(score.kl) else 0.0
    return (-score.value if higher else score.value, kl)


def greedy_order(flex: Sequence[int], score: Callable[[tuple[int, ...]], Score], *, higher: bool, steps: int,
                 progress: Progress | None = None, should_stop: ShouldStop | None = None,
                 another_step: Callable[[int, int], bool] | None = None,
                 ) -> tuple[tuple[int, ...], dict[int, Score], list[Score]]:
    """Greedy nested removal over `flex`: (order, single-drop scores, score after each of the `steps` removals).

    The layers left after `steps` follow in the order of their single-drop scores (least harmful first).
    should_stop(): checked before every scored removal; True raises Stopped there.
    another_step(k, passes done): asked before each greedy step after the first; False ends the greedy part there
    (a time budget), the rest following by single-drop score as after `steps`."""
    steps = max(1, min(steps, len(flex)))
    total = removals(len(flex), steps)
    done, removed, curve = 0, [], []
    single: dict[int, Score] = {}
    for k in range(steps):
        if k and another_step is not None and not another_step(k, done):
            break
        scores = {}
        for layer in (x for x in flex if x not in removed):
            stop_if(should_stop)
            scores[layer] = score((*removed, layer))
            done += 1
            if progress:
                progress(done, total, f"step {k + 1}/{steps}: without layer {layer}")
        if k == 0:
            single = scores
        best = min(scores, key=lambda layer: (*_rank(scores[layer], higher), layer))
        removed.append(best)
        curve.append(scores[best])
    rest = sorted((x for x in flex if x not in removed), key=lambda layer: (*_rank(single[layer], higher), layer))
    return (*removed, *rest), single, curve


# ------------------------------------------------------------------ the three signals


def _own_answers(engine: Any, cal_set: CalibrationSet, tokens: int,
                 should_stop: ShouldStop | None = None) -> TeacherForced | Batches:
    """Full depth's own greedy answers to the set's prompts (a task's up to the end of its reply), teacher-forced:
    a task set's questions one batch per task (`Batches`: each task's shots run once)."""
    # A TeacherForced runs its prompts' pass as it is made: under the engine's lock, like every pass on a shared
    # model (another session's recording hooks are on the same layers while its step runs).
    if cal_set.tasks:
        answered = _task_answers(engine, cal_set, tokens, should_stop)
        with engine.lock:
            return Batches(tuple(_forced(engine.adapter, prompts, answers) for prompts, answers in answered))
    ids = [engine.encode([p], cal_set.chat_template)[0][0].tolist() for p in cal_set.prompts]  # the engine's own tokens
    traces = engine.generate_batch(ids, FullConfig(), GenerationConfig(max_new_tokens=tokens), TRACE_OFF,
                                   should_stop=should_stop)
    stop_if(should_stop)  # stopped within the answers: nothing to score
    with engine.lock:
        return _forced(engine.adapter, ids, [[s.token_id for s in trace.steps] for trace in traces])


def _forced(adapter: Any, prompts: list[list[int]], answers: list[list[int]]) -> TeacherForced:
    """Position t (fed answer[t]) predicts answer[t + 1]; answer[0] comes from the prompt at full depth."""
    return TeacherForced(adapter, prompts, [a[:-1] for a in answers], [a[1:] for a in answers])


def _by_task(cal_set: CalibrationSet) -> list[tuple[Any, list[Any]]]:
    """The set's validation questions grouped by task, in the set's order: (task, its examples)."""
    groups: dict[str, tuple[Any, list[Any]]] = {}
    for task, ex in task_prompts(cal_set):
        groups.setdefault(task.name, (task, []))[1].append(ex)
    return list(groups.values())


def _task_answers(engine: Any, cal_set: CalibrationSet, tokens: int,
                  should_stop: ShouldStop | None = None) -> list[tuple[list[list[int]], list[list[int]]]]:
    """Per task, (prompt ids, reply ids) of the set's questions answered at full depth, each reply up to its end
    (at most `tokens`), the shots prefilled once per batch and finished replies leaving it
    (`d3.research.answers`); a reply of one token has nothing to teacher-force and is left out."""
    from d3.research.answers import PrefilledQuestions

    out = []
    for task, examples in _by_task(cal_set):
        stop_if(should_stop)
        replies = PrefilledQuestions(engine, task, examples, batch=64).answer(FullConfig()).ids
        kept = [(ex, list(reply[:tokens])) for ex, reply in zip(examples, replies) if len(reply) >= 2]
        if kept:
            out.append(([engine.encode([task.prompt(ex)], False)[0][0].tolist() for ex, _ in kept],
                        [reply for _, reply in kept]))
    if not out:
        raise ValueError("every reply to the calibration questions is one token: nothing to teacher-force")
    return out


def _prose(engine: Any, cal_set: CalibrationSet, tokens: int, prefix: int = 32) -> TeacherForced:
    """The text cut into windows of `prefix` prompt tokens (full depth) and `tokens` continuation tokens."""
    ids = engine.tokenizer(cal_set.text, add_special_tokens=False)["input_ids"]
    width = prefix + tokens + 1
    windows = [ids[i:i + width] for i in range(0, len(ids) - prefix - 2, width)]
    windows = [w for w in windows if len(w) > prefix + 2]
    if not windows:
        raise ValueError(f"the text is {len(ids)} tokens; perplexity needs more than {prefix + 2}")
    return TeacherForced(engine.adapter, [w[:prefix] for w in windows], [w[prefix:-1] for w in windows],
                         [w[prefix + 1:] for w in windows])


def _task_score(engine: Any, cal_set: CalibrationSet) -> Callable[[tuple[int, ...]], Score]:
    """Exact match on the validation questions, answered greedily with the removal fixed after the first token
    (the questions' full-depth prefill computed once, `d3.research.answers`)."""
    from d3.research.answers import PrefilledQuestions

    prefilled = [PrefilledQuestions(engine, task, examples) for task, examples in _by_task(cal_set)]

    def score(removed: tuple[int, ...]) -> Score:
        answers = [q.answer(StaticSkipConfig(skip=tuple(removed))) for q in prefilled]
        return Score(sum(sum(a.correct) for a in answers) / sum(len(a.correct) for a in answers))

    return score


def scorer(engine: Any, signal: str, cal_set: CalibrationSet, tokens: int,
           should_stop: ShouldStop | None = None) -> Callable[[tuple[int, ...]], Score]:
    """removal -> Score for this signal on this set (everything shared by the removals is computed here, once)."""
    if signal not in SIGNALS:
        raise ValueError(f"signal={signal!r} is not allowed: signal must be one of {', '.join(SIGNALS)}")
    if signal == "task":
        if not cal_set.tasks:
            raise ValueError("the task signal needs a generation task (--task NAME): it scores exact match on its "
                             "validation split")
        return _task_score(engine, cal_set)
    if signal == "perplexity":
        if not cal_set.text:
            raise ValueError("the perplexity signal reads prose: give a text file (--text FILE) or none for the shipped one")
        with engine.lock:
            tf = _prose(engine, cal_set, tokens)
        return _locked(engine, lambda removed: _as_perplexity(tf.score(removed, "nll")))
    tf = _own_answers(engine, cal_set, tokens, should_stop)
    return _locked(engine, lambda removed: tf.score(removed, "agreement"))


def _locked(engine: Any, score: Callable[[tuple[int, ...]], Score]) -> Callable[[tuple[int, ...]], Score]:
    """Each pass holds the engine's lock, so a shared model interleaves calibration with other users' steps."""
    def run(removed: tuple[int, ...]) -> Score:
        with engine.lock:
            return score(removed)
    return run


def _as_perplexity(score: Score) -> Score:
    return Score(math.exp(score.value), score.kl)


# ------------------------------------------------------------------ calibrate, cache, resolve


def calibrate(engine: Any, signal: str, cal_set: CalibrationSet | None = None, *, core: tuple[int, int] | None = None,
              steps: int | None = None, tokens: int = TOKENS.default, progress: Progress | None = None,
              use_cache: bool = True, announce: Announce | None = announce_to_stderr) -> Calibration:
    """Measure the greedy nested drop order of `engine`'s model under `signal` on `cal_set` (default: the signal's
    own set), cached per (model, signal, set, core, tokens, steps) in the model cache folder.

    steps: greedy removals (default: every flex layer); the rest follow by single-drop score.
    announce: told one line of the cost (removals x the measured time of one pass) before the removals start."""
    cal_set = cal_set or default_set(signal)
    L = engine.num_layers
    head, tail = core if core is not None else D3Config().core(L)
    D3Config(core_head=head, core_tail=tail).check_layers(L)
    flex = list(range(head, L - tail))
    if not flex:
        raise ValueError(f"core {head}+{tail} leaves no flex layer of {L} to order")
    steps = len(flex) if steps is None else steps
    if not (isinstance(steps, int) and 1 <= steps):
        raise ValueError(f"steps={steps!r} is not allowed: steps must be an integer >= 1 (greedy removals)")
    steps = min(steps, len(flex))
    TOKENS.check("tokens", tokens)
    path = calibration_path(engine.name, signal, cal_set.name, (head, tail), tokens, steps)
    if use_cache and path.is_file():
        try:
            return read_calibration(path)
        except ValueError as err:
            log.warning("measuring again: %s", err)
    result, _ = _measure(engine, signal, cal_set, (head, tail), steps, tokens, progress, {}, announce)
    _write(path, result)
    return result


def calibrate_and_compare(engine: Any, signal: str, cal_set: CalibrationSet, orders: dict[str, Sequence[int]], *,
                          core: tuple[int, int], steps: int, tokens: int = TOKENS.default, progress: Progress | None = None,
                          should_stop: ShouldStop | None = None,
                          budget_s: float | None = None) -> tuple[Calibration, dict[str, list[float]]]:
    """`calibrate` (not cached: the page's one prompt) plus, for each named order, the signal after dropping its
    first 1 .. steps layers (the removal curve of the order in use, beside the calibrated one).

    should_stop(): checked between every two passes; True raises `d3.research.Stopped` (a time limit, a caller
    gone): the measurement stops within one pass.
    budget_s: seconds the whole measurement may take; fewer greedy steps (at least one) where the next would not fit
    at the mean cost of the passes so far (a 28-layer 1.5B model on a CPU: ~150 passes of 1-2 s for 8 steps). The
    result's `steps` says how many ran."""
    L = engine.num_layers
    D3Config(core_head=core[0], core_tail=core[1]).check_layers(L)
    steps = max(1, min(steps, L - sum(core)))
    return _measure(engine, signal, cal_set, core, steps, tokens, progress, orders, should_stop=should_stop,
                    budget_s=budget_s)


def _within(budget_s: float | None, t0: float, flex: int,
            orders: dict[str, Sequence[int]]) -> Callable[[int, int], bool] | None:
    """another_step for `greedy_order`: whether greedy step k, and then the compared orders' first k + 1 layers, still
    fit in `budget_s` from `t0`, at the mean cost of the passes scored so far (what a pass costs varies with the
    layers it drops and with the machine's load: measured as it goes, not once beforehand)."""
    if budget_s is None:
        return None
    started = time.perf_counter()

    def another_step(k: int, done: int) -> bool:
        now = time.perf_counter()
        each = (now - started) / max(done, 1)
        passes = (flex - k) + sum(min(k + 1, len(o)) for o in orders.values())
        return (now - t0) + passes * each <= budget_s

    return another_step


def _measure(engine: Any, signal: str, cal_set: CalibrationSet, core: tuple[int, int], steps: int, tokens: int,
             progress: Progress | None, orders: dict[str, Sequence[int]],
             announce: Announce | None = None, should_stop: ShouldStop | None = None,
             budget_s: float | None = None) -> tuple[Calibration, dict[str, list[float]]]:
    t0 = time.perf_counter()
    head, tail = core
    flex = list(range(head, engine.num_layers - tail))
    score = scorer(engine, signal, cal_set, tokens, should_stop)
    stop_if(should_stop)
    t_full = time.perf_counter()
    full = score(())
    if announce is not None:  # one removal costs about what full depth's pass did
        count = removals(len(flex), steps) + sum(min(steps, len(o)) for o in orders.values())
        announce(cost_line(count, time.perf_counter() - t_full))
    order, single, curve = greedy_order(flex, score, higher=HIGHER_IS_BETTER[signal], steps=steps, progress=progress,
                                        should_stop=should_stop, another_step=_within(budget_s, t0, len(flex), orders))
    steps = len(curve)  # fewer than asked where the budget ended the greedy part

    def stopping(removed: tuple[int, ...]) -> float:
        stop_if(should_stop)
        return round(score(removed).value, 6)

    compared = {name: [stopping(tuple(o[:k])) for k in range(1, min(steps, len(o)) + 1)] for name, o in orders.items()}
    result = Calibration(
        model=engine.name, num_layers=engine.num_layers, signal=signal, calibration_set=cal_set.name, core=core,
        order=order, single={k: round(v.value, 6) for k, v in single.items()}, curve=tuple(round(s.value, 6) for s in curve),
        full=round(full.value, 6), single_kl={k: round(v.kl, 6) for k, v in single.items() if not math.isnan(v.kl)},
        curve_kl=tuple(round(s.kl, 6) for s in curve if not math.isnan(s.kl)), tokens=tokens, steps=steps,
        seconds=round(time.perf_counter() - t0, 2))
    return result, compared


def _write(path: Path, result: Calibration) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")  # processes of one run may write it at once
    tmp.write_text(json.dumps(result.to_dict(), indent=1), encoding="utf-8")
    tmp.replace(path)
