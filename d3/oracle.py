"""The oracle: the fewest of D3's layers each generated token needs to keep full depth's top-1 (teacher-forced).

For generated token i, every earlier position is at full depth (so the KV cache is exact) and only token i's
own forward pass runs D3's layer set for a budget n (`d3.schedule.d3_layers`: the same sets D3 runs, for the
same drop order and core). Its need is the smallest n from the core floor up whose top-1 equals full depth's.

Cost: one full-depth pass over prompt + answer gives the cache and the residual stream at every layer. A
budget's layers below its first dropped layer all run, so token i's residual there equals full depth's: the
step starts from the recorded residual at that layer, not from the embedding. This holds for any layer set
(nested or strided); the cache is cut per position from the full pass's keys and values, never recomputed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import torch
from transformers.cache_utils import DynamicCache

from d3.adapter import Adapter
from d3.config import TRACE_OFF, D3Config, FullConfig, GenerationConfig
from d3.engine import Engine
from d3.oracle_fit import fit_alpha, judge, position_summary, prediction_depth, underserved_fraction
from d3.schedule import d3_layers, plan


@dataclass(frozen=True, eq=False)
class FullPass:
    """One full-depth pass over the prompt and the answer (all but its last token), kept for the oracle.

    kv: per layer (keys, values), each [1, kv_heads, seq, head_dim] for positions 0 .. seq - 1.
    resid: [L + 1, T, d_model], the residual stream entering layer l at each query (row L: the last layer's out).
    logprobs: float32 [T, vocab], full depth's next-token log-probs at each query.
    Query i (predicting answer token i) sits at position prompt_len - 1 + i.
    """

    prompt_len: int
    answer: tuple[int, ...]
    kv: list[tuple[torch.Tensor, torch.Tensor]]
    resid: torch.Tensor
    logprobs: torch.Tensor

    @property
    def steps(self) -> int:
        return len(self.answer)

    @property
    def top1(self) -> list[int]:
        return self.logprobs.argmax(-1).tolist()

    def query(self, i: int) -> int:
        return self.prompt_len - 1 + i


def _check_window(adapter: Adapter, seq_len: int) -> None:
    """Cutting a sliding-window cache back is only exact while it holds every position (Gemma 3: 512)."""
    window = getattr(adapter.config, "sliding_window", None)
    if window and "sliding_attention" in adapter.layer_types and seq_len >= window - 1:
        raise ValueError(f"prompt + answer is {seq_len} tokens; the oracle needs fewer than {window - 1} on this model "
                         "(its sliding-window cache cannot be cut back beyond its window)")


def full_pass(adapter: Adapter, prompt_ids: Sequence[int], answer: Sequence[int]) -> FullPass:
    """Run prompt + answer[:-1] through every layer once, as `prefill` does, recording what the oracle reuses."""
    if not prompt_ids or not answer:
        raise ValueError("the oracle needs a non-empty prompt and a non-empty answer")
    ids = torch.tensor([list(prompt_ids) + list(answer[:-1])], device=adapter.model.device)  # [1, seq]
    _check_window(adapter, ids.shape[1] + 1)
    start = len(prompt_ids) - 1  # the first query: the last prompt position
    cache = DynamicCache(config=adapter.config)
    positions = torch.arange(ids.shape[1], device=ids.device)[None]  # [1, seq]
    hidden = adapter.embed(ids)  # [1, seq, d_model]
    masks = adapter.masks(hidden, torch.ones_like(ids), cache, positions)
    ropes = adapter.rope(hidden, positions)
    resid = [hidden[0, start:]]
    for idx in range(adapter.num_layers):
        kind = adapter.layer_types[idx]
        hidden = adapter.run_layer(idx, hidden, masks[kind], ropes[kind], cache, positions)
        resid.append(hidden[0, start:])
    logprobs = torch.log_softmax(adapter.logits(hidden[0, start:]), dim=-1)  # [T, vocab]
    kv = [(layer.keys, layer.values) for layer in cache.layers]
    return FullPass(len(prompt_ids), tuple(answer), kv, torch.stack(resid), logprobs)


@dataclass
class _Query:
    """What every budget of one query shares: the exact cache before it, and its masks and rotary embedding."""

    i: int
    cache: DynamicCache
    positions: torch.Tensor  # [1, 1]
    masks: dict[str, Any]
    ropes: dict[str, Any]


def _query(adapter: Adapter, fp: FullPass, i: int) -> _Query:
    q = fp.query(i)
    past = [(k[..., :q, :], v[..., :q, :]) for k, v in fp.kv] if q > 0 else None
    cache = DynamicCache(past, config=adapter.config)
    positions = torch.tensor([[q]], device=fp.resid.device)
    hidden = fp.resid[0, i][None, None]  # [1, 1, d_model]
    mask = torch.ones(1, q + 1, dtype=torch.long, device=hidden.device)
    return _Query(i, cache, positions, adapter.masks(hidden, mask, cache, positions), adapter.rope(hidden, positions))


def budget_logits(adapter: Adapter, fp: FullPass, query: _Query, layers: Sequence[int]) -> torch.Tensor:
    """Query i's next-token logits [vocab] when it runs only `layers` (earlier positions at full depth).

    Starts from full depth's residual at the first layer not in `layers`: every layer below it ran, on the same
    input and the same cache, so that residual is what the step would have computed. The cache is left as it was.
    """
    run = set(layers)
    first_dropped = next((idx for idx in range(adapter.num_layers) if idx not in run), adapter.num_layers)
    if first_dropped == adapter.num_layers:
        return fp.logprobs[query.i]  # full depth: log-probs have the logits' argmax and KL 0 to themselves
    hidden = fp.resid[first_dropped, query.i][None, None]  # [1, 1, d_model]
    ran = []
    for idx in sorted(run):
        if idx < first_dropped:
            continue
        kind = adapter.layer_types[idx]
        hidden = adapter.run_layer(idx, hidden, query.masks[kind], query.ropes[kind], query.cache, query.positions)
        ran.append(idx)
    for idx in ran:  # each layer that ran appended this query's key/value: take it back out
        query.cache.layers[idx].crop(-1)
    return adapter.logits(hidden[:, -1])[0]


def need_and_stable(keeps: Callable[[int], bool], floor: int, num_layers: int) -> tuple[int, int]:
    """(need, stable) for one token, where keeps(n) says whether budget n keeps full depth's top-1.

    need: the smallest budget that keeps it (scanning up from the floor). stable: the smallest budget from which
    every larger budget keeps it (scanning down from L - 1); need <= stable, and they differ where a small
    budget happens to hit the right token while some larger one misses. Budget L always keeps it.
    """
    need = next((n for n in range(floor, num_layers) if keeps(n)), num_layers)
    stable = next((n + 1 for n in range(num_layers - 1, need - 1, -1) if not keeps(n)), need)
    return need, stable


@dataclass(frozen=True)
class Depths:
    """Per answer token: `need` (the oracle depth) and `stable` (see `need_and_stable`), ints in [floor, L]."""

    need: list[int]
    stable: list[int]


def oracle_depths(adapter: Adapter, fp: FullPass, cfg: D3Config) -> Depths:
    """Per answer token, the budgets (core floor .. L) whose D3 layer set keeps full depth's top-1."""
    num_layers = adapter.num_layers
    floor = max(1, sum(cfg.core(num_layers)))
    top1 = fp.top1
    need, stable = [], []
    with torch.inference_mode():
        for i in range(fp.steps):
            query = _query(adapter, fp, i)

            def keeps(n: int) -> bool:
                return int(budget_logits(adapter, fp, query, d3_layers(cfg, num_layers, n)).argmax()) == top1[i]

            a, b = need_and_stable(keeps, floor, num_layers)
            need.append(a)
            stable.append(b)
    return Depths(need, stable)


def kl_at_budget(adapter: Adapter, fp: FullPass, cfg: D3Config) -> list[float]:
    """Per answer token, KL(full depth || D3's own budget for that step under `cfg`) of the next-token distribution."""
    out = []
    with torch.inference_mode():
        for i in range(fp.steps):
            layers = plan(cfg, adapter.num_layers, i).run
            logp = torch.log_softmax(budget_logits(adapter, fp, _query(adapter, fp, i), layers).float(), dim=-1)
            full = fp.logprobs[i]
            out.append(max(0.0, float((full.exp() * (full - logp)).sum())))
    return out


def lens_top1(adapter: Adapter, fp: FullPass) -> np.ndarray:
    """int [L + 1, T]: the logit lens's top-1 (final norm + LM head) after 0 .. L layers at each query."""
    with torch.inference_mode():
        return np.stack([adapter.logits(fp.resid[k]).argmax(-1).cpu().numpy() for k in range(adapter.num_layers + 1)])


@dataclass
class Answer:
    """One prompt's full-depth answer and its oracle: JSON-ready lists plus the full pass for later KL passes."""

    prompt: str
    prompt_ids: list[int]
    fp: FullPass
    texts: list[str]
    oracle_depth: list[int] = field(default_factory=list)
    stable_depth: list[int] = field(default_factory=list)
    prediction_depth: list[int] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)

    def to_dict(self, title: str = "") -> dict[str, Any]:
        return {"title": title, "prompt": self.prompt, "prompt_tokens": len(self.prompt_ids),
                "answer_ids": list(self.fp.answer), "answer_tokens": self.texts,
                "full_top1_matches_answer": float(np.mean(np.array(self.fp.top1) == np.array(self.fp.answer))),
                "oracle_depth": self.oracle_depth, "stable_depth": self.stable_depth, "prediction_depth": self.prediction_depth,
                "seconds": {k: round(v, 3) for k, v in self.seconds.items()}}


