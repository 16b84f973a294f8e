"""A quality signal that tells a paraphrase from a broken answer: full depth's probability of each D3 token on D3's
own text (teacher-forced), in the D3 pane's underline and legend and in the status line."""

from __future__ import annotations

import math

import numpy as np
import pytest

from d3.compare import compare
from d3.config import TRACE_OFF, D3Config, GenerationConfig
from explorer import views
from viz.stream import token_html


@pytest.fixture(scope="module")
def comparison(tiny_engine):
    return compare(tiny_engine, "hello there", D3Config(alpha=0.8, core_head=1, core_tail=1),
                   GenerationConfig(max_new_tokens=8), TRACE_OFF)


def test_full_logprob_is_full_depths_own_on_the_skip_text(tiny_engine, comparison):
    ref = tiny_engine.full_depth_logprobs("hello there", comparison.skip.token_ids)
    expected = ref.gather(1, ref.new_tensor(comparison.skip.token_ids, dtype=int)[:, None])[:, 0].numpy()
    np.testing.assert_allclose(comparison.full_logprob, expected, rtol=1e-5, atol=1e-5)
    assert math.isclose(comparison.full_perplexity(), float(np.exp(-expected.mean())), rel_tol=1e-6)
    s = comparison.summary()
    assert s["full_ppl_of_skip"] == comparison.full_perplexity() and s["full_ppl_of_full"] > 0


def test_the_pane_underlines_each_token_by_full_depths_probability_and_the_status_says_the_perplexity(comparison):
    probs = [0.9, 0.1, 0.001] + [0.5] * (len(comparison.skip.steps) - 3)
    html = token_html(comparison.skip, reference=comparison.full, full_prob=probs, full_ppl=3.25)
    assert html.count("d3-likely") == 1 + len(probs) - 3 and html.count("d3-possible") == 1
    assert html.count("d3-unlikely") == 1 and "perplexity 3.25" in html
    assert "d3-plausibility" not in token_html(comparison.skip, reference=comparison.full)  # not before it is known
    status = views.status_html(comparison.skip, comparison.full, "done", comparison=comparison)
    assert "Full-depth perplexity of D3's text" in status and f"{comparison.full_perplexity():.3g}"[:3] in status
