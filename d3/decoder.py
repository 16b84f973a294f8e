"""The skip-aware decode loop: prefill at full depth, then one token at a time through the layers a plan names.

Mirrors transformers' own `for decoder_layer in self.layers` loop, calling the library's layers, cache,
masks, rotary embedding, norm and LM head through `Adapter`. Skipped layers still get a KV entry at
every position (filled by copy / propagate, or a masked-out hole), so every layer's cache stays aligned.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from transformers.cache_utils import DynamicCache

from d3.adapter import Adapter
from d3.config import EarlyExitConfig, GenerationConfig
from d3.hooks import StatsRecorder, recording
from d3.schedule import Fill, LayerPlan, fill_plan


@dataclass
class DecodeState:
    """Mutable per-generation state: the KV cache, the 2-D padding mask, holes left by `none` filling."""

    cache: DynamicCache
    attention_mask: torch.Tensor  # [batch, seq] 1 = real token, 0 = left padding
    next_positions: torch.Tensor  # [batch, 1] position id of the next token
    holes: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> bool [batch, seq], True = hole

    @property
    def seq_len(self) -> int:
        return self.attention_mask.shape[1]

    def grow(self) -> None:
        """Account for one new position in the padding mask and the hole masks."""
        b = self.attention_mask.shape[0]
        self.attention_mask = torch.cat([self.attention_mask, self.attention_mask.new_ones(b, 1)], dim=1)
        for layer, hole in self.holes.items():
            self.holes[layer] = torch.cat([hole, hole.new_zeros(b, 1)], dim=1)

    def repeat(self, n: int) -> None:
        """Turn a batch-1 state into n identical rows (one shared prefill for n continuations)."""
        if self.attention_mask.shape[0] != 1:
            raise ValueError(f"repeat needs a batch of 1, got {self.attention_mask.shape[0]}")
        self.cache.batch_repeat_interleave(n)
        self.attention_mask = self.attention_mask.expand(n, -1).contiguous()
        self.next_positions = self.next_positions.expand(n, -1).contiguous()
        self.holes = {layer: hole.expand(n, -1).contiguous() for layer, hole in self.holes.items()}

    def keep(self, rows: torch.Tensor) -> None:
        """Keep only `rows` (indices into the batch, [kept]) of the cache, the masks and the positions: finished
        replies leave the batch, so later steps compute only the rows still writing."""
        self.cache.batch_select_indices(rows)
        self.attention_mask = self.attention_mask[rows]
        self.next_positions = self.next_positions[rows]
        self.holes = {layer: hole[rows] for layer, hole in self.holes.items()}

    def mark_hole(self, layer: int) -> None:
        """The newest position of `layer` holds no real KV entry."""
        if layer not in self.holes:
            self.holes[layer] = torch.zeros_like(self.attention_mask, dtype=torch.bool)
        self.holes[layer][:, -1] = True


@dataclass(frozen=True)
class StepOutput:
    """One forward pass (prefill or one decode step) for the whole batch.

    logits: float32 [batch, vocab] for the next token.
    stats: LAYER_STATS name -> float32 CPU [batch, L] (empty when not recorded).
    attention: layer -> float32 CPU [batch, heads, q, kv].  confidence: per exit check (early exit only).
    """

    logits: torch.Tensor
    layers_run: tuple[int, ...]
    filled: tuple[Fill, ...]  # (layer, how, source layer or None) per skipped layer, as fill_plan decided
    stats: dict[str, torch.Tensor] = field(default_factory=dict)
    attention: dict[int, torch.Tensor] = field(default_factory=dict)
    confidence: tuple[float, ...] = ()
    exit_layer: int | None = None
    lens: torch.Tensor | None = None  # [n_ran, batch, vocab] logits read out after each layer that ran (logit lens)
    lens_states: torch.Tensor | None = None  # [n_ran, batch, d_model] float32 CPU: what the lens would read out


def left_padded_positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids that ignore left padding, as `generate` builds them: [batch, seq]."""
    pos = attention_mask.long().cumsum(-1) - 1
    return pos.masked_fill(attention_mask == 0, 0)


def _layer_mask(state: DecodeState, idx: int, base: Any) -> Any:
    """The library's mask for this layer, with this layer's holes masked out (only where it has holes)."""
    hole = state.holes.get(idx)
    if hole is None:
        return base
    allowed = (state.attention_mask.bool() & ~hole)[:, None, None, :]  # [batch, 1, 1, seq]
    if base is None:
        return allowed
    allowed = allowed[..., -base.shape[-1]:]
    if base.dtype == torch.bool:
        return base & allowed
    return base.masked_fill(~allowed, torch.finfo(base.dtype).min)