def measure(engine: Engine, prompt: str, cfg: D3Config, max_new_tokens: int = 64, *, chat_template: bool = True) -> Answer:
    """Generate the full-depth greedy answer, then the oracle depth and prediction depth of each of its tokens."""
    cfg.check_layers(engine.num_layers)
    t0 = time.perf_counter()
    gen = GenerationConfig(max_new_tokens=max_new_tokens)
    trace = engine.generate(prompt, FullConfig(), gen, TRACE_OFF, chat_template=chat_template)
    prompt_ids = engine.encode([prompt], chat_template)[0][0].tolist()
    t1 = time.perf_counter()
    with torch.inference_mode():
        fp = full_pass(engine.adapter, prompt_ids, trace.token_ids)
    t2 = time.perf_counter()
    answer = Answer(prompt, prompt_ids, fp, [s.text for s in trace.steps])
    depths = oracle_depths(engine.adapter, fp, cfg)
    answer.oracle_depth, answer.stable_depth = depths.need, depths.stable
    t3 = time.perf_counter()
    answer.prediction_depth = prediction_depth(lens_top1(engine.adapter, fp), np.array(fp.top1)).tolist()
    t4 = time.perf_counter()
    answer.seconds = {"generate": t1 - t0, "full_pass": t2 - t1, "oracle": t3 - t2, "lens": t4 - t3, "total": t4 - t0}
    return answer


