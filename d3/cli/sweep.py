"""`python -m d3 sweep`: the sweep's flags, parsed into a `SweepSpec`, and the run with a progress bar."""

from __future__ import annotations

import argparse
import csv
import re
from collections.abc import Callable
from dataclasses import fields
from fractions import Fraction
from pathlib import Path
from typing import Any

import d3.research.sweep
from d3.cli.common import (
    CliError,
    add_field_args,
    add_model_arg,
    add_threads_arg,
    check_output_file,
    describe_param,
    int_in,
    set_threads,
)
from d3.config import BASELINES, CONFIDENCE_MEASURES, DROP_ORDERS, FILLS, core_fits, params
from d3.research.data import DEFAULT_TASKS
from d3.research.gentasks import DEFAULT_GENERATION_TASKS
from d3.research.sweep.spec import Progress, SweepSpec, load_prompts, prompt_count
from d3.research.sweep.table import sidecar


def _ascii(text: str) -> str:
    """The text, if it is ASCII: Python reads other scripts' digits as numbers ("٠.٩"), no other tool here does."""
    if not text.isascii():
        raise ValueError("give ASCII digits")
    return text


def _floats(text: str) -> tuple[float, ...]:
    """"0.85,2/3" -> (0.85, 0.666...)."""
    try:
        return tuple(float(Fraction(x.strip())) for x in _ascii(text).split(",") if x.strip())
    except (ValueError, ZeroDivisionError):
        raise ValueError("give numbers or fractions, comma-separated (0.85,2/3)") from None


def _fraction(text: str) -> float:
    """"2/3" -> 0.666...: one number or fraction."""
    values = _floats(text)
    if len(values) != 1:
        raise ValueError("give one number or fraction (2/3)")
    return values[0]


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in _ascii(text).split(",") if x.strip())
    except ValueError:
        raise ValueError("give integers, comma-separated (0,16)") from None


def _cores(text: str) -> tuple[tuple[int, int] | None, ...]:
    """"default,0+0,2+2" -> (None, (0, 0), (2, 2))."""
    out: list[tuple[int, int] | None] = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        if part == "default":
            out.append(None)
            continue
        pair = part.split("+")
        if len(pair) != 2 or not all(x.strip().isascii() and x.strip().isdigit() and len(x.strip()) <= 6 for x in pair):
            raise ValueError(f"{part[:40]!r} is not a core split: give default or HEAD+TAIL, comma-separated (default,2+2)")
        out.append((int(pair[0]), int(pair[1])))
    return tuple(out)


