"""The sweep's table: its columns and types, reading and appending CSV rows, the JSON and trace sidecars."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from d3.trace import LAYER_STATS

# The table, in order. Every row of every sweep has exactly these columns.
COLUMNS = (
    "key", "model", "num_layers", "strategy", "label", "params", "target_depth", "prompts", "new_tokens", "repeats",
    "mean_layers", "planned_mean_layers", "depth_fraction", "fixed_cost_layers",
    "theoretical_speedup", "theoretical_speedup_fixed", "measured_speedup", "measured_speedup_iqr",
    "measured_speedup_min", "measured_speedup_max", "self_speedup",
    "decode_speedup", "full_tokens_per_s", "method_tokens_per_s", "timing_pairs",
    "agreement", "agreement_low", "agreement_high", "first_divergence", "kl_teacher", "kl_free", "filled_kv_error",
    "ppl", "ppl_full", "ppl_ratio", "ppl_tokens",
    "accuracy", "accuracy_full", "diff", "diff_low", "diff_high", "chance", "task_scoring", "task_accuracy", "seconds", "finished_at",
)
FLOAT_COLUMNS = tuple(c for c in COLUMNS if c not in (
    "key", "model", "strategy", "label", "params", "task_scoring", "task_accuracy", "finished_at",
    "num_layers", "prompts", "new_tokens", "repeats", "timing_pairs", "ppl_tokens"))
INT_COLUMNS = ("num_layers", "prompts", "new_tokens", "repeats", "timing_pairs", "ppl_tokens")
STRING_COLUMNS = ("key", "model", "strategy", "label", "params", "task_scoring", "task_accuracy", "finished_at")


def read_results(path: str | Path) -> pd.DataFrame:
    """The sweep table with its column types; an empty table with every column if the file is absent."""
    path = Path(path)
    if not path.is_file() or path.stat().st_size == 0:
        return pd.DataFrame({c: pd.Series(dtype=_dtype(c)) for c in COLUMNS})
    df = pd.read_csv(path, dtype={c: "object" for c in STRING_COLUMNS})
    df = df.reindex(columns=[*df.columns, *(c for c in COLUMNS if c not in df.columns)])  # a table from before a column
    for c in FLOAT_COLUMNS:
        df[c] = pd.to_numeric(df[c], errors="coerce").astype("float64")
    for c in INT_COLUMNS:
        df[c] = pd.to_numeric(df[c], errors="coerce").fillna(0).astype("int64")
    for c in STRING_COLUMNS:
        df[c] = df[c].astype("object").where(df[c].notna(), "").astype(str)
    return df.drop_duplicates("key", keep="last").reset_index(drop=True)


def _dtype(column: str) -> str:
    return "float64" if column in FLOAT_COLUMNS else "int64" if column in INT_COLUMNS else "object"


def append_row(path: str | Path, row: dict[str, Any]) -> None:
    """Append one row to the CSV (header first if the file is new), flushed before returning."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    new = not path.is_file() or path.stat().st_size == 0
    frame = pd.DataFrame([{c: row.get(c, float("nan")) for c in COLUMNS}], columns=list(COLUMNS))
    if not new and pd.read_csv(path, nrows=0).columns.tolist() != list(COLUMNS):  # written before a column was added
        old = read_results(path).reindex(columns=list(COLUMNS))
        frame, new = pd.concat([old, frame], ignore_index=True), True
        path.write_text("", encoding="utf-8")
    with open(path, "a", encoding="utf-8", newline="") as fh:
        frame.to_csv(fh, header=new, index=False)
        fh.flush()


def sidecar(path: str | Path, suffix: str) -> Path:
    """results/x.csv -> results/x.<suffix>."""
    path = Path(path)
    return path.with_name(path.stem + "." + suffix)


def slim_trace(trace: Any) -> dict[str, Any]:
    """A trace without per-step stats, top-k or attention: enough for the layers-vs-step view."""
    d = trace.to_dict()
    for step in d["steps"]:
        for k in ("stats", "attention", "topk", "logit_lens", "confidence"):
            step.pop(k, None)
    d["prompt_stats"] = {"tokens": [], "stats": {}}
    return d


def block_rows(traces: Sequence[Any]) -> list[dict[str, Any]]:
    """One row per (trace, layer): mean attention / MLP change over the trace's generated tokens (Fig. 3 data)."""
    rows = []
    for i, trace in enumerate(traces):
        means = {}
        for name in LAYER_STATS:
            values = trace.stat(name)[1:]  # decode steps; step 0 is the prefill's last position
            with np.errstate(all="ignore"):
                means[name] = np.nanmean(values, axis=0) if len(values) else np.full(trace.num_layers, np.nan)
        for layer in range(trace.num_layers):
            rows.append({"trace": i, "layer": layer, **{k: _json_float(v[layer]) for k, v in means.items()}})
    return rows


def _json_float(x: Any) -> float | None:
    x = float(x)
    return None if math.isnan(x) else round(x, 6)


def append_jsonl(path: Path, record: dict[str, Any]) -> None:
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(record) + "\n")


def write_json(csv_path: str | Path) -> Path:
    """The finished table as JSON records next to the CSV (NaN as null)."""
    out = sidecar(csv_path, "json")
    df = read_results(csv_path)
    out.write_text(df.to_json(orient="records", indent=1, force_ascii=False), encoding="utf-8")
    return out
