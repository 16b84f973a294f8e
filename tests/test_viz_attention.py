"""viz/attention.py: one head's attention map per run, rows of tokens that skipped the layer filled grey, and key
labels a person can read."""

from __future__ import annotations

import numpy as np

from d3.config import D3Config, FullConfig, GenerationConfig, TraceConfig
from tests.figures import by_role
from viz.attention import SKIPPED_FILL, attention_map, key_labels


def test_rows_of_tokens_that_skipped_the_layer_are_filled_grey(tiny_engine) -> None:
    cfg = D3Config(alpha=0.93, core_head=1, core_tail=1)
    trace = tiny_engine.generate("the cat sat", cfg, GenerationConfig(max_new_tokens=12, stop_at_eos=False),
                                 TraceConfig(attention_layers=(1,)))
    skipped = [t for t, s in enumerate(trace.steps) if 1 not in s.layers_run]
    assert skipped and len(skipped) < len(trace.steps)
    grey = by_role(attention_map(trace, 1, 0), "skipped-rows")
    assert len(grey) == 1 and grey[0].colorscale[0][1] == SKIPPED_FILL
    z = np.asarray(grey[0].z, dtype=float)
    assert [t for t in range(len(z)) if np.isfinite(z[t]).all()] == skipped  # whole rows, exactly the skipped ones


def test_prompt_keys_read_like_generated_ones(tiny_engine) -> None:
    trace = tiny_engine.generate("the cat sat", D3Config(alpha=0.9, core_head=1, core_tail=1),
                                 GenerationConfig(max_new_tokens=3), TraceConfig(attention_layers=(0,)))
    trace = trace.__class__(**{**trace.__dict__, "prompt_stats": trace.prompt_stats.__class__(
        tokens=("Ġthe", "Ġcat", "Ċ"), stats={}, attention={})})
    assert key_labels(trace, 3, 3) == ["␣the", "␣cat", "⏎"]
    fig = attention_map(trace, 0, 0)
    assert fig.layout.xaxis.title.text == "key position"  # short: two panels' titles side by side do not collide


def test_attention_key_labels_are_thinned_so_they_do_not_overlap(tiny_engine) -> None:
    from d3.config import TraceConfig

    trace = tiny_engine.generate("the quick brown fox jumps over the lazy dog " * 3, FullConfig(),
                                 GenerationConfig(max_new_tokens=40), TraceConfig(attention_layers=(2,)))
    fig = attention_map(trace, 2, 0)
    ticks = fig.layout.xaxis.ticktext
    assert ticks is not None and len(ticks) <= 24  # about one label per 30 px of a 700 px wide panel