def _words(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def _task_names(text: str, mode: str = "score") -> tuple[str, ...]:
    """Comma-separated task names; "default" stands for the tasks the embedded model is above chance (or zero)
    on: d3.research.data.DEFAULT_TASKS, or d3.research.gentasks.DEFAULT_GENERATION_TASKS with --task-mode generate."""
    names = _words(text)
    if names != ("default",):
        return names
    return DEFAULT_GENERATION_TASKS if mode == "generate" else DEFAULT_TASKS


def _shown(value: Any) -> str:
    """A SweepSpec default as its flag takes it: (0.85, 2/3) -> "0.85,2/3", (None, (2, 2)) -> "default,2+2"."""
    if value is None:
        return "default"
    if isinstance(value, tuple):
        return ",".join(_shown(v) if not isinstance(v, tuple) else f"{v[0]}+{v[1]}" for v in value) or "none"
    if isinstance(value, float) and len(repr(value)) > 6:  # 2/3 rather than 0.6666666666666666
        fraction = Fraction(value).limit_denominator(100)
        return str(fraction) if abs(float(fraction) - value) < 1e-12 else repr(value)
    return str(value)


# The spec's list fields, each a comma-separated flag: its parser and what it is. The default is the spec's own
# (SweepSpec), shown in the help; a flag left out leaves the field at it.
LISTS: dict[str, tuple[Callable[[str], Any], str]] = {
    "depths": (_floats, "target mean depths, fractions of L"),
    "alphas": (_floats, "extra D3 settings with explicit alpha"),
    "cores": (_cores, "D3 core splits, e.g. default,0+0,4+4"),
    "starts": (_ints, "D3 start values in tokens, e.g. 0,16"),
    "fills": (_words, f"D3 fills among {','.join(FILLS)}"),
    "drop_orders": (_words, f"D3 drop orders among {','.join(DROP_ORDERS)}; calibrated is the model's measured "
                    "order, calibrated:NAME a cached calibration (calibrated:agreement)"),
    "baselines": (_words, f"baselines among {','.join(BASELINES)}"),
    "baseline_depths": (_floats, "depths for baselines (default: --depths)"),
    "early_exit_measures": (_words, f"early exit's confidence measures among {','.join(CONFIDENCE_MEASURES)}"),
    "early_exit_depths": (_floats, "depths for early exit (default: baseline depths)"),
}
OPTIONAL_LISTS = ("baseline_depths", "early_exit_depths")  # empty: None (the field's default: follow the others)
SCALARS = ("max_new_tokens", "repeats", "task_limit", "task_scoring", "task_mode", "task_split", "ppl_chunks")
FLAGS = {"max_new_tokens": "--new-tokens", "chat_template": "--no-chat-template"}  # spec fields named otherwise


def _flag(field: str) -> str:
    return FLAGS.get(field, "--" + field.replace("_", "-"))
def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register `sweep` on an argparse subparsers object: every flag that sets a SweepSpec field takes its range,
    choices and default from the spec (its Params, or the field's default for the lists)."""
    p = subparsers.add_parser("sweep", help="run a grid of D3 settings and baselines at matched depth",
                              description=d3.research.sweep.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    defaults: dict[str, Any] = {f.name: f.default for f in fields(SweepSpec)}
    add_model_arg(p)
    p.add_argument("--out", default="results/sweep.csv", help="CSV appended row by row; a rerun resumes")
    p.add_argument("--prompts", type=int_in(1, prompt_count()), default=len(defaults["prompts"]),
                   help=f"how many prompts of assets/prompts.json (it holds {prompt_count()})")
    add_field_args(p, SweepSpec, SCALARS, flags=FLAGS)
    for name, (_, what) in LISTS.items():
        default = "" if name in OPTIONAL_LISTS else f" (default {_shown(defaults[name])})"
        p.add_argument(_flag(name), dest=name, default=None, help=(what + default).replace("%", "%%"))
    variants_at = params(SweepSpec)["variants_at"]
    p.add_argument("--variants-at", default=None, help=describe_param(variants_at).replace(
        f"default {variants_at.default}", f"default {_shown(variants_at.default)}"))
    p.add_argument("--product", action="store_true", help="full product of the D3 axes at every depth")
    p.add_argument("--tasks", default="", help="BIG-bench tasks (d3.research.data.TASKS), comma separated; 'default' for "
                   "d3.research.data.DEFAULT_TASKS, the ones the embedded model is above chance on")
    add_threads_arg(p)
    p.add_argument("--limit", type=int_in(1), default=None, help="measure at most this many new settings, then stop")
    p.add_argument("--no-chat-template", action="store_true")
    p.set_defaults(func=main)
    return p


def _parsed(flag: str, parse: Callable[[str], Any], text: str) -> Any:
    try:
        return parse(text)
    except ValueError as err:
        raise CliError(f"{flag} {text[:40]!r}: {err}") from None


def spec_from_args(args: argparse.Namespace) -> SweepSpec:
    """The spec of the flags; CliError naming the flag of the first value that is not allowed. A list flag left
    out leaves its field at the spec's default."""
    given: dict[str, Any] = {}
    for name, (parse, _) in LISTS.items():
        text = getattr(args, name)
        if text is not None:
            value = _parsed(_flag(name), parse, text)
            given[name] = (value or None) if name in OPTIONAL_LISTS else value
    if args.variants_at is not None:
        given["variants_at"] = _parsed("--variants-at", _fraction, args.variants_at)
    try:
        return SweepSpec(
            model=args.model, prompts=load_prompts(args.prompts), **{name: getattr(args, name) for name in SCALARS},
            **given, product=args.product, tasks=_task_names(args.tasks, args.task_mode),
            chat_template=not args.no_chat_template)
    except ValueError as err:  # the spec names its field ("tasks=... is not allowed: tasks must be ..."): say the flag
        message = str(err)
        field = re.match(r"\w+", message)
        if field:
            message = re.sub(rf"^{field.group(0)}=(.*?) {field.group(0)} must", lambda m: f"{_flag(field.group(0))}="
                             f"{m.group(1)} {_flag(field.group(0))} must", message, count=1)
        raise CliError(message) from None


def check_results_file(path: str | Path, task_mode: str) -> None:
    """An existing --out must be a sweep's own table (of this task mode) to be appended to: its header has the key
    column and no column the sweep does not write. Anything else is refused, never appended to."""
    path = Path(path)
    if not path.is_file() or path.stat().st_size == 0:
        return
    from d3.research.sweep.generation import GEN_COLUMNS
    from d3.research.sweep.table import COLUMNS

    columns: tuple[str, ...] = GEN_COLUMNS if task_mode == "generate" else COLUMNS
    try:
        with path.open(newline="", encoding="utf-8") as fh:
            header = next(csv.reader(fh), [])
    except (OSError, UnicodeDecodeError, csv.Error):
        header = []
    if "key" not in header or not set(header) <= set(columns):
        kind = "a generation sweep's" if task_mode == "generate" else "a sweep's"
        raise CliError(f"--out {path} is not {kind} table (a rerun appends to one): give a new file, or that "
                       "sweep's own CSV to resume it")


def check_cores(spec: SweepSpec, num_layers: int) -> None:
    """Every core split keeps the core rule (d3.config.core_fits); CliError naming --cores otherwise."""
    for core in spec.cores:
        if core is not None and not core_fits(*core, num_layers):
            raise CliError(f"--cores {core[0]}+{core[1]}: head + tail must be at most {num_layers - 1}, leaving one "
                           f"of {spec.model}'s {num_layers} layers to drop")


def tqdm_progress() -> tuple[Progress, Callable[[], None]]:
    """A progress(fraction, desc) callback drawing a tqdm bar, and a function that closes the bar."""
    from tqdm import tqdm

    bar = tqdm(total=1000, unit="‰", bar_format="{l_bar}{bar}| {elapsed}<{remaining}")

    def update(fraction: float, desc: str) -> None:
        bar.set_description_str(desc[:60])
        bar.n = int(round(fraction * 1000))
        bar.refresh()

    return update, bar.close


def main(args: argparse.Namespace, engine: Any = None) -> int:
    """Run the sweep; `engine` lets tests inject a tiny model."""
    check_output_file(args.out, "--out")  # before any model loads: a bad path fails in milliseconds
    spec = spec_from_args(args)
    check_results_file(args.out, spec.task_mode)
    from d3.models import KNOWN_MODELS

    known = KNOWN_MODELS.get(spec.model)
    if known is not None:  # its layers are known without loading it
        check_cores(spec, known.facts.num_layers)
    set_threads(args.threads)
    # Loaded here, not at the top: the parser is built for every command, and the run needs torch.
    from d3.research.sweep.run import load_engine, run_sweep

    engine = engine if engine is not None else load_engine(spec.model)
    check_cores(spec, engine.num_layers)  # a local model: right after it loads, before any work

    progress, close = tqdm_progress()
    try:
        if spec.task_mode == "generate":
            from d3.research.sweep.generation import run_generation_sweep

            df = run_generation_sweep(spec, args.out, engine=engine, progress=progress, limit=args.limit)
        else:
            df = run_sweep(spec, args.out, engine=engine, progress=progress, limit=args.limit)
    finally:
        close()
    print("\n".join(paired_lines(df)))
    json_note = "" if spec.task_mode == "generate" else f" (JSON: {sidecar(args.out, 'json')})"
    print(f"{len(df)} rows in {args.out}{json_note}")
    return 0


def _pts(row: Any, key: str) -> str:
    """"-2.6 [-4.9, -0.6] pts" from the row's `key`, `key`_low and `key`_high (fractions); "" when not measured."""
    values = [row.get(k) for k in (key, f"{key}_low", f"{key}_high")]
    if any(v is None or v != v for v in values):  # NaN: not measured, or no interval (one prompt)
        return ""
    d, lo, hi = (100 * float(v) for v in values)
    return f"{d:+.1f} [{lo:+.1f}, {hi:+.1f}] pts"


def paired_lines(df: Any) -> list[str]:
    """One line per row: depth run, measured speedup and every quality figure as a paired difference from full
    depth on the same prompts or questions with its 95% interval (accuracy: exact McNemar; agreement and the
    same-answer rate: paired bootstrap, over prompts for agreement)."""
    lines = []
    for row in df.to_dict("records"):
        parts = [f"{row.get('label', '')}: {float(row.get('mean_layers', float('nan'))):.2f} layers, "
                 f"{float(row.get('measured_speedup', float('nan'))):.2f}x measured"]
        if _pts(row, "diff"):
            parts.append(f"accuracy {_pts(row, 'diff')}")
        for key, name in (("agreement", "agreement"), ("same_answer", "same answer")):
            value = row.get(key)
            if value is not None and value == value:
                shifted = {key: value - 1, f"{key}_low": row.get(f"{key}_low", float("nan")) - 1,
                           f"{key}_high": row.get(f"{key}_high", float("nan")) - 1}
                parts.append(f"{name} {_pts(shifted, key) or f'{100 * (value - 1):+.1f} pts (one prompt: no interval)'}")
        lines.append("; ".join(parts))
    return lines
