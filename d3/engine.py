"""The engine a caller drives: stream a generation as traces, compare against full depth, measure perplexity."""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch

from d3.adapter import Adapter, check_supported
from d3.config import (
    MAX_PROMPT_TOKENS_CAP,
    EarlyExitConfig,
    FullConfig,
    GenerationConfig,
    StrategyConfig,
    TraceConfig,
    TRACE_OFF,
    D3Config,
    default_core,
)
from d3.decoder import DecodeState, StepOutput, decode_one_token, prefill, sample
from d3.hooks import StatsRecorder
from d3.schedule import plan
from d3.trace import LAYER_STATS, PromptStats, TokenStep, Trace

PROMPT_ATTENTION_MAX = 256  # prompt x prompt attention is kept only for prompts up to this many tokens


def check_prompt(prompt: Any) -> str:
    """A prompt must be non-empty text without control characters (newlines and tabs are fine)."""
    if not isinstance(prompt, str):
        raise ValueError(f"prompt must be text, got {type(prompt).__name__}")
    cleaned = "".join(ch for ch in prompt if ch in "\n\t" or (ch.isprintable() and ch not in "\ufeff"))
    if not cleaned.strip():
        raise ValueError("prompt is empty: type some text to continue (control characters are ignored)")
    return cleaned


@dataclass
class _Row:
    """Per-sequence bookkeeping while a batch decodes."""

    ids: list[int]
    steps: list[TokenStep]
    pad: int = 0  # left-padding positions, cut from this row's attention weights
    done: bool = False


