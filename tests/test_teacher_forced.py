"""d3/teacher_forced.py: one parallel pass that reads a removal's log-probs over forced continuations. Checked
against a separate computation: the model's own forward over prompt + continuation, with each removed layer made
the identity on the continuation's positions only (by a forward hook), which is what D3's decode does when no
generated token runs those layers."""

from __future__ import annotations

import math

import pytest
import torch

from d3.adapter import Adapter
from d3.teacher_forced import TeacherForced
from d3.testing import tiny_llama
from tests.tiny import tiny_gemma3

PROMPTS = [[5, 17, 3, 42], [8, 23]]  # left padded against each other
CONTS = [[11, 9, 30], [4, 4, 7, 19, 2]]  # right padded


def reference(model, prompt: list[int], cont: list[int], removed: set[int]) -> torch.Tensor:
    """log-probs [len(cont), vocab] predicting after each continuation position, removed layers skipped there."""
    P = len(prompt)

    def identity_on_continuation(module, args, output):
        out = output[0] if isinstance(output, tuple) else output
        out = torch.cat([out[:, :P], args[0][:, P:]], dim=1)
        return (out, *output[1:]) if isinstance(output, tuple) else out

    hooks = [model.model.layers[i].register_forward_hook(identity_on_continuation) for i in removed]
    try:
        with torch.inference_mode():
            logits = model(torch.tensor([prompt + cont])).logits[0, P:].float()
    finally:
        for h in hooks:
            h.remove()
    return torch.log_softmax(logits, dim=-1)


@pytest.fixture(scope="module", params=["llama", "gemma3"])
def forced(request):
    model = (tiny_llama(6) if request.param == "llama" else tiny_gemma3()).eval()
    return model, TeacherForced(Adapter(model), PROMPTS, CONTS, targets=[c[1:] for c in CONTS])


@pytest.mark.parametrize("removed", [(), (2,), (3, 1), (1, 2, 4)])
def test_a_removals_log_probs_equal_the_models_forward_with_those_layers_skipped_after_the_prompt(forced, removed) -> None:
    model, tf = forced
    logp = tf.logprobs(removed)
    for row, (prompt, cont) in enumerate(zip(PROMPTS, CONTS)):
        expected = reference(model, prompt, cont, set(removed))
        torch.testing.assert_close(logp[row, :len(cont)], expected, rtol=1e-4, atol=1e-4)


def test_greedy_steps_share_a_removal_and_still_read_each_candidate_right(forced) -> None:
    """The pass reuses the previous removal's residuals (the greedy search's shared prefix); reading (1,), then
    (1, 3), then (1, 2) in a row gives what each gives alone."""
    model, tf = forced
    for removed in [(1,), (1, 3), (1, 2)]:
        expected = reference(model, PROMPTS[0], CONTS[0], set(removed))
        torch.testing.assert_close(tf.logprobs(removed)[0, :len(CONTS[0])], expected, rtol=1e-4, atol=1e-4)


def test_scores_count_only_the_targets_positions(forced) -> None:
    """Agreement is the share of scored positions whose top-1 is the target; nll the targets' mean NLL; full depth
    has no KL from itself."""
    model, tf = forced
    removed = (2,)
    hits, nll, n = 0, 0.0, 0
    for prompt, cont in zip(PROMPTS, CONTS):
        logp = reference(model, prompt, cont, set(removed))
        for t, target in enumerate(cont[1:]):
            hits += int(logp[t].argmax() == target)
            nll -= float(logp[t, target])
            n += 1
    assert tf.score(removed, "agreement").value == pytest.approx(hits / n)
    assert tf.score(removed, "nll").value == pytest.approx(nll / n, rel=1e-4)
    assert tf.score((), "agreement").kl == pytest.approx(0.0, abs=1e-6) and tf.score(removed, "nll").kl > 0
    assert not math.isnan(tf.score(removed, "agreement").kl)


def test_empty_prompts_or_continuations_are_refused() -> None:
    adapter = Adapter(tiny_llama(2))
    with pytest.raises(ValueError, match="non-empty"):
        TeacherForced(adapter, [[1, 2], []], [[3], [4]], [[], []])
    with pytest.raises(ValueError, match="non-empty"):
        TeacherForced(adapter, [[1, 2]], [[]], [[]])


@pytest.mark.parametrize("reference", ["summary", "kept", "read out"],
                         ids=["linear head's summary", "reference kept", "reference read out again"])
