"""Calibrated drop orders as data: what a calibration records, where it is cached, the orders that ship, and how a
name ("measured", "agreement", "task@arith") in `D3Config.layer_order` becomes this model's layers.

Measuring a calibration is research (`d3.research.calibrate`); the engine only reads them, so this lives in the core.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from d3.config import D3Config, check_layer_order
from d3.model_cache import cache_root

log = logging.getLogger(__name__)

SIGNALS = ("agreement", "perplexity", "task")
HIGHER_IS_BETTER = {"agreement": True, "perplexity": False, "task": True}
UNITS = {"agreement": "share of full depth's next tokens kept top-1", "perplexity": "perplexity of the prose's continuation",
         "task": "exact match on the validation questions"}
CALIBRATION_VERSION = 1

# ------------------------------------------------------------------ what a calibration returns


@dataclass(frozen=True)
class Calibration:
    """A measured drop order. `single`: layer -> the signal after removing that layer alone; `curve[k]`: the signal
    after removing order[:k + 1]; `full`: the signal at full depth. KL (agreement / perplexity) beside each."""

    model: str
    num_layers: int
    signal: str
    calibration_set: str
    core: tuple[int, int]
    order: tuple[int, ...]
    single: dict[int, float]
    curve: tuple[float, ...]
    full: float
    single_kl: dict[int, float] = field(default_factory=dict)
    curve_kl: tuple[float, ...] = ()
    tokens: int = 0
    steps: int = 0
    seconds: float = 0.0
    version: int = CALIBRATION_VERSION

    @property
    def name(self) -> str:
        """What `D3Config(layer_order=...)` takes to name this calibration (resolved by `resolve`)."""
        return f"{self.signal}@{self.calibration_set}"

    @property
    def higher_is_better(self) -> bool:
        return HIGHER_IS_BETTER[self.signal]

    def config(self, **fields: Any) -> D3Config:
        """D3 with this order (`fields`: alpha, start, fill, ...)."""
        head, tail = self.core
        return D3Config(drop_order="calibrated", layer_order=self.order, core_head=head, core_tail=tail, **fields)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["single"] = {str(k): v for k, v in self.single.items()}
        d["single_kl"] = {str(k): v for k, v in self.single_kl.items()}
        d["name"], d["unit"] = self.name, UNITS[self.signal]
        return d

    @classmethod
    def from_dict(cls, d: Any) -> Calibration:
        """A calibration read back (JSON); ValueError saying what is wrong with it, whatever was stored."""
        if not isinstance(d, dict):
            raise ValueError(f"a calibration is a JSON object, not {type(d).__name__}")
        try:
            keep = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
            keep["single"] = _scores("single", d["single"])
            keep["single_kl"] = _scores("single_kl", d.get("single_kl") or {})
            for name in ("core", "order", "curve", "curve_kl"):
                keep[name] = tuple(keep.get(name) or ())
        except KeyError as err:
            raise ValueError(f"{err.args[0]} is missing") from None
        except (TypeError, AttributeError) as err:
            raise ValueError(f"a field has the wrong type ({err})") from None
        return _checked(cls(**keep))


def _finite(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} holds {str(value)[:20]!r}, not a finite number")
    return float(value)


def _scores(name: str, d: Any) -> dict[int, float]:
    if not isinstance(d, dict):
        raise ValueError(f"{name} is {type(d).__name__}, not an object of layer -> score")
    if len(d) > 10_000:
        raise ValueError(f"{name} has {len(d):,} entries")
    return {int(k): _finite(name, v) for k, v in d.items()}


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _checked(c: Calibration) -> Calibration:
    """`c` if every field is what `calibrate` writes; ValueError naming the first field that is not."""
    if c.signal not in SIGNALS:
        raise ValueError(f"signal {str(c.signal)[:20]!r} is not one of {', '.join(SIGNALS)}")
    if not (_is_int(c.num_layers) and 1 <= c.num_layers <= 10_000):
        raise ValueError(f"num_layers {str(c.num_layers)[:20]!r} is not a layer count")
    if not (len(c.core) == 2 and all(_is_int(x) and x >= 0 for x in c.core) and sum(c.core) < c.num_layers):
        raise ValueError(f"core {str(c.core)[:20]} is not two layer counts that leave a flex layer")
    if not all(_is_int(x) for x in c.order):
        raise ValueError("order holds something other than layer numbers")
    check_layer_order(c.order, c.num_layers, *c.core)
    if set(c.single) != set(c.order):
        raise ValueError("single does not score each flex layer once")
    if not 1 <= len(c.curve) <= len(c.order):
        raise ValueError(f"curve has {len(c.curve)} points for {len(c.order)} flex layers")
    for name in ("curve", "curve_kl"):
        for value in getattr(c, name):
            _finite(name, value)
    _finite("full", c.full)
    return c


def read_calibration(path: Path) -> Calibration:
    """The calibration stored at `path`; ValueError naming the file and what is wrong with it."""
    try:
        return Calibration.from_dict(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as err:
        raise ValueError(f"{path}: not a usable calibration ({str(err)[:200]})") from None


CALIBRATION_ENV = "D3_CALIBRATION_DIR"


def calibration_root() -> Path:
    """Where calibrations are cached: $D3_CALIBRATION_DIR, else the model cache's calibration/ folder."""
    return Path(os.environ.get(CALIBRATION_ENV) or cache_root() / "calibration").expanduser()