def _keys_values(cache: Any, idx: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Layer idx's cached keys and values, [batch, kv_heads, pos, head_dim] each."""
    layer = cache.layers[idx]
    return layer.keys, layer.values


def _fill(adapter: Adapter, state: DecodeState, pending: list[tuple[int, torch.Tensor]], ran: list[int],
          fill: str, ropes: dict[str, Any]) -> tuple[Fill, ...]:
    """Give every skipped layer a KV entry at the newest position, as `d3.schedule.fill_plan` decides (the one place
    that decides how, and from which layer, an entry is filled); returns those decisions for the trace."""
    cache = state.cache
    hidden_of = dict(pending)
    decisions = fill_plan(ran, list(hidden_of), fill, adapter.layer_types)
    for idx, how, src in decisions:
        hidden = hidden_of[idx]
        if how == "copy":
            device = adapter.layer_device(idx)  # layers may sit on different devices (device_map="auto")
            assert src is not None  # fill_plan names the layer a copy reads
            src_keys, src_values = _keys_values(cache, src)
            keys, values = src_keys[..., -1:, :].to(device), src_values[..., -1:, :].to(device)
        elif how == "propagate":
            keys, values = adapter.project_kv(idx, hidden, ropes[adapter.layer_types[idx]])
        else:  # none: a zero placeholder that the mask hides from every later query
            keys = hidden.new_zeros(hidden.shape[0], adapter.num_kv_heads, 1, adapter.head_dim,
                                    device=adapter.layer_device(idx))
            values = torch.zeros_like(keys)
            state.mark_hole(idx)
        cache.update(keys, values, idx)
    return decisions


def _confidence(adapter: Adapter, cfg: EarlyExitConfig, hidden: torch.Tensor,
                previous: torch.Tensor) -> tuple[float, torch.Tensor | None]:
    """The batch's lowest confidence after this layer (the batch exits together, as in CALM),
    and the logits it computed on the way (softmax_gap), reused as the output if the batch exits here."""
    if cfg.measure == "cosine":
        return float(_cosine_last(hidden, previous).min()), None
    logits = adapter.logits(hidden[:, -1])
    top2 = torch.softmax(logits, dim=-1).topk(2, dim=-1).values  # [batch, 2]
    return float((top2[:, 0] - top2[:, 1]).min()), logits


def _cosine_last(hidden: torch.Tensor, previous: torch.Tensor) -> torch.Tensor:
    """cosine(previous, hidden) at the last position: [batch]. `previous` (the layer below's output) moves to the
    device of the layer that made `hidden` (they differ under device_map="auto")."""
    return F.cosine_similarity(hidden[:, -1].float(), previous[:, -1].to(hidden.device).float(), dim=-1)


class _EarlyExit:
    """Confidence early exit within one forward pass: after each layer from the plan's `min_exit` on (never
    after the last layer), measure the confidence; the first time it reaches the threshold the batch exits."""

    def __init__(self, adapter: Adapter, cfg: EarlyExitConfig, min_exit: int) -> None:
        self.adapter, self.cfg, self.min_exit = adapter, cfg, min_exit
        self.confidence: list[float] = []
        self.layer: int | None = None  # the layer the batch exited after
        self.logits: torch.Tensor | None = None  # [batch, vocab] computed by the check, reused as the output

    def check(self, idx: int, n_ran: int, hidden: torch.Tensor, before: torch.Tensor) -> None:
        """Layer `idx` (the `n_ran`-th to run) turned `before` into `hidden`."""
        if n_ran < self.min_exit or idx >= self.adapter.num_layers - 1:
            return
        value, logits = _confidence(self.adapter, self.cfg, hidden, before)
        self.confidence.append(value)
        if value >= self.cfg.threshold:
            self.layer, self.logits = idx, logits


def _capture_attention(adapter: Adapter, state: DecodeState, recorder: StatsRecorder, masks: dict[str, Any],
                       ropes: dict[str, Any]) -> dict[int, torch.Tensor]:
    out = {}
    for idx, h_in in recorder.inputs.items():
        kind = adapter.layer_types[idx]
        keys = _keys_values(state.cache, idx)[0]
        mask = _layer_mask(state, idx, masks[kind])
        if mask is None:
            mask = state.attention_mask.bool()[:, None, None, :]
        out[idx] = adapter.attention_probs(idx, h_in, ropes[kind], keys, mask).cpu()
    return out


def _logit_lens(adapter: Adapter, outputs: dict[int, torch.Tensor]) -> torch.Tensor:
    # Whole logits, not just the argmax: the token is picked after this step, and the lens view wants its probability.
    # One LM-head call for all layers: it reads the head's weights once instead of once per layer (~4x faster).
    # Layers may live on several devices (device_map="auto"): each last position moves to the head's.
    head = adapter.head_device()
    return adapter.logits(torch.stack([h[:, -1].to(head) for h in outputs.values()]))  # [n_ran, batch, vocab]


def _lens_states(outputs: dict[int, torch.Tensor]) -> torch.Tensor:
    # A copy of the last position only (the layer outputs themselves live on as the next layers' inputs).
    first = next(iter(outputs.values())).device  # layers may live on several devices: gathered on one, copied once
    return torch.stack([h[:, -1].to(first) for h in outputs.values()]).float().cpu()  # [n_ran, batch, d_model]


def forward(adapter: Adapter, state: DecodeState, hidden: torch.Tensor, positions: torch.Tensor, layer_plan: LayerPlan,
            fill: str, *, early_exit: EarlyExitConfig | None = None, recorder: StatsRecorder | None = None,
            logit_lens: bool = False, lens_states: bool = False) -> StepOutput:
    """Run `hidden` ([batch, pos, d_model]) through the planned layers, filling the rest; the core of every step.
    logit_lens reads the lens out now (an LM head over every layer that ran); lens_states keeps its input instead."""
    masks = adapter.masks(hidden, state.attention_mask, state.cache, positions)
    ropes = adapter.rope(hidden, positions)
    run = set(layer_plan.run)
    ran: list[int] = []
    pending: list[tuple[int, torch.Tensor]] = []  # skipped layers and the hidden state they would have read
    exit_check = _EarlyExit(adapter, early_exit, layer_plan.min_exit) if early_exit is not None else None
    lens_in: dict[int, torch.Tensor] = {}  # layer -> its output, read out by the logit lens after the loop
    for idx in range(adapter.num_layers):
        if idx not in run or (exit_check is not None and exit_check.layer is not None):
            pending.append((idx, hidden))
            continue
        kind = adapter.layer_types[idx]
        before = hidden
        hidden = adapter.run_layer(idx, hidden, _layer_mask(state, idx, masks[kind]), ropes[kind], state.cache, positions)
        ran.append(idx)
        if logit_lens or lens_states:
            lens_in[idx] = hidden
        if exit_check is not None:
            exit_check.check(idx, len(ran), hidden, before)
    filled = _fill(adapter, state, pending, ran, fill, ropes) if pending else ()
    attention = _capture_attention(adapter, state, recorder, masks, ropes) if recorder and recorder.inputs else {}
    exit_logits = exit_check.logits if exit_check is not None else None
    return StepOutput(
        logits=exit_logits if exit_logits is not None else adapter.logits(hidden[:, -1]),
        layers_run=tuple(ran),
        filled=filled,
        stats=recorder.collect() if recorder is not None else {},
        attention=attention,
        confidence=tuple(exit_check.confidence) if exit_check is not None else (),
        exit_layer=exit_check.layer if exit_check is not None else None,
        lens=_logit_lens(adapter, lens_in) if lens_in and logit_lens else None,
        lens_states=_lens_states(lens_in) if lens_in and lens_states else None,
    )


def _recorded(adapter: Adapter, recorder: StatsRecorder | None, batch: int, valid: torch.Tensor | None,
              run: Callable[[], StepOutput]) -> StepOutput:
    """Call `run()` with the recorder's hooks registered for exactly this forward pass (or none)."""
    if recorder is None:
        return run()
    with recording(adapter, recorder, batch, valid):
        return run()


def prefill(adapter: Adapter, input_ids: torch.Tensor, attention_mask: torch.Tensor, *,
            recorder: StatsRecorder | None = None, logit_lens: bool = False,
            lens_states: bool = False) -> tuple[DecodeState, StepOutput]:
    """Run the prompt ([batch, prompt_len], left padded) at full depth; returns the state and the first step."""
    state = DecodeState(DynamicCache(config=adapter.config), attention_mask, attention_mask.new_zeros(0))
    positions = left_padded_positions(attention_mask)  # [batch, prompt_len]
    hidden = adapter.embed(input_ids)  # [batch, prompt_len, d_model]
    full = LayerPlan(tuple(range(adapter.num_layers)), adapter.num_layers)
    out = _recorded(adapter, recorder, input_ids.shape[0], attention_mask,
                    lambda: forward(adapter, state, hidden, positions, full, "copy", recorder=recorder, logit_lens=logit_lens,
                                    lens_states=lens_states))
    state.next_positions = positions[:, -1:] + 1
    return state, out


def decode_one_token(adapter: Adapter, state: DecodeState, tokens: torch.Tensor, layer_plan: LayerPlan, fill: str, *,
                     early_exit: EarlyExitConfig | None = None, recorder: StatsRecorder | None = None,
                     logit_lens: bool = False, lens_states: bool = False) -> StepOutput:
    """Feed the last tokens ([batch]) through the planned layers and return the next-token logits."""
    state.grow()
    positions = state.next_positions  # [batch, 1]
    hidden = adapter.embed(tokens[:, None])  # [batch, 1, d_model]
    out = _recorded(adapter, recorder, tokens.shape[0], None,
                    lambda: forward(adapter, state, hidden, positions, layer_plan, fill, early_exit=early_exit,
                                    recorder=recorder, logit_lens=logit_lens, lens_states=lens_states))
    state.next_positions = positions + 1
    return out


def sample(logits: torch.Tensor, gen: GenerationConfig, generator: torch.Generator | None) -> torch.Tensor:
    """Greedy argmax, or temperature + top-p sampling from a seeded generator: [batch, vocab] -> [batch]."""
    if gen.greedy:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits / gen.temperature, dim=-1)
    if gen.top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        drop = sorted_p.cumsum(-1) - sorted_p > gen.top_p  # keep the smallest prefix reaching top_p
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
    if generator is not None and generator.device != probs.device:  # a generator elsewhere: sample where it is
        return torch.multinomial(probs.cpu(), 1, generator=generator).squeeze(-1).to(logits.device)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)  # where the logits are: no vocab-wide copy