class Engine:
    """A loaded model plus the skip-aware loop. Thread-safe: one forward pass at a time per engine."""

    def __init__(self, model: torch.nn.Module, tokenizer: Any, name: str = "model",
                 max_prompt_tokens: int = MAX_PROMPT_TOKENS_CAP) -> None:
        check_supported(model)
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name
        self.adapter = Adapter(model)
        self.num_layers = self.adapter.num_layers
        self.max_prompt_tokens = max_prompt_tokens
        self.device = next(model.parameters()).device
        self._lock = threading.Lock()
        eos = getattr(model.generation_config, "eos_token_id", None) or tokenizer.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, (list, tuple)) else [eos]) - {None}
        self.fixed_cost_layers = self._fixed_cost_in_layers()

    @property
    def lock(self) -> threading.Lock:
        """Held for every forward pass; code that runs the model's layers itself (the oracle) takes it too, so its
        passes never interleave with a traced step whose hooks are registered."""
        return self._lock

    @classmethod
    def from_loaded(cls, loaded: Any) -> "Engine":
        return cls(loaded.model, loaded.tokenizer, name=loaded.name)

    # -- text in ---------------------------------------------------------------------------------
    def _fixed_cost_in_layers(self) -> float:
        """Embedding lookup is ~free; the LM head's matmul in units of one decoder layer's matmuls."""
        layer_params = sum(p.numel() for p in self.adapter.layers[0].parameters())
        head = self.model.lm_head.weight.numel()
        return head / max(layer_params, 1)

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))

    def render(self, prompt: str, chat_template: bool = True) -> str:
        prompt = check_prompt(prompt)
        if chat_template and self.has_chat_template:
            return self.tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                                      add_generation_prompt=True)
        return prompt

    def encode(self, prompts: Sequence[str], chat_template: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-padded ids and mask, [batch, prompt_len]; over-long prompts raise ValueError."""
        rows = [self._ids(p, chat_template) for p in prompts]
        for r in rows:
            if len(r) > self.max_prompt_tokens:
                raise ValueError(f"prompt is {len(r)} tokens long; the limit is {self.max_prompt_tokens} tokens")
            if not r:
                raise ValueError("prompt is empty after tokenisation")
        width = max(len(r) for r in rows)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else next(iter(self.eos_ids), 0)
        ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], device=self.device)
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=self.device)
        return ids, mask

    def _ids(self, prompt: str | Sequence[int], chat_template: bool) -> list[int]:
        if isinstance(prompt, (list, tuple)) and all(isinstance(t, int) for t in prompt):
            return list(prompt)
        text = self.render(prompt, chat_template)  # type: ignore[arg-type]  (render rejects non-text)
        return self.tokenizer(text, add_special_tokens=not chat_template or not self.has_chat_template)["input_ids"]

    def token_text(self, ids: list[int], i: int) -> str:
        """Text that token i adds, decoded incrementally with a little left context: a byte-level piece that ends
        inside a multi-byte character adds nothing (its half decodes to U+FFFD), and the token that completes the
        character adds all of it."""
        lo = max(0, i - 8)
        before = self.tokenizer.decode(ids[lo:i], skip_special_tokens=False).rstrip("\ufffd")
        after = self.tokenizer.decode(ids[lo:i + 1], skip_special_tokens=False).rstrip("\ufffd")
        return after[len(before):] if after.startswith(before) else self.tokenizer.decode([ids[i]])

    # -- the loop --------------------------------------------------------------------------------
    def check(self, strategy: StrategyConfig, trace: TraceConfig) -> None:
        strategy.check_layers(self.num_layers)
        bad = [x for x in trace.attention_layers if x >= self.num_layers]
        if bad:
            raise ValueError(f"attention_layers={bad} is not allowed: layers are 0..{self.num_layers - 1}")

    def run(self, prompts: Sequence[str], strategy: StrategyConfig, gen: GenerationConfig = GenerationConfig(),
            trace: TraceConfig = TraceConfig(), *, chat_template: bool = True,
            forced: Sequence[Sequence[int]] | None = None, should_stop: Callable[[], bool] | None = None,
            observer: Callable[[int, StepOutput, DecodeState], None] | None = None) -> Iterator[list[Trace]]:
        """Decode a batch; after every step yield one Trace per prompt (steps so far).

        forced: token ids to feed instead of sampling (teacher forcing), one list per prompt.
        observer(step, out, state) sees every step's output (float32 logits) and the decode state (KV cache).
        prompts: text, or token id lists used as they are (no chat template, no special tokens added).
        should_stop(): checked before every step; True ends the generation (Stop button, closed tab).
        """
        self.check(strategy, trace)
        ids, mask = self.encode(prompts, chat_template)
        headers = [self._header(p, strategy, ids[b], mask[b]) for b, p in enumerate(prompts)]
        rows = [_Row([], [], pad=int((mask[b] == 0).sum())) for b in range(len(prompts))]
        generator = torch.Generator().manual_seed(gen.seed) if not gen.greedy else None
        recorder = StatsRecorder(self.num_layers, trace.attention_layers) if trace.enabled and trace.sublayer_stats else None
        early = strategy if isinstance(strategy, EarlyExitConfig) else None
        limit = gen.max_new_tokens if forced is None else min(gen.max_new_tokens, min(len(f) for f in forced))
        state: DecodeState | None = None
        prompt_stats: list[PromptStats] = []
        finish, prefill_ms = "", 0.0
        for step in range(limit):
            if should_stop is not None and should_stop():
                finish = "stopped"
                break
            t0 = time.perf_counter()
            with self._lock, torch.inference_mode():
                if state is None:
                    state, out = prefill(self.adapter, ids, mask, recorder=recorder, logit_lens=trace.logit_lens)
                    prompt_stats = self._prompt_stats(out, ids, mask)
                else:
                    last = torch.tensor([r.ids[-1] for r in rows], device=self.device)
                    out = decode_one_token(self.adapter, state, last, plan(strategy, self.num_layers, step),
                                           strategy.fill, early_exit=early, recorder=recorder, logit_lens=trace.logit_lens)
                if observer is not None:
                    observer(step, out, state)
                picked = sample(out.logits, gen, generator) if forced is None else torch.tensor([f[step] for f in forced])
                picked_list = picked.tolist()
            wall_ms = (time.perf_counter() - t0) * 1000
            prefill_ms = wall_ms if step == 0 else prefill_ms  # step 0 is the prompt's prefill
            self._record(rows, step, picked_list, out, strategy, trace, wall_ms, stop_at_eos=gen.stop_at_eos and forced is None)
            if gen.stop_at_eos and forced is None and all(r.done for r in rows):
                finish = "eos"
            elif step == limit - 1:
                finish = "length"
            else:
                finish = ""
            yield [h.with_steps(r.steps, prompt_stats=ps, finish_reason=finish, prefill_ms=prefill_ms)
                   for h, r, ps in zip(headers, rows, prompt_stats)]
            if finish == "eos":
                return
        if finish == "stopped" and state is not None:
            yield [h.with_steps(r.steps, prompt_stats=ps, finish_reason="stopped", prefill_ms=prefill_ms)
                   for h, r, ps in zip(headers, rows, prompt_stats)]

    def _header(self, prompt: str | Sequence[int], strategy: StrategyConfig, ids: torch.Tensor, mask: torch.Tensor) -> Trace:
        core = strategy.core(self.num_layers) if isinstance(strategy, D3Config) else default_core(self.num_layers)
        text = prompt if isinstance(prompt, str) else self.tokenizer.decode(list(prompt))
        return Trace(model=self.name, num_layers=self.num_layers, strategy=strategy.to_dict(), prompt=text, core=core,
                     num_heads=self.adapter.num_heads, fixed_cost_layers=self.fixed_cost_layers)

    def _prompt_stats(self, out: StepOutput, ids: torch.Tensor, mask: torch.Tensor) -> list[PromptStats]:
        stats = []
        for b in range(ids.shape[0]):
            real = ids[b][mask[b].bool()].tolist()
            tokens = tuple(self.tokenizer.convert_ids_to_tokens(real))
            per_layer = {name: out.stats[k, b].numpy().copy() for k, name in enumerate(LAYER_STATS)} if out.stats is not None else {}
            attention = {}
            if len(real) <= PROMPT_ATTENTION_MAX:
                n = len(real)
                attention = {layer: a[b, :, -n:, -n:].to(torch.float16).numpy() for layer, a in out.attention.items()}
            stats.append(PromptStats(tokens=tokens, stats=per_layer, attention=attention))
        return stats

    def _record(self, rows: list[_Row], step: int, picked: list[int], out: StepOutput, strategy: StrategyConfig,
                trace: TraceConfig, wall_ms: float, stop_at_eos: bool = True) -> None:
        planned = plan(strategy, self.num_layers, step).budget
        logprobs = torch.log_softmax(out.logits, dim=-1)
        for b, row in enumerate(rows):
            if row.done:
                continue
            row.ids.append(picked[b])
            row.steps.append(self._token_step(row, b, step, out, planned, logprobs, trace, wall_ms))
            row.done = stop_at_eos and picked[b] in self.eos_ids

    def _token_step(self, row: _Row, b: int, step: int, out: StepOutput, planned: int, logprobs: torch.Tensor,
                    trace: TraceConfig, wall_ms: float) -> TokenStep:
        token = row.ids[-1]
        extra: dict[str, Any] = {}
        lp = logprobs[b]
        extra["logprob"] = float(lp[token])
        if trace.enabled:
            extra["entropy"] = float(-(lp.exp() * lp).nan_to_num(0.0).sum())
            if trace.top_k:
                top = lp.topk(trace.top_k)
                extra["topk"] = tuple((int(i), self.tokenizer.decode([int(i)]), float(math.exp(v)))
                                      for v, i in zip(top.values.tolist(), top.indices.tolist()))
        if out.stats is not None and step > 0:
            extra["stats"] = {name: out.stats[k, b].numpy().copy() for k, name in enumerate(LAYER_STATS)}
        if out.attention and step > 0:
            extra["attention"] = {layer: a[b, :, -1, row.pad:].to(torch.float16).numpy() for layer, a in out.attention.items()}
        if out.lens is not None:
            extra.update(self._lens(out.layers_run, out.lens[:, b], token))
        return TokenStep(step=step, token_id=token, text=self.token_text(row.ids, len(row.ids) - 1),
                         layers_run=out.layers_run, filled=out.filled, planned=planned,
                         entropy=extra.pop("entropy", float("nan")), wall_ms=wall_ms, seq=b,
                         confidence=out.confidence, exit_layer=out.exit_layer, **extra)

    def _lens(self, layers_run: tuple[int, ...], logits: torch.Tensor, token: int) -> dict[str, tuple]:
        """Per layer ([n_ran, vocab] logits in): the lens's top-1 text, and the picked token's probability and
        rank ("", NaN and -1 where the layer did not run)."""
        logprobs = torch.log_softmax(logits, dim=-1)
        picked = logprobs[:, token]  # [n_ran]
        by_layer = dict(zip(layers_run, zip(logprobs.argmax(-1).tolist(), picked.exp().tolist(),
                                            (logprobs > picked[:, None]).sum(-1).tolist())))
        rows = [by_layer.get(layer) for layer in range(self.num_layers)]
        return {"logit_lens": tuple(self.tokenizer.decode([r[0]]) if r else "" for r in rows),
                "lens_prob": tuple(float(r[1]) if r else float("nan") for r in rows),
                "lens_rank": tuple(int(r[2]) if r else -1 for r in rows)}

    # -- conveniences ----------------------------------------------------------------------------
    def stream(self, prompt: str, strategy: StrategyConfig, gen: GenerationConfig = GenerationConfig(),
               trace: TraceConfig = TraceConfig(), **kwargs: Any) -> Iterator[Trace]:
        """One prompt: yield the growing Trace after every generated token."""
        for traces in self.run([prompt], strategy, gen, trace, **kwargs):
            yield traces[0]

    def generate(self, prompt: str, strategy: StrategyConfig = FullConfig(), gen: GenerationConfig = GenerationConfig(),
                 trace: TraceConfig = TraceConfig(), **kwargs: Any) -> Trace:
        last = None
        for last in self.stream(prompt, strategy, gen, trace, **kwargs):
            pass
        assert last is not None
        return last

    def generate_batch(self, prompts: Sequence[str], strategy: StrategyConfig = FullConfig(),
                       gen: GenerationConfig = GenerationConfig(), trace: TraceConfig = TRACE_OFF, **kwargs: Any) -> list[Trace]:
        last: list[Trace] = []
        for last in self.run(prompts, strategy, gen, trace, **kwargs):
            pass
        return last

    def score_continuations(self, prompt_ids: Sequence[int], continuations: Sequence[Sequence[int]],
                            strategy: StrategyConfig = FullConfig()) -> list[float]:
        """Summed log-probability of each continuation after the prompt, read under `strategy`.

        The prompt is prefilled once at full depth (as `run` does) and its cache shared by every
        continuation; token k of a continuation is fed at decode step k, so it sees the same layer plan
        as in `run(..., forced=...)`. Continuations may differ in length."""
        self.check(strategy, TRACE_OFF)
        if not prompt_ids or not continuations or any(len(c) == 0 for c in continuations):
            raise ValueError("score_continuations needs a non-empty prompt and non-empty continuations")
        width = max(len(c) for c in continuations)
        padded = torch.tensor([list(c) + [c[0]] * (width - len(c)) for c in continuations], device=self.device)
        own = torch.tensor([[k < len(c) for k in range(width)] for c in continuations], device=self.device)
        early = strategy if isinstance(strategy, EarlyExitConfig) else None
        ids = torch.tensor([list(prompt_ids)], device=self.device)
        with self._lock, torch.inference_mode():
            state, out = prefill(self.adapter, ids, torch.ones_like(ids))
            state.repeat(len(continuations))
            total = torch.log_softmax(out.logits.float(), dim=-1)[0, padded[:, 0]]  # [n], first tokens from prefill
            for step in range(1, width):
                out = decode_one_token(self.adapter, state, padded[:, step - 1], plan(strategy, self.num_layers, step),
                                       strategy.fill, early_exit=early)
                lp = torch.log_softmax(out.logits.float(), dim=-1).gather(1, padded[:, step:step + 1])[:, 0]
                total += torch.where(own[:, step], lp, torch.zeros_like(lp))
        return total.tolist()

    def full_depth_logprobs(self, prompt: str, tokens: Sequence[int], chat_template: bool = True) -> torch.Tensor:
        """Full-depth next-token log-probs after the prompt and after each of `tokens`: float32 [len(tokens), vocab]."""
        ids, mask = self.encode([prompt], chat_template)
        full = torch.cat([ids, torch.tensor([list(tokens)], device=self.device)], dim=1)
        with self._lock, torch.inference_mode():
            logits = self.model(input_ids=full, attention_mask=torch.ones_like(full)).logits[0].float()
        start = ids.shape[1] - 1
        return torch.log_softmax(logits[start:start + len(tokens)], dim=-1)
