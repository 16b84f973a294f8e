"""The Sweep tab: a small sweep bounded on the server, its table and Pareto view, and loading a row into the Live
tab's controls."""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gradio as gr
import numpy as np
import pandas as pd

from d3.config import D3Config, FullConfig, GenerationConfig, SkipDecodeConfig, strategy_from_dict
from d3.engine import Engine
from d3.research.sweep import BUILTIN_PROMPTS, Setting, SweepSpec, setting_key
from d3.research.sweep.grid import all_settings
from d3.research.sweep.measure import References, measure_row, quality, references, theoretical_columns
from d3.research.sweep.table import append_row, read_results
from explorer import views
from explorer.caps import Caps
from explorer.controls import CONTROL_NAMES, FIELDS, LABELS, PAGE_RANGES, STRATEGY_LABELS, layer_order_text, page_param
from explorer.deadline import Deadline
from explorer.parse import as_choice, as_flag, as_number, clean_prompt
from explorer.pool import ModelPool
from explorer.ui import core_sliders, ordered, user_errors
from viz import pareto
from viz.stream import SPEED_ABOVE_THEORY, speed_words

SWEEP_INPUTS = ("model", "chat_template", "sweep_prompts", "sweep_settings", "sweep_tokens")
SWEEP_OUTPUTS = ("sweep_results", "sweep_table", "sweep_pareto", "sweep_note", "sweep_file")
SWEEP_LOAD_OUTPUTS = (*CONTROL_NAMES, "sweep_note", "modes", "status")


@dataclass(frozen=True)
class SweepChoice:
    """One entry of the Sweep tab's fixed menu: a strategy tuned to a target mean depth (fraction of L)."""

    label: str
    strategy: str  # "d3", "skipdecode" or "unified"
    depth: float


SWEEP_MATCHED_DEPTH = 2 / 3  # the baselines run at this depth, as does the middle D3 setting
SWEEP_MENU: dict[str, SweepChoice] = {
    "d3_85": SweepChoice("D3 at 85% mean depth", "d3", 0.85),
    "d3_75": SweepChoice("D3 at 75% mean depth", "d3", 0.75),
    "d3_67": SweepChoice("D3 at 67% mean depth", "d3", SWEEP_MATCHED_DEPTH),
    "skipdecode_67": SweepChoice("SkipDecode at 67% (matched)", "skipdecode", SWEEP_MATCHED_DEPTH),
    "unified_67": SweepChoice("Unified Layer Skipping at 67% (matched)", "unified", SWEEP_MATCHED_DEPTH),
}
# The default sweep, chosen by measurement (scripts/sweep_budget.py, docs/speed.md): the matched-depth comparison at 8
# tokens. D3's row is measured first, so the baselines after it do not delay it; at 16 tokens on a busy 2-core CPU with
# another visitor's run beside it, D3's row was predicted done at 79 s, past the 60 s limit; at 8 tokens the tab's
# handler drew it within the limit ("Measured 1 of 4 rows within the 60 s limit", 54.5 s, load 9-16).
SWEEP_DEFAULT = ("d3_67", "skipdecode_67", "unified_67")
SWEEP_DEFAULT_TOKENS = 8  # the tokens slider's starting value (explorer.layout), chosen by scripts/sweep_budget.py
SWEEP_PROMPT = BUILTIN_PROMPTS[0]  # the prompts box's starting text (explorer.layout)
SWEEP_MAX_SETTINGS = 4
SWEEP_MAX_PROMPTS = 2
SWEEP_MAX_NEW_TOKENS = 24
SWEEP_MIN_NEW_TOKENS = 2
SWEEP_REPEATS = 3  # timing pairs per prompt: one pair made full depth against itself read 3.6x
SWEEP_MAX_S = 60  # a sweep stops here (or at the server's run limit, if lower) and shows the rows it finished
# The table's columns as a person reads them (the result file keeps the sweep's own names: `sweep_results`).
SWEEP_HEADERS = {"label": "setting", "strategy": "strategy", "target_depth": "target depth",
                 "mean_layers": "mean layers", "theoretical_speedup": "theoretical ×", "measured_speedup": "measured ×",
                 "speed": "speed, read how", "agreement": "agreement", "agreement_low": "agreement 95% low",
                 "agreement_high": "agreement 95% high", "first_divergence": "first divergence",
                 "kl_teacher": "KL teacher-forced", "kl_free": "KL free-running", "params": "setting in full (JSON)"}
