"""`python -m d3 paper`: the paper's protocol (validation-chosen alpha and start, test exact match and speed)."""

from __future__ import annotations

import argparse
import sys
from dataclasses import fields
from typing import Any

from d3.cli.common import (
    CliError,
    add_model_arg,
    add_threads_arg,
    check_device,
    check_output_file,
    check_steps,
    int_in,
    known_layers,
    set_threads,
)
from d3.config import DROP_ORDERS, D3Config, default_core, params
from d3.research.paper import SELECTION_RULE, TASKS, RunSettings

# The orders the validation split may choose among: every named drop order of the registry (d3.config.DROP_ORDERS;
# calibrated: per model, not per task), and `task`, the order calibrated on the task's own validation split.
DROP_ORDERS_ALLOWED: tuple[str, ...] = (*(o for o in DROP_ORDERS if o != "calibrated"), "task")
SETTINGS: dict[str, Any] = {f.name: f.default for f in fields(RunSettings)}  # the protocol's defaults, said once there
ALPHA = params(D3Config)["alpha"]


def _floats(text: str) -> tuple[float, ...]:
    try:
        if not text.isascii():  # Python reads other scripts' digits ("٠.٩"); no other tool here does
            raise ValueError(text)
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a comma-separated list of numbers") from err


def _show(values: tuple[object, ...]) -> str:
    return ",".join(map(str, values))


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
    p.add_argument("--limit", type=int_in(1), default=SETTINGS["limit"], help="test questions per task (default all)")
    p.add_argument("--val-limit", type=int_in(1), default=SETTINGS["val_limit"],
                   help="validation questions per task (default all)")
    p.add_argument("--alphas", type=_floats, default=SETTINGS["alphas"], help=f"alpha grid, comma-separated: each "
                   f"{ALPHA.allowed()} (default {_show(SETTINGS['alphas'])})")
    p.add_argument("--start-fractions", type=_floats, default=SETTINGS["start_fractions"],
                   help="start grid as fractions of the mean full-depth output length, comma-separated (default "
                   f"{_show(SETTINGS['start_fractions'])})")
    p.add_argument("--drop-orders", default=",".join(SETTINGS["drop_orders"]), help="drop orders the validation "
                   f"split chooses among, comma-separated: {', '.join(DROP_ORDERS_ALLOWED)} (task: the order "
                   "calibrated by exact match on the validation split)")
    p.add_argument("--calibrate-steps", type=int_in(1), default=SETTINGS["calibrate_steps"],
                   help="greedy removals of the task-calibrated order, at most the model's flex layers (default "
                   f"{SETTINGS['calibrate_steps']})")
    p.add_argument("--batch-size", type=int_in(1), default=SETTINGS["batch_size"])
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
    if not args.alphas or not all(ALPHA.ok(a) for a in args.alphas):
        raise CliError(f"--alphas {args.alphas}: each alpha must be {ALPHA.allowed()}")
    orders = [o.strip() for o in args.drop_orders.split(",") if o.strip()]
    if not orders or any(o not in DROP_ORDERS_ALLOWED for o in orders):
        raise CliError(f"--drop-orders {args.drop_orders!r}: each must be one of {', '.join(DROP_ORDERS_ALLOWED)}")
    if not args.start_fractions or not all(0 <= f <= 1 for f in args.start_fractions):
        raise CliError(f"--start-fractions {args.start_fractions}: each fraction must be in [0, 1]")
    check_output_file(args.out, "--out")
    if args.device_map is None:
        check_device(args.device)
    known = known_layers(args.model)
    if known is not None:  # its layers are known without loading it: a bad --calibrate-steps fails in milliseconds
        _check_steps(args, known)
    return tasks


def _check_steps(args: argparse.Namespace, num_layers: int) -> None:
    """--calibrate-steps: at most the flex layers the default core leaves (the calibration's own cap, as for
    `calibrate --steps`)."""
    check_steps(args.calibrate_steps, "--calibrate-steps", args.model, num_layers, *default_core(num_layers))


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
    _check_steps(args, engine.num_layers)  # a local model: right after it loads, before any work
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
