"""Quality against full depth: token agreement, KL teacher-forced and free-running, filled-KV error, perplexity."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from d3.config import TRACE_OFF, FullConfig, GenerationConfig, StrategyConfig, TraceConfig
from d3.decoder import DecodeState, StepOutput
from d3.engine import Engine
from d3.trace import RAN, Comparison, Speedup, Trace, measured_speedup, token_agreement  # noqa: F401


@dataclass
class Recorded:
    """A run's trace plus what only the comparison needs: per-step log-probs and the final KV cache."""

    trace: Trace | None = None
    logprobs: list[torch.Tensor] = field(default_factory=list)  # each float32 CPU [vocab]
    state: DecodeState | None = None

    def observe(self, step: int, out: StepOutput, state: DecodeState) -> None:
        self.logprobs.append(torch.log_softmax(out.logits[0], dim=-1).cpu())
        self.state = state

    def stacked(self) -> torch.Tensor:
        return torch.stack(self.logprobs) if self.logprobs else torch.zeros(0, 0)  # [T, vocab]


def record(engine: Engine, prompt: str | Sequence[int], strategy: StrategyConfig, gen: GenerationConfig,
           trace: TraceConfig = TraceConfig(), **kwargs: Any) -> Iterator[tuple[Trace, Recorded]]:
    """Stream one prompt like `Engine.stream`, also recording log-probs and the cache for `compare`."""
    rec = Recorded()
    for t in engine.stream(prompt, strategy, gen, trace, observer=rec.observe, **kwargs):
        rec.trace = t
        yield t, rec


def run_recorded(engine: Engine, prompt: str | Sequence[int], strategy: StrategyConfig, gen: GenerationConfig,
                 trace: TraceConfig = TraceConfig(), **kwargs: Any) -> Recorded:
    rec = Recorded()
    for _, rec in record(engine, prompt, strategy, gen, trace, **kwargs):
        pass
    return rec


def kl_rows(p_log: torch.Tensor, q_log: torch.Tensor) -> np.ndarray:
    """KL(p || q) per row of two [T, vocab] log-prob tensors (over the shorter T): float [T]."""
    n = min(len(p_log), len(q_log))
    if n == 0:
        return np.zeros(0)
    p, q = p_log[:n], q_log[:n]
    kl = (p.exp() * (p - q)).sum(-1)
    return kl.clamp_min(0).numpy().astype(np.float64)


def kv_error(full: DecodeState, skip: DecodeState, steps: int) -> np.ndarray:
    """||kv_skip - kv_full|| / ||kv_full|| per generated step and layer: float [steps, L].

    Row i is the KV entry written while producing token i (row 0: the last prompt position, from the prefill).
    Both caches must hold the same tokens (teacher forcing). Rows outside a sliding window are NaN.
    """
    layers = len(full.cache.layers)
    out = np.full((steps, layers), np.nan)
    for idx in range(layers):
        a, b = full.cache.layers[idx], skip.cache.layers[idx]
        n = min(steps, a.keys.shape[-2], b.keys.shape[-2])
        if n == 0:
            continue
        ref = torch.cat([a.keys[..., -n:, :], a.values[..., -n:, :]], dim=-1)[0].float()  # [kv_heads, n, 2*hd]
        got = torch.cat([b.keys[..., -n:, :], b.values[..., -n:, :]], dim=-1)[0].float()
        err = (got - ref).norm(dim=(0, 2)) / ref.norm(dim=(0, 2)).clamp_min(1e-6)  # [n]
        out[steps - n:, idx] = err.cpu().numpy()
    return out


def _never() -> bool:
    return False


def compare(engine: Engine, prompt: str, strategy: StrategyConfig, gen: GenerationConfig = GenerationConfig(),
            trace: TraceConfig = TraceConfig(), *, chat_template: bool = True, full: Recorded | None = None,
            skip: Recorded | None = None, should_stop: Callable[[], bool] = _never) -> Comparison | None:
    """Measure a skipping strategy against full depth on one prompt (runs whatever was not passed in).

    should_stop(): checked before every decode step of the runs this makes (a Stop button, a closed tab); True ends
    them and the comparison is None. The measured speedup is `Comparison.speedup`."""
    kw: dict[str, Any] = dict(chat_template=chat_template, should_stop=should_stop)
    full = full or run_recorded(engine, prompt, FullConfig(), gen, trace, **kw)
    skip = skip or run_recorded(engine, prompt, strategy, gen, trace, **kw)
    if should_stop():
        return None
    assert full.trace is not None and skip.trace is not None
    teacher = run_recorded(engine, prompt, strategy, gen, TRACE_OFF, forced=[full.trace.token_ids], **kw)
    free_ref = engine.full_depth_logprobs(prompt, skip.trace.token_ids, chat_template=chat_template,
                                          should_stop=should_stop)
    if free_ref is None:
        return None
    free_ref = free_ref.cpu()
    n = token_agreement(full.trace.token_ids, skip.trace.token_ids).compared
    agree = np.array(full.trace.token_ids[:n]) == np.array(skip.trace.token_ids[:n])  # bool [n], per position
    steps = len(teacher.logprobs)
    teacher_grid = teacher.trace.grid() if teacher.trace is not None else np.zeros((0, engine.num_layers), np.int8)
    return Comparison(
        full=full.trace,
        skip=skip.trace,
        agree=agree,
        kl_teacher=kl_rows(full.stacked(), teacher.stacked()),
        kl_free=kl_rows(free_ref, skip.stacked()),
        kv_error=kv_error(full.state, teacher.state, steps) if steps else np.zeros((0, engine.num_layers)),
        filled_mask=teacher_grid != RAN,
        teacher_grid=teacher_grid,
        full_logprob=free_ref.gather(1, torch.tensor(skip.trace.token_ids)[:, None])[:, 0].double().numpy()
        if len(skip.trace.token_ids) else np.zeros(0),
    )