SWEEP_TABLE_COLUMNS = list(SWEEP_HEADERS.values())


def sweep_bounds_text() -> str:
    return (f"Bounded on the server: at most {SWEEP_MAX_SETTINGS} settings from the menu (plus the full-depth "
            f"reference row), {SWEEP_MAX_PROMPTS} prompts, {SWEEP_MAX_NEW_TOKENS} new tokens, {SWEEP_REPEATS} timing pairs "
            f"per prompt (median); no perplexity or task accuracy. A sweep stops after {SWEEP_MAX_S} s and shows the "
            "rows it finished.")


def sweep_spec(model: str, prompts: Any, choices: Any, new_tokens: Any, chat_template: Any, caps: Caps) -> SweepSpec:
    """The SweepSpec of a Sweep-tab request, within the tab's bounds; ValueError with a plain message otherwise.

    prompts: text, one prompt per line (blank lines ignored)."""
    if isinstance(prompts, str) and len(prompts) > caps.max_prompt_chars:
        raise ValueError(f"prompts are {len(prompts):,} characters long; the limit is {caps.max_prompt_chars:,}")
    if not isinstance(prompts, str) or not prompts.strip():
        raise ValueError("prompt is empty: type one or two prompts, one per line")
    lines = [clean_prompt(line, caps).strip() for line in prompts.splitlines() if line.strip()]
    if not lines:
        raise ValueError("prompt is empty: type one or two prompts, one per line")
    if len(lines) > SWEEP_MAX_PROMPTS:
        raise ValueError(f"{len(lines)} prompts given; the sweep takes at most {SWEEP_MAX_PROMPTS} (one per line)")
    if isinstance(choices, str):
        choices = [choices]
    if not isinstance(choices, (list, tuple)) or not choices:
        raise ValueError("no settings chosen: tick at least one setting to sweep")
    keys = list(dict.fromkeys(as_choice("setting", c, tuple(SWEEP_MENU)) for c in choices))
    if len(keys) > SWEEP_MAX_SETTINGS:
        raise ValueError(f"{len(keys)} settings chosen; the sweep runs at most {SWEEP_MAX_SETTINGS}: untick some")
    tokens = int(as_number("sweep_tokens", new_tokens, SWEEP_MIN_NEW_TOKENS, min(SWEEP_MAX_NEW_TOKENS, max(
        caps.max_new_tokens, SWEEP_MIN_NEW_TOKENS)), integer=True))
    picked = [SWEEP_MENU[k] for k in keys]
    d3_depths = tuple(c.depth for c in picked if c.strategy == "d3")
    baselines = tuple(dict.fromkeys(c.strategy for c in picked if c.strategy != "d3"))
    return SweepSpec(model=model, prompts=tuple(lines), max_new_tokens=tokens, repeats=SWEEP_REPEATS, depths=d3_depths,
                     baselines=baselines, baseline_depths=(SWEEP_MATCHED_DEPTH,) if baselines else None,
                     ppl_chunks=0, chat_template=as_flag("chat_template", chat_template))


def _never() -> bool:
    return False


class OutOfTime(Exception):
    """Raised before a token once a sweep's time is up: the sweep ends there and keeps the rows it finished."""


class _Counting:
    """An engine view that counts the runs the sweep starts (the sweep reports progress once per setting, tens
    of seconds apart; the page wants a bar that moves every second or two) and hands each run `should_stop`,
    which the engine checks before every token."""

    def __init__(self, engine: Engine, tick: Callable[[], None], should_stop: Callable[[], bool] = _never) -> None:
        self._engine, self._tick, self._should_stop = engine, tick, should_stop

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def stream(self, *args: Any, **kwargs: Any) -> Any:
        self._tick()
        return self._engine.stream(*args, **{"should_stop": self._should_stop, **kwargs})

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        self._tick()
        return self._engine.generate(*args, **{"should_stop": self._should_stop, **kwargs})

    def generate_batch(self, *args: Any, **kwargs: Any) -> Any:
        self._tick()
        return self._engine.generate_batch(*args, **{"should_stop": self._should_stop, **kwargs})