MIN_SHARED = 8  # a shared prefix shorter than this is not worth a separate pass


def shared_prefill(adapter: Any, ids: torch.Tensor, mask: torch.Tensor, room: int = 0) -> tuple[DecodeState, StepOutput]:
    """`d3.decoder.prefill` of left-padded prompts ([batch, prompt_len]) that begin alike (the same shots): the
    common prefix runs once for one row, its cache is repeated for every row, and only each prompt's own tail
    runs per row (left-padded after the prefix: the padding sits between prefix and tail, masked as keys, and
    positions skip it). Same state and first logits as `prefill`, up to float rounding; `prefill` itself when
    the prompts share fewer than MIN_SHARED tokens, or when a sliding-window layer's window (counted in cache
    entries, padding included) is shorter than the prompts plus `room` tokens to come, where the padding's
    place would change what the window holds."""
    rows = [r[m.bool()].tolist() for r, m in zip(ids, mask)]
    shared = min(len(r) for r in rows) - 1  # every row keeps at least one token of its own
    for k in range(shared):
        if any(r[k] != rows[0][k] for r in rows):
            shared = k
            break
    window = getattr(adapter.config, "sliding_window", None)
    # a sliding window shorter than the prompt and what follows it: its cache would not hold every prompt position
    short_window = "sliding_attention" in adapter.layer_types and window is not None and window < ids.shape[1] + room
    if shared < MIN_SHARED or short_window:
        return prefill(adapter, ids, mask)
    state, _ = prefill(adapter, ids.new_tensor([rows[0][:shared]]), mask.new_ones(1, shared))
    state.repeat(len(rows))
    width = max(len(r) - shared for r in rows)
    tail = ids.new_tensor([[rows[0][0]] * (width - len(r) + shared) + r[shared:] for r in rows])  # [batch, width]
    tail_mask = mask.new_tensor([[0] * (width - len(r) + shared) + [1] * (len(r) - shared) for r in rows])
    state.attention_mask = torch.cat([state.attention_mask, tail_mask], dim=1)  # [batch, shared + width]
    positions = shared + left_padded_positions(tail_mask)  # [batch, width]
    full = LayerPlan(tuple(range(adapter.num_layers)), adapter.num_layers)
    out = forward(adapter, state, adapter.embed(tail), positions, full, "copy")
    state.next_positions = positions[:, -1:] + 1
    return state, out
