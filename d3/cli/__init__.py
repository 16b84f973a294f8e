"""`python -m d3`: generate with a skipping strategy, describe a model, and the measurement subcommands."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from d3.cli.common import CLI_NARROW, CliError, add_field_args, add_model_arg, check_device, describe_param, param_type
from d3.config import (
    STRATEGIES,
    TRACE_OFF,
    GenerationConfig,
    Param,
    StrategyConfig,
    TraceConfig,
    params,
    strategy_from_dict,
)
from d3.research.data import fetch

# Subcommands that live in their own modules, each exposing add_parser(subparsers) and main(args) -> int.
# The handlers below and those modules import torch and the model code only when a command runs, so building
# the parser (and rejecting a bad flag) stays fast.
EXTRA_COMMANDS = ("d3.cli.bench", "d3.cli.sweep", "d3.cli.report", "d3.cli.oracle", "d3.cli.paper", "d3.cli.calibrate",
                  "d3.cli.install")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, no usage dump
        raise CliError(message)


def _add_model_args(p: argparse.ArgumentParser) -> None:
    add_model_arg(p)
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N or mps")
    p.add_argument("--dtype", default="auto", help="auto (the model's own: bfloat16 for qwen2.5-coder-1.5b, else "
                   "float32), float32, bfloat16 or float16")


def strategy_params() -> dict[str, list[tuple[type[StrategyConfig], Param]]]:
    """Each strategy field (the registry in d3.config) -> the strategies that have it, with its Param."""
    found: dict[str, list[tuple[type[StrategyConfig], Param]]] = {}
    for cls in STRATEGIES.values():
        for name, p in params(cls).items():
            if p.checked:  # a field of its own kind (layer_order) has a flag of its own
                found.setdefault(name, []).append((cls, p))
    return found


def _flag_help(owners: list[tuple[type[StrategyConfig], Param]]) -> str:
    """One clause per distinct Param, naming the strategies it belongs to: "D3 (depth decay): token i runs ...
    (a number in (0, 1]; default 0.99)"."""
    groups: dict[Param, list[str]] = {}
    for cls, p in owners:
        groups.setdefault(p, []).append(cls.label)
    return "; ".join(f"{', '.join(labels)}: {describe_param(p)}" for p, labels in groups.items())


def add_generation_args(p: argparse.ArgumentParser) -> None:
    """--max-new-tokens, --temperature, --top-p, --seed: one per GenerationConfig field of the registry."""
    add_field_args(p, GenerationConfig, tuple(params(GenerationConfig)))


def add_strategy_args(p: argparse.ArgumentParser) -> None:
    """Strategy flags shared by generate and the measurement commands, one per registered strategy field (d3.config:
    a field added there is a flag here, with its range, choices, default and help)."""
    p.add_argument("--strategy", default="d3", choices=sorted(STRATEGIES))
    for name, owners in strategy_params().items():
        first = owners[0][1]
        # the type reads the kind only (strategies share a flag, each with its own range: the config checks it)
        kind: dict[str, Any] = ({"choices": first.choices} if first.choices
                                else {"type": param_type(Param("", "", integer=first.integer, optional=first.optional)
                                                         .narrowed(**CLI_NARROW.get(name, {})),
                                                         "--" + name.replace("_", "-"))})
        p.add_argument("--" + name.replace("_", "-"), help=_flag_help(owners), **kind)
    p.add_argument("--layer-order", type=layer_order_arg, help="D3 with --drop-order calibrated: the flex layers in "
                   "drop order (comma-separated), or a calibration's name (agreement, task@task:..., measured: the "
                   "model's measured best; default measured)")


def layer_order_arg(text: str) -> tuple[int, ...] | str:
    """"3,4,5" -> (3, 4, 5); anything else is a calibration's name, resolved once the model is loaded."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if parts and all(p.isascii() and p.isdigit() for p in parts):
        return tuple(int(p) for p in parts)
    if not text.strip():
        raise argparse.ArgumentTypeError("give the layers (3,4,5) or a calibration's name")
    return text.strip()


def strategy_from_args(args: argparse.Namespace) -> Any:
    """The strategy config the flags describe; flags that don't apply to the strategy are an error."""
    cls = STRATEGIES[args.strategy]
    names = [*strategy_params(), "layer_order"]
    given = {f: getattr(args, f) for f in names if getattr(args, f, None) is not None}
    if given.get("drop_order") == "calibrated":
        given.setdefault("layer_order", "measured")
    elif "layer_order" in given:
        raise CliError("--layer-order only applies with --drop-order calibrated")
    allowed = set(cls.__dataclass_fields__)
    extra = sorted(set(given) - allowed)
    if extra:
        flags = ", ".join("--" + e.replace("_", "-") for e in extra)
        raise CliError(f"{flags} does not apply to --strategy {args.strategy}")
    return strategy_from_dict({"strategy": args.strategy, **given})


