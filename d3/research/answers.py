"""Greedy answers to a task's questions under many strategies, sharing one full-depth prefill.

Every strategy runs the prompt's prefill at full depth, so when one batch of questions is answered under many
strategies (a calibration's candidate removals, a sweep of drop orders) the prefill, which costs more than the
answers on a few-shot prompt, is computed once and its state copied for each strategy. The decode loop is the
engine's (`d3.decoder.decode_one_token` through `d3.schedule.plan`), greedy, stopped once every reply has ended
(the blank line before the next question, or end of sequence), as `d3.research.sweep.generation.answer_batch` does.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from d3.config import TRACE_OFF, EarlyExitConfig, StrategyConfig
from d3.decoder import DecodeState, decode_one_token, shared_prefill
from d3.research.gentasks import STOP
from d3.schedule import plan


@dataclass(frozen=True)
class Answers:
    """One strategy on the questions: which are right, and the layers per generated token up to the replies' ends."""

    correct: tuple[bool, ...]
    mean_layers: float
    texts: tuple[str, ...]
    tokens: int = 0  # generated tokens up to the replies' ends, over which mean_layers is taken
    ids: tuple[tuple[int, ...], ...] = ()  # each reply's token ids up to its end (the end of sequence included)

    @property
    def accuracy(self) -> float:
        return sum(self.correct) / max(len(self.correct), 1)


class PrefilledQuestions:
    """A task's questions (each a `task.prompt(example)`, raw text), prefilled once in batches of `batch`."""

    def __init__(self, engine: Any, task: Any, examples: Sequence[Any], batch: int = 32, keep: bool = True) -> None:
        """keep: hold every batch's prefilled state (memory: the KV cache of every prompt); else hold only the
        shots' shared prefix and run each batch's questions on it again at every `answer` (a few tokens each)."""
        self.engine, self.task, self.examples = engine, task, list(examples)
        self.max_new_tokens = task.max_new_tokens
        self.keep = keep
        self._batches: list[tuple[list[Any], Any]] = []
        for i in range(0, len(self.examples), batch):
            part = self.examples[i:i + batch]
            ids, mask = engine.encode([task.prompt(ex) for ex in part], chat_template=False)
            self._batches.append((part, self._prefill(ids, mask) if keep else (ids, mask)))

    def _prefill(self, ids: torch.Tensor, mask: torch.Tensor) -> tuple[DecodeState, torch.Tensor]:
        with self.engine.lock, torch.inference_mode():
            state, out = shared_prefill(self.engine.adapter, ids, mask, room=self.max_new_tokens)
        return state, out.logits.argmax(-1)

    def answer(self, strategy: StrategyConfig) -> Answers:
        """Every question answered greedily under `strategy` (checked against the model first)."""
        strategy = self.engine.resolve(strategy)
        self.engine.check(strategy, TRACE_OFF)
        correct: list[bool] = []
        texts: list[str] = []
        replies: list[tuple[int, ...]] = []
        layers = tokens = 0
        for part, held in self._batches:
            state, first = copy.deepcopy(held) if self.keep else self._prefill(*held)
            rows, used, n = self._decode(state, first, strategy)
            layers, tokens = layers + used, tokens + n
            replies.extend(tuple(r) for r in rows)
            for ex, ids in zip(part, rows):
                text = self.engine.tokenizer.decode([t for t in ids if t not in self.engine.eos_ids])
                texts.append(text)
                correct.append(bool(self.task.score(ex, text)))
        return Answers(tuple(correct), layers / max(tokens, 1), tuple(texts), tokens, tuple(replies))

    def _decode(self, state: DecodeState, first: torch.Tensor, strategy: StrategyConfig) -> tuple[list[list[int]], int, int]:
        """(each row's ids up to its reply's end, layers summed over those tokens, those tokens).

        A finished reply leaves the batch (its rows of the cache too), so a batch costs what its replies still
        write, not its longest reply times its size; rows are independent, so the answers are the same. Early exit
        keeps every row: its exit is decided over the batch."""
        eng = self.engine
        rows: list[list[int]] = [[int(t)] for t in first.tolist()]
        live = [k for k, r in enumerate(rows) if not self._ended(r)]  # rows of the batch still writing
        layers, tokens = eng.num_layers * len(rows), len(rows)  # token 0 comes from the prefill, at full depth
        early = strategy if isinstance(strategy, EarlyExitConfig) else None
        if early is None and len(live) < len(rows):
            state.keep(torch.tensor(live, dtype=torch.long))
        last = first[live] if early is None else first
        for step in range(1, self.max_new_tokens):
            if not live:
                break
            layer_plan = plan(strategy, eng.num_layers, step)
            with eng.lock, torch.inference_mode():
                out = decode_one_token(eng.adapter, state, last, layer_plan, strategy.fill, early_exit=early)
            last = out.logits.argmax(-1)  # [live rows] (every row under early exit)
            picked = last.tolist() if early is None else [last[k].item() for k in live]
            still = []
            for j, (k, token) in enumerate(zip(live, picked)):
                rows[k].append(token)
                layers, tokens = layers + len(out.layers_run), tokens + 1
                if not self._ended(rows[k]):
                    still.append(j)
            if early is None and still and len(still) < len(live):
                state.keep(torch.tensor(still, dtype=torch.long))
                last = last[still]
            live = [live[j] for j in still]
        return rows, layers, tokens

    def _ended(self, ids: list[int]) -> bool:
        """The reply is complete: an end-of-sequence token, or its text reached the blank line."""
        return bool(ids) and (ids[-1] in self.engine.eos_ids or STOP in self.engine.tokenizer.decode(ids))