def planned_settings(spec: SweepSpec, engine: Any) -> list[Setting]:
    """The rows a Sweep-tab sweep measures, in the order it measures them: D3's first, then the baselines, then
    full depth timed against itself (the timing noise) last. A default sweep that ran full depth's own timing
    pairs first ended at its limit with only that row on a busy 2-core CPU (issue 44, M4); every row's agreement
    is read against the full-depth reference runs recorded before any row, so none needs the noise row."""
    settings = all_settings(spec, engine)  # full depth first, then D3, then the baselines
    full = [s for s in settings if isinstance(s.config, FullConfig)]
    d3 = [s for s in settings if isinstance(s.config, D3Config)]
    return [*d3, *[s for s in settings if s not in full and s not in d3], *full]


def runs_per_row(spec: SweepSpec) -> int:
    """Runs one row starts: an untimed warm-up of the setting, a full-depth and a timed run per timing pair, and
    (beyond full depth's own row) one teacher-forced pass per prompt for KL and the filled states' error."""
    return 1 + 2 * spec.repeats * len(spec.prompts) + len(spec.prompts)


def reference_runs(spec: SweepSpec) -> int:
    """Runs before the first row: full depth's warm-up and its recorded run per prompt (the agreement's reference)."""
    return 1 + len(spec.prompts)


def expected_runs(spec: SweepSpec) -> int:
    """About how many runs a Sweep-tab spec starts: the reference runs, then each row's (`runs_per_row`)."""
    settings = len(spec.depths) + len(spec.baselines) + 1
    return reference_runs(spec) + settings * runs_per_row(spec)


def runs_until_rows(spec: SweepSpec) -> list[int]:
    """Runs started by the end of each planned row, in `planned_settings` order (D3, baselines, full depth)."""
    rows = len(spec.depths) + len(spec.baselines) + 1
    return [reference_runs(spec) + (i + 1) * runs_per_row(spec) for i in range(rows)]


def run_small_sweep(engine: Engine, spec: SweepSpec, progress: Callable[[float, str], None] | None = None,
                    should_stop: Callable[[], bool] = _never) -> pd.DataFrame:
    """The table `iter_small_sweep` ends with: every row, or the rows finished before the sweep ran out of time."""
    df = pd.DataFrame()
    for df in iter_small_sweep(engine, spec, progress, should_stop):
        pass
    return df


def reference_row(engine: Any, spec: SweepSpec, setting: Setting, refs: References, key: str) -> dict[str, Any]:
    """The full-depth row before full depth is timed against itself: its quality read from the reference runs
    (agreement 1 by definition), 1× measured speedup (the unit every row is measured in), no timing noise yet."""
    L = engine.num_layers
    row: dict[str, Any] = {"key": key, "model": engine.name, "num_layers": L, "strategy": "full", "label": setting.label,
                           "params": json.dumps(setting.config.to_dict(), sort_keys=True), "target_depth": 1.0,
                           "prompts": len(spec.prompts), "new_tokens": spec.max_new_tokens, "repeats": spec.repeats,
                           "planned_mean_layers": float(L), "fixed_cost_layers": engine.fixed_cost_layers,
                           "measured_speedup": 1.0, "decode_speedup": 1.0, "self_speedup": float("nan"),
                           "timing_pairs": 0}
    scores, _ = quality(engine, spec, setting.config, refs)
    row.update(scores)
    row["depth_fraction"] = row["mean_layers"] / L
    row.update(theoretical_columns(float(L), row["mean_layers"], L, engine.fixed_cost_layers))
    return row


def _reference_first(df: pd.DataFrame) -> pd.DataFrame:
    """The table as the tab shows it: the full-depth reference on top, then the rows in the order measured."""
    full = df["strategy"] == "full"
    out = pd.concat([df[full], df[~full]], ignore_index=True)
    out.attrs.update(df.attrs)
    return out


