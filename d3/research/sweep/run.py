"""The sweep loop: every setting not yet in the CSV is measured and appended, one row at a time, so a rerun resumes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pandas as pd

from d3.engine import Engine
from d3.models import get_model
from d3.research.sweep.grid import all_settings
from d3.research.sweep.measure import measure_row, references
from d3.research.sweep.spec import Progress, SweepSpec, setting_key
from d3.research.sweep.table import append_jsonl, append_row, block_rows, read_results, sidecar, slim_trace, write_json


def run_sweep(spec: SweepSpec, out: str | Path, *, engine: Engine | None = None, progress: Progress | None = None,
              limit: int | None = None) -> pd.DataFrame:
    """Measure every setting of `spec` not already in `out` (at most `limit` new ones), row by row.

    Returns the whole table (old and new rows). `progress(fraction, desc)` is called as settings finish."""
    for _ in iter_sweep(spec, out, engine=engine, progress=progress, limit=limit):
        pass
    return read_results(out)


def iter_sweep(spec: SweepSpec, out: str | Path, *, engine: Engine | None = None, progress: Progress | None = None,
               limit: int | None = None) -> Iterator[pd.DataFrame]:
    """`run_sweep`, yielding the whole table (old and new rows) after each row is appended to `out`: the full-depth
    reference row first, then the settings one by one. A caller that stops iterating (or an exception raised from
    inside a run) leaves every row yielded so far in `out`."""
    engine = engine if engine is not None else load_engine(spec.model)
    out = Path(out)
    done = set(read_results(out)["key"])
    settings = all_settings(spec, engine)
    keyed = [(setting_key(spec, engine.name, s), s) for s in settings]
    todo = [(k, s) for k, s in keyed if k not in done][: limit if limit is not None else None]
    report = progress or (lambda f, d: None)
    report(0.0, f"{len(keyed) - len([k for k, _ in keyed if k not in done])} of {len(keyed)} settings already done")
    if todo:
        refs = references(engine, spec, progress)
        traces_path = sidecar(out, "traces.jsonl")
        if keyed[0][0] not in done:  # the full-depth row carries the Fig. 3 data
            append_jsonl(traces_path, {"kind": "block", "key": keyed[0][0], "rows": block_rows([r.trace for r in refs.recorded])})
        for i, (key, setting) in enumerate(todo):
            report(i / len(todo), f"{setting.label} ({i + 1}/{len(todo)})")
            row, first = measure_row(engine, spec, setting, refs, key)
            append_row(out, row)
            append_jsonl(traces_path, {"kind": "layers", "key": key, "label": setting.label, "trace": slim_trace(first)})
            yield read_results(out)
        report(1.0, f"{len(todo)} settings measured")
    write_json(out)


def load_engine(name: str) -> Engine:
    return Engine.from_loaded(get_model(name))