def _per_prompt(values: list[list[Any]]) -> list[Any]:
    """One prompt: its list as it is; several: a list per prompt."""
    return values[0] if len(values) == 1 else values


def study(engine: Engine, prompts: Sequence[tuple[str, str]], cfg: D3Config, max_new_tokens: int = 64, *,
          chat_template: bool = True, alpha: float | None = None, k: float = 0.10,
          report_at: Sequence[D3Config] = (), log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The oracle on (title, prompt) pairs, the decay fitted to all their needs, and D3 judged against them.

    The schedule judged (under-served fraction, KL at its budget) is `cfg` with `alpha` when given, else the
    least-squares fit's alpha and start. `report_at`: further D3 settings whose under-served fraction is listed.
    """
    t0 = time.perf_counter()
    answers = []
    for n, (title, prompt) in enumerate(prompts):
        answers.append(measure(engine, prompt, cfg, max_new_tokens, chat_template=chat_template))
        if log:
            log(f"[{n + 1}/{len(prompts)}] {title or prompt[:40]!r}: {len(answers[-1].oracle_depth)} tokens in "
                f"{answers[-1].seconds['total']:.1f} s")
    L = engine.num_layers
    needs = [a.oracle_depth for a in answers]
    fits = fit_alpha(needs, L, core=cfg.core(L), k=k)
    judged = cfg.with_(alpha=alpha) if alpha is not None else fits["least_squares"].config(cfg)
    kl = [kl_at_budget(engine.adapter, a.fp, judged) for a in answers]
    return {
        "model": engine.name, "num_layers": L, "core": list(cfg.core(L)), "drop_order": cfg.drop_order,
        "max_new_tokens": max_new_tokens, "chat_template": chat_template and engine.has_chat_template,
        "oracle_depth": _per_prompt(needs), "stable_depth": _per_prompt([a.stable_depth for a in answers]),
        "prediction_depth": _per_prompt([a.prediction_depth for a in answers]),
        "alpha_fit": {name: f.to_dict() for name, f in fits.items()}, "k": k,
        "alpha": judged.alpha, "start": judged.start,
        "alpha_source": "--alpha" if alpha is not None else "least_squares fit",
        "underserved_fraction": underserved_fraction(needs, judged, L),
        "kl_at_budget": _per_prompt([[round(x, 5) for x in row] for row in kl]),
        "underserved_at": [judge(needs, c, L) for c in report_at],
        "summary": {"oracle_depth": position_summary(needs, L),
                    "stable_depth": position_summary([a.stable_depth for a in answers], L),
                    "fits_stable_depth": {n: f.to_dict() for n, f in fit_alpha([a.stable_depth for a in answers], L,
                                                                               core=cfg.core(L), k=k).items()}},
        "prompts": [a.to_dict(title) for a, (title, _) in zip(answers, prompts)],
        "seconds": round(time.perf_counter() - t0, 2),
    }