def iter_small_sweep(engine: Engine, spec: SweepSpec, progress: Callable[[float, str], None] | None = None,
                     should_stop: Callable[[], bool] = _never) -> Iterator[pd.DataFrame]:
    """Run `spec` on `engine` into a fresh temporary CSV (never resumed from an earlier sweep): the full-depth
    reference runs, then the rows in `planned_settings` order (D3's first, full depth's own timing last), yielding
    the table after the reference and after each row, and once more at the end. The full-depth row is in every
    table (on top), at first without its timing noise, which its own row adds last.
    `progress(fraction, desc)` moves with every run started, never backwards; `should_stop()` is checked before
    every token of every run (it raises to end the sweep: a run stopped early would measure nothing). When it
    raises `OutOfTime`, the last table yielded holds the rows finished before, with the reason in
    `df.attrs["stopped"]`."""
    report = progress or (lambda fraction, desc: None)
    state = {"runs": 0, "shown": 0.0, "desc": "Starting the sweep…"}
    total = expected_runs(spec)

    def show(fraction: float, desc: str | None = None) -> None:
        state["desc"] = progress_words(desc) if desc else state["desc"]
        state["shown"] = max(state["shown"], min(fraction, 1.0))
        report(state["shown"], state["desc"])

    def tick() -> None:
        state["runs"] += 1
        show(min(0.98, state["runs"] / total))

    with tempfile.TemporaryDirectory(prefix="d3-sweep-") as folder:
        counting, path = _Counting(engine, tick, should_stop), Path(folder) / "sweep.csv"
        try:
            settings = planned_settings(spec, counting)
            refs = references(counting, spec, lambda fraction, desc: show(fraction, desc))
            full = settings[-1]
            append_row(path, reference_row(counting, spec, full, refs, setting_key(spec, engine.name, full)))
            yield _reference_first(read_results(path))
            for i, setting in enumerate(settings):
                label = NOISE_ROW if setting is full else setting.label
                show(state["shown"], f"{label} ({i + 1}/{len(settings)})")
                row, _ = measure_row(counting, spec, setting, refs, setting_key(spec, engine.name, setting))
                append_row(path, row)  # full depth's timed row replaces its reference row (same key)
                yield _reference_first(read_results(path))
        except OutOfTime as stop:
            done = _reference_first(read_results(path))
            done.attrs["stopped"] = str(stop)
            yield done
            return
        show(1.0, f"{len(settings)} settings measured")
        yield _reference_first(read_results(path))


NOISE_ROW = "full depth against itself (the timing noise)"


def speed_reading(measured: Any, theoretical: Any, noise: float, strategy: str) -> str:
    """How to read one row's measured speedup: above its theoretical bound (not possible: a timing artefact), within
    the noise that full depth timed against itself read, or "" where it stands as measured."""
    m, t = pd.to_numeric(pd.Series([measured, theoretical]), errors="coerce")
    if strategy == "full":
        return "the unit: every other row is measured against it"
    if pd.isna(m):
        return "not measured"
    if abs(m - 1.0) <= abs(noise - 1.0) and not (not pd.isna(t) and m > t * SPEED_ABOVE_THEORY):
        return f"within timing noise (full depth read {noise:.2f}× against itself)"
    # the Live tab's one reading (above theory, slower than full depth); the noise is the reference's, not an interval
    return speed_words(float(m), None, None, None if pd.isna(t) else float(t))


def progress_words(desc: str) -> str:
    """The sweep's progress as a person reads it: what is being measured now, never a count that reads as done
    ("full-depth reference 1/1" was shown while the reference was still being measured, and stayed when the sweep
    stopped before it was)."""
    reference = re.fullmatch(r"full-depth reference (\d+)/(\d+)", desc)
    if reference:
        return f"Measuring the full-depth reference: prompt {reference[1]} of {reference[2]}…"
    setting = re.fullmatch(r"(.+) \((\d+)/(\d+)\)", desc)
    if setting:
        return f"Measuring {setting[1]}: row {setting[2]} of {setting[3]} (rows done: {int(setting[2]) - 1})…"
    return desc


