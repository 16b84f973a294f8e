"""Trace building: every decode step's output becomes one `TokenStep` per sequence of a growing `Trace`."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from d3.config import TraceConfig
from d3.decoder import StepOutput
from d3.lens import lens_fields, read_logits
from d3.pieces import BYTE_FALLBACK, piece_text, token_bytes
from d3.schedule import LayerPlan
from d3.trace import PromptStats, TokenStep, Trace

PROMPT_ATTENTION_MAX = 256  # prompt x prompt attention is kept only for prompts up to this many tokens


def token_text(tokenizer: Any, ids: list[int], i: int) -> str:
    """Text that token i adds, decoded incrementally with a little left context: a byte-level piece that ends
    inside a multi-byte character adds nothing (its half decodes to U+FFFD), and the token that completes the
    character adds all of it."""
    return token_texts(tokenizer, ids, i)[0]


def token_texts(tokenizer: Any, ids: list[int], i: int) -> tuple[str, str]:
    """(the text token i adds, `token_text`; its piece): the piece is "" unless the token ends inside a multi-byte
    character, whose text shows at the token that completes it; then it is the token on its own (`piece_text`),
    e.g. " <0xF0><0x9F>" for the first two of an emoji's four bytes and a space."""
    if BYTE_FALLBACK.fullmatch(str(tokenizer.convert_ids_to_tokens(int(ids[i])) or "")):
        return _byte_texts(tokenizer, ids, i)
    lo = max(0, i - 8)
    written = tokenizer.decode(ids[lo:i], skip_special_tokens=False)
    before = written.rstrip("\ufffd")
    decoded = tokenizer.decode(ids[lo:i + 1], skip_special_tokens=False)
    after = decoded.rstrip("\ufffd")
    text = after[len(before):] if after.startswith(before) else piece_text(tokenizer, ids[i])
    # Earlier tokens' bytes that this token does not complete (the model wrote a character's first byte, then "/")
    # decode to U+FFFD in front of it: they are those tokens' own (their `piece`), not this token's ("�/", issue 44).
    dangling = len(written) - len(before)
    leading = len(text) - len(text.lstrip("\ufffd"))
    text = text[min(dangling, leading):]
    return text, piece_text(tokenizer, ids[i]) if decoded.endswith("\ufffd") else ""


def _byte_texts(tokenizer: Any, ids: list[int], i: int) -> tuple[str, str]:
    """`token_texts` of a byte-fallback token ("<0xF0>", Gemma's, Llama 2's), from the bytes themselves: a Hugging
    Face byte-fallback decoder turns a whole run of byte tokens into U+FFFD per byte when the run ends inside a
    character, so decoding with left context read a character completed earlier in the run as this token's (Gemma 3
    copying hieroglyphs wrote "<0xF0>" as text, then "𓀄𓀄" for one). The text is the characters this token's byte
    completes; earlier tokens' bytes that no token completed stay theirs (their `piece`)."""
    run = [i]
    while run[0] > 0 and len(run) < 8 and BYTE_FALLBACK.fullmatch(
            str(tokenizer.convert_ids_to_tokens(int(ids[run[0] - 1])) or "")):
        run.insert(0, run[0] - 1)
    data = b"".join(token_bytes(tokenizer, ids[j]) or b"" for j in run)
    text, pending = [], False
    at = 0
    while at < len(data):
        lead = data[at]
        size = 1 if lead < 0xC0 else 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4 if lead < 0xF8 else 1
        tail = data[at + 1:at + size]
        if any(b & 0xC0 != 0x80 for b in tail):  # not continued: a byte on its own, never a character
            size = 1
        if at + size > len(data):  # the character goes on past this token
            pending = True
            break
        if at + size == len(data):  # ends with this token's byte: a character, or a byte no character holds
            try:
                text.append(data[at:at + size].decode("utf-8"))
            except UnicodeDecodeError:
                pending = True  # shown by its bytes ("<0x93>"), never U+FFFD
        at += size
    return "".join(text), piece_text(tokenizer, ids[i]) if pending else ""


@dataclass
class _Row:
    """One sequence of the batch while it decodes."""

    pad: int  # left-padding positions, cut from this row's attention weights
    ids: list[int] = field(default_factory=list)
    steps: list[TokenStep] = field(default_factory=list)
    done: bool = False


