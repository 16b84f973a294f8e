"""The one trace type: a frozen TokenStep per generated token inside a Trace. Plain Python and numpy only."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # pandas is imported where a table is made: `import d3` stays light
    import pandas as pd

# Cell codes of the tokens x layers grid (Fig. 1 of the paper).
SKIPPED, RAN, FILLED_COPY, FILLED_PROPAGATE, HOLE = 0, 1, 2, 3, 4
CELL_NAMES = {SKIPPED: "skipped", RAN: "ran", FILLED_COPY: "filled (copy)", FILLED_PROPAGATE: "filled (propagate)", HOLE: "hole (masked)"}
FILL_CODES = {"copy": FILLED_COPY, "propagate": FILLED_PROPAGATE, "none": HOLE}

# Per-layer scalar names recorded from hooks; each is a float array of shape [num_layers], NaN where not run.
LAYER_STATS = ("attn_cos", "attn_dist", "mlp_cos", "mlp_dist", "hidden_norm")


@dataclass(frozen=True)
class Agreement:
    """How two token sequences agree, position by position, over the shorter of the two.

    compared: positions compared (the shorter length).  agreeing: positions with equal tokens.
    first_divergence: the first position where they differ, None if none of the compared ones do.
    """

    compared: int
    agreeing: int
    first_divergence: int | None

    @property
    def agreement(self) -> float:
        """Fraction of compared positions that agree (1.0 when nothing was compared)."""
        return self.agreeing / self.compared if self.compared else 1.0


def token_agreement(a: Sequence[int], b: Sequence[int]) -> Agreement:
    """Compare two token id sequences position by position, over the shorter of the two."""
    same = [x == y for x, y in zip(a, b)]
    first = same.index(False) if False in same else None
    return Agreement(compared=len(same), agreeing=sum(same), first_divergence=first)


def _nan_layers(num_layers: int) -> np.ndarray:
    return np.full(num_layers, np.nan, dtype=np.float32)


@dataclass(frozen=True, eq=False)
class TokenStep:
    """What happened when one sequence generated its `step`-th token (0 = first generated token).

    layers_run: ascending layer indices that ran.
    filled: (layer, how, source) for each skipped layer whose KV entry was filled, as the decoder decided
      (`d3.schedule.fill_plan`): how in copy/propagate/none; source is the layer copied from (None otherwise).
    stats: LAYER_STATS name -> float32 array [num_layers] (NaN for layers that did not run).
      attn_cos / mlp_cos: cosine between a sublayer's residual input and output.
      attn_dist / mlp_dist: ||out - in|| / ||in|| for that sublayer.  hidden_norm: ||layer output||.
    topk: (token_id, text, probability) of the most likely next tokens at this step.
    logit_lens: top-1 token text read out after each layer ("" where the layer did not run).
    lens_prob / lens_rank: after each layer, the lens's probability and rank (0 = top-1) of the token that was
      picked (NaN / -1 where the layer did not run).
    lens_states: float32 [n_layers_run, d_model], the output of each layer that ran at this position, kept for
      reading the lens out later (`d3.lens.read_lens`); None once read out, or when not kept. Not exported.
    attention: layer -> float16 array [heads, kv_len], this token's attention weights at that layer.
    confidence: early exit only, the confidence measured after each layer (NaN where not measured).
    piece: "" unless the token ends inside a multi-byte character (its `text` then holds only what comes before
      it; the token that completes the character holds the character): the token on its own, its bytes of that
      character written out ("<0xF0><0x9F>", `d3.trace_builder.piece_text`).
    """

    step: int
    token_id: int
    text: str
    layers_run: tuple[int, ...]
    filled: tuple[tuple[int, str, int | None], ...]
    planned: int
    entropy: float
    wall_ms: float
    seq: int = 0
    logprob: float = float("nan")
    topk: tuple[tuple[int, str, float], ...] = ()
    stats: dict[str, np.ndarray] = field(default_factory=dict)
    logit_lens: tuple[str, ...] = ()
    lens_prob: tuple[float, ...] = ()
    lens_rank: tuple[int, ...] = ()
    attention: dict[int, np.ndarray] = field(default_factory=dict)
    confidence: tuple[float, ...] = ()
    exit_layer: int | None = None
    piece: str = ""
    lens_states: np.ndarray | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if any(len(f) != 3 for f in self.filled):  # (layer, how) from before sources were recorded: source unknown
            object.__setattr__(self, "filled", tuple(_fill_entry(f) for f in self.filled))

    @property
    def n_layers(self) -> int:
        return len(self.layers_run)

    def cells(self, num_layers: int) -> np.ndarray:
        """int8 [num_layers]: RAN, SKIPPED, or a FILLED_* / HOLE code per layer."""
        row = np.full(num_layers, SKIPPED, dtype=np.int8)
        row[list(self.layers_run)] = RAN
        for layer, how, _ in self.filled:
            row[layer] = FILL_CODES[how]
        return row

    def fill_sources(self, num_layers: int) -> np.ndarray:
        """int16 [num_layers]: the layer each copied KV entry was copied from, -1 where nothing was copied."""
        row = np.full(num_layers, -1, dtype=np.int16)
        for layer, how, source in self.filled:
            if how == "copy" and source is not None:
                row[layer] = source
        return row

    def to_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in asdict(replace(self, lens_states=None)).items()
             if k not in ("stats", "attention", "lens_states")}
        d["stats"] = {k: _floats(v) for k, v in self.stats.items()}
        d["lens_prob"] = _floats(self.lens_prob)
        d["attention"] = {str(k): np.asarray(v, dtype=np.float32).round(5).tolist() for k, v in self.attention.items()}
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TokenStep:
        d = dict(d)
        d["layers_run"] = tuple(d["layers_run"])
        d["filled"] = tuple(_fill_entry(f) for f in d["filled"])
        d["topk"] = tuple((int(a), str(b), float(c)) for a, b, c in d.get("topk", ()))
        d["logit_lens"] = tuple(d.get("logit_lens", ()))
        d["lens_prob"] = tuple(_unfloat(x) for x in d.get("lens_prob", ()))
        d["lens_rank"] = tuple(int(x) for x in d.get("lens_rank", ()))
        d["confidence"] = tuple(_unfloat(x) for x in d.get("confidence", ()))
        d["stats"] = {k: np.array([_unfloat(x) for x in v], dtype=np.float32) for k, v in d.get("stats", {}).items()}
        d["attention"] = {int(k): np.array(v, dtype=np.float16) for k, v in d.get("attention", {}).items()}
        for key in ("entropy", "logprob", "wall_ms"):
            d[key] = _unfloat(d.get(key))
        return cls(**d)


def _fill_entry(f: Sequence[Any]) -> tuple[int, str, int | None]:
    """(layer, how, source); traces saved before sources were recorded hold (layer, how): source unknown (None)."""
    source = f[2] if len(f) > 2 else None
    return int(f[0]), str(f[1]), None if source is None else int(source)


def _floats(values: Iterable[float]) -> list[float | None]:
    """JSON-safe floats: NaN becomes None."""
    return [None if (x is None or math.isnan(x)) else round(float(x), 6) for x in np.asarray(values, dtype=np.float64)]


def _unfloat(x: Any) -> float:
    return float("nan") if x is None else float(x)


@dataclass(frozen=True, eq=False)
class PromptStats:
    """Full-depth prefill statistics, averaged over prompt positions.

    stats: LAYER_STATS name -> float32 array [num_layers].
    attention: layer -> float16 array [heads, prompt_len, prompt_len].
    """

    tokens: tuple[str, ...] = ()
    stats: dict[str, np.ndarray] = field(default_factory=dict)
    attention: dict[int, np.ndarray] = field(default_factory=dict)


@dataclass(frozen=True, eq=False)
class Trace:
    """Everything one generation produced, for one sequence. Views need nothing else.

    strategy: the strategy config as a dict ({"strategy": name, **fields}).
    core: (head, tail) core split used for display (D3's own, else the default split).
    """

    model: str
    num_layers: int
    strategy: dict[str, Any]
    prompt: str
    core: tuple[int, int]
    steps: tuple[TokenStep, ...] = ()
    prompt_stats: PromptStats = field(default_factory=PromptStats)
    prefill_ms: float = 0.0
    finish_reason: str = ""
    num_heads: int = 0
    fixed_cost_layers: float = 0.0
    layer_types: tuple[str, ...] = ()  # each layer's attention type (full_attention, sliding_attention); () unknown

    def with_steps(self, steps: Iterable[TokenStep], **changes: Any) -> Trace:
        return replace(self, steps=tuple(steps), **changes)

    # -- derived views of the steps --------------------------------------------------------
    @property
    def strategy_name(self) -> str:
        return str(self.strategy.get("strategy", "?"))

    @property
    def text(self) -> str:
        return "".join(s.text for s in self.steps)

    @property
    def token_ids(self) -> list[int]:
        return [s.token_id for s in self.steps]

    @property
    def layers_used(self) -> np.ndarray:
        """int [T]: layers run per generated token."""
        return np.array([s.n_layers for s in self.steps], dtype=np.int64)

    @property
    def planned(self) -> np.ndarray:
        return np.array([s.planned for s in self.steps], dtype=np.int64)

    @property
    def mean_layers(self) -> float:
        return float(self.layers_used.mean()) if self.steps else float(self.num_layers)

    def grid(self) -> np.ndarray:
        """int8 [T, num_layers] of cell codes (RAN, SKIPPED, FILLED_COPY, FILLED_PROPAGATE, HOLE)."""
        if not self.steps:
            return np.zeros((0, self.num_layers), dtype=np.int8)
        return np.stack([s.cells(self.num_layers) for s in self.steps])

    def fill_sources(self) -> np.ndarray:
        """int16 [T, num_layers]: where each copied KV entry came from (`TokenStep.fill_sources`), -1 elsewhere."""
        if not self.steps:
            return np.zeros((0, self.num_layers), dtype=np.int16)
        return np.stack([s.fill_sources(self.num_layers) for s in self.steps])

    def stat(self, name: str) -> np.ndarray:
        """float32 [T, num_layers] of one LAYER_STATS value (NaN where a layer did not run or was not traced)."""
        rows = [s.stats.get(name, _nan_layers(self.num_layers)) for s in self.steps]
        return np.stack(rows) if rows else np.zeros((0, self.num_layers), dtype=np.float32)

    def theoretical_speedup(self, with_fixed_cost: bool = False) -> float:
        fixed = self.fixed_cost_layers if with_fixed_cost else 0.0
        return (self.num_layers + fixed) / max(self.mean_layers + fixed, 1e-9)

    @property
    def decode_seconds(self) -> float:
        return sum(s.wall_ms for s in self.steps) / 1000.0

    @property
    def tokens_per_s(self) -> float:
        secs = self.decode_seconds
        return len(self.steps) / secs if secs > 0 else 0.0

    # -- export ------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "num_layers": self.num_layers,
            "strategy": self.strategy,
            "prompt": self.prompt,
            "core": list(self.core),
            "prefill_ms": self.prefill_ms,
            "finish_reason": self.finish_reason,
            "num_heads": self.num_heads,
            "fixed_cost_layers": self.fixed_cost_layers,
            "layer_types": list(self.layer_types),
            "prompt_stats": {
                "tokens": list(self.prompt_stats.tokens),
                "stats": {k: _floats(v) for k, v in self.prompt_stats.stats.items()},
            },
            "steps": [s.to_dict() for s in self.steps],
        }

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Trace:
        ps = d.get("prompt_stats", {})
        prompt_stats = PromptStats(
            tokens=tuple(ps.get("tokens", ())),
            stats={k: np.array([_unfloat(x) for x in v], dtype=np.float32) for k, v in ps.get("stats", {}).items()},
        )
        return cls(
            model=d["model"],
            num_layers=int(d["num_layers"]),
            strategy=dict(d["strategy"]),
            prompt=d["prompt"],
            core=tuple(d["core"]),
            steps=tuple(TokenStep.from_dict(s) for s in d["steps"]),
            prompt_stats=prompt_stats,
            prefill_ms=float(d.get("prefill_ms", 0.0)),
            finish_reason=d.get("finish_reason", ""),
            num_heads=int(d.get("num_heads", 0)),
            fixed_cost_layers=float(d.get("fixed_cost_layers", 0.0)),
            layer_types=tuple(d.get("layer_types", ())),
        )

    @classmethod
    def from_json(cls, text: str) -> Trace:
        return cls.from_dict(json.loads(text))

    def to_frame(self) -> pd.DataFrame:  # one row per (token, layer)
        """Tidy table: one row per generated token and layer, with the cell state and per-layer stats."""
        import pandas as pd  # only for this export: `import d3` (configs, schedules, traces) stays light

        grid = self.grid()
        rows = []
        for t, s in enumerate(self.steps):
            for layer in range(self.num_layers):
                row = {"step": s.step, "token_id": s.token_id, "text": s.text, "layer": layer,
                       "cell": CELL_NAMES[int(grid[t, layer])], "layers_used": s.n_layers, "planned": s.planned,
                       "entropy": s.entropy, "wall_ms": s.wall_ms}
                for name in LAYER_STATS:
                    arr = s.stats.get(name)
                    row[name] = float(arr[layer]) if arr is not None else float("nan")
                rows.append(row)
        return pd.DataFrame(rows)


def run_counts(skip: Trace, full: Trace) -> dict[str, Any]:
    """The one count of a skipping run against full depth, for every sentence, table and export that gives one: the
    tokens each run wrote, the positions both wrote (`compared`), how many of those agree, the first divergence, and
    which run ended earlier at its end-of-text token (`ended_first`: "full", "skip" or "")."""
    a = token_agreement(skip.token_ids, full.token_ids)
    ended = ""
    if len(skip.steps) != len(full.steps):
        shorter, name = (skip, "skip") if len(skip.steps) < len(full.steps) else (full, "full")
        ended = name if shorter.finish_reason == "eos" else ""
    return {"tokens": len(skip.steps), "full_tokens": len(full.steps), "compared": a.compared, "agreeing": a.agreeing,
            "agreement": a.agreement, "first_divergence": a.first_divergence, "ended_first": ended}


def speedup_fields(speedup: Speedup | None) -> dict[str, Any]:
    nan = float("nan")
    return {"measured_speedup": speedup.ratio if speedup else nan, "measured_speedup_low": speedup.low if speedup else nan,
            "measured_speedup_high": speedup.high if speedup else nan,
            "speedup_resolvable": bool(speedup and speedup.resolvable)}


def prediction_depth(rank: np.ndarray) -> np.ndarray:
    """float [T]: per token, the first column from which the logit lens ranks the chosen token first at every column
    after it that ran; NaN where even the last column that ran does not (a sampled token, or nothing ran).

    rank: int [T, K], the lens's rank of the chosen token at each column (0 = top-1, -1 = the layer did not run).
    For a trace the columns are layers (`TokenStep.lens_rank`); for the oracle, column k is the lens after k layers
    (column 0: the embedding), so the depth is a number of layers. The one definition; `d3.research.oracle.lens_depth`
    computes the same on the model, top-down, and is tested equal to it."""
    rank = np.asarray(rank)
    out = np.full(rank.shape[0], np.nan)
    for t, row in enumerate(rank):
        ran = np.flatnonzero(row >= 0)
        if not ran.size or row[ran[-1]] != 0:
            continue
        misses = ran[row[ran] != 0]
        out[t] = ran[ran > misses[-1]][0] if misses.size else ran[0]
    return out


def own_perplexity(trace: Trace) -> float:
    """A run's perplexity of its own text (each token's log-prob under the run that wrote it); NaN if not recorded."""
    lp = np.array([s.logprob for s in trace.steps], dtype=np.float64)
    lp = lp[np.isfinite(lp)]
    return float(np.exp(-lp.mean())) if lp.size else float("nan")


@dataclass(frozen=True)
class Speedup:
    """Measured speedup of a skipping run over full depth, from the two runs' own step times.

    ratio: median full-depth decode-step time over the skipping run's, on the positions both reached (the first step,
      the prompt's prefill at full depth in both, left out).  low / high: its 95% interval, a bootstrap over the
      paired steps (the runs interleave token by token in one process, so step k of each saw the same machine load).
    theoretical: L / mean layers of the skipping run.  steps: paired steps measured.
    resolvable: the interval excludes 1, so the run measured a difference at all. A 1.04x theoretical speedup on a
      shared CPU usually isn't: then say so (`describe`) rather than show a number noise made."""

    ratio: float
    low: float
    high: float
    theoretical: float
    steps: int

    @property
    def resolvable(self) -> bool:
        return self.low > 1.0 or self.high < 1.0

    def describe(self) -> str:
        if not self.resolvable:
            return f"too small to measure here: theoretical {self.theoretical:.2f}x"
        return f"{self.ratio:.2f}x measured (95% {self.low:.2f}–{self.high:.2f}; theoretical {self.theoretical:.2f}x)"


