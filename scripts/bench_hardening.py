"""Timings the hardening tests no longer assert (a busy machine fails timed assertions), measured side by side.

1. A 200,000-entry layer_order refused by the page's own validation (explorer.runs.check_run), against a valid
   order's full validation; and the order check itself, one pass (Counter) against the old count-per-entry.
2. The converted weights' check at load: a stat (size and time unchanged), the ends hash, and the full sha256
   (only when a file's time changed), on SmolLM2's cache file if it is converted here (read only).

Usage: python scripts/bench_hardening.py
"""

from __future__ import annotations

import os
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def best(fn: Callable[[], object], repeats: int = 5) -> float:
    """The fastest of `repeats` runs, in seconds (the least disturbed by other processes)."""
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        try:
            fn()
        except ValueError:
            pass
        times.append(time.perf_counter() - started)
    return min(times)


def old_repeated(given: list[int]) -> list[int]:
    return sorted({x for x in given if given.count(x) > 1})  # the check before issue 27: O(n^2)


def new_repeated(given: list[int]) -> list[int]:
    return sorted(x for x, n in Counter(given).items() if n > 1)


def layer_order() -> None:
    from explorer.caps import Caps
    from explorer.controls import DEFAULTS
    from explorer.pool import ModelPool
    from explorer.runs import check_run

    pool = ModelPool(caps=Caps())  # the known models' facts come from the table: nothing loads
    valid = DEFAULTS.with_(prompt="hi", model="smollm2-135m")  # the measured order, calibrated
    huge = valid.with_(layer_order="3," * 200_000)
    t_valid, t_huge = best(lambda: check_run(pool, valid)), best(lambda: check_run(pool, huge))
    print(f"check_run, valid 24-layer order: {t_valid * 1000:.2f} ms; 200,000-entry order refused: "
          f"{t_huge * 1000:.2f} ms ({t_huge / t_valid:.2f}x the valid one)")
    given = [3] * 5_000
    t_old, t_new = best(lambda: old_repeated(given), 1), best(lambda: new_repeated(given))
    print(f"repeated-entry check on 5,000 entries: count per entry {t_old * 1000:.1f} ms, one pass "
          f"{t_new * 1000:.2f} ms ({t_old / t_new:.0f}x)")


def weights() -> None:
    from d3.model_cache import cache_root, full_digest, weight_record

    found = sorted((cache_root() / "smollm2-135m").glob("*/model.safetensors"))
    if not found:
        print("SmolLM2 is not converted here: no weight-check timings")
        return
    path = found[0]
    t_stat = best(lambda: os.stat(path))
    t_ends = best(lambda: weight_record(path))
    t_full = best(lambda: full_digest(path), 3)
    print(f"weights ({path.stat().st_size / 1e6:.0f} MB): stat {t_stat * 1e6:.0f} µs, ends hash "
          f"{t_ends * 1000:.1f} ms (every load), full sha256 {t_full:.2f} s (once per change of the file; "
          f"{t_full / t_ends:.0f}x the ends)")


if __name__ == "__main__":
    layer_order()
    weights()
