"""Hostile routes under load, over loopback: each one sent for a bounded time and count, and what it costs the
server's log and disk.

Usage: python scripts/hostile_load.py [--seconds 30] [--max-requests 5000] [--routes a,b,...]

Starts the page with a tiny random model on 127.0.0.1 (its log and gradio's temp folder its own), then, route by
route, sends the same hostile request one after another for `--seconds` (at most `--max-requests` times) and prints
the requests sent, their answers, and the growth of the server's log and of the temp folder. The bounds checked at
the end are those README.md's Reliability section states: the log grows by at most a few lines per route (a bad
request's traceback is one line, one per kind a minute), the temp folder by at most the uploads' total
(explorer.guard.UploadBounds). Exit status 0 when both hold.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402

from explorer.guard import UploadBounds  # noqa: E402
from explorer.loadtest.server import TINY, running_server  # noqa: E402

PROMPT = "x" * 200_000  # a long value: a route that copied the request into the log would show it at once
LOG_BOUND_PER_ROUTE = 8_000  # bytes: a few one-line records per route and minute


def _generate_inputs(client: httpx.Client, url: str) -> tuple[int, int]:
    """/generate's fn_index and its number of inputs, from the page's config."""
    config = client.get(f"{url}config").json()
    dep = next(d for d in config["dependencies"] if d.get("api_name") == "generate")
    return dep["id"], len(dep["inputs"])


def routes(client: httpx.Client, url: str) -> dict[str, Callable[[int], httpx.Response]]:
    """Name -> one hostile request (the argument numbers it, for values that must differ)."""
    api = f"{url}gradio_api/"
    fn, inputs = _generate_inputs(client, url)

    def join(n: int, count: int) -> httpx.Response:
        return client.post(f"{api}queue/join", json={"data": [PROMPT] + [0] * (count - 1), "fn_index": fn,
                                                     "session_hash": f"h{n}", "event_data": None})

    return {
        "join /generate, one value too few (200 KB prompt)": lambda n: join(n, inputs - 1),
        "run/generate, one value too few": lambda n: client.post(f"{api}run/generate",
                                                                 json={"data": [PROMPT] + [0] * (inputs - 2)}),
        "call/generate, a 2 MB body": lambda n: client.post(f"{api}call/generate", json={"data": ["y" * 2_000_000]}),
        "call/v2/generate, a parameter it does not take": lambda n: client.post(f"{api}call/v2/generate",
                                                                               json={"not_a_field": PROMPT}),
        "call/v2/<no such endpoint>": lambda n: client.post(f"{api}call/v2/nothing{n}", json={}),
        "GET queue/data, unknown session": lambda n: client.get(f"{api}queue/data", params={"session_hash": f"u{n}"}),
        "GET call/generate/<bogus id>": lambda n: client.get(f"{api}call/generate/bogus{n}"),
        "upload, 900 KB files": lambda n: client.post(f"{api}upload",
                                                      files={"files": (f"f{n}.bin", b"0" * 900_000)}),
    }


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=30.0, help="per route (at most 120)")
    p.add_argument("--max-requests", type=int, default=5000, help="per route (at most 20000)")
    p.add_argument("--routes", default="", help="comma-separated words; only routes whose name holds one")
    args = p.parse_args()
    seconds, most = min(max(args.seconds, 1.0), 120.0), min(max(args.max_requests, 1), 20_000)
    temp = Path(tempfile.mkdtemp(prefix="d3-hostile-"))
    rows, ok = [], True
    with running_server(TINY, env={"GRADIO_TEMP_DIR": str(temp)}) as server, httpx.Client(timeout=30) as client:
        chosen = {k: v for k, v in routes(client, server.url).items()
                  if not args.routes or any(w in k for w in args.routes.split(","))}
        for name, send in chosen.items():
            log0, disk0, statuses, n = server.log_path.stat().st_size, folder_bytes(temp), {}, 0
            began = time.monotonic()
            end = began + seconds
            while time.monotonic() < end and n < most:
                try:
                    status = send(n).status_code
                except httpx.HTTPError as err:
                    status = type(err).__name__
                statuses[status] = statuses.get(status, 0) + 1
                n += 1
            took = time.monotonic() - began
            time.sleep(1.0)  # what the server writes after answering (a background task's log line) lands
            log_growth, disk_growth = server.log_path.stat().st_size - log0, folder_bytes(temp) - disk0
            rows.append({"route": name, "requests": n, "seconds": round(took, 1), "answers": statuses, "log_bytes": log_growth,
                         "disk_bytes": disk_growth})
            print(json.dumps(rows[-1]), flush=True)
        tracebacks = server.tracebacks()
        log_total = server.log_path.stat().st_size
    disk_total = folder_bytes(temp)
    log_ok = all(r["log_bytes"] <= LOG_BOUND_PER_ROUTE for r in rows) and tracebacks == 0
    disk_ok = disk_total <= UploadBounds().kept_bytes
    ok = log_ok and disk_ok
    print(f"log: {log_total:,} bytes in all, {tracebacks} tracebacks; at most {LOG_BOUND_PER_ROUTE:,} per route: "
          f"{'held' if log_ok else 'MISSED'}")
    print(f"temp folder: {disk_total:,} bytes in all; bound {UploadBounds().kept_bytes:,}: "
          f"{'held' if disk_ok else 'MISSED'}")
    for path in sorted(temp.rglob("*"), reverse=True):  # the script's own temp folder, removed
        path.unlink() if path.is_file() else path.rmdir()
    temp.rmdir()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
