"""Resident memory of the page's model pool as the known models load, with D3_MAX_MODELS of them kept (the least
recently used unloaded beyond it): loads each known model through the pool, runs 4 tokens on it, prints the
process's resident memory after each.

Usage: nice -n 10 python scripts/pool_memory.py [--max-models 3]"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def rss_gib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 2**20
    return float("nan")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-models", type=int, default=3)
    args = parser.parse_args()
    from d3.config import TRACE_OFF, FullConfig, GenerationConfig
    from d3.models import KNOWN_MODELS
    from explorer.caps import Caps
    from explorer.pool import ModelPool

    pool = ModelPool(caps=Caps(max_models=args.max_models))
    print(f"start: {rss_gib():.2f} GiB", flush=True)
    for name in KNOWN_MODELS:
        engine = pool.engine(name)
        engine.generate("Hello", FullConfig(), GenerationConfig(max_new_tokens=4), TRACE_OFF)
        del engine
        print(f"after {name}: {rss_gib():.2f} GiB resident, loaded {pool.loaded()}", flush=True)


if __name__ == "__main__":
    main()