@pytest.mark.parametrize("removed", [(), (2,), (3, 1)])
def test_a_score_read_a_chunk_at_a_time_equals_one_over_the_whole_log_probs(forced, removed, reference, monkeypatch) -> None:
    """Scores are read two positions at a time (Gemma 3's vocabulary would make [B, T, vocab] gigabytes). Full
    depth is held as what KL needs under a linear head (sum p log p, pW, pb per position), or, for a head that
    is not linear (a capped one), as its log-probs, kept or read out again: the same agreement, NLL and KL as
    over the whole tensors, every way."""
    import d3.teacher_forced as tf_module

    model, whole = forced
    vocab = model.lm_head.out_features
    monkeypatch.setattr(tf_module, "CHUNK_ELEMENTS", 2 * vocab)
    monkeypatch.setattr(tf_module, "KEPT_REFERENCE_ELEMENTS", 10**9 if reference == "kept" else 0)
    adapter = Adapter(model)
    if reference != "summary":
        monkeypatch.setattr(adapter, "linear_head", lambda: None)
    tf = TeacherForced(adapter, PROMPTS, CONTS, targets=[c[1:] for c in CONTS])
    assert tf._chunk == 2 and (tf._reference is not None) == (reference == "kept")
    assert (tf._head is not None) == (reference == "summary")
    m, full, ours = tf.scored, whole.logprobs(()), whole.logprobs(removed)
    kl = (full.exp() * (full - ours)).sum(-1).clamp_min(0)[m].mean().item()
    agreement = (ours.argmax(-1) == tf.target_ids)[m].float().mean().item()
    nll = -ours.gather(-1, tf.target_ids[..., None])[..., 0][m].mean().item()
    for metric, value in (("agreement", agreement), ("nll", nll)):
        score = tf.score(removed, metric)
        assert score.value == pytest.approx(value, abs=1e-5) and score.kl == pytest.approx(kl, abs=1e-6)


SHOTS = [7, 31, 12, 5, 40, 22, 9, 14, 3, 28]  # a shared prefix of 10 tokens, as few-shot questions begin
SHARED_PROMPTS = [SHOTS + [6, 18, 2], SHOTS + [25], SHOTS + [11, 4]]
SHARED_CONTS = [[13, 8, 21], [16, 2, 2, 30], [19]]


@pytest.mark.parametrize("family,window,shared", [("llama", None, True), ("gemma3", 64, True), ("gemma3", 4, False)],
                         ids=["llama", "gemma3", "gemma3 window 4"])
