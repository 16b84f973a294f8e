"""The logit lens read out after a run: the layer outputs a trace kept (`TraceConfig(lens_states=True)`) go
through the final norm and LM head in a few batched calls, only when someone looks at the lens."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from d3.adapter import Adapter
from d3.pieces import piece_text
from d3.trace import Trace

ROWS_PER_CALL = 256  # (token, layer) rows per LM-head call: [256, vocab] float32 logits is 50 MB on SmolLM2


def lens_fields(tokenizer: Any, num_layers: int, layers_run: Sequence[int], top1: Sequence[int],
                prob: Sequence[float], rank: Sequence[int]) -> dict[str, tuple]:
    """TokenStep's lens fields from one reading per layer that ran: the lens's top-1 text, and the picked token's
    probability and rank ("", NaN and -1 where the layer did not run)."""
    by_layer = dict(zip(layers_run, zip(top1, prob, rank)))
    rows = [by_layer.get(layer) for layer in range(num_layers)]
    return {"logit_lens": tuple(piece_text(tokenizer, int(r[0])) if r else "" for r in rows),
            "lens_prob": tuple(float(r[1]) if r else float("nan") for r in rows),
            "lens_rank": tuple(int(r[2]) if r else -1 for r in rows)}


def read_logits(logits: torch.Tensor, tokens: torch.Tensor) -> tuple[list[int], list[float], list[int]]:
    """Per row of logits [rows, vocab] and its picked token [rows]: (top-1 id, p(token), rank of token)."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    picked = logprobs.gather(1, tokens[:, None])  # [rows, 1]
    return (logprobs.argmax(-1).tolist(), picked[:, 0].exp().tolist(), (logprobs > picked).sum(-1).tolist())


def has_lens_states(trace: Trace | None) -> bool:
    """True if `trace` kept the lens's inputs that have not been read out yet."""
    return trace is not None and bool(trace.steps) and all(s.lens_states is not None for s in trace.steps)


def read_lens(adapter: Adapter, tokenizer: Any, trace: Trace, rows_per_call: int = ROWS_PER_CALL) -> Trace:
    """`trace` with every step's lens read out from its kept layer outputs (and those dropped); unchanged if it
    kept none. The same numbers as recording the lens while generating, for a fraction of the LM-head time."""
    if not has_lens_states(trace):
        return trace
    states = np.concatenate([s.lens_states for s in trace.steps])  # [rows, d_model], rows = sum of layers run
    tokens = torch.tensor(np.repeat([s.token_id for s in trace.steps], [len(s.layers_run) for s in trace.steps]))
    device, dtype = adapter.model.lm_head.weight.device, adapter.model.lm_head.weight.dtype
    top1: list[int] = []
    prob: list[float] = []
    rank: list[int] = []
    with torch.inference_mode():
        for lo in range(0, len(states), rows_per_call):
            hidden = torch.from_numpy(states[lo:lo + rows_per_call]).to(device=device, dtype=dtype)
            t, p, r = read_logits(adapter.logits(hidden), tokens[lo:lo + rows_per_call].to(device))
            top1 += t
            prob += p
            rank += r
    steps, at = [], 0
    for s in trace.steps:
        n = len(s.layers_run)
        fields = lens_fields(tokenizer, trace.num_layers, s.layers_run, top1[at:at + n], prob[at:at + n],
                             rank[at:at + n])
        steps.append(replace(s, lens_states=None, **fields))
        at += n
    return trace.with_steps(steps)
