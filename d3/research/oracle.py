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

import contextlib
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from transformers.cache_utils import DynamicCache

from d3.adapter import Adapter
from d3.config import TRACE_OFF, D3Config, FullConfig, GenerationConfig
from d3.engine import Engine
from d3.research import ShouldStop, stop_if
from d3.research.oracle_fit import fit_alpha, judge, need_and_stable, position_summary, underserved_fraction
from d3.schedule import d3_layers, order_key, plan


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
        resid.append(hidden[0, start:].to(ids.device))  # layers may live on several devices: stacked on one
    logprobs = torch.log_softmax(adapter.logits(hidden[0, start:]), dim=-1)  # [T, vocab]
    kv = [(layer.keys, layer.values) for layer in cache.layers]
    return FullPass(len(prompt_ids), tuple(answer), kv, torch.stack(resid), logprobs)


class _ExactPast:
    """Full depth's keys and values before one query, shared by every row that runs a layer.

    `update` is the one cache method a decoder layer calls (Llama, Mistral, Qwen2/3 and Gemma 3 attention), so
    a layer can run on just the rows whose layer set holds it, each seeing the exact past plus its own key/value,
    without a cache copy per row or rolling anything back afterwards.
    """

    def __init__(self, kv: list[tuple[torch.Tensor, torch.Tensor]], q: int) -> None:
        self.kv, self.q = kv, q

    def update(self, keys: torch.Tensor, values: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        past_k, past_v = (t[..., : self.q, :].expand(keys.shape[0], -1, -1, -1) for t in self.kv[layer_idx])
        return torch.cat([past_k, keys], dim=-2), torch.cat([past_v, values], dim=-2)  # [rows, kv_heads, q + 1, hd]


def _rows(x: Any, sel: torch.Tensor, batch: int) -> Any:
    """Rows `sel` of a per-row tensor (mask, cos, sin); None and batch-1 broadcasts pass through."""
    return x[sel] if isinstance(x, torch.Tensor) and x.shape[0] == batch > 1 else x


def budget_logprobs(adapter: Adapter, fp: FullPass, i: int, layer_sets: Sequence[Sequence[int]]) -> torch.Tensor:
    """Query i's next-token log-probs [len(layer_sets), vocab]: one row per layer set, all in one batch.

    Earlier positions are at full depth (their exact keys and values from the full pass). A row passes the layers
    it skips unchanged, as D3's decode step does, and each layer runs only on the rows that hold it. Every row
    starts from full depth's residual at the lowest first-dropped layer of all rows: below its own first dropped
    layer a row runs every layer, on the same input and the same past as full depth did, so that residual is
    what it would compute.
    """
    L, rows = adapter.num_layers, len(layer_sets)
    runs = torch.tensor([[idx in set(layers) for idx in range(L)] for layers in layer_sets])  # bool [B, L]
    if runs.all():
        return fp.logprobs[i].expand(rows, -1)
    first = int((~runs).any(0).float().argmax())
    q = fp.query(i)
    device = fp.resid.device
    positions = torch.full((rows, 1), q, device=device)
    hidden = fp.resid[first, i].expand(rows, 1, -1).clone()  # [B, 1, d_model]
    # The library's masks need a real cache of the past's length; the layers themselves only read _ExactPast.
    sizing = DynamicCache([(k[..., :q, :], v[..., :q, :]) for k, v in fp.kv] if q else None, config=adapter.config)
    masks = adapter.masks(hidden, torch.ones(rows, q + 1, dtype=torch.long, device=device), sizing, positions)
    ropes = adapter.rope(hidden, positions)
    past = _ExactPast(fp.kv, q)
    for idx in range(first, L):
        sel = runs[:, idx].nonzero()[:, 0].to(device)
        if len(sel):
            kind = adapter.layer_types[idx]
            rope = tuple(_rows(t, sel, rows) for t in ropes[kind])
            out = adapter.run_layer(idx, hidden[sel], _rows(masks[kind], sel, rows), rope, past, positions[sel])
            hidden = hidden.index_copy(0, sel, out)
    return torch.log_softmax(adapter.logits(hidden[:, -1]), dim=-1)


@dataclass(frozen=True)
class BudgetScan:
    """Every budget n from the core floor to L, for every answer token: column n - floor of each array.

    keeps: bool [T, L - floor + 1], D3's layer set for n keeps full depth's top-1.
    kl: float [T, L - floor + 1], KL(full depth || budget n) of the next-token distribution.
    """

    cfg: D3Config
    floor: int
    keeps: np.ndarray
    kl: np.ndarray

    def depths(self) -> tuple[list[int], list[int]]:
        """(need, stable) per token: see `d3.research.oracle_fit.need_and_stable`."""
        pairs = [need_and_stable(row, self.floor) for row in self.keeps]
        return [a for a, _ in pairs], [b for _, b in pairs]

    def _columns(self, cfg: D3Config, num_layers: int) -> list[int]:
        """Per token, the column of D3's own budget for that step under `cfg` (same core and drop order)."""
        if cfg.core(num_layers) != self.cfg.core(num_layers) or order_key(cfg) != order_key(self.cfg):
            raise ValueError("the scan holds one core and drop order's layer sets; scan again for another")
        return [plan(cfg, num_layers, i).budget - self.floor for i in range(len(self.kl))]

    def kl_at(self, cfg: D3Config, num_layers: int) -> list[float]:
        """Per token, KL(full depth || D3 under `cfg`) of the next-token distribution, teacher-forced."""
        return [float(self.kl[i, j]) for i, j in enumerate(self._columns(cfg, num_layers))]

    def kept_at(self, cfg: D3Config, num_layers: int) -> list[bool]:
        """Per token, whether D3 under `cfg` keeps full depth's top-1 (teacher-forced). A token with need <= its
        budget can still lose it, where a budget between need and stable depth misses."""
        return [bool(self.keeps[i, j]) for i, j in enumerate(self._columns(cfg, num_layers))]


def scan_budgets(adapter: Adapter, fp: FullPass, cfg: D3Config, lock: AbstractContextManager[Any] | None = None,
                 should_stop: ShouldStop | None = None) -> BudgetScan:
    """Run every answer token at every D3 budget below L (one batch per token) against full depth.

    lock: held for each token's batch (the engine's lock, so a shared model interleaves with other users).
    should_stop(): checked before each token's batch; True raises Stopped there."""
    L = adapter.num_layers
    floor = max(1, sum(cfg.core(L)))
    sets = [d3_layers(cfg, L, n) for n in range(floor, L)]
    keeps = np.ones((fp.steps, L - floor + 1), dtype=bool)  # budget L is full depth: it keeps, with KL 0
    kl = np.zeros((fp.steps, L - floor + 1))
    top1 = fp.top1
    with torch.inference_mode():
        for i in range(fp.steps):
            stop_if(should_stop)
            with lock or contextlib.nullcontext():
                logp = budget_logprobs(adapter, fp, i, sets) if sets else fp.logprobs[i][None, :0]
            full = fp.logprobs[i]
            keeps[i, :-1] = (logp.argmax(-1) == top1[i]).cpu().numpy()
            kl[i, :-1] = (full.exp() * (full - logp)).sum(-1).clamp_min(0).cpu().numpy()
    return BudgetScan(cfg, floor, keeps, kl)


def lens_top1(adapter: Adapter, fp: FullPass) -> np.ndarray:
    """int [L + 1, T]: the logit lens's top-1 (final norm + LM head) after 0 .. L layers at each query."""
    with torch.inference_mode():
        return np.stack([adapter.logits(fp.resid[k]).argmax(-1).cpu().numpy() for k in range(adapter.num_layers + 1)])


def lens_depth(adapter: Adapter, fp: FullPass) -> list[int]:
    """`prediction_depth(lens_top1(...), top1)` read from the top down: a token leaves the LM-head calls at the
    first layer (going down) where the lens loses full depth's top-1, so most tokens cost a few calls, not L."""
    top1 = torch.tensor(fp.top1, device=fp.resid.device)
    depth = torch.zeros(fp.steps, dtype=torch.long)
    active = torch.arange(fp.steps, device=fp.resid.device)
    with torch.inference_mode():
        for k in range(adapter.num_layers - 1, -1, -1):
            lost = adapter.logits(fp.resid[k, active]).argmax(-1) != top1[active]
            depth[active[lost].cpu()] = k + 1
            active = active[~lost]
            if not len(active):
                break
    return depth.tolist()


@dataclass
class Answer:
    """One prompt's full-depth answer and its oracle: the full pass, the scan of every budget, JSON-ready lists."""

    prompt: str
    prompt_ids: list[int]
    fp: FullPass
    texts: list[str]
    scan: BudgetScan
    oracle_depth: list[int] = field(default_factory=list)
    stable_depth: list[int] = field(default_factory=list)
    prediction_depth: list[int] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)

    def to_dict(self, title: str = "") -> dict[str, Any]:
        return {"title": title, "prompt": self.prompt, "prompt_tokens": len(self.prompt_ids),
                "answer_ids": list(self.fp.answer), "answer_tokens": self.texts,
                "full_top1_matches_answer": float(np.mean(np.array(self.fp.top1) == np.array(self.fp.answer))),
                "oracle_depth": self.oracle_depth, "stable_depth": self.stable_depth, "prediction_depth": self.prediction_depth,
                "budgets": list(range(self.scan.floor, self.scan.floor + self.scan.keeps.shape[1])),
                "kept_by_token": ["".join("1" if k else "0" for k in row) for row in self.scan.keeps],
                "kept_by_budget": [round(float(x), 4) for x in self.scan.keeps.mean(0)],
                "mean_kl_by_budget": [round(float(x), 4) for x in self.scan.kl.mean(0)],
                "seconds": {k: round(v, 3) for k, v in self.seconds.items()}}


