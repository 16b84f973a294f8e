"""`python -m explorer.loadtest`: the load test's command line (and, with --serve, the server subprocess)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from d3.config import DEFAULT_MODEL
from explorer.loadtest import __doc__ as DOC
from explorer.loadtest.phases import run
from explorer.loadtest.report import render
from explorer.loadtest.server import TINY, serve


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=DOC, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=DEFAULT_MODEL, help=f"a known model name (default {DEFAULT_MODEL})")
    p.add_argument("--tiny", action="store_true", help="serve a tiny random model instead (fast, for the test suite)")
    p.add_argument("--clients", type=int, default=8, help="clients generating at once in phase 1 (default 8)")
    p.add_argument("--tokens", type=int, default=16, help="new tokens per phase-1 generation (default 16)")
    p.add_argument("--runs", type=int, default=200, help="generations in a row in phase 2 (default 200)")
    p.add_argument("--run-tokens", type=int, default=8, help="new tokens per phase-2 generation (default 8)")
    p.add_argument("--sessions", type=int, default=4, help="sessions phase 2 rotates through (default 4)")
    p.add_argument("--warmup", type=int, default=10, help="phase-2 runs before the RSS baseline (default 10)")
    p.add_argument("--max-growth", type=float, default=5.0, help="RSS growth target after warm-up, %% (default 5)")
    p.add_argument("--time-limit", type=float, default=1200, help="stop after this many seconds (default 1200)")
    p.add_argument("--json", type=Path, help="also write the report here as JSON")
    p.add_argument("--students", type=int, default=0,
                   help="the class load test instead: this many simulated students (explorer/loadtest/classroom.py)")
    p.add_argument("--minutes", type=float, default=10.0, help="the class load test's length (default 10)")
    p.add_argument("--deep", default=None, help="the model each student switches to once (default: the 28-layer one; "
                                                "'' for none)")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                   help="the class server's environment (D3_QUEUE_SIZE=64, ...), repeatable")
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)  # the server subprocess
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.students < 0 or args.minutes <= 0 or any("=" not in e for e in args.env):
        p.error("--students must be at least 0, --minutes above 0, each --env NAME=VALUE")
    if args.clients < 1 or args.runs < 0 or args.sessions < 1 or args.tokens < 1 or args.run_tokens < 1:
        p.error("--clients, --sessions, --tokens and --run-tokens must be at least 1, --runs at least 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.serve:
        serve(TINY if args.tiny or args.model == TINY else args.model, args.port)
        return 0
    if args.students:
        return run_the_class(args, argv)
    try:
        report = run(args)
    except (RuntimeError, TimeoutError) as err:  # the server did not start
        print(f"load test aborted: {err}", file=sys.stderr)
        return 2
    print(render(report))
    if args.json:
        args.json.write_text(json.dumps(report.to_dict(), indent=2))
    return 0 if not report.failures else 1


def run_the_class(args: argparse.Namespace, argv: Sequence[str] | None) -> int:
    from explorer.loadtest.classroom import default_deep, render_class, run_class, write

    model = TINY if args.tiny else args.model
    deep = default_deep(model) if args.deep is None else args.deep
    env = dict(e.split("=", 1) for e in args.env)
    command = "python -m explorer.loadtest " + " ".join(sys.argv[1:] if argv is None else argv)
    try:
        report = run_class(args.students, args.minutes, model, deep, env, command)
    except (RuntimeError, TimeoutError) as err:
        print(f"load test aborted: {err}", file=sys.stderr)
        return 2
    print(render_class(report))
    if args.json:
        write(report, args.json)
    ok = report.server_alive and not report.server_tracebacks and not report.failures  # a refusal is no failure
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
