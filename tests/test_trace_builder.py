"""d3/trace_builder.py: each decode step becomes a TokenStep (cell codes, a JSON round trip of the whole trace)."""

from __future__ import annotations

from d3.config import D3Config, GenerationConfig, TraceConfig
from d3.trace import FILLED_COPY, RAN, Trace

GREEDY = GenerationConfig(max_new_tokens=24, stop_at_eos=False)
PROMPT = "hello world"


def test_grid_codes(tiny_engine):
    trace = tiny_engine.generate(PROMPT, D3Config(alpha=0.7, core_head=1, core_tail=1), GREEDY, TraceConfig())
    grid = trace.grid()
    assert grid.shape == (GREEDY.max_new_tokens, 6)
    assert (grid[0] == RAN).all() and (grid[-1] == FILLED_COPY).any()
    assert (grid == RAN).sum(axis=1).tolist() == trace.layers_used.tolist()


def test_trace_json_round_trip(tiny_engine):
    trace = tiny_engine.generate(PROMPT, D3Config(alpha=0.8, core_head=1, core_tail=1, fill="none"), GREEDY,
                                 TraceConfig(attention_layers=(2,)))
    back = Trace.from_json(trace.to_json())
    assert back.token_ids == trace.token_ids and (back.grid() == trace.grid()).all()
    assert back.steps[3].filled == trace.steps[3].filled
    frame = trace.to_frame()
    assert len(frame) == len(trace.steps) * 6 and set(frame["cell"]) >= {"ran", "hole (masked)"}
