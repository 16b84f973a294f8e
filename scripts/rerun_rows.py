"""Re-measure one strategy's rows of a committed sweep in place, after its schedule changed, without rerunning the rest.

    python scripts/rerun_rows.py --strategy unified -- <the sweep's own flags, as in the README>

The sweep resumes by key (a hash of the setting and of everything measured with it), so a row whose setting changed
(here: Unified Layer Skipping gained `spacing`) no longer matches any setting of the grid. This drops such stale
rows of `--strategy` (and their traces), lets `run_sweep` measure what is missing in a scratch copy, refuses to go on
if anything else would be re-measured, and writes the new rows back where the old ones stood (matched by label).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from d3.cli import build_parser  # noqa: E402
from d3.cli.common import set_threads  # noqa: E402
from d3.cli.sweep import spec_from_args  # noqa: E402
from d3.research.sweep.grid import all_settings  # noqa: E402
from d3.research.sweep.spec import setting_key  # noqa: E402
from d3.research.sweep.table import read_results, sidecar, write_json  # noqa: E402


def main(argv: list[str], engine: Any = None) -> int:
    """`engine` lets tests inject a tiny model; otherwise the sweep's --model is loaded."""
    ours = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ours.add_argument("--strategy", required=True, help="strategy whose stale rows are measured again")
    split = argv.index("--") if "--" in argv else len(argv)
    opts = ours.parse_args(argv[:split])
    args = build_parser().parse_args(["sweep", *argv[split + 1:]])
    spec = spec_from_args(args)
    set_threads(args.threads)
    from d3.engine import Engine
    from d3.models import get_model
    from d3.research.sweep.run import run_sweep

    engine = engine if engine is not None else Engine.from_loaded(get_model(spec.model))
    results = Path(args.out)
    old = read_results(results)
    current = {setting_key(spec, engine.name, s): s for s in all_settings(spec, engine)}
    stale = old[(old.strategy == opts.strategy) & ~old.key.isin(list(current))]
    missing = [s for k, s in current.items() if k not in set(old.key)]
    if sorted(s.label for s in missing) != sorted(stale.label) or any(s.config.name != opts.strategy for s in missing):
        print(f"refusing: {len(missing)} settings would be measured ({[s.label for s in missing]}), but the stale "
              f"{opts.strategy} rows are {list(stale.label)}", file=sys.stderr)
        return 2
    print(f"measuring again: {list(stale.label)}")
    with tempfile.TemporaryDirectory(prefix="rerun-") as scratch:
        work = Path(scratch) / results.name
        old[~old.key.isin(stale.key)].to_csv(work, index=False)
        traces = [json.loads(line) for line in sidecar(results, "traces.jsonl").read_text().splitlines()]
        sidecar(work, "traces.jsonl").write_text("".join(json.dumps(t) + "\n" for t in traces if t["key"] not in set(stale.key)))
        new = run_sweep(spec, work, engine=engine)
        _write_back(old, new, stale, results)
        shutil.copyfile(sidecar(work, "traces.jsonl"), sidecar(results, "traces.jsonl"))
    write_json(results)
    print(f"{len(stale)} rows replaced in {results}")
    return 0


def _write_back(old: pd.DataFrame, new: pd.DataFrame, stale: pd.DataFrame, results: Path) -> None:
    """The old table's row order, each stale row replaced by the new row with its label."""
    fresh = new[~new.key.isin(old.key)].set_index("label")
    replaced = set(stale.key)
    rows = [fresh.loc[row["label"]].to_dict() | {"label": row["label"]} if row["key"] in replaced else row.to_dict()
            for _, row in old.iterrows()]
    pd.DataFrame(rows, columns=list(old.columns)).to_csv(results, index=False)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
