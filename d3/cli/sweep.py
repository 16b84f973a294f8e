"""`python -m d3 sweep`: the sweep's flags, parsed into a `SweepSpec`, and the run with a progress bar."""

from __future__ import annotations

import argparse
import re
from fractions import Fraction
from typing import Any, Callable

from tqdm import tqdm

import d3.research.sweep
from d3.cli.common import CliError, add_field_args, add_model_arg, add_threads_arg, check_output_file, int_in, \
    set_threads
from d3.config import DROP_ORDERS, GenerationConfig, core_fits, params
from d3.models import KNOWN_MODELS
from d3.research.data import DEFAULT_TASKS
from d3.research.gentasks import DEFAULT_GENERATION_TASKS
from d3.research.sweep.spec import BASELINES, MIN_SWEEP_TOKENS, TASK_MODES, TASK_SCORINGS, Progress, SweepSpec, \
    load_prompts, prompt_count
from d3.research.sweep.table import sidecar


def _floats(text: str) -> tuple[float, ...]:
    """"0.85,2/3" -> (0.85, 0.666...)."""
    try:
        return tuple(float(Fraction(x.strip())) for x in text.split(",") if x.strip())
    except (ValueError, ZeroDivisionError):
        raise ValueError("give numbers or fractions, comma-separated (0.85,2/3)") from None


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
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
        if len(pair) != 2 or not all(x.strip().isdigit() and len(x.strip()) <= 6 for x in pair):
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


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register `sweep` on an argparse subparsers object."""
    p = subparsers.add_parser("sweep", help="run a grid of D3 settings and baselines at matched depth",
                              description=d3.research.sweep.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arg(p)
    p.add_argument("--out", default="results/sweep.csv", help="CSV appended row by row; a rerun resumes")
    p.add_argument("--prompts", type=int_in(1, prompt_count()), default=4,
                   help=f"how many prompts of assets/prompts.json (it holds {prompt_count()})")
    add_field_args(p, GenerationConfig, ("max_new_tokens",), flags={"max_new_tokens": "--new-tokens"},
                   narrow={"max_new_tokens": params(GenerationConfig)["max_new_tokens"].narrowed(lo=MIN_SWEEP_TOKENS)})
    p.add_argument("--repeats", type=int_in(1, 50), default=3, help="timing repeats (full depth and method alternate)")
    p.add_argument("--depths", default="0.85,0.75,2/3,0.55", help="target mean depths, fractions of L")
    p.add_argument("--alphas", default="", help="extra D3 settings with explicit alpha")
    p.add_argument("--cores", default="default", help="D3 core splits, e.g. default,0+0,4+4")
    p.add_argument("--starts", default="0", help="D3 start values in tokens, e.g. 0,16")
    p.add_argument("--fills", default="copy", help="D3 fills among copy,propagate,none")
    p.add_argument("--drop-orders", default="middle_out", help=f"D3 drop orders among {','.join(DROP_ORDERS)}; "
                   "calibrated is the model's measured order, calibrated:NAME a cached calibration (calibrated:agreement)")
    p.add_argument("--task-split", default="all", choices=("all", "test"), help="generate mode: all questions "
                   "(validation first) or only the test split")
    p.add_argument("--variants-at", default="2/3", help="depth at which the non-base D3 variants run")
    p.add_argument("--product", action="store_true", help="full product of the D3 axes at every depth")
    p.add_argument("--baselines", default=",".join(BASELINES))
    p.add_argument("--baseline-depths", default="", help="depths for baselines (default: --depths)")
    p.add_argument("--early-exit-measures", default="softmax_gap", help="softmax_gap,cosine")
    p.add_argument("--early-exit-depths", default="", help="depths for early exit (default: baseline depths)")
    p.add_argument("--tasks", default="", help="BIG-bench tasks (d3.research.data.TASKS), comma separated; 'default' for "
                   "d3.research.data.DEFAULT_TASKS, the ones the embedded model is above chance on")
    p.add_argument("--task-limit", type=int_in(1), default=30)
    p.add_argument("--task-scoring", default="loglik", choices=TASK_SCORINGS)
    p.add_argument("--task-mode", default="score", choices=TASK_MODES,
                   help="generate: generation accuracy (the paper's measure): --tasks are d3.research.gentasks tasks, answered "
                   "in full by greedy generation and scored by exact match; each setting timed against full depth "
                   "on --repeats batches per task; --new-tokens is the answer length depths are matched over")
    p.add_argument("--ppl-chunks", type=int_in(0), default=4)
    add_threads_arg(p)
    p.add_argument("--limit", type=int_in(1), default=None, help="measure at most this many new settings, then stop")
    p.add_argument("--no-chat-template", action="store_true")
    p.set_defaults(func=main)
    return p


FLAGS = {"max_new_tokens": "--new-tokens", "chat_template": "--no-chat-template"}  # spec fields named otherwise


def _flag(field: str) -> str:
    return FLAGS.get(field, "--" + field.replace("_", "-"))


def _parsed(flag: str, parse: Callable[[str], Any], text: str) -> Any:
    try:
        return parse(text)
    except ValueError as err:
        raise CliError(f"{flag} {text[:40]!r}: {err}") from None


def spec_from_args(args: argparse.Namespace) -> SweepSpec:
    """The spec of the flags; CliError naming the flag of the first value that is not allowed."""
    lists = {name: _parsed(_flag(name), parse, getattr(args, name)) for name, parse in (
        ("depths", _floats), ("alphas", _floats), ("cores", _cores), ("starts", _ints), ("variants_at", _floats),
        ("baseline_depths", _floats), ("early_exit_depths", _floats))}
    if not lists["variants_at"]:
        raise CliError("--variants-at is empty: give one depth (2/3)")
    try:
        return SweepSpec(
            model=args.model, prompts=load_prompts(args.prompts), max_new_tokens=args.max_new_tokens, repeats=args.repeats,
            depths=lists["depths"], alphas=lists["alphas"], cores=lists["cores"], starts=lists["starts"],
            fills=_words(args.fills), drop_orders=_words(args.drop_orders), variants_at=lists["variants_at"][0],
            product=args.product, baselines=_words(args.baselines),
            baseline_depths=lists["baseline_depths"] or None, early_exit_measures=_words(args.early_exit_measures),
            early_exit_depths=lists["early_exit_depths"] or None,
            tasks=_task_names(args.tasks, args.task_mode), task_limit=args.task_limit, task_scoring=args.task_scoring,
            task_mode=args.task_mode, task_split=args.task_split,
            ppl_chunks=args.ppl_chunks, chat_template=not args.no_chat_template)
    except ValueError as err:  # the spec names its field ("tasks=... is not allowed: tasks must be ..."): say the flag
        message = str(err)
        field = re.match(r"\w+", message)
        if field:
            message = re.sub(rf"^{field.group(0)}=(.*?) {field.group(0)} must", lambda m: f"{_flag(field.group(0))}="
                             f"{m.group(1)} {_flag(field.group(0))} must", message, count=1)
        raise CliError(message) from None


def check_cores(spec: SweepSpec, num_layers: int) -> None:
    """Every core split keeps the core rule (d3.config.core_fits); CliError naming --cores otherwise."""
    for core in spec.cores:
        if core is not None and not core_fits(*core, num_layers):
            raise CliError(f"--cores {core[0]}+{core[1]}: head + tail must be at most {num_layers - 1}, leaving one "
                           f"of {spec.model}'s {num_layers} layers to drop")


def tqdm_progress() -> tuple[Progress, Callable[[], None]]:
    """A progress(fraction, desc) callback drawing a tqdm bar, and a function that closes the bar."""
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
