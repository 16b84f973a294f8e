"""The teacher-forced parallel pass behind the calibration's `agreement` and `perplexity` signals.

For a fixed removal S, D3's decode equals one parallel pass over the generated tokens: no token after the prompt
runs a layer of S, so no filled entry is read. A generated position's residual below S's lowest layer is full
depth's, so the pass starts there from the residuals of one full-depth pass (as the oracle does), and every kept
layer above runs on all generated positions at once, reading the prompt's exact keys and values.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers.cache_utils import DynamicCache

from d3.adapter import Adapter
from d3.decoder import shared_prefill
from d3.schedule import fill_plan, plan

CHUNK_ELEMENTS = 1 << 26  # log-probs read out at once: 256 MiB of float32 (256 positions of Gemma 3's vocabulary)
KEPT_REFERENCE_ELEMENTS = 1 << 27  # full depth's log-probs are kept up to 512 MiB, else read out again per score


@dataclass(frozen=True)
class Score:
    """A removal's signal value and, where the signal has one, the mean KL(full depth || removal)."""

    value: float
    kl: float = float("nan")


def _keys_values(cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each layer's (keys, values) of a filled cache (every layer of these models holds both)."""
    return [(layer.keys, layer.values) for layer in cache.layers]


class _PromptPast:
    """The prompt's exact keys and values, shared by every removal: `update` (the one cache method a decoder layer
    calls) returns them followed by the generated positions' own, and stores nothing, so nothing is rolled back."""

    def __init__(self, kv: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self.kv = kv

    def update(self, keys: torch.Tensor, values: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        past_k, past_v = self.kv[layer_idx]
        return torch.cat([past_k, keys], dim=-2), torch.cat([past_v, values], dim=-2)


@dataclass
class TeacherForced:
    """Prompts (left padded, full depth) and continuations (right padded) read under a removal, in one pass.

    Scored position t of row b is continuation position t, predicting `targets[b][t]`; a removal is scored against
    full depth's log-probs there (from the same pass with nothing removed). The prompts run once, their shared
    prefix once for all (`_shared_prompt`); the continuation's residuals at every layer are kept."""

    adapter: Adapter
    prompts: list[list[int]]
    continuations: list[list[int]]
    targets: list[list[int]]

    def __post_init__(self) -> None:
        if not self.prompts or any(not p for p in self.prompts) or any(not c for c in self.continuations):
            raise ValueError("calibration needs non-empty prompts and continuations")
        device = self.adapter.model.device
        P = max(len(p) for p in self.prompts)
        T = max(len(c) for c in self.continuations)

        def pad(row: list[int], width: int, left: bool) -> list[int]:
            return ([0] * (width - len(row)) + row) if left else (row + [0] * (width - len(row)))

        self.scored = torch.tensor([[t < len(tg) for t in range(T)] for tg in self.targets], device=device)  # bool [B, T]
        self.target_ids = torch.tensor([pad(tg, T, False) for tg in self.targets], device=device)
        self.T = T
        prompt_ids = torch.tensor([pad(p, P, True) for p in self.prompts], device=device)
        prompt_mask = torch.tensor([[0] * (P - len(p)) + [1] * len(p) for p in self.prompts], device=device)
        continuation = torch.tensor([pad(c, T, False) for c in self.continuations], device=device)
        with torch.inference_mode():
            if not self._shared_prompt(prompt_ids, prompt_mask):
                self._prompt_pass(prompt_ids, prompt_mask)
            self._full_pass(continuation)

    def _shared_prompt(self, ids: torch.Tensor, mask: torch.Tensor) -> bool:
        """The prompts' keys and values from `d3.decoder.shared_prefill` (prompts that begin alike, as
        few-shot questions do, run their common prefix once); False where its cache does not hold every prompt
        position (a sliding window shorter than prompt and continuation), left to `_prompt_pass`."""
        state, _ = shared_prefill(self.adapter, ids, mask, room=self.T)
        kv = _keys_values(state.cache)
        if any(keys.shape[-2] != state.seq_len for keys, _ in kv):
            return False
        self.kv = kv
        self.prompt_mask = state.attention_mask
        self.positions = state.next_positions + torch.arange(self.T, device=ids.device)  # [B, T]
        return True

    def _prompt_pass(self, ids: torch.Tensor, mask: torch.Tensor) -> None:
        """Every layer over the (left padded) prompts at full depth, keeping every position's keys and values (a
        sliding layer's window is in its mask)."""
        a, cache = self.adapter, DynamicCache()
        positions = (mask.long().cumsum(-1) - 1).clamp_min(0)
        hidden = a.embed(ids)
        masks, ropes = a.masks(hidden, mask, cache, positions), a.rope(hidden, positions)
        for idx in range(a.num_layers):
            hidden = a.run_layer(idx, hidden, masks[a.layer_types[idx]], ropes[a.layer_types[idx]], cache, positions)
        self.kv = _keys_values(cache)
        self.prompt_mask = mask
        self.positions = positions[:, -1:] + 1 + torch.arange(self.T, device=ids.device)

    def _full_pass(self, continuation: torch.Tensor) -> None:
        """Every layer over the continuation at full depth, reading the prompt's keys and values: the residual
        entering each layer (and leaving the last), and full depth's log-probs where they are small."""
        a = self.adapter
        self.mask = torch.cat([self.prompt_mask, self.prompt_mask.new_ones(continuation.shape)], dim=1)
        cont = a.embed(continuation)
        sizing = DynamicCache([(k, v) for k, v in self.kv])  # the prompt's whole length, as _PromptPast gives it
        self.masks = a.masks(cont, self.mask, sizing, self.positions)
        self.ropes = a.rope(cont, self.positions)
        resid: list[torch.Tensor] = []
        resid.append(self._run(cont, 0, set(), resid))
        self.resid = resid  # L + 1 entries of [B, T, d_model]
        self._base: tuple[tuple[int, ...], list[torch.Tensor]] | None = None
        self._targets = self.target_ids[self.scored].to(a.head_device())  # [N]: the scored positions, row by row
        # Full depth's log-probs at the scored positions, [N, vocab] a chunk at a time: kept where they are
        # small, else read out again from the last residual at each score (Gemma 3's 262k-token vocabulary
        # over a few thousand positions is gigabytes per copy).
        n, vocab = self._targets.numel(), a.model.lm_head.out_features
        self._chunk = max(1, CHUNK_ELEMENTS // vocab)
        self._head = a.linear_head()
        full = self._at_scored(resid[-1])
        if self._head is not None:  # KL needs only these per position: no [N, vocab] copy, nothing read out again
            self._summary = [self._summarize(full[s:s + self._chunk]) for s in range(0, n, self._chunk)]
            self._reference = None
        else:
            kept = n * vocab <= KEPT_REFERENCE_ELEMENTS
            self._reference = [self._read_out(full[s:s + self._chunk]) for s in range(0, n, self._chunk)] if kept else None

    def _summarize(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Full depth's distribution p at positions `hidden` [n, d_model], as KL(p || q) needs it under a linear head
        (logits z = s (W norm(h) + b)): sum p log p [n], p's mean head row p W [n, d_model], and p b [n]. Then
        KL = sum p log p - s (pW . norm(h_q) + p b) + logsumexp(z_q), from the removal's own logits alone."""
        assert self._head is not None  # set in _full_pass before any summary is made
        weight, bias, _ = self._head
        logp = self._read_out(hidden)
        p = logp.exp()
        plogp = (p * logp).sum(-1)
        return plogp, p @ weight, (p @ bias) if bias is not None else torch.zeros_like(plogp)

    def _at_scored(self, resid: torch.Tensor) -> torch.Tensor:
        """The scored positions of a residual [B, T, d_model] -> [N, d_model]. The last layer, whose residual this
        is, may live on another device than the inputs and the mask (device_map="auto"): the mask moves to it."""
        return resid[self.scored.to(resid.device)]

    @property
    def positions_scored(self) -> int:
        return int(self._targets.numel())

    def _run(self, hidden: torch.Tensor, start: int, skip: set[int], keep: list[torch.Tensor] | None = None) -> torch.Tensor:
        """Layers start .. L - 1 but those in `skip`, over the continuation; `keep` collects the residual entering each."""
        a, past = self.adapter, _PromptPast(self.kv)
        for idx in range(start, a.num_layers):
            if keep is not None:
                keep.append(hidden)
            if idx not in skip:
                kind = a.layer_types[idx]
                hidden = a.run_layer(idx, hidden, self.masks[kind], self.ropes[kind], past, self.positions)
        return hidden

    def _stack(self, removed: tuple[int, ...]) -> list[torch.Tensor]:
        """The residual entering every layer (and leaving the last) with `removed` skipped; the latest is kept, so
        the greedy step's candidates (its removal plus one layer) share it."""
        if self._base is not None and self._base[0] == removed:
            return self._base[1]
        if not removed:
            stack = self.resid
        else:
            first = min(removed)
            keep = list(self.resid[:first])
            keep.append(self._run(self.resid[first], first, set(removed), keep))
            stack = keep
        self._base = (removed, stack)
        return stack

    def _read_out(self, hidden: torch.Tensor) -> torch.Tensor:
        """Log-probs of residuals `hidden` [n, d_model] -> [n, vocab]."""
        return torch.log_softmax(self.adapter.logits(hidden), dim=-1)

    def _last(self, removed: tuple[int, ...]) -> torch.Tensor:
        """The continuation's residual leaving the last layer [B, T, d_model] with `removed` skipped.

        Below the last-named layer c, the residual is that of removed[:-1] (c changes nothing under it), so the pass
        starts at c from that removal's residuals (the previous greedy step's, computed once per step)."""
        if not removed:
            return self.resid[-1]
        *base, last = removed
        start = self._stack(tuple(base))[last]
        return self._run(start, last, set(removed))

    def logprobs(self, removed: Sequence[int]) -> torch.Tensor:
        """Next-token log-probs [B, T, vocab] with the layers in `removed` skipped at every continuation position
        (full depth's with nothing removed). `score` reads the same a chunk of positions at a time."""
        with torch.inference_mode():
            return torch.log_softmax(self.adapter.logits(self._last(tuple(removed))), dim=-1)

    def score(self, removed: Sequence[int], metric: str) -> Score:
        """agreement (share of targets top-1) or nll (mean NLL of the targets), with the mean KL from full depth,
        over the scored positions, a chunk at a time (memory: a chunk's logits, not the whole [B, T, vocab])."""
        with torch.inference_mode():
            ours = self._at_scored(self._last(tuple(removed)))  # [N, d_model]
            full = self._at_scored(self.resid[-1]) if self._head is None and self._reference is None else None
            n, value, kl = self._targets.numel(), 0.0, 0.0
            for k, s in enumerate(range(0, n, self._chunk)):
                logits = self.adapter.logits(ours[s:s + self._chunk])  # [chunk, vocab]
                lse = torch.logsumexp(logits, dim=-1)
                again = full[s:s + self._chunk] if full is not None else None
                kl += self._kl(k, ours[s:s + self._chunk], logits, lse, again).clamp_min(0).sum().item()
                targets = self._targets[s:s + self._chunk]
                if metric == "agreement":
                    value += (logits.argmax(-1) == targets).sum().item()
                else:
                    value += (lse - logits.gather(-1, targets[:, None])[:, 0]).sum().item()
        return Score(value / n, kl / n)

    def _kl(self, k: int, ours: torch.Tensor, logits: torch.Tensor, lse: torch.Tensor,
            full: torch.Tensor | None) -> torch.Tensor:
        """KL(full depth || removal) at chunk k's positions [chunk]: from full depth's summary under a linear head,
        else from full depth's log-probs (kept, or read out again from its residuals `full`)."""
        if self._head is not None:
            plogp, p_weight, p_bias = self._summary[k]
            p_logits = self._head[2] * ((p_weight * self.adapter.final_norm(ours)).sum(-1) + p_bias)  # sum p z_q
            return plogp - p_logits + lse
        if self._reference is not None:
            logp = self._reference[k]
        else:
            assert full is not None  # `score` reads full depth's residuals out again where nothing is kept
            logp = self._read_out(full)
        return (logp.exp() * (logp - (logits - lse[:, None]))).sum(-1)


@dataclass(frozen=True)
class Batches:
    """Several teacher-forced batches scored as one, each score the mean over all their scored positions.

    Questions of different tasks share no shots, so each task's prompts form a batch of their own that runs its
    shots once (`TeacherForced._shared_prompt`), with its continuations padded only to its own longest reply."""

    parts: tuple[TeacherForced, ...]

    def score(self, removed: Sequence[int], metric: str) -> Score:
        n = [p.positions_scored for p in self.parts]
        scores = [p.score(removed, metric) for p in self.parts]
        total = sum(n)
        return Score(sum(s.value * k for s, k in zip(scores, n)) / total, sum(s.kl * k for s, k in zip(scores, n)) / total)


# ---------------------------------------------------------------- a strategy's greedy decode, read in one pass


LOGIT_CHUNK = 256  # positions read out through the LM head at once (early exit's checks, the final argmax)


@dataclass(frozen=True)
class ForcedReply:
    """A strategy read over a given reply (teacher forced): at each reply position s, the token the strategy's
    greedy decode would pick after the prompt and the reply's first s tokens, the logit margin of that pick over the
    runner-up, and the layers the token at s runs (token 0 comes out of the full-depth prefill)."""

    predicted: tuple[int, ...]
    margin: tuple[float, ...]
    layers: tuple[int, ...]

    def first_change(self, reply: Sequence[int]) -> int | None:
        """The first position where the strategy would write another token than `reply` (None: it writes `reply`)."""
        return next((s for s, (a, b) in enumerate(zip(self.predicted, reply)) if a != b), None)


class _Filling:
    """The cache stand-in of `forced_replies`: a decoder layer's `update` hands it the reply positions' keys and
    values (computed from each position's residual); positions that skip the layer under a copy fill get their
    source layer's entry instead; it returns the prompt's entries followed by those, and keeps the layer's for the
    layers above that copy from it. A skipping position's computed entry is its residual's own projection:
    propagate's fill, kept as it is. Nothing is written into the prompt's cache, so it serves every strategy."""

    def __init__(self, prompt_kv: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self.prompt_kv = prompt_kv
        self.kv: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * len(prompt_kv)
        self.copies: list[tuple[int, torch.Tensor]] = []  # (source layer, bool [B, T]) for the layer about to run

    def update(self, keys: torch.Tensor, values: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        for src, where in self.copies:
            src_keys, src_values = self.kv[src]  # type: ignore[misc]  # a source ran below, so it is kept
            pick = where[:, None, :, None].to(keys.device)
            keys = torch.where(pick, src_keys.to(keys.device), keys)
            values = torch.where(pick, src_values.to(values.device), values)
        self.kv[layer_idx] = (keys, values)
        past_k, past_v = self.prompt_kv[layer_idx]
        return torch.cat([past_k.to(keys.device), keys], dim=-2), torch.cat([past_v.to(values.device), values], dim=-2)


def prefill_prompts(adapter: Adapter, ids: torch.Tensor, mask: torch.Tensor) -> tuple[Any, torch.Tensor]:
    """Left-padded prompts ([B, P]) at full depth, as `d3.decoder.prefill` runs them: the decode state and the
    first token's logits [B, vocab]; `forced_replies(held=...)` reads any number of strategies from it."""
    from d3.decoder import prefill

    with torch.inference_mode():
        state, out = prefill(adapter, ids, mask)
    return state, out.logits


def forced_replies(adapter: Adapter, prompts: Sequence[Sequence[int]], replies: Sequence[Sequence[int]],
                   cfg: Any, held: tuple[Any, torch.Tensor] | None = None) -> list[ForcedReply]:
    """What `cfg`'s greedy decode (`d3.decoder`: prefill at full depth, then one token at a time through
    `d3.schedule.plan`, skipped layers filled as `d3.schedule.fill_plan` decides) would pick at every position of
    each given reply, read in one pass over the replies instead of one step per token.

    The prompts run once at full depth (`prefill_prompts`, or `held`: their prefill, shared by every strategy read
    from it: it is not changed). Then layer by layer over every reply position at once: a position runs the layer
    when its token's plan runs it, else keeps its residual and gets the layer's key/value entry by its fill (copy:
    the source layer's entry at that position, kept from below; propagate: its residual's own projection). Early
    exit (`EarlyExitConfig`) is decided per position, as a batch of one decides it (`d3.decoder` exits a batch
    together). So where a strategy's picks equal the reply up to position k, its free-running reply equals the
    given one up to k: one pass tells whether a setting writes full depth's reply, and where it first leaves it.
    The same computation as the decode in another summation order: picks agree up to float rounding (`margin` says
    how close each call was). Not read (ValueError): the none fill, and a copy from a layer above (a plan that
    skips layer 0)."""
    from d3.config import EarlyExitConfig

    if not prompts or len(prompts) != len(replies) or any(not p for p in prompts) or any(not r for r in replies):
        raise ValueError("forced_replies needs as many non-empty prompts as non-empty replies")
    if cfg.fill == "none":
        raise ValueError("forced_replies does not read the none fill (its holes)")
    L, device = adapter.num_layers, adapter.model.device
    B = len(prompts)
    if held is None:
        P = max(len(p) for p in prompts)
        ids = torch.tensor([[0] * (P - len(p)) + list(p) for p in prompts], device=device)
        mask = torch.tensor([[0] * (P - len(p)) + [1] * len(p) for p in prompts], device=device)
        held = prefill_prompts(adapter, ids, mask)
    state, first = held
    early = cfg if isinstance(cfg, EarlyExitConfig) else None
    T = max(len(r) for r in replies) - 1  # reply positions fed back: all but each reply's last token
    picks = first.topk(2, dim=-1)
    out_rows = [[(int(picks.indices[b, 0]), float(picks.values[b, 0] - picks.values[b, 1]), L)] for b in range(B)]
    if T > 0:
        _forced_pass(adapter, state, replies, cfg, early, T, out_rows)
    return [ForcedReply(tuple(t for t, _, _ in row[:len(r)]), tuple(m for _, m, _ in row[:len(r)]),
                        tuple(n for _, _, n in row[:len(r)])) for row, r in zip(out_rows, replies)]


def _forced_pass(adapter: Adapter, state: Any, replies: Sequence[Sequence[int]], cfg: Any, early: Any, T: int,
                 out_rows: list[list[tuple[int, float, int]]]) -> None:
    """`forced_replies`' pass over the reply positions (right padded to T): appends (pick, margin, layers) for
    reply tokens 1 .. T to each row of `out_rows`."""
    L, B, device = adapter.num_layers, len(replies), adapter.model.device
    cont = torch.tensor([list(r[:-1]) + [0] * (T - len(r) + 1) for r in replies], device=device)  # [B, T]
    real = torch.tensor([[t < len(r) - 1 for t in range(T)] for r in replies], device=device)
    step = torch.arange(1, T + 1, device=device).expand(B, T)  # position t feeds reply[t]: step t + 1
    plans = {s: plan(cfg, L, s) for s in range(1, T + 1)}
    run = torch.ones(B, T, L, dtype=torch.bool, device=device)  # the position runs the layer
    copy_src = torch.full((B, T, L), -1, dtype=torch.long, device=device)  # the layer a skip copies from
    if early is None:
        for s, p in plans.items():
            ran = set(p.run)
            run[:, s - 1] = torch.tensor([x in ran for x in range(L)], device=device)
            for idx, how, src in fill_plan(p.run, [x for x in range(L) if x not in ran], cfg.fill, adapter.layer_types):
                if how == "copy" and src is not None:
                    if src > idx:
                        raise ValueError(f"step {s} copies layer {idx}'s entry from layer {src} above it")
                    copy_src[:, s - 1, idx] = src
    exit_after = torch.full((B, T), L - 1, dtype=torch.long, device=device)
    active = torch.ones(B, T, dtype=torch.bool, device=device)  # early exit: not exited yet
    last_ran = {k: torch.full((B, T), -1, dtype=torch.long, device=device) for k in set(adapter.layer_types)}
    prompt_kv = _keys_values(state.cache)
    with torch.inference_mode():
        positions = state.next_positions + torch.arange(T, device=device)  # [B, T]
        mask = torch.cat([state.attention_mask, state.attention_mask.new_ones(B, T)], dim=1)
        hidden = adapter.embed(cont)
        masks = adapter.masks(hidden, mask, DynamicCache([(k, v) for k, v in prompt_kv]), positions)
        ropes = adapter.rope(hidden, positions)
        cache = _Filling(prompt_kv)
        for idx in range(L):
            kind = adapter.layer_types[idx]
            if early is None:
                runs, source = run[..., idx], copy_src[..., idx]
            else:
                runs = active.clone()
                if cfg.fill in ("copy", "copy_any_type"):  # fill_plan's nearest lower layer that ran (all did, to the exit)
                    kinds = [kind] if cfg.fill == "copy" else list(last_ran)
                    source = torch.stack([last_ran[k] for k in kinds]).amax(0).masked_fill(runs, -1)
                else:
                    source = torch.full_like(step, -1)
            cache.copies = [(int(s), source == s) for s in torch.unique(source).tolist() if s >= 0]
            out = adapter.run_layer(idx, hidden, masks[kind], ropes[kind], cache, positions)
            hidden = torch.where(runs[..., None].to(out.device), out, hidden.to(out.device))
            last_ran[kind] = torch.where(runs, idx, last_ran[kind])
            if early is not None and idx + 1 >= min(early.min_layers, L) and idx < L - 1:
                where = (active & real).nonzero(as_tuple=True)
                for s in range(0, where[0].numel(), LOGIT_CHUNK):
                    rows, cols = where[0][s:s + LOGIT_CHUNK], where[1][s:s + LOGIT_CHUNK]
                    probs = torch.softmax(adapter.logits(hidden[rows, cols]), dim=-1).topk(2, dim=-1).values
                    leave = (probs[:, 0] - probs[:, 1]) >= early.threshold
                    active[rows[leave], cols[leave]] = False
                    exit_after[rows[leave], cols[leave]] = idx
        for b, r in enumerate(replies):
            n = len(r) - 1
            for s in range(0, n, LOGIT_CHUNK):
                top2 = adapter.logits(hidden[b, s:min(n, s + LOGIT_CHUNK)]).topk(2, dim=-1)
                for t in range(top2.indices.shape[0]):
                    layers = len(plans[s + t + 1].run) if early is None else int(exit_after[b, s + t]) + 1
                    out_rows[b].append((int(top2.indices[t, 0]), float(top2.values[t, 0] - top2.values[t, 1]), layers))
