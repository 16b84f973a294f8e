"""Fit D3's decay to the depth each token needs (the oracle's output). Pure numpy: no torch, no model.

Needs are per-prompt lists of ints (position i = generated token i). A schedule's budgets are D3's own
(`d3.schedule.d3_budget`, step 0 at full depth because the prefill produces it), computed here for a whole
grid of (alpha, start) at once; a test checks them against `d3.schedule.budgets`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from d3.config import D3Config
from d3.schedule import budgets
from d3.trace import prediction_depth as trace_prediction_depth

Needs = Sequence[Sequence[int]]  # one list per prompt, one int per generated token

# Decay rates searched by both fits: coarse below 0.9, dense near 1 where D3's interesting settings live.
ALPHA_GRID: np.ndarray = np.unique(np.round(np.concatenate([
    np.linspace(0.5, 0.9, 41), np.linspace(0.9, 0.999, 100), 1 - np.geomspace(0.1, 1e-5, 400), [1.0]]), 7))
PAPER_ALPHAS: tuple[float, ...] = (0.99, 0.995, 0.999)  # the paper's interesting range (METHOD.md)


@dataclass(frozen=True)
class Fit:
    """One fitted schedule: its alpha and start, and how it serves the measured needs.

    rmse: root mean squared difference between budget and need (layers). mean_budget: layers per token.
    underserved: fraction of tokens whose budget is below their need.
    """

    method: str
    alpha: float
    start: int
    rmse: float
    mean_budget: float
    underserved: float
    theoretical_speedup: float

    def to_dict(self) -> dict[str, float | int | str]:
        return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in asdict(self).items()}

    def config(self, base: D3Config = D3Config()) -> D3Config:
        return base.with_(alpha=self.alpha, start=self.start)  # type: ignore[return-value]


def _as_rows(needs: Needs) -> list[np.ndarray]:
    rows = [np.asarray(r, dtype=np.int64) for r in needs]
    if not rows or all(len(r) == 0 for r in rows):
        raise ValueError("needs is empty: give at least one prompt with at least one generated token")
    return rows


def flat_needs(needs: Needs) -> tuple[np.ndarray, np.ndarray]:
    """(positions, needs) of every token of every prompt, both int [N]."""
    rows = _as_rows(needs)
    return np.concatenate([np.arange(len(r)) for r in rows]), np.concatenate(rows)


def budget_grid(alphas: np.ndarray, starts: np.ndarray, num_layers: int, steps: int, floor: int) -> np.ndarray:
    """int [len(alphas), len(starts), steps]: D3's budget per (alpha, start, step), as `d3.schedule` plans it."""
    decay = np.maximum(0, np.arange(steps)[None, :] - starts[:, None])  # [S, steps]
    raw = np.floor(num_layers * np.power(alphas[:, None, None], decay[None]) + 1e-9)  # same epsilon as d3_budget
    out = np.clip(raw, max(floor, 1), num_layers).astype(np.int64)
    out[..., 0] = num_layers  # the first token comes out of the full-depth prefill
    return out


def schedule_budgets(cfg: D3Config, num_layers: int, steps: int) -> np.ndarray:
    """int [steps]: D3's planned layers per step for `cfg` (`d3.schedule.budgets`)."""
    return np.asarray(budgets(cfg, num_layers, steps), dtype=np.int64)


def underserved_fraction(needs: Needs, cfg: D3Config, num_layers: int) -> float:
    """The fraction of tokens whose D3 budget under `cfg` is below the depth they need."""
    pos, need = flat_needs(needs)
    cfg.check_layers(num_layers)
    return float(np.mean(schedule_budgets(cfg, num_layers, int(pos.max()) + 1)[pos] < need))


def judge(needs: Needs, cfg: D3Config, num_layers: int) -> dict[str, float]:
    """How D3 under `cfg` serves the needs: under-served fraction, mean budget per token, theoretical speedup."""
    pos, need = flat_needs(needs)
    cfg.check_layers(num_layers)
    b = schedule_budgets(cfg, num_layers, int(pos.max()) + 1)[pos]
    return {"alpha": cfg.alpha, "start": cfg.start, "underserved_fraction": float(np.mean(b < need)),
            "mean_budget": float(b.mean()), "theoretical_speedup": num_layers / float(b.mean())}