def measure(engine: Engine, prompt: str, cfg: D3Config, max_new_tokens: int = 64, *, chat_template: bool = True,
            should_stop: ShouldStop | None = None) -> Answer:
    """Generate the full-depth greedy answer, then scan every budget and the logit lens for each of its tokens.

    should_stop(): checked before every generated token, every token's scan and the lens; True raises
    `d3.research.Stopped` (a time limit, a caller gone): the measurement stops within one step."""
    cfg.check_layers(engine.num_layers)
    t0 = time.perf_counter()
    gen = GenerationConfig(max_new_tokens=max_new_tokens)
    trace = None
    for trace in engine.stream(prompt, FullConfig(), gen, TRACE_OFF, chat_template=chat_template,
                               should_stop=should_stop):
        pass
    stop_if(should_stop)  # stopped within the answer (or before it): nothing to scan
    assert trace is not None
    prompt_ids = engine.encode([prompt], chat_template)[0][0].tolist()
    t1 = time.perf_counter()
    with engine.lock, torch.inference_mode():
        fp = full_pass(engine.adapter, prompt_ids, trace.token_ids)
    t2 = time.perf_counter()
    scan = scan_budgets(engine.adapter, fp, cfg, engine.lock, should_stop)
    answer = Answer(prompt, prompt_ids, fp, [s.text for s in trace.steps], scan)
    answer.oracle_depth, answer.stable_depth = answer.scan.depths()
    stop_if(should_stop)
    t3 = time.perf_counter()
    with engine.lock:
        answer.prediction_depth = lens_depth(engine.adapter, fp)
    t4 = time.perf_counter()
    answer.seconds = {"generate": t1 - t0, "full_pass": t2 - t1, "oracle": t3 - t2, "lens": t4 - t3, "total": t4 - t0}
    return answer


