"""token_agreement on plain token id lists, and Comparison reading its agreement from it."""

from __future__ import annotations

import json

import numpy as np
import pytest

from d3.config import FullConfig, GenerationConfig
from d3.trace import Agreement, Comparison, TokenStep, Trace, token_agreement


@pytest.mark.parametrize("a, b, expected", [
    ([5, 6, 7], [5, 6, 7], Agreement(compared=3, agreeing=3, first_divergence=None)),
    ([1, 6, 7], [2, 6, 7], Agreement(compared=3, agreeing=2, first_divergence=0)),
    ([5, 6, 7, 8], [5, 9], Agreement(compared=2, agreeing=1, first_divergence=1)),
    ([5, 6], [5, 6, 7, 8], Agreement(compared=2, agreeing=2, first_divergence=None)),
    ([], [5, 6], Agreement(compared=0, agreeing=0, first_divergence=None)),
    ([], [], Agreement(compared=0, agreeing=0, first_divergence=None)),
    ((3, 4, 0, 0), [3, 4, 1, 0], Agreement(compared=4, agreeing=3, first_divergence=2)),
])
def test_token_agreement(a: list[int], b: list[int], expected: Agreement) -> None:
    assert token_agreement(a, b) == expected


def test_agreement_fraction() -> None:
    assert token_agreement([1, 2, 3, 4], [1, 2, 0, 4]).agreement == pytest.approx(0.75)
    assert token_agreement([1, 2], [3, 4]).agreement == 0.0
    assert token_agreement([], [1]).agreement == 1.0  # nothing compared: nothing disagrees


def _trace(ids: list[int]) -> Trace:
    steps = tuple(TokenStep(step=i, token_id=t, text=str(t), layers_run=(0, 1), filled=(), planned=2, entropy=0.0,
                            wall_ms=1.0) for i, t in enumerate(ids))
    return Trace(model="m", num_layers=2, strategy={"strategy": "full"}, prompt="p", core=(1, 1), steps=steps)


def test_comparison_reads_agreement_from_its_traces() -> None:
    full, skip = _trace([1, 2, 3, 4, 5]), _trace([1, 2, 9, 4])
    empty = np.zeros(0)
    comp = Comparison(full=full, skip=skip, agree=np.array([True, True, False, True]), kl_teacher=empty,
                      kl_free=empty, kv_error=np.zeros((0, 2)), filled_mask=np.zeros((0, 2), bool))
    assert comp.tokens == Agreement(compared=4, agreeing=3, first_divergence=2)
    assert comp.first_divergence == 2
    assert comp.agreement == pytest.approx(0.75)
    assert comp.summary()["first_divergence"] == 2


def _timed(ms: list[float], layers: int = 2) -> Trace:
    steps = tuple(TokenStep(step=i, token_id=1, text="x", layers_run=tuple(range(layers)), filled=(), planned=layers,
                            entropy=0.0, wall_ms=m) for i, m in enumerate(ms))
    return Trace(model="m", num_layers=4, strategy={"strategy": "d3"}, prompt="p", core=(1, 1), steps=steps)


def test_a_speedup_that_noise_cannot_tell_from_one_says_so() -> None:
    from d3.trace import measured_speedup

    rng = np.random.default_rng(3)
    full = _timed(list(10 + rng.normal(0, 2, 40)), layers=4)
    skip = _timed(list(10 + rng.normal(0, 2, 40)), layers=3)  # same cost, 4/3 theoretical
    sp = measured_speedup(skip, full)
    assert sp is not None and sp.steps == 39 and sp.low < 1 < sp.high and not sp.resolvable
    assert sp.theoretical == pytest.approx(4 / 3)
    assert sp.describe() == "too small to measure here: theoretical 1.33x"


def test_a_real_speedup_is_measured_with_an_interval_around_it() -> None:
    from d3.trace import measured_speedup

    rng = np.random.default_rng(4)
    full = _timed(list(20 + rng.normal(0, 1, 30)), layers=4)
    skip = _timed(list(10 + rng.normal(0, 1, 30)), layers=2)
    sp = measured_speedup(skip, full)
    assert sp is not None and sp.resolvable and sp.low <= sp.ratio <= sp.high and 1.6 < sp.ratio < 2.4
    assert sp.describe().startswith(f"{sp.ratio:.2f}x measured (95% ")


def test_full_depth_against_itself_is_one_with_an_interval_of_zero_width() -> None:
    from d3.trace import measured_speedup

    full = _timed([5.0, 7.0, 6.0, 9.0, 8.0, 6.5], layers=4)
    sp = measured_speedup(full, full)
    assert sp is not None and sp.ratio == 1.0 and sp.low == sp.high == 1.0 and not sp.resolvable


def test_too_few_steps_measure_no_speedup() -> None:
    from d3.trace import measured_speedup

    assert measured_speedup(_timed([1, 1, 1, 1]), _timed([2, 2, 2, 2])) is None
    assert measured_speedup(None, _timed([2] * 9)) is None


def test_prefill_time_is_in_the_trace_and_its_json(tiny_engine) -> None:
    trace = tiny_engine.generate("hello", FullConfig(), GenerationConfig(max_new_tokens=3))
    assert trace.prefill_ms > 0 and trace.prefill_ms == pytest.approx(trace.steps[0].wall_ms)
    assert json.loads(trace.to_json())["prefill_ms"] == trace.prefill_ms