def test_prompts_that_begin_alike_run_their_prefix_once_and_read_the_same(family, window, shared) -> None:
    """Few-shot prompts run their common prefix once (`shared_prefill`: the padding then sits between prefix and
    tail); where a sliding window is shorter than prompt and continuation, they run whole, left padded. Either
    way a removal's log-probs are the model's own forward with those layers skipped after the prompt."""
    model = (tiny_llama(6) if family == "llama" else tiny_gemma3(sliding_window=window)).eval()
    tf = TeacherForced(Adapter(model), SHARED_PROMPTS, SHARED_CONTS, targets=[c[1:] + [1] for c in SHARED_CONTS])
    row = tf.mask[1].tolist()  # shared: [prefix, padding, the tail, the continuation]; else [padding, prompt, ...]
    if shared:
        assert row[:len(SHOTS)] == [1] * len(SHOTS) and 0 in row[len(SHOTS):] and row[-1] == 1
    else:
        assert row[0] == 0 and 0 not in row[row.index(1):]
    for removed in [(), (2,), (3, 1)]:
        logp = tf.logprobs(removed)
        for k, (prompt, cont) in enumerate(zip(SHARED_PROMPTS, SHARED_CONTS)):
            expected = reference(model, prompt, cont, set(removed))
            torch.testing.assert_close(logp[k, :len(cont)], expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("model_type", ["llama", "granite", "cohere", "gemma2", "gemma3_text"])
def test_a_heads_logits_are_its_scaled_product_where_it_is_linear(model_type) -> None:
    """`linear_head` (what the KL summary relies on) reproduces `logits` exactly where it claims to; a capped
    head (Gemma 2) claims nothing; Gemma 3 ships without a cap."""
    from d3.testing import tiny_family_model

    model = tiny_family_model(model_type)
    adapter = Adapter(model)
    head = adapter.linear_head()
    if getattr(model.config, "final_logit_softcapping", None):
        assert head is None
        return
    weight, bias, scale = head
    hidden = torch.randn(5, model.config.hidden_size)
    with torch.inference_mode():
        product = scale * (adapter.final_norm(hidden) @ weight.T + (bias if bias is not None else 0))
        torch.testing.assert_close(adapter.logits(hidden), product, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- forced_replies: a strategy's decode in one pass


def _forced_strategies():
    from d3.config import D3Config, EarlyExitConfig, FullConfig, SkipDecodeConfig, UnifiedConfig

    return [FullConfig(), D3Config(alpha=0.8, core_head=1, core_tail=1),
            D3Config(alpha=0.8, core_head=1, core_tail=1, drop_order="calibrated", layer_order=(3, 1, 4, 2)),
            D3Config(alpha=0.75, drop_order="middle_out"), D3Config(alpha=0.8, drop_order="bottom_up"),
            D3Config(alpha=0.7, start=3), D3Config(alpha=0.8, fill="propagate"), D3Config(alpha=0.8, fill="copy_any_type"),
            SkipDecodeConfig(max_layers=4, min_layers=2, horizon=8), UnifiedConfig(ratio=2.0),
            EarlyExitConfig(threshold=0.02, min_layers=2), EarlyExitConfig(threshold=0.02, min_layers=2, fill="copy")]


FORCED_PROMPTS = ["hello there", "a", "the quick brown fox jumps", "zz top 42, and more"]


@pytest.mark.parametrize("cfg", _forced_strategies(), ids=lambda c: c.describe())
def test_a_strategys_forced_picks_over_its_own_replies_are_its_replies(tiny_engine, cfg) -> None:
    """Every strategy of the study, forced over the reply its own decode wrote (one prompt at a time: early exit
    decides per batch), picks every token of it and reports the layers each ran; early exit's exits are read per
    position."""
    from d3.research.realwork import answer_batch
    from d3.teacher_forced import forced_replies

    replies = [answer_batch(tiny_engine, [p], cfg, 20)[0] for p in FORCED_PROMPTS]
    prompts = [tiny_engine.encode([p], chat_template=False)[0][0].tolist() for p in FORCED_PROMPTS]
    forced = forced_replies(tiny_engine.adapter, prompts, [list(r.ids) for r in replies], tiny_engine.resolve(cfg))
    for f, r in zip(forced, replies):
        assert f.predicted == r.ids and f.first_change(r.ids) is None
        assert f.layers == r.layers
    if type(cfg).__name__ != "FullConfig":
        assert any(min(r.layers) < tiny_engine.num_layers for r in replies)  # something was skipped


@pytest.mark.parametrize("cfg", _forced_strategies()[1:], ids=lambda c: c.describe())
def test_forced_over_full_depths_replies_a_strategy_leaves_them_where_its_own_decode_does(tiny_engine, cfg) -> None:
    """The shortcut: forced over full depth's replies, a strategy picks full depth's token up to the first position
    where its own free decode differs, and there picks its own decode's token; where it never differs the replies are
    the same."""
    from d3.config import FullConfig
    from d3.research.realwork import answer_batch, first_change
    from d3.teacher_forced import forced_replies

    full = answer_batch(tiny_engine, FORCED_PROMPTS, FullConfig(), 20)
    own = [answer_batch(tiny_engine, [p], cfg, 20)[0] for p in FORCED_PROMPTS]
    prompts = [tiny_engine.encode([p], chat_template=False)[0][0].tolist() for p in FORCED_PROMPTS]
    forced = forced_replies(tiny_engine.adapter, prompts, [list(r.ids) for r in full], tiny_engine.resolve(cfg))
    changed = 0
    for f, a, b in zip(forced, full, own):
        k = first_change(a.ids, b.ids)
        if k is None or k >= len(a.ids):  # the same reply (or full depth's, ended, is a prefix of the other's: no)
            assert f.first_change(a.ids) is None and a.ids == b.ids
        else:
            changed += 1
            assert f.first_change(a.ids) == k and f.predicted[k] == b.ids[k]
    assert changed  # the tiny model's replies do change under these settings


def test_forced_replies_refuses_what_it_does_not_read(tiny_engine) -> None:
    from d3.config import D3Config, SkipDecodeConfig
    from d3.teacher_forced import forced_replies

    with pytest.raises(ValueError, match="none fill"):
        forced_replies(tiny_engine.adapter, [[1, 2]], [[3, 4]], D3Config(alpha=0.5, fill="none"))
    with pytest.raises(ValueError, match="above it"):
        forced_replies(tiny_engine.adapter, [[1, 2]], [[3, 4, 5]], SkipDecodeConfig(max_layers=4, min_layers=2, warmup=0))
    with pytest.raises(ValueError, match="non-empty"):
        forced_replies(tiny_engine.adapter, [[1, 2]], [[]], D3Config(alpha=0.5))


def test_one_prefill_serves_every_strategy_read_from_it(tiny_engine) -> None:
    """`held`: the prompts' prefill, read by several strategies in turn, is left as it was: each reads what it
    reads from a prefill of its own."""
    from d3.config import D3Config, EarlyExitConfig
    from d3.teacher_forced import forced_replies, prefill_prompts

    ids, mask = tiny_engine.encode(FORCED_PROMPTS, chat_template=False)
    prompts = [row[m.bool()].tolist() for row, m in zip(ids, mask)]
    replies = [[5, 9, 11, 3, 7], [2, 4], [8, 8, 8, 1, 2, 3, 4], [6]]
    held = prefill_prompts(tiny_engine.adapter, ids, mask)
    cfgs = [D3Config(alpha=0.7), EarlyExitConfig(threshold=0.02, min_layers=2), D3Config(alpha=0.7, drop_order="bottom_up")]
    shared = [forced_replies(tiny_engine.adapter, prompts, replies, c, held=held) for c in cfgs]
    alone = [forced_replies(tiny_engine.adapter, prompts, replies, c) for c in cfgs]
    for a, b in zip(shared, alone):
        assert [f.predicted for f in a] == [f.predicted for f in b] and [f.layers for f in a] == [f.layers for f in b]
        assert [len(f.margin) for f in a] == [len(r) for r in replies]
