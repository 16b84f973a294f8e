"""The engine a caller drives: stream a generation as traces, compare against full depth, measure perplexity."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch

from d3.adapter import Adapter, check_supported
from d3.config import (
    MAX_PROMPT_TOKENS_CAP,
    TRACE_OFF,
    D3Config,
    EarlyExitConfig,
    FullConfig,
    GenerationConfig,
    StrategyConfig,
    TraceConfig,
    default_core,
)
from d3.decoder import DecodeState, StepOutput, decode_one_token, prefill, sample
from d3.hooks import StatsRecorder
from d3.schedule import LayerPlan, plan
from d3.trace import Trace
from d3.trace_builder import TraceBuilder, token_text


def check_prompt(prompt: Any) -> str:
    """A prompt must be non-empty text without control characters (newlines and tabs are fine)."""
    if not isinstance(prompt, str):
        raise ValueError(f"prompt must be text, got {type(prompt).__name__}")
    cleaned = "".join(ch for ch in prompt if ch in "\n\t" or (ch.isprintable() and ch not in "\ufeff"))
    if not cleaned.strip():
        raise ValueError("prompt is empty: type some text to continue (control characters are ignored)")
    return cleaned


@dataclass
class _Decoding:
    """The decoder side of one `Engine.run`: the prompt's prefill at the first step, then one token at a time."""

    adapter: Adapter
    ids: torch.Tensor  # [batch, prompt_len], left padded
    mask: torch.Tensor  # [batch, prompt_len]
    strategy: StrategyConfig
    trace: TraceConfig
    state: DecodeState | None = None

    def __post_init__(self) -> None:
        traced = self.trace.enabled and self.trace.sublayer_stats
        self.recorder = StatsRecorder(self.adapter.num_layers, self.trace.attention_layers) if traced else None
        self.early_exit = self.strategy if isinstance(self.strategy, EarlyExitConfig) else None

    def step(self, layer_plan: LayerPlan, last: list[int]) -> StepOutput:
        """One forward pass: the prefill (full depth, whatever the plan) or the `last` tokens through the plan."""
        if self.state is None:
            self.state, out = prefill(self.adapter, self.ids, self.mask, recorder=self.recorder,
                                      logit_lens=self.trace.logit_lens, lens_states=self.trace.lens_states)
            return out
        tokens = torch.tensor(last, device=self.ids.device)  # [batch]
        return decode_one_token(self.adapter, self.state, tokens, layer_plan, self.strategy.fill,
                                early_exit=self.early_exit, recorder=self.recorder, logit_lens=self.trace.logit_lens,
                                lens_states=self.trace.lens_states)


