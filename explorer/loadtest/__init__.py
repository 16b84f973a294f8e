"""Load test of the running app: many people at once (no cross-talk), then many generations in a row (flat memory).

Starts the app as a subprocess on 127.0.0.1 (a free port), drives it with gradio_client over loopback, and
stops it. Every loop is bounded in count and by --time-limit; past the limit the test stops by itself and
reports what it has.

0. Solo references: each client's prompt and sampling seed run alone, one after another.
1. Concurrency: --clients clients (threads, one gradio session each) press Generate at the same moment, each
   with its own prompt and seed (sampling, so any mix-up would show). Each checks the tokens of both panes in
   every streamed update (a prefix), in the final one (equal) and in its exported trace against its solo
   reference.
2. Endurance: --runs generations in a row from --sessions sessions, each checked against its solo reference.
   The server's RSS (/proc/<pid>/status) is read after --warmup of them and at the end.

Prints requests completed, errors by kind, p50/p95 latency, RSS before/after with growth, cross-talk count and
tracebacks in the server log; exits 1 when a target is missed (cross-talk, any error, any traceback, an
unfinished phase, RSS growth of --max-growth % or more), 2 when the server does not start.

Usage: python -m explorer.loadtest [--model smollm2-135m | --tiny] [--clients 8] [--tokens 16] [--runs 200]
                                   [--run-tokens 8] [--sessions 4] [--time-limit 1200] [--json PATH]
       python -m explorer.loadtest --students 30 --minutes 10 [--deep NAME] [--env NAME=VALUE ...] [--json PATH]
                                   (the class load test, explorer/loadtest/classroom.py)
"""

from explorer.loadtest.client import Outcome, Spec, Tokens, token_ids, tokens_of
from explorer.loadtest.report import Report, check, judge

__all__ = ["Outcome", "Report", "Spec", "Tokens", "check", "judge", "token_ids", "tokens_of"]
