"""`python -m d3 paper`: the paper's protocol (validation-chosen alpha and start, test exact match and speed)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from d3.cli.common import CliError, add_model_arg, add_threads_arg, check_output_file, set_threads
from d3.research.paper import ALPHAS, DROP_ORDER_CHOICES, SELECTION_RULE, START_FRACTIONS, TASKS


def _floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of numbers") from err


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "paper", help="the paper's protocol: alpha and start chosen on validation, test exact match and speedups",
        description="Runs the D3 paper's protocol on a model. " + SELECTION_RULE + " Then full depth and D3 answer "
        "the test questions interleaved in the same process (wall-clock speedup = full seconds / D3 seconds). "
        "Under `accelerate launch` each process answers a shard of the questions; the main process prints and "
        "writes the table.")
    add_model_arg(p, "known model name, a local model directory or a hub id")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N or mps (under accelerate: the "
                   "process's own device)")
    p.add_argument("--dtype", default="auto", help="auto (the model's own), float32, bfloat16 or float16")
    p.add_argument("--device-map", default=None, help="e.g. auto: spread one model over every GPU (one process)")
    p.add_argument("--tasks", default="addition", help=f"comma-separated, of: {', '.join(TASKS)}")
    p.add_argument("--limit", type=int, default=None, help="test questions per task (default all)")
    p.add_argument("--val-limit", type=int, default=None, help="validation questions per task (default all)")
    p.add_argument("--alphas", type=_floats, default=ALPHAS, help="alpha grid, comma-separated")
    p.add_argument("--start-fractions", type=_floats, default=START_FRACTIONS,
                   help="start grid as fractions of the mean full-depth output length, comma-separated")
    p.add_argument("--drop-orders", default=",".join(DROP_ORDER_CHOICES), help="drop orders the validation split "
                   "chooses among, comma-separated: middle_out, bottom_up, top_down, strided, and task (the order "
                   "calibrated by exact match on the validation split)")
    p.add_argument("--calibrate-steps", type=int, default=6, help="greedy removals of the task-calibrated order")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--chat-template", action="store_true", help="wrap prompts in the chat template (default raw "
                   "few-shot text, as for a base model)")
    p.add_argument("--out", default="paper_results.csv", help="CSV written by the main process")
    add_threads_arg(p, "torch CPU threads per process (0: torch's default)")
    p.set_defaults(func=main)
    return p


def _check(args: argparse.Namespace) -> list[str]:
    """Everything that can be wrong with the flags, found before any model loads."""
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    unknown = [t for t in tasks if t not in TASKS]
    if not tasks or unknown:
        raise CliError(f"--tasks {args.tasks!r}: tasks are {', '.join(TASKS)}")
    for flag, value in (("--limit", args.limit), ("--val-limit", args.val_limit), ("--batch-size", args.batch_size)):
        if value is not None and value < 1:
            raise CliError(f"{flag} {value}: must be at least 1")
    if not args.alphas or not all(0 < a <= 1 for a in args.alphas):
        raise CliError(f"--alphas {args.alphas}: each alpha must be in (0, 1]")
    orders = [o.strip() for o in args.drop_orders.split(",") if o.strip()]
    allowed = ("middle_out", "bottom_up", "top_down", "strided", "task")
    if not orders or any(o not in allowed for o in orders):
        raise CliError(f"--drop-orders {args.drop_orders!r}: each must be one of {', '.join(allowed)}")
    if args.calibrate_steps < 1:
        raise CliError(f"--calibrate-steps {args.calibrate_steps}: must be at least 1")
    if not args.start_fractions or not all(0 <= f <= 1 for f in args.start_fractions):
        raise CliError(f"--start-fractions {args.start_fractions}: each fraction must be in [0, 1]")
    check_output_file(args.out, "--out")
    return tasks


def _wants_cpu(device: str) -> bool:
    import torch

    return device == "cpu" or (device == "auto" and not torch.cuda.is_available())


def _engine(args: argparse.Namespace, shards: Any) -> Any:
    from d3.cli import _quiet_transformers
    from d3.engine import Engine
    from d3.models import load_model

    _quiet_transformers()
    if args.device_map and shards.count > 1:
        raise CliError("--device-map spreads one model over the GPUs: run it as one process, not under "
                       f"accelerate launch with {shards.count} processes")
    device = args.device
    if shards.count > 1 and device in ("auto", "cuda"):
        device = str(shards.state.device)  # each process on its own GPU (cuda:local_rank), or cpu
    loaded = load_model(args.model, device=device, dtype=args.dtype, device_map=args.device_map)
    return Engine.from_loaded(loaded)


def main(args: argparse.Namespace) -> int:
    from d3.research.paper import RunSettings, Shards, get_task, run_task, table, write_csv

    tasks = _check(args)
    set_threads(args.threads)
    shards = Shards(cpu=_wants_cpu(args.device))
    engine = _engine(args, shards)
    orders = tuple(o.strip() for o in args.drop_orders.split(",") if o.strip())
    settings = RunSettings(alphas=tuple(args.alphas), start_fractions=tuple(args.start_fractions), limit=args.limit,
                           drop_orders=orders, calibrate_steps=args.calibrate_steps,
                           val_limit=args.val_limit, batch_size=args.batch_size, chat_template=args.chat_template)
    say = (lambda line: print(line, file=sys.stderr, flush=True)) if shards.is_main else (lambda _: None)
    rows = [run_task(engine, get_task(name), shards, settings, say) for name in tasks]
    if shards.is_main:
        print(table(rows))
        print(f"\nwrote {write_csv(rows, args.out)} ({shards.count} process{'es' if shards.count > 1 else ''})")
    return 0