def perplexity(engine: Engine, text: str | Sequence[int], strategy: StrategyConfig, *, prefix_tokens: int = 8,
               max_tokens: int = 256) -> float:
    """Perplexity of real text whose tokens after a full-depth prefix are read under the strategy's schedule.

    Position i after the prefix plays the role of generated token i (teacher forcing), so the schedule
    decays along the text exactly as it would along a generation.
    """
    ids = engine.tokenizer(text)["input_ids"] if isinstance(text, str) else list(text)
    ids = ids[: prefix_tokens + max_tokens]
    if len(ids) <= prefix_tokens:
        raise ValueError(f"text has {len(ids)} tokens; perplexity needs more than prefix_tokens={prefix_tokens}")
    forced = ids[prefix_tokens:]
    gen = GenerationConfig(max_new_tokens=min(len(forced), 1024), stop_at_eos=False)
    traces = engine.generate_batch([ids[:prefix_tokens]], strategy, gen, TRACE_OFF, forced=[forced])
    nll = -np.array([s.logprob for s in traces[0].steps])
    return float(np.exp(nll.mean()))


@dataclass(frozen=True)
class DtypeGap:
    """How far a lower-precision copy of a model is from the float32 one on one prompt, both at full depth.

    token_agreement: share of the greedy tokens equal to float32's (free-running); first_divergence: where they first
    differ (None: nowhere). max_logit_diff / mean_logit_diff: |logits - float32 logits| over the vocabulary, under
    teacher forcing on float32's tokens (so every step compares the same context).
    """

    dtype: str
    tokens: int
    token_agreement: float
    first_divergence: int | None
    max_logit_diff: float
    mean_logit_diff: float

    def line(self) -> str:
        where = "nowhere" if self.first_divergence is None else f"at token {self.first_divergence}"
        return (f"{self.dtype} against float32 over {self.tokens} greedy tokens: {self.token_agreement:.0%} agree "
                f"(first difference {where}), max |logit difference| {self.max_logit_diff:.3g}, "
                f"mean {self.mean_logit_diff:.3g}")


def _logits_of(engine: Engine, prompt: str | Sequence[int], gen: GenerationConfig, **kwargs: Any) -> tuple[list[int], torch.Tensor]:
    logits: list[torch.Tensor] = []
    observe = lambda step, out, state: logits.append(out.logits[0].float().cpu())  # noqa: E731  [vocab]
    trace = None
    for trace in engine.stream(prompt, FullConfig(), gen, TRACE_OFF, observer=observe, **kwargs):
        pass
    assert trace is not None
    return list(trace.token_ids), torch.stack(logits)  # [T, vocab]


def dtype_gap(reference: Engine, other: Engine, prompt: str | Sequence[int],
              gen: GenerationConfig = GenerationConfig(max_new_tokens=32, stop_at_eos=False), *,
              chat_template: bool = True) -> DtypeGap:
    """`other` (the same model in bfloat16 / float16) measured against `reference` (float32) on `prompt`."""
    ref_tokens, ref_logits = _logits_of(reference, prompt, gen, chat_template=chat_template)
    own_tokens, _ = _logits_of(other, prompt, gen, chat_template=chat_template)
    _, forced = _logits_of(other, prompt, gen, chat_template=chat_template, forced=[ref_tokens])
    diff = (forced - ref_logits[:len(forced)]).abs()  # [T, vocab]
    agreement = token_agreement(ref_tokens, own_tokens)
    dtype = str(next(other.model.parameters()).dtype).removeprefix("torch.")
    return DtypeGap(dtype=dtype, tokens=agreement.compared, token_agreement=agreement.agreement,
                    first_divergence=agreement.first_divergence, max_logit_diff=float(diff.max()),
                    mean_logit_diff=float(diff.mean()))
