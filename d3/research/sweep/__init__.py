"""Grid sweeps: D3 settings and baselines at matched mean depth, measured against full depth, one CSV row each.

`python -m d3 sweep` runs a `SweepSpec` grid over a prompt set and appends one tidy row per setting to a CSV
as soon as it is measured, so an interrupted sweep resumes: a rerun skips every setting whose key (a stable
hash of the setting and of everything that was measured with it) is already in the file.

Per setting: mean layers used, theoretical speedup with and without the LM-head fixed cost, measured speedup
against full depth (full depth and the method alternate on the same prompts; median over prompt x repeat
pairs), greedy agreement and first divergence, KL teacher-forced and free-running (`d3.compare.compare`),
perplexity of real text read under the schedule, and task accuracy where tasks are given.

Timing and quality runs compute exactly `max_new_tokens` steps (`stop_at_eos=False`), so every strategy is timed
on the same positions of its schedule. The engine stops recording a sequence's steps at its first EOS (while
still computing the remaining steps), so `mean_layers`, agreement and KL cover the tokens up to that EOS;
theoretical speedups use the planned mean over all computed steps (see `theoretical_columns`).
"""

from __future__ import annotations

# The package, one job per module:
#   spec     what is measured: `SweepSpec`, one `Setting`, the row key, the prompt set
#   grid     depth matching (alpha, SkipDecode, Unified, early-exit threshold for a target mean depth) and the grid
#   measure  one row: timing, agreement and KL against full depth, perplexity (loads torch)
#   tasks    BIG-bench task accuracy under a schedule
#   table    the CSV's columns, reading and appending rows, JSON sidecars
#   run      the loop: settings not yet in the CSV, measured one by one (loads torch)
from typing import Any

from d3.research.sweep.grid import all_settings
from d3.research.sweep.spec import (
    BASELINES,
    BUILTIN_PROMPTS,
    TASK_SCORINGS,
    Setting,
    SweepSpec,
    load_prompts,
    setting_key,
)
from d3.research.sweep.table import COLUMNS, read_results, sidecar

__all__ = ["BASELINES", "BUILTIN_PROMPTS", "TASK_SCORINGS", "COLUMNS", "Setting", "SweepSpec", "all_settings",
           "load_prompts", "read_results", "run_sweep", "setting_key", "sidecar"]


def __getattr__(name: str) -> Any:
    # run_sweep is loaded on first use: it needs torch (through d3.compare), and the report and the CLI's
    # parser import this package without ever running a model.
    if name == "run_sweep":
        from d3.research.sweep.run import run_sweep

        return run_sweep
    raise AttributeError(f"module 'd3.research.sweep' has no attribute {name!r}")