class TraceBuilder:
    """Collects one `Trace` per prompt of a batch, a step at a time.

    headers: the empty Trace of each prompt (model, strategy, prompt text, core).
    ids, mask: the batch's left-padded prompt, [batch, prompt_len].
    stop_at_eos: a sequence stops recording steps at its first EOS (the batch keeps computing until all stop).
    """

    def __init__(self, headers: list[Trace], ids: torch.Tensor, mask: torch.Tensor, trace: TraceConfig,
                 tokenizer: Any, eos_ids: set[int], *, stop_at_eos: bool) -> None:
        self.headers, self.ids, self.mask, self.trace = headers, ids, mask, trace
        self.tokenizer, self.eos_ids, self.stop_at_eos = tokenizer, eos_ids, stop_at_eos
        self.rows = [_Row(pad=int((mask[b] == 0).sum())) for b in range(len(headers))]
        self.prompt_stats: list[PromptStats] = [PromptStats() for _ in headers]
        self.prefill_ms = 0.0
        self.num_layers = headers[0].num_layers

    def last_tokens(self) -> list[int]:
        """The token each sequence picked last (the input of the next decode step)."""
        return [r.ids[-1] for r in self.rows]

    def add(self, step: int, layer_plan: LayerPlan, picked: list[int], out: StepOutput, wall_ms: float) -> None:
        """Record step `step` (0 = the prefill's token): the plan it ran under, the picked tokens, the pass's output."""
        if step == 0:  # the prompt's prefill
            self.prompt_stats, self.prefill_ms = self._prompt_stats(out), wall_ms
        read = self._read(torch.log_softmax(out.logits, dim=-1), picked)
        for b, row in enumerate(self.rows):
            if row.done:
                continue
            row.ids.append(picked[b])
            row.steps.append(self._token_step(row, b, step, out, layer_plan.budget, read[b], wall_ms))
            row.done = self.stop_at_eos and picked[b] in self.eos_ids

    def finish_reason(self, step: int, limit: int) -> str:
        """"eos" when every sequence has stopped, "length" at the last step, else ""."""
        if self.stop_at_eos and all(r.done for r in self.rows):
            return "eos"
        return "length" if step == limit - 1 else ""

    def traces(self, finish: str) -> list[Trace]:
        return [h.with_steps(r.steps, prompt_stats=ps, finish_reason=finish, prefill_ms=self.prefill_ms)
                for h, r, ps in zip(self.headers, self.rows, self.prompt_stats)]

    def _prompt_stats(self, out: StepOutput) -> list[PromptStats]:
        """Full-depth statistics of each prompt, from the prefill's output."""
        stats = []
        for b in range(self.ids.shape[0]):
            real = self.ids[b][self.mask[b].bool()].tolist()
            tokens = tuple(self.tokenizer.convert_ids_to_tokens(real))
            per_layer = {name: values[b].numpy().copy() for name, values in out.stats.items()}
            attention = {}
            if len(real) <= PROMPT_ATTENTION_MAX:
                n = len(real)
                attention = {layer: a[b, :, -n:, -n:].to(torch.float16).numpy() for layer, a in out.attention.items()}
            stats.append(PromptStats(tokens=tokens, stats=per_layer, attention=attention))
        return stats

    def _read(self, logprobs: torch.Tensor, picked: list[int]) -> list[dict[str, Any]]:
        """Each row's log-prob of its picked token, entropy and top-k from log-probs [batch, vocab], computed for
        the whole batch on the logits' device and copied out together: a few device syncs per step, not per row."""
        chosen = logprobs.gather(1, torch.tensor(picked, device=logprobs.device)[:, None])[:, 0]  # [batch]
        if not self.trace.enabled:
            return [{"logprob": v} for v in chosen.tolist()]
        entropy = -(logprobs.exp() * logprobs).nan_to_num(0.0).sum(-1)  # [batch]
        rows = [{"logprob": v, "entropy": e} for v, e in torch.stack([chosen, entropy]).T.tolist()]
        if self.trace.top_k:
            top = logprobs.topk(self.trace.top_k, dim=-1)
            for row, values, ids in zip(rows, top.values.tolist(), top.indices.tolist()):
                row["topk"] = tuple((i, piece_text(self.tokenizer, i), math.exp(v)) for v, i in zip(values, ids))
        return rows

    def _token_step(self, row: _Row, b: int, step: int, out: StepOutput, planned: int, read: dict[str, Any],
                    wall_ms: float) -> TokenStep:
        token = row.ids[-1]
        extra: dict[str, Any] = dict(read)
        if out.stats and step > 0:  # step 0's statistics are the prompt's (prompt_stats)
            extra["stats"] = {name: values[b].numpy().copy() for name, values in out.stats.items()}
        if out.attention and step > 0:
            extra["attention"] = {layer: a[b, :, -1, row.pad:].to(torch.float16).numpy() for layer, a in out.attention.items()}
        if out.lens is not None:
            extra.update(lens_fields(self.tokenizer, self.num_layers, out.layers_run,
                                     *read_logits(out.lens[:, b], torch.full((len(out.layers_run),), token, device=out.lens.device))))
        if out.lens_states is not None:
            extra["lens_states"] = out.lens_states[:, b].numpy().copy()  # [n_ran, d_model]
        text, piece = token_texts(self.tokenizer, row.ids, len(row.ids) - 1)
        return TokenStep(step=step, token_id=token, text=text, piece=piece,
                         layers_run=out.layers_run, filled=out.filled, planned=planned,
                         entropy=extra.pop("entropy", float("nan")), wall_ms=wall_ms, seq=b,
                         confidence=out.confidence, exit_layer=out.exit_layer, **extra)
