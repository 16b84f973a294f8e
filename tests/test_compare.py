"""d3.compare: a skipping run against full depth on one prompt, stoppable between decode steps, with its measured
speedup."""

from __future__ import annotations

import math

from d3.compare import compare
from d3.config import D3Config, GenerationConfig, TRACE_OFF


def test_compare_measures_agreement_kl_and_the_speedup_with_its_interval(tiny_engine) -> None:
    comp = compare(tiny_engine, "hello there", D3Config(alpha=0.9), GenerationConfig(max_new_tokens=10), TRACE_OFF)
    assert comp is not None and len(comp.skip.steps) == len(comp.full.steps) == 10
    assert comp.kl_teacher.shape == (10,) and 0 <= comp.agreement <= 1
    sp = comp.speedup
    assert sp is not None and sp.steps == 9 and sp.low <= sp.ratio <= sp.high
    summary = comp.summary()
    assert summary["measured_speedup"] == sp.ratio and summary["speedup_resolvable"] == sp.resolvable


def test_compare_stops_between_steps_when_asked(tiny_engine) -> None:
    """should_stop is read before every decode step of every run compare makes: stopped after 3 reads, it has run
    at most 3 steps and returns no comparison (the page's Stop button and a closed tab rely on it)."""
    reads = []

    def should_stop() -> bool:
        reads.append(1)
        return len(reads) > 3

    comp = compare(tiny_engine, "hello there", D3Config(alpha=0.9), GenerationConfig(max_new_tokens=40), TRACE_OFF,
                   should_stop=should_stop)
    assert comp is None
    assert 4 <= len(reads) < 40  # far fewer reads than the 3 x 40 steps of an unstopped comparison


def test_compare_without_a_stop_reads_it_at_every_step(tiny_engine) -> None:
    reads = []
    comp = compare(tiny_engine, "hello there", D3Config(alpha=0.9), GenerationConfig(max_new_tokens=6), TRACE_OFF,
                   should_stop=lambda: reads.append(1) is not None)
    assert comp is not None and not math.isnan(comp.kl_teacher.mean())
    assert len(reads) >= 3 * 6  # full, skip and the teacher-forced run each read it every step
