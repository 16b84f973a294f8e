"""Each scenario's claim, and the page's default run, proven on the embedded SmolLM2-135M: a change of default
or of a scenario that breaks a lesson fails here. The controls are the page's own (scenario_controls,
model_defaults), parsed as a run parses them."""

from __future__ import annotations

import pytest

from d3.compare import compare
from d3.config import TRACE_OFF, D3Config, FullConfig
from d3.research.data import example_prompts
from d3.research.gentasks import answer_text
from d3.trace import token_agreement
from explorer.caps import Caps
from explorer.controls import Controls, model_defaults, parse_controls
from explorer.scenarios import scenario_controls
from tests.apphelpers import run_pair

pytestmark = pytest.mark.integration
MODEL = "smollm2-135m"
CAPS = Caps(max_new_tokens=64)


def _run(engine, key: str, step: int):
    values = {**scenario_controls(key, step, engine.num_layers, MODEL), "model": MODEL}
    c = Controls(**values)
    strategy, gen = parse_controls(c, engine.num_layers, CAPS)
    d3 = engine.generate(c.prompt, strategy, gen, TRACE_OFF, chat_template=c.chat_template)
    return c, strategy, gen, d3


@pytest.fixture(scope="module")
def full_answer(smol_engine):
    c, _, gen, _ = _run(smol_engine, "full_vs_d3", 0)
    full = smol_engine.generate(c.prompt, FullConfig(), gen, TRACE_OFF, chat_template=c.chat_template)
    assert answer_text(full.text) == "56"  # full depth answers the question
    return full


def test_full_vs_d3_keeps_the_answer_at_fewer_layers(smol_engine, full_answer):
    _, strategy, _, d3 = _run(smol_engine, "full_vs_d3", 0)
    assert strategy.drop_order == "calibrated"  # the page's measured order, not the paper's middle-out
    assert answer_text(d3.text) == "56" and d3.mean_layers < smol_engine.num_layers - 0.5
    assert token_agreement(full_answer.token_ids, d3.token_ids).agreement >= 0.9


def test_aggressive_alpha_loses_the_answer(smol_engine, full_answer):
    _, _, _, d3 = _run(smol_engine, "aggressive", 0)
    assert answer_text(d3.text) != "56"
    assert token_agreement(full_answer.token_ids, d3.token_ids).first_divergence <= 5


def test_the_core_keeps_the_answer_and_without_it_the_text_is_lost(smol_engine, full_answer):
    _, with_core, _, kept = _run(smol_engine, "core", 0)
    _, without, _, lost = _run(smol_engine, "core", 1)
    assert with_core.core(30) == (3, 3) and without.core(30) == (0, 0)
    assert answer_text(kept.text) == "56" and answer_text(lost.text) != "56"
    assert token_agreement(full_answer.token_ids, lost.token_ids).first_divergence <= 2
    assert (token_agreement(full_answer.token_ids, kept.token_ids).first_divergence or 99) > 10


def test_the_fills_differ_and_one_keeps_the_text_readable(smol_engine):
    c, strategy, gen, _ = _run(smol_engine, "fill", 0)
    ppl = {}
    texts = set()
    for fill in ("copy", "propagate", "none"):
        comparison = compare(smol_engine, c.prompt, strategy.with_(fill=fill), gen, TRACE_OFF,
                             chat_template=c.chat_template)
        ppl[fill] = comparison.full_perplexity()
        texts.add(comparison.skip.text)
    assert len(texts) >= 2  # the fills change what is written
    assert min(ppl.values()) <= 12  # one keeps the text readable to full depth
    assert max(ppl.values()) >= 3 * min(ppl.values())


PPL_FACTOR = 1.5  # full depth finds D3's text at most this much more perplexing than its own


def _answer_end(trace) -> int:
    """The token index where full depth's answer (its first sentence) ends."""
    text = ""
    for i, step in enumerate(trace.steps):
        text += step.text
        if ". " in text or text.endswith("."):
            return i
    return len(trace.steps)


def test_the_default_run_keeps_full_depths_meaning_while_running_fewer_layers(smol_engine):
    """The page opened on SmolLM2 and Generate pressed: the default prompt (chat text) with its chat-calibrated order
    at the page's α keeps full depth's meaning, measured, not by a keyword: full depth finds D3's whole answer at
    most PPL_FACTOR as perplexing as its own, and the two texts part only after full depth's answer (its first
    sentence). The order calibrated on arithmetic fails both on this prompt (1.8x, token 16: "reflects off the
    Earth's surface, creating the illusion of blue"), and so does the paper's literal middle-out."""
    c = model_defaults(MODEL).with_(prompt=example_prompts()[0].prompt, model=MODEL)
    strategy, gen = parse_controls(c, smol_engine.num_layers, CAPS)
    comparison = compare(smol_engine, c.prompt, strategy, gen, TRACE_OFF)
    d3, full = comparison.skip, comparison.full
    assert d3.mean_layers < smol_engine.num_layers - 1  # fewer layers: more than one saved per token on average
    assert comparison.full_perplexity() <= PPL_FACTOR * comparison.summary()["full_ppl_of_full"]
    assert comparison.first_divergence is None or comparison.first_divergence > _answer_end(full)
    arithmetic = model_defaults(MODEL, "arithmetic").with_(prompt=c.prompt, model=MODEL)
    wrong = compare(smol_engine, c.prompt, parse_controls(arithmetic, 30, CAPS)[0], gen, TRACE_OFF, full=None)
    assert wrong.full_perplexity() > PPL_FACTOR * wrong.summary()["full_ppl_of_full"] \
        or wrong.first_divergence <= _answer_end(full)  # the measure catches the wrong physics
    paper = c.with_(drop_order="middle_out")
    literal = smol_engine.generate(c.prompt, parse_controls(paper, 30, CAPS)[0], gen, TRACE_OFF)
    assert token_agreement(full.token_ids, literal.token_ids).first_divergence <= 3


@pytest.mark.integration
@pytest.mark.slow
def test_the_core_scenario_shows_what_its_text_claims(smol_engine) -> None:
    """Core 3 + 3 keeps D3 on full depth's text for longer than core 0 + 0 (first divergence and agreement), on the
    prompt the page opens with (measured: first divergence at token 9 against 1, agreement 0.31 against 0.06)."""
    from d3.research.data import example_prompts
    from explorer.scenarios import SCENARIOS, scenario_controls

    scenario = SCENARIOS["core"]
    results = []
    for step in range(len(scenario.runs)):
        controls = scenario_controls("core", step, 30)
        cfg = D3Config(alpha=controls["alpha"], core_head=controls["core_head"], core_tail=controls["core_tail"],
                       drop_order=controls["drop_order"])
        last = run_pair(smol_engine, cfg, tokens=32, prompt=example_prompts()[0].prompt)  # the page's first prompt
        results.append(last.comparison.summary())
    with_core, without = results
    assert with_core["first_divergence"] is None or without["first_divergence"] is not None
    assert (with_core["first_divergence"] or 99) > (without["first_divergence"] or 0) + 2
    assert with_core["agreement"] > without["agreement"] + 0.1