def _quiet_transformers() -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def load_engine(args: argparse.Namespace) -> Any:
    from d3.engine import Engine
    from d3.models import get_model

    _quiet_transformers()

    return Engine.from_loaded(get_model(args.model, device=args.device, dtype=args.dtype))


def _token_rows(trace: Any) -> list[str]:
    rows = [f"{'step':>4}  {'layers':>6}  {'entropy':>7}  token"]
    for s in trace.steps:
        rows.append(f"{s.step:>4}  {s.n_layers:>3}/{trace.num_layers:<2}  {s.entropy:7.3f}  {s.text!r}")
    return rows


def cmd_generate(args: argparse.Namespace) -> int:
    from d3.engine import check_prompt

    check_prompt(args.prompt)  # before the model loads: a bad prompt fails in milliseconds
    strategy = strategy_from_args(args)
    check_device(args.device)  # mps on a machine without it: one line now, not a traceback from the model's move
    gen = GenerationConfig(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
                           seed=args.seed)
    engine = load_engine(args)
    try:
        strategy = engine.resolve(strategy)
    except ValueError as err:  # the config's field, as the flag that set it
        raise CliError(str(err).replace("layer_order=", "--layer-order ", 1)) from None
    trace = engine.generate(args.prompt, strategy, gen, TraceConfig() if args.json or not args.quiet else TRACE_OFF,
                            chat_template=not args.no_chat_template)
    if args.json:
        print(trace.to_json())
        return 0
    print(trace.text)
    if not args.quiet:
        print()
        print("\n".join(_token_rows(trace)))
        print(f"\n{len(trace.steps)} tokens, mean {trace.mean_layers:.1f}/{trace.num_layers} layers, "
              f"theoretical speedup {trace.theoretical_speedup():.2f}x "
              f"({trace.theoretical_speedup(with_fixed_cost=True):.2f}x counting the LM head), "
              f"{trace.tokens_per_s:.1f} tokens/s, finished: {trace.finish_reason}")
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    from d3.families import family_of, fill_exactness
    from d3.models import describe, get_model

    check_device(args.device)
    _quiet_transformers()
    loaded = get_model(args.model, device=args.device, dtype=args.dtype)
    info = describe(loaded)
    info["fills"] = fill_exactness(family_of(loaded.config))
    if args.dtype not in ("auto", "float32"):
        info["dtype_gap"] = _dtype_gap(loaded, args).line()
    if args.json:
        print(json.dumps(info, default=str))
        return 0
    for key, value in info.items():
        if key != "fills":
            print(f"{key:>16}: {value}")
    head, tail = info["default_core"]
    n = info["num_layers"]
    print(f"{'layers':>16}: core head 0..{head - 1}, flex {head}..{n - tail - 1}, core tail {n - tail}..{n - 1}")
    for fill, how in info["fills"].items():
        print(f"{fill:>16}: {how}")
    return 0


DTYPE_GAP_PROMPT = "The three primary colors are"


def _dtype_gap(loaded: Any, args: argparse.Namespace) -> Any:
    """The model in args.dtype against itself in float32 on one prompt (`d3.compare.dtype_gap`)."""
    from d3.compare import dtype_gap
    from d3.engine import Engine
    from d3.models import get_model

    reference = get_model(args.model, device=args.device, dtype="float32")
    return dtype_gap(Engine.from_loaded(reference), Engine.from_loaded(loaded), DTYPE_GAP_PROMPT,
                     GenerationConfig(max_new_tokens=16, stop_at_eos=False))


def cmd_fetch_data(args: argparse.Namespace) -> int:
    print(f"data in {fetch(data_dir=args.data_dir)}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m d3", description="D3 Explorer: position-aware depth decay decoding")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    gen = sub.add_parser("generate", help="generate text with a skipping strategy and show per-token layer usage")
    gen.add_argument("--prompt", required=True)
    add_generation_args(gen)
    gen.add_argument("--no-chat-template", action="store_true", help="feed the prompt as raw text")
    gen.add_argument("--json", action="store_true", help="print the whole trace as JSON")
    gen.add_argument("--quiet", action="store_true", help="print only the generated text")
    add_strategy_args(gen)
    _add_model_args(gen)
    gen.set_defaults(func=cmd_generate)
    info = sub.add_parser("info", help="the model, its family, how exact each fill is for it, its layers and the default "
                          "core split; with --dtype bfloat16 / float16, how far that dtype is from float32")
    info.add_argument("--json", action="store_true")
    _add_model_args(info)
    info.set_defaults(func=cmd_info)
    fetch = sub.add_parser("fetch-data", help="download the BIG-bench task files (PyPI sdist) into the data cache")
    fetch.add_argument("--data-dir", default=None)
    fetch.set_defaults(func=cmd_fetch_data)
    for name in EXTRA_COMMANDS:
        importlib.import_module(name).add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return int(args.func(args) or 0)
    except (CliError, ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
