"""Memory per visitor, over loopback: the server's RSS before and after N new sessions (one gradio_client each,
one short generation each), then again once those sessions have expired.

Usage: python scripts/session_memory.py [--tiny | --model smollm2-135m] [--sessions 50] [--tokens 4] [--public]
                                       [--prompt-words N] [--budget-mib MIB]

--prompt-words makes each visitor's prompt about that many words long (a ~480-token prompt records every layer's
attention: the heavy part of a session); --budget-mib sets D3_SESSION_MEMORY_MIB, the budget of what all sessions
keep together (explorer.memory).

The server runs with D3_SESSION_TTL=60 (the shortest lifetime it takes); expired sessions are forgotten within
explorer.expiry.PRUNE_EVERY_S. Target: growth per session under 2 MB once the sessions have expired.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from explorer.expiry import PRUNE_EVERY_S  # noqa: E402
from explorer.loadtest.server import TINY, running_server  # noqa: E402

TTL_S = 60


def visit(url: str, tokens: int, prompt: str = "The capital of France is") -> None:
    """One new visitor: a new client (a new session), one generation."""
    from gradio_client import Client

    client = Client(url, verbose=False, download_files=tempfile.gettempdir())
    final = client.predict(prompt=prompt, max_new_tokens=tokens, api_name="/generate")
    assert "Done." in final[0] or "time limit" in final[0], final[0]  # a run stopped at the limit is kept too
    client.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--tiny", action="store_true", help="serve a tiny random model (fast)")
    p.add_argument("--sessions", type=int, default=50)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--tokens", type=int, default=4)
    p.add_argument("--public", action="store_true", help="serve with D3_PUBLIC=1")
    p.add_argument("--prompt-words", type=int, default=0, help="each visitor's prompt about this many words long")
    p.add_argument("--budget-mib", type=int, default=0, help="D3_SESSION_MEMORY_MIB (default: the server's)")
    args = p.parse_args()
    env = {"D3_SESSION_TTL": str(TTL_S), "D3_PUBLIC": "1" if args.public else "0"}
    if args.budget_mib:
        env["D3_SESSION_MEMORY_MIB"] = str(args.budget_mib)
    words = ("the quick brown fox jumps over a lazy dog near the river bank " * 64).split()[:args.prompt_words]
    prompt = " ".join(words) + " The capital of France is" if words else "The capital of France is"
    with running_server(TINY if args.tiny else args.model, env=env) as server:
        for _ in range(args.warmup):
            visit(server.url, args.tokens, prompt)
        time.sleep(TTL_S + 2 * PRUNE_EVERY_S)  # the warm-up sessions expire: the baseline holds none
        before = server.rss()
        print(f"RSS before: {before:.1f} MiB", flush=True)
        started = time.perf_counter()
        peak = before
        for _ in range(args.sessions):
            visit(server.url, args.tokens, prompt)
            peak = max(peak, server.rss())
        busy = server.rss()
        print(f"RSS with {args.sessions} sessions: {busy:.1f} MiB", flush=True)
        took = time.perf_counter() - started
        time.sleep(TTL_S + 2 * PRUNE_EVERY_S)
        after = server.rss()
        tracebacks = server.tracebacks()
    report = {"model": TINY if args.tiny else args.model, "sessions": args.sessions, "tokens": args.tokens,
              "prompt_words": args.prompt_words, "budget_mib": args.budget_mib or None,
              "rss_before_mib": round(before, 1), "rss_with_sessions_mib": round(busy, 1),
              "rss_peak_mib": round(peak, 1),
              "rss_after_expiry_mib": round(after, 1),
              "growth_per_session_mib": round((after - before) / args.sessions, 3),
              "held_per_live_session_mib": round((busy - before) / args.sessions, 3),
              "seconds": round(took, 1), "tracebacks": tracebacks}
    print(json.dumps(report, indent=1))
    ok = report["growth_per_session_mib"] < 2.0 and tracebacks == 0
    print("target met: growth per session under 2 MB after expiry" if ok else "TARGET MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