def _picker(gen: GenerationConfig, forced: Sequence[Sequence[int]] | None) -> Callable[[int, torch.Tensor], torch.Tensor]:
    """pick(step, logits) -> the next token of each sequence ([batch]): sampled, or the forced ones."""
    if forced is not None:
        return lambda step, logits: torch.tensor([f[step] for f in forced])
    if gen.greedy:
        return lambda step, logits: sample(logits, gen, None)
    made: dict[torch.device, torch.Generator] = {}

    def pick(step: int, logits: torch.Tensor) -> torch.Tensor:
        # The generator lives where the logits are: sampling then copies no vocabulary-wide tensor to the CPU.
        if logits.device not in made:
            made[logits.device] = torch.Generator(logits.device).manual_seed(gen.seed)
        return sample(logits, gen, made[logits.device])

    return pick


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
    def from_loaded(cls, loaded: Any) -> Engine:
        return cls(loaded.model, loaded.tokenizer, name=loaded.name)

    # -- text in ---------------------------------------------------------------------------------
    def _fixed_cost_in_layers(self) -> float:
        """Embedding lookup is ~free; the LM head's matmul in units of one decoder layer's matmuls."""
        layer_params: int = sum(p.numel() for p in self.adapter.layers[0].parameters())
        head: int = self.adapter.model.lm_head.weight.numel()  # the adapter's model: this engine's own
        return head / max(layer_params, 1)

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))

    def render(self, prompt: str, chat_template: bool = True) -> str:
        prompt = check_prompt(prompt)
        if chat_template and self.has_chat_template:
            rendered: str = self.tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                                               add_generation_prompt=True)
            return rendered
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
        text = self.render(cast(str, prompt), chat_template)  # render rejects what is not text
        ids: list[int] = self.tokenizer(text, add_special_tokens=not chat_template or not self.has_chat_template)["input_ids"]
        return ids

    def token_text(self, ids: list[int], i: int) -> str:
        """Text that token i adds (see `d3.trace_builder.token_text`)."""
        return token_text(self.tokenizer, ids, i)

    # -- the loop --------------------------------------------------------------------------------
    def resolve(self, strategy: StrategyConfig) -> StrategyConfig:
        """`strategy` with a calibrated order named by a calibration ("agreement", "measured", ...) turned into this
        model's layers (`d3.orders.resolve`); any other strategy as it is."""
        if isinstance(strategy, D3Config) and not strategy.resolved:
            from d3.orders import resolve

            return resolve(strategy, self)
        return strategy

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
        should_stop(): checked before every step, once the engine's lock is held; True ends the generation (Stop
        button, closed tab, time limit).
        """
        strategy = self.resolve(strategy)
        self.check(strategy, trace)
        ids, mask = self.encode(prompts, chat_template)
        limit = gen.max_new_tokens if forced is None else min(gen.max_new_tokens, min(len(f) for f in forced))
        decoding = _Decoding(self.adapter, ids, mask, strategy, trace)
        builder = TraceBuilder([self._header(p, strategy) for p in prompts], ids, mask, trace, self.tokenizer,
                               self.eos_ids, stop_at_eos=gen.stop_at_eos and forced is None)
        pick = _picker(gen, forced)
        for step in range(limit):
            layer_plan = plan(strategy, self.num_layers, step)
            with self._lock, torch.inference_mode():
                # Checked once the lock is held: a step waits here for other users' passes (another run's steps,
                # a comparison's or a measurement's pass), and a time limit that passed meanwhile must stop it
                # before it computes (step 0 is the prompt's prefill).
                stopped = should_stop is not None and should_stop()
                if not stopped:
                    t0 = time.perf_counter()
                    out = decoding.step(layer_plan, builder.last_tokens() if step else [])
                    if observer is not None:
                        assert decoding.state is not None  # set by the step just taken
                        observer(step, out, decoding.state)
                    picked = pick(step, out.logits).tolist()
            if stopped:
                if step:
                    yield builder.traces("stopped")
                return
            builder.add(step, layer_plan, picked, out, wall_ms=(time.perf_counter() - t0) * 1000)
            finish = builder.finish_reason(step, limit)
            yield builder.traces(finish)
            if finish == "eos":
                return

    def _header(self, prompt: str | Sequence[int], strategy: StrategyConfig) -> Trace:
        """The Trace of one prompt before its first step: model, strategy, prompt text, the core shown."""
        core = strategy.core(self.num_layers) if isinstance(strategy, D3Config) else default_core(self.num_layers)
        text = prompt if isinstance(prompt, str) else self.tokenizer.decode(list(prompt))
        return Trace(model=self.name, num_layers=self.num_layers, strategy=strategy.to_dict(), prompt=text, core=core,
                     num_heads=self.adapter.num_heads, fixed_cost_layers=self.fixed_cost_layers,
                     layer_types=tuple(self.adapter.layer_types))

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
        strategy = self.resolve(strategy)
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
            head = out.logits.device  # the LM head's, under device_map="auto" not the inputs' (self.device)
            on_head, own = padded.to(head), own.to(head)
            total = torch.log_softmax(out.logits.float(), dim=-1)[0, on_head[:, 0]]  # [n], first tokens from prefill
            for step in range(1, width):
                out = decode_one_token(self.adapter, state, padded[:, step - 1], plan(strategy, self.num_layers, step),
                                       strategy.fill, early_exit=early)
                lp = torch.log_softmax(out.logits.float(), dim=-1).gather(1, on_head[:, step:step + 1])[:, 0]
                total += torch.where(own[:, step].to(lp.device), lp, torch.zeros_like(lp)).to(total.device)
        return total.tolist()

    def full_depth_logprobs(self, prompt: str, tokens: Sequence[int], chat_template: bool = True, *,
                            should_stop: Callable[[], bool] | None = None) -> torch.Tensor | None:
        """Full-depth next-token log-probs after the prompt and after each of `tokens`: float32 [len(tokens), vocab].
        None when `should_stop()` is true once the engine's lock is held (the pass may wait for it)."""
        ids, mask = self.encode([prompt], chat_template)
        full = torch.cat([ids, torch.tensor([list(tokens)], device=self.device)], dim=1)
        with self._lock, torch.inference_mode():
            if should_stop is not None and should_stop():
                return None
            logits = self.model(input_ids=full, attention_mask=torch.ones_like(full)).logits[0].float()
        start = ids.shape[1] - 1
        return torch.log_softmax(logits[start:start + len(tokens)], dim=-1)
