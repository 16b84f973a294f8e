"""The teacher-forced parallel pass behind the calibration's `agreement` and `perplexity` signals.

For a fixed removal S, D3's decode equals one parallel pass over the generated tokens: no token after the prompt
runs a layer of S, so no filled entry is read. A generated position's residual below S's lowest layer is full
depth's, so the pass starts there from the residuals of one full-depth pass (as the oracle does), and every kept
layer above runs on all generated positions at once, reading the prompt's exact keys and values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch
from transformers.cache_utils import DynamicCache

from d3.adapter import Adapter


@dataclass(frozen=True)
class Score:
    """A removal's signal value and, where the signal has one, the mean KL(full depth || removal)."""

    value: float
    kl: float = float("nan")


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

    Scored position t of row b is continuation position t, predicting `targets[b][t]`; `reference` is full depth's
    log-probs there [B, T, vocab] (from the same pass with nothing removed)."""

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
        pad = lambda row, width, left: ([0] * (width - len(row)) + row) if left else (row + [0] * (width - len(row)))  # noqa: E731
        ids = torch.tensor([pad(p, P, True) + pad(c, T, False) for p, c in zip(self.prompts, self.continuations)], device=device)
        self.mask = torch.tensor([[0] * (P - len(p)) + [1] * (len(p) + T) for p in self.prompts], device=device)
        self.scored = torch.tensor([[t < len(tg) for t in range(T)] for tg in self.targets], device=device)  # bool [B, T]
        self.target_ids = torch.tensor([pad(tg, T, False) for tg in self.targets], device=device)
        self.P, self.T = P, T
        self._full_pass(ids)

    def _full_pass(self, ids: torch.Tensor) -> None:
        """Every layer over prompt + continuation: the prompt's KV, the continuation's residual entering each layer."""
        a = self.adapter
        positions = (self.mask.long().cumsum(-1) - 1).clamp_min(0)
        self.positions = positions[:, self.P:]
        cache = DynamicCache()  # every layer keeps every position: a sliding layer's window is in its mask
        with torch.inference_mode():
            hidden = a.embed(ids)
            masks = a.masks(hidden, self.mask, cache, positions)
            ropes = a.rope(hidden, positions)
            resid = [hidden[:, self.P:]]
            for idx in range(a.num_layers):
                kind = a.layer_types[idx]
                hidden = a.run_layer(idx, hidden, masks[kind], ropes[kind], cache, positions)
                resid.append(hidden[:, self.P:])
            self.resid = resid  # L + 1 entries of [B, T, d_model]
            self.kv = [(layer.keys[..., :self.P, :], layer.values[..., :self.P, :]) for layer in cache.layers]
            self.reference = torch.log_softmax(a.logits(hidden[:, self.P:]), dim=-1)
            self._ref_probs = self.reference.exp()
            self._neg_entropy = (self._ref_probs * self.reference).sum(-1)  # KL(ref || q) = this - sum(ref * log q)
            self._base: tuple[tuple[int, ...], list[torch.Tensor]] | None = None
            sizing = DynamicCache([(k, v) for k, v in self.kv])  # the prompt's whole length, as _PromptPast gives it
            cont = resid[0]
            self.masks = a.masks(cont, self.mask, sizing, self.positions)
            self.ropes = a.rope(cont, self.positions)

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

    def logprobs(self, removed: Sequence[int]) -> torch.Tensor:
        """Next-token log-probs [B, T, vocab] with the layers in `removed` skipped at every continuation position.

        Below the last-named layer c, the residual is that of removed[:-1] (c changes nothing under it), so the pass
        starts at c from that removal's residuals (the previous greedy step's, computed once per step)."""
        if not removed:
            return self.reference
        removed = tuple(removed)
        *base, last = removed
        with torch.inference_mode():
            start = self._stack(tuple(base))[last]
            hidden = self._run(start, last, set(removed))
            return torch.log_softmax(self.adapter.logits(hidden), dim=-1)

    def score(self, removed: Sequence[int], metric: str) -> Score:
        """agreement (share of targets top-1) or nll (mean NLL of the targets), with the mean KL from full depth."""
        logp = self.logprobs(removed)
        m = self.scored
        kl = (self._neg_entropy - (self._ref_probs * logp).sum(-1)).clamp_min(0)[m].mean().item()
        if metric == "agreement":
            value = (logp.argmax(-1) == self.target_ids)[m].float().mean().item()
        else:
            value = -logp.gather(-1, self.target_ids[..., None])[..., 0][m].mean().item()
        return Score(value, kl)