def sweep_table(df: pd.DataFrame, noise: float = 1.0) -> pd.DataFrame:
    """The columns the Sweep tab shows (rounded, under readable headers), one row per setting, in the sweep's order;
    the speed column says how to read each measured speedup (`speed_reading`, against the reference's `noise`)."""
    table = df.reindex(columns=list(SWEEP_HEADERS)).reset_index(drop=True)
    table["speed"] = [speed_reading(m, t, noise, str(k)) for m, t, k in
                      zip(table["measured_speedup"], table["theoretical_speedup"], table["strategy"])]
    numeric = [c for c in SWEEP_HEADERS if c not in ("label", "strategy", "params", "speed")]
    table[numeric] = table[numeric].apply(pd.to_numeric, errors="coerce").round(4)
    return table.rename(columns=SWEEP_HEADERS)


def sweep_controls(row: Mapping[str, Any]) -> dict[str, Any]:
    """Live-control values that reproduce one sweep row (`params` is its strategy config as JSON).

    ValueError for the full-depth reference row (the right pane always runs full depth)."""
    params = json.loads(row["params"]) if isinstance(row["params"], str) else dict(row["params"])
    cfg = strategy_from_dict(dict(params))
    layers = int(row["num_layers"])
    if cfg.name not in STRATEGY_LABELS:
        raise ValueError("this row is the full-depth reference, which the right pane always runs: pick another row")
    out: dict[str, Any] = {"strategy": cfg.name, "max_new_tokens": int(row["new_tokens"])}
    for control, (owner, key) in FIELDS.items():  # every page control that is one of this strategy's fields
        if owner is not GenerationConfig and isinstance(cfg, owner):
            out[control] = getattr(cfg, key)
    if isinstance(cfg, D3Config):
        out["core_head"], out["core_tail"] = cfg.core(layers)
        out["layer_order"] = layer_order_text(cfg.layer_order) if isinstance(cfg.layer_order, tuple) else ""
    elif isinstance(cfg, SkipDecodeConfig):
        out["skipdecode_max"], out["skipdecode_min"] = cfg.bounds(layers)
    for control in PAGE_RANGES.keys() & out.keys():  # a setting the page's controls cannot hold is not loaded
        if not page_param(control).ok(out[control]):
            raise ValueError(f"{LABELS[control]} {out[control]:g} is outside the page's range "
                             f"({page_param(control).allowed()}): run it with `python -m d3 generate`")
    return out


# ---------------------------------------------------------------- handlers


def _sweep_figure(df: pd.DataFrame, presentation: bool = False) -> Any:
    return pareto(df, y="agreement", title="Greedy agreement vs measured speedup", presentation=presentation)


def run_sweep(pool: ModelPool, model: str, chat_template: bool, sweep_prompts: str, sweep_settings: list[str],
              sweep_tokens: int, progress: gr.Progress = gr.Progress()) -> tuple[Any, ...]:
    """The outputs `stream_sweep` ends with (for a caller that wants only the finished sweep)."""
    out: tuple[Any, ...] = ()
    for out in stream_sweep(pool, model, chat_template, sweep_prompts, sweep_settings, sweep_tokens, progress):
        pass
    return out


def stream_sweep(pool: ModelPool, model: str, chat_template: bool, sweep_prompts: str, sweep_settings: list[str],
                 sweep_tokens: int, progress: gr.Progress = gr.Progress()) -> Iterator[tuple[Any, ...]]:
    """A small bounded sweep (d3.research.sweep.iter_sweep) on the chosen model: the table, its Pareto view and a
    note after each row as it is measured (the full-depth reference first), and once more when it ends, also when
    it ends at its time limit (the rows already measured stay)."""
    with user_errors():
        name = pool.check_name(model)
        spec = sweep_spec(name, sweep_prompts, sweep_settings, sweep_tokens, chat_template, pool.caps)
        progress(0.0, desc="Loading the model…" if not pool.is_loaded(name) else "Starting the sweep…")
        engine = pool.engine(name)
        limit = sweep_time_limit(pool.caps)
        deadline = Deadline(limit)

        def out_of_time() -> bool:
            """Before every token: where the next token would end past the deadline the sweep ends there (a sweep
            nobody waits for must end too; checked only between settings, the largest overran its limit by 13%)."""
            if deadline.passed():
                raise OutOfTime(f"the sweep reached its time limit of {limit} s")
            return False

        tables = iter_small_sweep(engine, spec, progress=lambda fraction, desc: progress(fraction, desc=desc),
                                  should_stop=out_of_time)
        df = next(tables)
        for following in tables:
            yield ordered(SWEEP_OUTPUTS, **sweep_outputs(df, spec, running=True, limit=limit))
            df = following
    yield ordered(SWEEP_OUTPUTS, **sweep_outputs(df, spec, limit=limit))