def _grid_scores(pos: np.ndarray, need: np.ndarray, grid: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per (alpha, start): squared error sum, under-served count and budget sum, each [A, S].

    Tokens are summarised per position first (count, sum and sum of squares of need, and how many need more
    than each budget), so the work is [A, S, steps], not [A, S, tokens]."""
    steps, top = grid.shape[-1], int(max(grid.max(), need.max())) + 1
    count = np.bincount(pos, minlength=steps).astype(np.float64)  # [steps]
    s1 = np.bincount(pos, weights=need, minlength=steps)
    s2 = np.bincount(pos, weights=need.astype(np.float64) ** 2, minlength=steps)
    at = np.zeros((steps, top + 1), dtype=np.int64)  # at[p, v]: tokens at position p that need v layers
    np.add.at(at, (pos, need), 1)
    above = at[:, ::-1].cumsum(1)[:, ::-1] - at  # above[p, v]: tokens at p that need more than v
    b = grid.astype(np.float64)
    sse = (count * b ** 2 - 2 * s1 * b + s2).sum(-1)
    under = above[np.arange(steps), grid].sum(-1)  # above[p, budget at p] summed over p
    return sse, under.astype(np.float64), (count * b).sum(-1)


def _fit(method: str, alphas: np.ndarray, starts: np.ndarray, a: int, s: int, sse: np.ndarray, under: np.ndarray,
         total: np.ndarray, n: int, num_layers: int) -> Fit:
    mean = float(total[a, s]) / n
    return Fit(method=method, alpha=float(alphas[a]), start=int(starts[s]), rmse=float(np.sqrt(sse[a, s] / n)),
               mean_budget=mean, underserved=float(under[a, s]) / n, theoretical_speedup=num_layers / mean)


def fit_alpha(needs: Needs, num_layers: int, *, core: tuple[int, int], k: float = 0.10, start: int | None = None,
              alphas: np.ndarray = ALPHA_GRID) -> dict[str, Fit]:
    """Both fits of floor(L * alpha ** (i - start)) (clamped at the core floor) to the needs.

    "least_squares": the (alpha, start) whose budgets are closest to the needs in squared layers; every start
    from 0 to the longest answer is searched when `start` is None.
    "coverage": the smallest alpha (the fastest schedule) that under-serves at most a fraction `k` of the
    tokens, at `start` (0 when None): searching start too would let a cliff (full depth, then the floor for
    the last k% of tokens) win.
    """
    if not 0 <= k <= 1:
        raise ValueError(f"k={k!r} is not allowed: k must be a fraction in [0, 1]")
    pos, need = flat_needs(needs)
    steps = int(pos.max()) + 1
    alphas = np.asarray(alphas, dtype=np.float64)
    start_grid = np.arange(steps + 1) if start is None else np.array([start], dtype=np.int64)
    sse, under, total = _grid_scores(pos, need, budget_grid(alphas, start_grid, num_layers, steps, sum(core)))
    n = len(need)
    a, s = _roundest(sse, alphas, start_grid)
    fits = {"least_squares": _fit("least_squares", alphas, start_grid, a, s, sse, under, total, n, num_layers)}
    fixed = np.array([start or 0], dtype=np.int64)
    sse, under, total = _grid_scores(pos, need, budget_grid(alphas, fixed, num_layers, steps, sum(core)))
    # Budgets only grow with alpha, so the feasible alphas are those above a threshold; alpha 1 always is.
    a, s = _roundest(np.where(under <= k * n + 1e-9, total, np.inf), alphas, fixed)
    fits["coverage"] = _fit("coverage", alphas, fixed, a, s, sse, under, total, n, num_layers)
    return fits


def _roundest(score: np.ndarray, alphas: np.ndarray, starts: np.ndarray) -> tuple[int, int]:
    """The (alpha, start) indices of the lowest score. Budgets are floors, so a range of settings can give the
    same schedule: then the smallest start, the alpha with the fewest decimals, and the smallest alpha."""
    ties = np.argwhere(score <= score.min() + 1e-9)
    return min(((int(a), int(s)) for a, s in ties), key=lambda t: (starts[t[1]], len(repr(float(alphas[t[0]]))), alphas[t[0]]))


def prediction_depth(lens_top1: np.ndarray, final_top1: np.ndarray) -> np.ndarray:
    """int [T]: the fewest layers k after which the logit lens's top-1 equals `final_top1` and stays so.

    lens_top1: int [L + 1, T], the lens's top-1 after k layers (row 0: the embedding). The last row is the
    model's own output, so the answer is at most L (when it differs, L + 1 says the lens never settles).
    """
    miss = (np.asarray(lens_top1) != np.asarray(final_top1)[None, :]).T.astype(np.int64)  # [T, L+1]: rank 0 or not
    depth = trace_prediction_depth(miss)  # column k = after k layers, so the first stable column is a layer count
    return np.nan_to_num(depth, nan=miss.shape[1]).astype(np.int64)


def need_and_stable(keeps: Sequence[bool], floor: int) -> tuple[int, int]:
    """(need, stable) of one token, where keeps[j] says whether budget floor + j keeps full depth's top-1 (the
    last entry, budget L, always does).

    need: the smallest budget that keeps it (the oracle depth). stable: the smallest budget from which every
    larger budget keeps it. need <= stable; they differ where a small budget hits the right token by luck
    while a larger one misses it.
    """
    row = np.asarray(keeps, dtype=bool)
    if not row.size or not row[-1]:
        raise ValueError("keeps must end with True: full depth keeps its own top-1")
    misses = np.flatnonzero(~row)
    return floor + int(np.argmax(row)), floor + (int(misses[-1]) + 1 if misses.size else 0)


def position_summary(needs: Needs, num_layers: int) -> dict[str, float]:
    """Does need fall with position? Spearman's rho of need against position, and mean need by quarter."""
    pos, need = flat_needs(needs)
    rho = _spearman(pos, need)
    steps = int(pos.max()) + 1
    quarter = np.minimum(4 * pos // max(steps, 1), 3)
    means = [float(need[quarter == q].mean()) if np.any(quarter == q) else float("nan") for q in range(4)]
    return {"spearman_need_vs_position": rho, "mean_need": float(need.mean()), "tokens": int(len(need)),
            "mean_need_first_quarter": means[0], "mean_need_last_quarter": means[3],
            "share_needing_full_depth": float(np.mean(need >= num_layers))}


def _spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rank correlation with average ranks for ties (NaN when either side is constant)."""
    rx, ry = _ranks(x), _ranks(y)
    if rx.std() == 0 or ry.std() == 0:
        return float("nan")
    return float(np.corrcoef(rx, ry)[0, 1])


def _ranks(v: np.ndarray) -> np.ndarray:
    order = np.argsort(v, kind="mergesort")
    ranks = np.empty(len(v), dtype=np.float64)
    ranks[order] = np.arange(len(v), dtype=np.float64)
    _, inverse, counts = np.unique(v, return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, weights=ranks)
    return sums[inverse] / counts[inverse]