MIN_TIMED_STEPS = 4  # fewer paired steps than this measure nothing


def measured_speedup(skip: Trace | None, full: Trace | None, *, resamples: int = 1000, seed: int = 0) -> Speedup | None:
    """`Speedup` of `skip` over `full` from their step times (None when fewer than MIN_TIMED_STEPS pairs exist)."""
    if skip is None or full is None:
        return None
    n = min(len(skip.steps), len(full.steps))
    if n - 1 < MIN_TIMED_STEPS:
        return None
    s = np.array([x.wall_ms for x in skip.steps[1:n]], dtype=np.float64)
    f = np.array([x.wall_ms for x in full.steps[1:n]], dtype=np.float64)
    if not (np.all(np.isfinite(s)) and np.all(np.isfinite(f))) or np.median(s) <= 0:
        return None
    idx = np.random.default_rng(seed).integers(0, len(s), size=(resamples, len(s)))  # paired: one index, both runs
    boot = np.median(f[idx], axis=1) / np.maximum(np.median(s[idx], axis=1), 1e-12)
    low, high = np.quantile(boot, [0.025, 0.975])
    return Speedup(ratio=float(np.median(f) / np.median(s)), low=float(low), high=float(high),
                   theoretical=skip.theoretical_speedup(), steps=len(s))