def _lost(answers: Sequence[Answer], cfg: D3Config, num_layers: int) -> float:
    """The share of all answers' tokens whose top-1 D3 under `cfg` loses (teacher-forced)."""
    kept = [k for a in answers for k in a.scan.kept_at(cfg, num_layers)]
    return 1 - sum(kept) / len(kept)


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
    settings = [cfg.with_(alpha=c.alpha, start=c.start) for c in report_at]  # the scan's core and drop order
    kl = [a.scan.kl_at(judged, L) for a in answers]
    return {
        "model": engine.name, "num_layers": L, "core": list(cfg.core(L)), "drop_order": cfg.drop_order,
        "layer_order": list(cfg.layer_order) if isinstance(cfg.layer_order, tuple) else cfg.layer_order,
        "max_new_tokens": max_new_tokens, "chat_template": chat_template and engine.has_chat_template,
        "oracle_depth": _per_prompt(needs), "stable_depth": _per_prompt([a.stable_depth for a in answers]),
        "prediction_depth": _per_prompt([a.prediction_depth for a in answers]),
        "alpha_fit": {name: f.to_dict() for name, f in fits.items()}, "k": k,
        "alpha": judged.alpha, "start": judged.start,
        "alpha_source": "given" if alpha is not None else "least_squares fit",
        "underserved_fraction": underserved_fraction(needs, judged, L),
        "kl_at_budget": _per_prompt([[round(x, 5) for x in row] for row in kl]),
        "top1_lost_fraction": _lost(answers, judged, L),
        "underserved_at": [{**judge(needs, c, L), "top1_lost_fraction": _lost(answers, c, L)} for c in settings],
        "summary": {"oracle_depth": position_summary(needs, L),
                    "stable_depth": position_summary([a.stable_depth for a in answers], L),
                    "fits_stable_depth": {n: f.to_dict() for n, f in fit_alpha([a.stable_depth for a in answers], L,
                                                                               core=cfg.core(L), k=k).items()}},
        "prompts": [a.to_dict(title) for a, (title, _) in zip(answers, prompts)],
        "seconds": round(time.perf_counter() - t0, 2),
    }