def sweep_time_limit(caps: Caps) -> int:
    """Seconds a Sweep-tab sweep may run: SWEEP_MAX_S, or the server's run limit when that is lower."""
    return min(SWEEP_MAX_S, caps.max_run_s)


def measured_rows(df: pd.DataFrame) -> int:
    """Rows a sweep has measured: each setting's, and full depth's once it was timed against itself (until then
    its row is the reference runs alone, shown so that every setting has its unit)."""
    if df.empty:
        return 0
    full = df["strategy"] == "full"
    pairs = pd.to_numeric(df["timing_pairs"], errors="coerce") if "timing_pairs" in df else pd.Series(1, index=df.index)
    return int((~full).sum() + (full & (pairs.fillna(0) > 0)).sum())


def sweep_outputs(df: pd.DataFrame, spec: SweepSpec, *, running: bool = False, limit: int = SWEEP_MAX_S) -> dict[str, Any]:
    """The table, the Pareto view and the note of a finished sweep, of one stopped at its time limit (the
    rows done so far kept and drawn, and a plain message saying so), or (`running`) of one still measuring. Each
    note says how many of the planned rows were measured within the `limit` (seconds)."""
    stopped = df.attrs.get("stopped")
    total = len(spec.depths) + len(spec.baselines) + 1
    done = measured_rows(df)
    if running and not df.empty:
        df, noise = reference_as_one(df)
        note = (f"Measured {done} of {total} rows so far (D3's first, full depth timed against itself last; the "
                "full-depth reference runs, on top, are every row's unit); measuring the next one. The rows below "
                f"are final; the sweep stops at its {limit} s limit and keeps them.")
        return dict(sweep_results=df, sweep_table=sweep_table(df, noise), sweep_pareto=_sweep_figure(df),
                    sweep_note=note, sweep_file=None)
    if stopped and df.empty:
        note = (f"**Stopped: {stopped}** before the full-depth reference was measured: measured 0 of {total} rows, "
                "so there is nothing to show. Choose fewer settings or tokens, or a shorter prompt, and run it again.")
        return dict(sweep_results=df, sweep_table=sweep_table(df), sweep_pareto=None, sweep_note=note, sweep_file=None)
    df, noise = reference_as_one(df)
    noise_words = (f"Full depth timed against itself read {noise:.2f}×: differences that small are timing noise."
                   if np.isfinite(noise) else "Full depth was not timed against itself (its row comes last), so "
                   "the timing noise is not known: read small differences from 1× as noise.")
    if stopped:
        note = (f"**Stopped: {stopped}**. Measured {done} of {total} rows within the {limit} s limit "
                f"({_row_words(df)}); they are kept below and on the plot. {noise_words} Choose fewer settings or "
                "tokens to measure the rest. Click a point or a row to load its setting into the controls.")
    else:
        note = (f"Measured {done} of {total} rows within the {limit} s limit ({_row_words(df)}) on "
                f"{len(spec.prompts)} prompt(s), {spec.max_new_tokens} new tokens, {spec.repeats} timing pairs each "
                f"(median). {noise_words} {interval_note(len(spec.prompts))} Click a point or a row to load its "
                "setting into the controls.")
    return dict(sweep_results=df, sweep_table=sweep_table(df, noise), sweep_pareto=_sweep_figure(df), sweep_note=note,
                sweep_file=None)  # the previous sweep's CSV is no longer offered


def _row_words(df: pd.DataFrame) -> str:
    """Which rows a table holds, counted by strategy: "2 D3, 1 SkipDecode and full depth's reference"."""
    names = {"d3": "D3", "skipdecode": "SkipDecode", "unified": "Unified Layer Skipping", "early_exit": "early exit"}
    counts = df.loc[df["strategy"] != "full", "strategy"].value_counts(sort=False)
    parts = [f"{n} {names.get(str(k), str(k))}" for k, n in counts.items()]
    full = df[df["strategy"] == "full"]
    if not full.empty:
        timed = measured_rows(full) > 0
        parts.append("full depth timed against itself" if timed else "full depth's reference runs (not yet timed "
                     "against itself)")
    return ", ".join(parts[:-1]) + (" and " if len(parts) > 1 else "") + parts[-1] if parts else "no rows"


