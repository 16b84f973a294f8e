"""The load test's phases against one running server: solo references, many clients at once, many runs in a row."""

from __future__ import annotations

import argparse
import concurrent.futures
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from d3.models import KNOWN_MODELS
from explorer.loadtest.client import Outcome, Spec, Tokens, error_kind, exported_d3_ids, generate
from explorer.loadtest.report import Report, check, judge, percentiles
from explorer.loadtest.server import TINY, Server, running_server

PROMPTS = ("tell me a story about a small red fox", "what is the capital of france?",
           "write a poem about the sea at night", "list three fruits and their colours",
           "explain why the sky looks blue", "how do bees make honey?", "describe a quiet morning in the hills",
           "give me a recipe for bread", "why do cats purr?", "name a few famous rivers",
           "what happens when water boils?", "say something kind to a friend")
_STARTED = time.monotonic()


def progress(message: str) -> None:
    """A progress line on stderr (the report itself goes to stdout)."""
    print(f"[{time.monotonic() - _STARTED:6.0f} s] {message}", file=sys.stderr, flush=True)


def references(client: Any, specs: Sequence[Spec], model: str, layers: int, deadline: float,
               report: Report) -> dict[Spec, Tokens]:
    """Each spec run alone, one after another."""
    refs: dict[Spec, Tokens] = {}
    for spec in specs:
        if time.monotonic() > deadline:
            report.timed_out = True
            break
        outcome = generate(client, spec, model, layers, deadline - time.monotonic())
        if outcome.error:
            report.errors[f"reference {outcome.error}"] += 1
        else:
            refs[spec] = outcome.tokens  # type: ignore[assignment]
    report.completed["references"] = len(refs)
    report.distinct_references = len(set(refs.values()))
    return refs


def concurrent_phase(server: Server, specs: Sequence[Spec], refs: dict[Spec, Tokens], model: str, layers: int,
                     deadline: float, report: Report) -> None:
    """Every client presses Generate at the same moment; each checks its tokens and its export."""
    from gradio_client import Client

    clients = [Client(server.url, verbose=False) for _ in specs]
    barrier = threading.Barrier(len(specs))
    in_flight, lock = [0], threading.Lock()

    def one(client: Any, spec: Spec) -> Outcome:
        barrier.wait(timeout=60)
        with lock:
            in_flight[0] += 1
            report.max_in_flight = max(report.max_in_flight, in_flight[0])
        try:
            outcome = generate(client, spec, model, layers, deadline - time.monotonic())
        finally:
            with lock:
                in_flight[0] -= 1
        if not outcome.error:
            try:
                outcome.exported = exported_d3_ids(client)
            except Exception as err:
                outcome.error = "export " + error_kind(err)
        return outcome

    with concurrent.futures.ThreadPoolExecutor(len(specs)) as pool:
        outcomes = list(pool.map(one, clients, specs))
    latencies = []
    for i, outcome in enumerate(outcomes):
        check(report, outcome, refs.get(outcome.spec), f"client {i}")
        if not outcome.error:
            latencies.append(outcome.latency_s)
            if outcome.updates < 3:
                report.failures.append(f"client {i} got {outcome.updates} updates: the run did not stream")
    report.completed["concurrent"] = len(latencies)
    report.latency_s["concurrent"] = percentiles(latencies)
    if any(o.error == "timeout" for o in outcomes):
        report.timed_out = True


def endurance_phase(server: Server, specs: Sequence[Spec], refs: dict[Spec, Tokens], runs: int, warmup: int,
                    model: str, layers: int, deadline: float, report: Report) -> None:
    """`runs` generations in a row from a few sessions; RSS after the warm-up and at the end."""
    from gradio_client import Client

    clients = [Client(server.url, verbose=False) for _ in specs]
    latencies: list[float] = []
    report.rss_mib["after_warmup"] = server.rss() if warmup == 0 else float("nan")
    for i in range(runs):
        if time.monotonic() > deadline:
            report.timed_out = True
            break
        k = i % len(specs)
        outcome = generate(clients[k], specs[k], model, layers, deadline - time.monotonic())
        check(report, outcome, refs.get(specs[k]), f"run {i}")
        if not outcome.error:
            latencies.append(outcome.latency_s)
        if i + 1 == warmup:
            report.rss_mib["after_warmup"] = server.rss()
        if (i + 1) % 10 == 0:
            report.rss_series_mib.append(round(server.rss(), 1))
        if (i + 1) % 25 == 0:
            progress(f"  {i + 1}/{runs} done, {sum(report.errors.values())} errors, RSS {server.rss():.0f} MiB")
    time.sleep(1.0)  # let the last run's buffers go before the final reading
    report.rss_mib["end"] = server.rss()
    report.completed["endurance"] = len(latencies)
    report.latency_s["endurance"] = percentiles(latencies)


def run(args: argparse.Namespace) -> Report:
    """All phases against a fresh server; the report says what was done and what was missed."""
    from gradio_client import Client

    started = time.monotonic()
    deadline = started + args.time_limit
    model = TINY if args.tiny else args.model
    layers = 6 if args.tiny else _num_layers(model)
    report = Report(model=model, planned={"concurrent": args.clients, "endurance": args.runs})
    burst = [Spec(PROMPTS[i % len(PROMPTS)], seed=1000 + i, tokens=args.tokens) for i in range(args.clients)]
    steady = [Spec(PROMPTS[i % len(PROMPTS)], seed=2000 + i, tokens=args.run_tokens) for i in range(args.sessions)]
    env = {"D3_QUEUE_SIZE": str(2 * args.clients)} if args.clients > 8 else {}  # the default queue holds 16
    progress(f"starting the app with {model}")
    with running_server(model, env, start_timeout=min(300, args.time_limit)) as server:
        report.rss_mib["start"] = server.rss()
        progress(f"serving at {server.url}; {len(burst) + len(steady)} solo reference runs")
        refs = references(Client(server.url, verbose=False), [*burst, *steady], model, layers, deadline, report)
        report.rss_mib["after_references"] = server.rss()
        if not report.timed_out:
            progress(f"phase 1: {len(burst)} clients at once")
            concurrent_phase(server, burst, refs, model, layers, deadline, report)
        report.rss_mib["after_concurrent"] = server.rss()
        if not report.timed_out:
            progress(f"phase 2: {args.runs} generations in a row")
            warmup = min(args.warmup, args.runs // 2)
            endurance_phase(server, steady, refs, args.runs, warmup, model, layers, deadline, report)
        report.server_tracebacks = server.tracebacks()
        if server.proc.poll() is not None:  # it must still be serving after everything above
            report.failures.append(f"the server exited (status {server.proc.returncode}) during the test")
        if report.server_tracebacks or server.proc.poll() is not None:
            report.server_log_tail = server.log_tail(60)
    report.wall_s = time.monotonic() - started
    judge(report, args.max_growth)
    return report


def _num_layers(model: str) -> int:
    if model not in KNOWN_MODELS:
        raise SystemExit(f"--model must be one of {', '.join(KNOWN_MODELS)} (or use --tiny)")
    return KNOWN_MODELS[model].facts.num_layers