def calibration_path(model: str, signal: str, set_name: str, core: tuple[int, int], tokens: int, steps: int) -> Path:
    safe = lambda s: re.sub(r"[^A-Za-z0-9_.+-]+", "_", s)[:120]  # noqa: E731
    return (calibration_root() / safe(model) /
            f"{signal}__{safe(set_name)}__core{core[0]}+{core[1]}__T{tokens}__k{steps}.json")


def cached(model: str) -> list[Calibration]:
    """Every usable calibration cached for `model`, newest first; a file that is not one is skipped, and the log
    names it."""
    folder = calibration_path(model, "x", "x", (0, 0), 0, 0).parent
    found = []
    for path in sorted(folder.glob("*.json"), key=_mtime, reverse=True):
        try:
            found.append(read_calibration(path))
        except ValueError as err:  # one bad file never hides the good ones
            log.warning("skipped %s", err)
    return found


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:  # removed while we looked
        return 0.0


# The measured best order of each embedded model (README "Drop order"; results/drop_order_*.json), for its default
# core: what the name "measured" resolves to. Keyed by model, then core (head, tail).
MEASURED: dict[str, dict[tuple[int, int], tuple[int, ...]]] = {
    # agreement with full depth's own tokens on the arithmetic validation questions (4 greedy steps, then by single
    # drop): the best order at ~28 of 30 layers on the test questions, and its single drops rank the layers as the
    # test does (Spearman 0.91). For chat text the order calibrated on chat prompts keeps the text longer:
    # CHAT_ORDERS below.
    "smollm2-135m": {(3, 3): (4, 5, 6, 9, 3, 7, 10, 15, 26, 25, 11, 17, 12, 13, 21, 22, 8, 19, 18, 14, 23, 16, 24, 20)},
    # exact match on the validation questions of 1-digit addition and subtraction (the task signal; its best single
    # drop first, the rest by single-drop score): the best order at 17 of 18 layers on the test questions
    "gemma3-270m": {(2, 2): (14, 9, 2, 4, 13, 8, 15, 10, 7, 12, 3, 5, 6, 11)},
    # agreement with full depth's own tokens on 20 validation questions of word problems and word copying (1 greedy
    # step, then by single drop; the drop-order study's calibration): at 26.03 of 28 layers it kept 120 of 120 test
    # answers, and -0.8 [-0.8, +0.8] points on a fresh seed's 120, where bottom_up at 25.13 lost half of its first 40
    "qwen2.5-coder-1.5b": {(3, 3): (3, 10, 6, 9, 4, 16, 11, 12, 13, 8, 18, 17, 14, 21, 20, 5, 7, 15, 23, 22, 19, 24)},
}


# Agreement on the 8 chat prompts of assets/prompts.json, greedy to the end: on the page's chat prompt it keeps full
# depth's text about twice as long as the arithmetic order, and breaks arithmetic at 28 layers (docs/drop_order.md).
CHAT_ORDERS: dict[str, dict[tuple[int, int], tuple[int, ...]]] = {
    "smollm2-135m": {(3, 3): (3, 17, 16, 7, 14, 19, 18, 5, 26, 25, 4, 6, 15, 23, 11, 20, 12, 13, 10, 22, 9, 8, 21, 24)},
    # The same 8 prompts, 32 tokens, 3 greedy steps then by single drop (results/qwen_chat_calibration.json, 17 min on
    # one thread): on them, 64 tokens at α 0.99 / 0.995 / 0.98 with core 3 + 3, it keeps full depth's text 114 / 126 /
    # 106 tokens in all before the first differences against middle-out's 101 / 105 / 70 (docs/models.md).
    "qwen2.5-coder-1.5b": {(3, 3): (10, 13, 9, 8, 7, 12, 6, 16, 14, 3, 15, 5, 4, 17, 11, 18, 20, 22, 24, 23, 21, 19)},
}


def resolve(cfg: D3Config, engine: Any) -> D3Config:
    """`cfg` with a calibration's name in layer_order turned into its layers, checked against the model: "measured"
    is the model's measured best order (`MEASURED`); otherwise the newest cached calibration of this model whose
    name is `signal@set` or, for a bare signal, whose signal matches."""
    if cfg.drop_order != "calibrated" or not isinstance(cfg.layer_order, str):
        return cfg
    name = cfg.layer_order
    L = engine.num_layers
    head, tail = cfg.core(L)
    shipped = MEASURED.get(engine.name, {}).get((head, tail))
    if name == "measured" and shipped:
        return cfg.with_(layer_order=shipped)  # type: ignore[return-value]
    matches = [c for c in cached(engine.name) if (c.name == name or c.signal == name) and c.core == (head, tail)]
    if not matches and name == "measured":
        raise ValueError(f"layer_order='measured': no measured order ships for {engine.name} with core {head}+{tail}; "
                         f"run `python -m d3 calibrate --model {engine.name}` and name its result")
    if not matches:
        signal = name.split("@")[0]
        if signal not in SIGNALS:
            known = sorted({c.name for c in cached(engine.name)})
            raise ValueError(f"layer_order={name[:40]!r} names no calibration: use 'measured', a signal "
                             f"({', '.join(SIGNALS)}) or SIGNAL@SET"
                             + (f"; cached for {engine.name}: {', '.join(known[:8])}" if known else ""))
        raise ValueError(f"layer_order={name!r}: no calibration of that name for {engine.name} with core {head}+{tail} "
                         f"is cached; run `python -m d3 calibrate --model {engine.name} --signal {signal} "
                         f"--core-head {head} --core-tail {tail}` first")
    check_layer_order(matches[0].order, L, head, tail)
    return cfg.with_(layer_order=matches[0].order)  # type: ignore[return-value]
