"""`python -m d3 calibrate`: which flex layers this model can spare, as a greedy nested drop order (cached)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from d3.cli.common import (
    CliError,
    add_field_args,
    add_model_arg,
    add_threads_arg,
    check_input_file,
    check_steps,
    describe_param,
    int_in,
    known_layers,
    param_type,
    set_threads,
)
from d3.config import D3Config
from d3.orders import SIGNALS
from d3.research.calibration_sets import TOKENS

SIGNAL_HELP = ("agreement: share of full depth's own next tokens kept top-1, teacher-forced (SWIFT); perplexity: NLL "
               "of prose (SLEB); task: exact match on a generation task's validation split (TALE)")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser("calibrate", help="measure which flex layers the model can spare (a calibrated drop order)",
                              description=__doc__)
    add_model_arg(p)
    p.add_argument("--signal", default=SIGNALS[0], choices=SIGNALS, help=SIGNAL_HELP)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prompts", help="a prompt file: JSON list (strings or {prompt}) or one prompt per line "
                     "(default for agreement: assets/prompts.json)")
    src.add_argument("--task", help="generation task(s), comma-separated: their validation split (default for task: "
                     "the arithmetic tasks)")
    src.add_argument("--prompt", help="one prompt")
    src.add_argument("--text", help="perplexity: a prose file (default: assets/ppl_text.txt)")
    p.add_argument("--steps", type=int_in(1), help="greedy removals, at most the model's flex layers (default: every "
                   "flex layer); the rest follow by single-drop score")
    p.add_argument("--tokens", type=param_type(TOKENS, "--tokens"), default=TOKENS.default, help=describe_param(TOKENS))
    add_field_args(p, D3Config, ("core_head", "core_tail"))
    p.add_argument("--no-chat-template", action="store_true", help="--prompt/--prompts as raw text (base models)")
    p.add_argument("--no-cache", action="store_true", help="measure again even when a cached result exists")
    add_threads_arg(p)
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=main)
    return p


def calibration_set(args: argparse.Namespace) -> Any:
    """The set the flags name, checked before the model loads."""
    from d3.research import calibrate as cal

    chat = not args.no_chat_template
    if args.prompt is not None:
        return cal.prompt_set(args.prompt, chat)
    if args.prompts is not None:
        check_input_file(args.prompts, "--prompts")
        found = cal.prompts_set(args.prompts)
        return found if chat else cal.CalibrationSet(found.name + ":raw", found.prompts, False)
    if args.task is not None:
        return cal.task_set([t.strip() for t in args.task.split(",") if t.strip()])
    if args.text is not None:
        check_input_file(args.text, "--text")
        return cal.text_set(args.text)
    return cal.default_set(args.signal)


def _check_pairing(signal: str, cal_set: Any) -> None:
    if signal == "task" and not cal_set.tasks:
        raise CliError("--signal task scores a generation task's validation split: give --task NAME (or no set)")
    if signal == "perplexity" and not cal_set.text:
        raise CliError("--signal perplexity reads prose: give --text FILE (or no set for assets/ppl_text.txt)")
    if signal == "agreement" and cal_set.text:
        raise CliError("--signal agreement reads prompts (--prompts, --prompt or --task), not --text")


def main(args: argparse.Namespace) -> int:
    from d3.cli import load_engine
    from d3.research import calibrate as cal

    cal_set = calibration_set(args)
    _check_pairing(args.signal, cal_set)
    known = known_layers(args.model)
    if known is not None:  # its layers are known without loading it: a bad core or --steps fails in milliseconds
        _check_core_and_steps(args, known)
    set_threads(args.threads)
    args.device, args.dtype = "auto", "auto"
    engine = load_engine(args)
    fitted = _check_core_and_steps(args, engine.num_layers)
    core = None if args.core_head is None and args.core_tail is None else fitted
    quiet = args.json

    def progress(done: int, total: int, what: str) -> None:
        if not quiet:
            print(f"\r[{done}/{total}] {what}   ", end="", file=sys.stderr, flush=True)

    result = cal.calibrate(engine, args.signal, cal_set, core=core, steps=args.steps, tokens=args.tokens,
                           progress=progress, use_cache=not args.no_cache)
    if not quiet:
        print(file=sys.stderr)
    if args.json:
        print(json.dumps(result.to_dict()))
        return 0
    print(f"{result.model}: {result.signal} on {result.calibration_set} ({cal.UNITS[result.signal]})")
    print(f"full depth: {result.full:.4f}; core {result.core[0]}+{result.core[1]}; {result.seconds:.1f} s")
    print("drop order: " + " ".join(map(str, result.order)))
    for k, (layer, value) in enumerate(zip(result.order, result.curve), 1):
        print(f"  {k:>2}. drop {layer:>2}: {value:.4f} (alone: {result.single[layer]:.4f})")
    print(f"use it: --drop-order calibrated --layer-order {result.name}  (or --layer-order "
          f"{','.join(map(str, result.order))})")
    return 0


def _check_core_and_steps(args: argparse.Namespace, num_layers: int) -> tuple[int, int]:
    """The core (the core rule, d3.config.core_fits) and --steps (at most the flex layers it leaves)."""
    cfg = D3Config(core_head=args.core_head, core_tail=args.core_tail)
    head, tail = cfg.core(num_layers)
    try:
        cfg.check_layers(num_layers)
    except ValueError as err:
        raise CliError(str(err).replace("core_head + core_tail", "--core-head + --core-tail")) from None
    check_steps(args.steps, "--steps", args.model, num_layers, head, tail)
    return head, tail