@dataclass(frozen=True, eq=False)
class Comparison:
    """A skipping run measured against full depth on the same prompt (all arrays indexed by position).

    agree: bool [T] tokens equal at each position (over the shorter of the two runs).
    kl_teacher: float [T] KL(full || skip) of next-token distributions, skip fed the full-depth tokens (local error).
    kl_free: float [T'] KL(full || skip) on the skip run's own tokens (compounding error).
    kv_error: float [T, L] relative error ||kv_skip - kv_full|| / ||kv_full|| under teacher forcing;
      filled_mask: bool [T, L] True where that entry was filled (copy/propagate) or a hole.
    """

    full: Trace
    skip: Trace
    agree: np.ndarray
    kl_teacher: np.ndarray
    kl_free: np.ndarray
    kv_error: np.ndarray
    filled_mask: np.ndarray
    teacher_grid: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), dtype=np.int8))
    # full depth's log-probability of each token the skipping run wrote, read on that run's own text (teacher-forced):
    # float [T']. A paraphrase full depth would also write scores high; a broken answer low.
    full_logprob: np.ndarray = field(default_factory=lambda: np.zeros(0))

    @property
    def full_prob(self) -> np.ndarray:
        """Full depth's probability of each token of the skipping run's text: float [T']."""
        prob: np.ndarray = np.exp(self.full_logprob)
        return prob

    def full_perplexity(self) -> float:
        """Full depth's perplexity of the skipping run's text (its own text's is `perplexity(self.full)`)."""
        return float(np.exp(-self.full_logprob.mean())) if self.full_logprob.size else float("nan")

    @property
    def tokens(self) -> Agreement:
        """Greedy token agreement of the skipping run with full depth."""
        return token_agreement(self.full.token_ids, self.skip.token_ids)

    @property
    def first_divergence(self) -> int | None:
        return self.tokens.first_divergence

    @property
    def agreement(self) -> float:
        return self.tokens.agreement

    @property
    def speedup(self) -> Speedup | None:
        """Measured speedup of the skipping run over full depth (`measured_speedup`), with its interval."""
        return measured_speedup(self.skip, self.full)

    def filled_kv_error(self) -> float:
        """Mean relative KV error over filled entries (NaN if nothing was filled)."""
        vals = self.kv_error[self.filled_mask]
        vals = vals[np.isfinite(vals)]
        return float(vals.mean()) if vals.size else float("nan")

    def summary(self) -> dict[str, Any]:
        return {
            "strategy": self.skip.strategy_name,
            **run_counts(self.skip, self.full),
            "mean_layers": self.skip.mean_layers,
            "theoretical_speedup": self.skip.theoretical_speedup(),
            **speedup_fields(self.speedup),
            "kl_teacher_mean": float(np.nanmean(self.kl_teacher)) if self.kl_teacher.size else float("nan"),
            "kl_free_mean": float(np.nanmean(self.kl_free)) if self.kl_free.size else float("nan"),
            "filled_kv_error": self.filled_kv_error(),
            "full_ppl_of_skip": self.full_perplexity(),
            "full_ppl_of_full": own_perplexity(self.full),
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "summary": self.summary(),
            "agree": self.agree.astype(bool).tolist(),
            "kl_teacher": _floats(self.kl_teacher),
            "kl_free": _floats(self.kl_free),
            "kv_error": [_floats(r) for r in self.kv_error],
            "filled_mask": self.filled_mask.astype(bool).tolist(),
            "full_logprob": _floats(self.full_logprob),
            "full": self.full.to_dict(),
            "skip": self.skip.to_dict(),
        }