def interval_note(prompts: int) -> str:
    """What the agreement's interval is, or why there is none (its unit is the prompt)."""
    if prompts < 2:
        return ("Agreement is full depth's tokens kept, on one prompt: no interval (its tokens are not independent; "
                "type a second prompt on its own line for a 95% interval over prompts).")
    return ("Agreement is paired with full depth on the same prompts; agreement_low/high and the error bars are its "
            f"95% interval (paired bootstrap over the {prompts} prompts: wide with so few).")


def reference_as_one(df: pd.DataFrame) -> tuple[pd.DataFrame, float]:
    """The table with the full-depth reference at 1× measured speedup (it is the unit every other row is
    measured in), and what its own timing pairs read (the noise floor, shown in the note): a reference that
    read 1.3× would otherwise sit right of every setting on the Pareto view for a timing artefact alone."""
    full = df["strategy"] == "full"
    column = "self_speedup" if "self_speedup" in df else "measured_speedup"
    noise = float(pd.to_numeric(df.loc[full, column], errors="coerce").median()) if full.any() else float("nan")
    out = df.copy()
    out.loc[full, "measured_speedup"] = 1.0
    return out, noise


class Selection(gr.EventData):
    """gr.SelectData that also takes a call with no select event (an API call): its index is then None. Gradio
    builds the annotated class from the event's data, and gr.SelectData fails on none, before the handler runs."""

    def __init__(self, target: Any, data: Any) -> None:
        super().__init__(target, data)
        self.index = data.get("index") if isinstance(data, dict) else None


def load_sweep_setting(sweep_results: pd.DataFrame | None,
                       evt: Selection = None) -> tuple[Any, ...]:  # type: ignore[assignment]
    """A clicked table row sets the live controls to that row's strategy and parameters. (`evt` is annotated with
    a plain class, not `Selection | None`: Gradio passes the event only to a parameter annotated with a class.)"""
    index = getattr(evt, "index", None)
    if index is None:
        return ordered(SWEEP_LOAD_OUTPUTS, sweep_note="Click a row of the sweep's table to load its setting.")
    return _load_sweep_row(sweep_results, index[0] if isinstance(index, (list, tuple)) and index else index)


def load_sweep_point(sweep_results: pd.DataFrame | None, sweep_point: str) -> tuple[Any, ...]:
    """A clicked point of the Pareto view ("ROW@stamp", written by assets/plot_click.js) loads that row."""
    return _load_sweep_row(sweep_results, str(sweep_point or "").partition("@")[0].strip())


def _load_sweep_row(sweep_results: pd.DataFrame | None, index: Any) -> tuple[Any, ...]:
    """The row's setting in the live controls; a row that loads nothing says why in the note under the plot
    (these run out of the queue, where an error would be an HTTP 500 that the page never shows)."""
    if sweep_results is None or len(sweep_results) == 0:
        return ordered(SWEEP_LOAD_OUTPUTS, sweep_note="No sweep results yet: press **Run sweep** first.")
    try:
        if int(index) < 0:
            raise IndexError(index)
        row = sweep_results.reset_index(drop=True).iloc[int(index)]
    except (TypeError, ValueError, IndexError):
        return ordered(SWEEP_LOAD_OUTPUTS, sweep_note="That row is not in the sweep's results: click another one.")
    try:
        values = sweep_controls(row)
    except ValueError as err:  # the full-depth reference row
        return ordered(SWEEP_LOAD_OUTPUTS, sweep_note=f"**{row['label']}**: {err}.")
    if "core_head" in values:
        values.update(core_sliders(int(row["num_layers"]), values["core_head"], values["core_tail"]))
    note = f"Loaded **{row['label']}** into the controls: press Generate to run it side by side with full depth."
    status = views.status_html(None, None, f"Loaded from the sweep: {row['label']}. Press Generate to run it.")
    return ordered(SWEEP_LOAD_OUTPUTS, sweep_note=note, modes=gr.Tabs(selected="live"), status=status, **values)
