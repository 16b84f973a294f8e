"""Paired differences between two strategies on the same questions, with 95% intervals. numpy only.

Two strategies answering the same questions are compared question by question: the difference of their accuracies
is read from the discordant pairs (right under one, wrong under the other), which is far tighter than two
independent intervals. `exact_difference` is the exact conditional (McNemar) interval: given m discordant pairs, the
count b of those won by the second strategy is Binomial(m, p) and the difference is m * (2p - 1) / n, so a
Clopper-Pearson interval for p maps to one for the difference. `bootstrap_difference` resamples questions (seeded)
for any per-question score (agreement, same-answer rate, accuracy). Identical answers give a zero-width interval.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

LEVEL = 0.95


@dataclass(frozen=True)
class Difference:
    """second - first on the same n questions, and its interval (same units as the scores: a fraction for accuracy).

    won: questions the second gets right and the first wrong; lost: the reverse (accuracy only, else 0)."""

    diff: float
    low: float
    high: float
    n: int
    method: str
    won: int = 0
    lost: int = 0

    def to_dict(self) -> dict[str, float | int | str]:
        return {"diff": round(self.diff, 5), "low": round(self.low, 5), "high": round(self.high, 5), "n": self.n,
                "method": self.method, "won": self.won, "lost": self.lost}

    def points(self) -> str:
        """"-2.6 [-4.9, -0.6] pts": the difference and interval in percentage points."""
        return f"{100 * self.diff:+.1f} [{100 * self.low:+.1f}, {100 * self.high:+.1f}] pts"


def _paired(first: Sequence[float], second: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    a, b = np.asarray(first, dtype=float), np.asarray(second, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"paired scores must be two lists of the same length: got {a.shape} and {b.shape}")
    if a.size == 0:
        raise ValueError("paired scores are empty: a difference needs at least one question")
    return a, b


def _binom_tail(k: int, m: int, p: float, upper: bool) -> float:
    """P(X >= k) if upper else P(X <= k), X ~ Binomial(m, p), summed exactly in log space."""
    if p <= 0.0:
        return float(k <= 0) if upper else 1.0
    if p >= 1.0:
        return 1.0 if upper else float(k >= m)
    ks = range(k, m + 1) if upper else range(0, k + 1)
    logs = [math.lgamma(m + 1) - math.lgamma(j + 1) - math.lgamma(m - j + 1) + j * math.log(p) + (m - j) * math.log1p(-p)
            for j in ks]
    top = max(logs)
    return float(math.exp(top) * sum(math.exp(v - top) for v in logs))


def clopper_pearson(k: int, m: int, level: float = LEVEL) -> tuple[float, float]:
    """The exact (Clopper-Pearson) interval for a binomial proportion k/m, by bisection on the binomial tails."""
    if not 0 <= k <= m or m < 1:
        raise ValueError(f"successes must be between 0 and trials (>= 1): got {k} of {m}")
    tail = (1 - level) / 2

    def solve(f, target: float) -> float:  # f increasing in p
        lo, hi = 0.0, 1.0
        for _ in range(100):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if f(mid) < target else (lo, mid)
        return (lo + hi) / 2

    low = 0.0 if k == 0 else solve(lambda p: _binom_tail(k, m, p, upper=True), tail)
    high = 1.0 if k == m else solve(lambda p: -_binom_tail(k, m, p, upper=False), -tail)
    return low, high


def exact_difference(first: Sequence[bool], second: Sequence[bool], level: float = LEVEL) -> Difference:
    """Accuracy of `second` minus `first` on the same questions, with the exact conditional McNemar interval."""
    a, b = _paired(first, second)
    n = a.size
    won = int(np.sum((b > 0) & (a <= 0)))
    lost = int(np.sum((a > 0) & (b <= 0)))
    m = won + lost
    diff = (won - lost) / n
    if m == 0:
        return Difference(0.0, 0.0, 0.0, n, "exact McNemar", 0, 0)
    p_low, p_high = clopper_pearson(won, m, level)
    return Difference(diff, m * (2 * p_low - 1) / n, m * (2 * p_high - 1) / n, n, "exact McNemar", won, lost)


def bootstrap_difference(first: Sequence[float], second: Sequence[float], *, resamples: int = 2000, seed: int = 0,
                         level: float = LEVEL) -> Difference:
    """Mean of `second - first` over the same questions, with a seeded paired-bootstrap percentile interval."""
    a, b = _paired(first, second)
    d = b - a
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, d.size, size=(resamples, d.size))
    means = d[idx].mean(axis=1)
    tail = 100 * (1 - level) / 2
    low, high = np.percentile(means, [tail, 100 - tail])
    binary = set(np.unique(np.concatenate([a, b])).tolist()) <= {0.0, 1.0}
    won, lost = (int(np.sum(d > 0)), int(np.sum(d < 0))) if binary else (0, 0)
    return Difference(float(d.mean()), float(min(low, d.mean())), float(max(high, d.mean())), d.size,
                      f"paired bootstrap ({resamples}, seed {seed})", won, lost)


@dataclass(frozen=True)
class Rate:
    """A proportion k/n with its exact (Clopper-Pearson) 95% interval: e.g. the share of questions on which a
    setting states the same answer as full depth (its fidelity, which does not need full depth to be right)."""

    k: int
    n: int
    low: float
    high: float

    @property
    def rate(self) -> float:
        return self.k / self.n

    def to_dict(self) -> dict[str, float | int]:
        return {"rate": round(self.rate, 5), "low": round(self.low, 5), "high": round(self.high, 5), "same": self.k,
                "n": self.n}


def exact_rate(hits: Sequence[bool], level: float = LEVEL) -> Rate:
    """The share of True among `hits`, with its exact interval."""
    n, k = len(hits), int(sum(bool(h) for h in hits))
    if n == 0:
        raise ValueError("a rate needs at least one question")
    low, high = clopper_pearson(k, n, level)
    return Rate(k, n, low, high)


def median_interval(values: Sequence[float], level: float = LEVEL) -> tuple[float, float, float, float]:
    """(median, low, high, coverage): a distribution-free interval for the median from order statistics, the
    widest-coverage-first pair (x_(k), x_(n+1-k)) whose binomial coverage is at least `level` (8 values: min and
    max, 99.2%). Used for timing ratios, whose noise is not normal."""
    xs = sorted(float(v) for v in values)
    n = len(xs)
    if n < 6:
        raise ValueError(f"a median's {100 * level:.0f}% interval needs at least 6 values: got {n}")
    k, coverage = 1, 1 - 2 * 0.5 ** n
    while k + 1 <= n // 2:
        cov = 1 - 2 * _binom_tail(k, n, 0.5, upper=False)  # P(x_(k+1) <= median <= x_(n-k))
        if cov < level:
            break
        k, coverage = k + 1, cov
    return float(np.median(xs)), xs[k - 1], xs[n - k], coverage


def speed_flag(low: float, theory_fixed: float, theory_plain: float) -> str:
    """"" when a measured speedup's interval reaches its theoretical bound; else what it exceeds, beyond its
    interval: "above theory" (the lower end above the bound with no fixed cost, which no skipping of layers can
    beat: a timing artefact) or "above the LM-head bound" (above the bound that counts the LM head as fixed cost)."""
    if low > theory_plain + 1e-12:
        return "above theory"
    if low > theory_fixed + 1e-12:
        return "above the LM-head bound"
    return ""


def replication(bound: float, original: dict[str, Any], fresh: dict[str, Any]) -> str:
    """How a headline setting's fresh-seed difference from full depth reads against the bound it was chosen under:
    "replicates" (the fresh loss's 95% upper bound also within `bound`), "refuted" (a loss beyond `bound`,
    resolved: the fresh upper end below -bound), or "does not replicate" (neither). `original` only names
    whether the headline met the bound at all ("no headline to replicate" when it did not)."""
    if original["low"] < -bound - 1e-12:
        return "no headline to replicate"
    if fresh["low"] >= -bound - 1e-12:
        return "replicates"
    return "refuted" if fresh["high"] < -bound - 1e-12 else "does not replicate"
