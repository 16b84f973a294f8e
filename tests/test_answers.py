"""d3.research.answers: the shared-prefix prefill and finished rows leaving the batch change no answer."""

from __future__ import annotations

import copy

import pytest
import torch

from d3.config import D3Config, FullConfig
from d3.decoder import decode_one_token, prefill
from d3.research.answers import PrefilledQuestions, shared_prefill
from d3.research.gentasks import get_generation_task
from d3.schedule import plan

SHOTS = list(range(5, 40))  # token ids every prompt begins with
PROMPTS = [SHOTS + [41, 42], SHOTS + [43], SHOTS + [44, 45, 46, 47], SHOTS + [48, 49, 50]]


@pytest.fixture(scope="module")
def wide_gemma(tiny_tok):
    """The tiny Gemma 3 with a sliding window (64) longer than the prompts and the steps decoded."""
    from d3.engine import Engine
    from tests.tiny import tiny_gemma3

    return Engine(tiny_gemma3(sliding_window=64), tiny_tok, name="tiny-gemma-wide")


@pytest.mark.parametrize("name", ["tiny_engine", "wide_gemma"])
def test_the_shared_prefix_prefill_equals_the_plain_one(name, request) -> None:
    """Same first logits and the same next steps' logits (full depth and D3) as prefilling every prompt whole."""
    engine = request.getfixturevalue(name)
    ids, mask = engine.encode(PROMPTS, chat_template=False)
    with torch.inference_mode():
        plain, first = prefill(engine.adapter, ids, mask)
        shared, ours = shared_prefill(engine.adapter, ids, mask)
        assert shared.attention_mask.shape[1] == len(SHOTS) + 4  # the prefix once, then the longest tail
        torch.testing.assert_close(ours.logits, first.logits, atol=1e-4, rtol=1e-4)
        last = first.logits.argmax(-1)
        for step, cfg in enumerate((FullConfig(), D3Config(alpha=0.6, core_head=1, core_tail=1)), start=1):
            layer_plan = plan(cfg, engine.num_layers, step)
            a = decode_one_token(engine.adapter, plain, last, layer_plan, cfg.fill)
            b = decode_one_token(engine.adapter, shared, last, layer_plan, cfg.fill)
            torch.testing.assert_close(b.logits, a.logits, atol=1e-4, rtol=1e-4)
            last = a.logits.argmax(-1)


def test_prompts_without_a_shared_prefix_or_within_a_short_window_are_prefilled_whole(tiny_engine, tiny_gemma) -> None:
    """No shared prefix; or a sliding window (the tiny Gemma's 4) that padding in the middle would shift."""
    for engine, prompts in ((tiny_engine, [[5, 6, 7], [8, 9]]), (tiny_gemma, PROMPTS)):
        ids, mask = engine.encode(prompts, chat_template=False)
        with torch.inference_mode():
            state, out = shared_prefill(engine.adapter, ids, mask)
            _, first = prefill(engine.adapter, ids, mask)
        assert torch.equal(state.attention_mask, mask) and torch.equal(out.logits, first.logits)


def test_rows_kept_decode_as_they_did_in_the_whole_batch(tiny_engine) -> None:
    """DecodeState.keep drops rows from the cache and masks; the rows left decode exactly as before."""
    ids, mask = tiny_engine.encode(PROMPTS, chat_template=False)
    cfg = D3Config(alpha=0.6, core_head=1, core_tail=1)
    with torch.inference_mode():
        state, out = prefill(tiny_engine.adapter, ids, mask)
        kept = copy.deepcopy(state)
        rows = torch.tensor([0, 2])
        kept.keep(rows)
        last = out.logits.argmax(-1)
        for step in (1, 2, 3):
            layer_plan = plan(cfg, tiny_engine.num_layers, step)
            whole = decode_one_token(tiny_engine.adapter, state, last, layer_plan, cfg.fill)
            part = decode_one_token(tiny_engine.adapter, kept, last[rows], layer_plan, cfg.fill)
            torch.testing.assert_close(part.logits, whole.logits[rows], atol=1e-5, rtol=1e-5)
            last = whole.logits.argmax(-1)
    assert kept.cache.layers[0].keys.shape[0] == 2 and kept.attention_mask.shape[0] == 2


def test_held_and_recomputed_prefills_answer_alike(tiny_engine) -> None:
    """keep=False (only the shots' prefix held, each batch's tails run again per answer) gives the same answers."""
    task = get_generation_task("gen_1_digit_addition")
    questions = task.split("test")[:5]
    held = PrefilledQuestions(tiny_engine, task, questions, batch=2)
    again = PrefilledQuestions(tiny_engine, task, questions, batch=2, keep=False)
    for cfg in (FullConfig(), D3Config(alpha=0.6, core_head=1, core_tail=1)):
        a, b = held.answer(cfg), again.answer(cfg)
        assert (a.texts, a.correct, a.tokens) == (b.texts, b.correct, b.tokens)
