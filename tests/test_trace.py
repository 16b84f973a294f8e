"""token_agreement on plain token id lists, and Comparison reading its agreement from it."""

from __future__ import annotations

import numpy as np
import pytest

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
