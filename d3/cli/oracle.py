"""`python -m d3 oracle`: the depth each token of a full-depth answer needs, the decay fitted to it, D3 judged."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from d3.cli import layer_order_arg
from d3.cli.common import (
    CliError,
    add_field_args,
    add_model_arg,
    add_threads_arg,
    check_input_file,
    check_output_file,
    int_in,
    set_threads,
)
from d3.config import D3Config, GenerationConfig
from d3.research.data import example_prompts
from d3.research.oracle_fit import PAPER_ALPHAS

# The sweep's D3 settings (results/smollm2_sweep.csv) besides the paper-like alphas: "alpha" or "alpha@start".
SWEEP_ALPHAS = "0.999999,0.9982,0.9954,0.9892,0.9792,0.9199@16"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser("oracle", help="the depth each generated token needs, and the D3 decay that fits it",
                              description=__doc__)
    p.add_argument("--prompt", help="one prompt")
    p.add_argument("--prompts-file", help="a JSON list of {title, prompt} (e.g. assets/prompts.json)")
    p.add_argument("--count", type=int_in(1), default=8, help="how many prompts of --prompts-file (default 8)")
    add_field_args(p, GenerationConfig, ("max_new_tokens",))
    add_field_args(p, D3Config, ("drop_order", "core_head", "core_tail"))
    p.add_argument("--layer-order", type=layer_order_arg, help="with --drop-order calibrated: the flex layers in drop "
                   "order (comma-separated) or a calibration's name (default measured)")
    add_field_args(p, D3Config, ("alpha",), keep_default=False)  # not given: the least-squares fit is judged
    add_field_args(p, D3Config, ("start",))
    p.add_argument("--k", type=_percent, default=10.0, help="coverage fit: at most this %% of tokens under-served")
    p.add_argument("--underserved-at", default=",".join(map(str, PAPER_ALPHAS)) + "," + SWEEP_ALPHAS,
                   help="D3 settings whose under-served fraction is listed: alpha or alpha@start, comma-separated")
    p.add_argument("--no-chat-template", action="store_true", help="feed prompts as raw text (base models)")
    add_model_arg(p)
    add_threads_arg(p)
    p.add_argument("--out", help="also write the JSON here")
    p.add_argument("--json", action="store_true", help="print the whole result as JSON")
    p.set_defaults(func=main)
    return p


def _percent(text: str) -> float:
    """A percentage in [0, 100], in ASCII digits."""
    try:
        value = float(text) if text.isascii() and len(text) <= 40 else None
    except ValueError:
        value = None
    if value is None or not 0 <= value <= 100:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not allowed: --k must be a percentage in [0, 100]")
    return value


def _settings(text: str) -> tuple[D3Config, ...]:
    out = []
    for part in (x.strip() for x in text.split(",") if x.strip()):
        alpha, _, start = part.partition("@")
        if not part.isascii():
            raise CliError(f"--underserved-at {part[:40]!r}: give ASCII digits (0.99 or 0.99@16)")
        try:
            out.append(D3Config(alpha=float(alpha), start=int(start or 0)))
        except ValueError as err:
            raise CliError(f"--underserved-at {part!r}: {err}") from err
    return tuple(out)


def _prompts(args: argparse.Namespace) -> list[tuple[str, str]]:
    if (args.prompt is None) == (args.prompts_file is None):
        raise CliError("give exactly one of --prompt and --prompts-file")
    if args.prompt is not None:
        return [("", args.prompt)]
    check_input_file(args.prompts_file, "--prompts-file")
    try:
        rows = example_prompts(Path(args.prompts_file))
    except (ValueError, KeyError, TypeError) as err:
        raise CliError(f"--prompts-file {args.prompts_file}: not a JSON list of {{title, prompt}} ({err})") from err
    return [(r.title, r.prompt) for r in rows[: args.count]]


def _check(args: argparse.Namespace) -> tuple[list[tuple[str, str]], D3Config, tuple[D3Config, ...]]:
    """Every flag checked before the model loads, so a mistake costs milliseconds."""
    from d3.engine import check_prompt

    prompts = _prompts(args)
    for _, text in prompts:
        check_prompt(text)
    GenerationConfig(max_new_tokens=args.max_new_tokens)
    if args.layer_order is not None and args.drop_order != "calibrated":
        raise CliError("--layer-order only applies with --drop-order calibrated")
    fields: dict[str, Any] = {"core_head": args.core_head, "core_tail": args.core_tail, "drop_order": args.drop_order,
                              "start": args.start}
    if args.drop_order == "calibrated":
        fields["layer_order"] = args.layer_order or "measured"
    if args.alpha is not None:
        fields["alpha"] = args.alpha
    cfg = D3Config(**fields)
    if args.out:
        check_output_file(args.out, "--out")
    return prompts, cfg, _settings(args.underserved_at)


def _lines(result: dict[str, Any]) -> list[str]:
    fits = result["alpha_fit"]
    summary = result["summary"]["oracle_depth"]
    return [
        f"{result['model']}: {summary['tokens']} tokens, mean need {summary['mean_need']:.1f}/{result['num_layers']} "
        f"layers, Spearman(need, position) {summary['spearman_need_vs_position']:.3f}",
        f"least-squares fit: alpha {fits['least_squares']['alpha']} start {fits['least_squares']['start']} "
        f"(rmse {fits['least_squares']['rmse']:.2f} layers)",
        f"coverage fit (<= {result['k']:.0%} under-served): alpha {fits['coverage']['alpha']} "
        f"({fits['coverage']['theoretical_speedup']:.2f}x theoretical)",
        f"at alpha {result['alpha']} start {result['start']}: {result['underserved_fraction']:.1%} of tokens under-served",
        f"{result['seconds']:.1f} s",
    ]


def main(args: argparse.Namespace, engine: Any = None) -> int:
    """Run the oracle; `engine` lets tests inject a tiny model."""
    prompts, cfg, report_at = _check(args)
    set_threads(args.threads)
    from d3.cli import load_engine
    from d3.research.oracle import study

    engine = engine or load_engine(argparse.Namespace(model=args.model, device="auto", dtype="auto"))
    cfg = engine.resolve(cfg)
    cfg.check_layers(engine.num_layers)
    log = (lambda line: print(line, file=sys.stderr, flush=True)) if args.out else None
    result = study(engine, prompts, cfg, args.max_new_tokens, chat_template=not args.no_chat_template,
                   alpha=args.alpha, k=args.k / 100, report_at=report_at, log=log)
    text = json.dumps(result)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n", encoding="utf-8")
    print(text if args.json else "\n".join(_lines(result)))
    return 0
