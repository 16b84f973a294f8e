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

Usage: python scripts/load_test.py [--model smollm2-135m | --tiny] [--clients 8] [--tokens 16] [--runs 200]
                                   [--run-tokens 8] [--sessions 4] [--time-limit 1200] [--json PATH]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

TINY = "tiny"
# Outputs of /generate over the API, in order (the session State is not part of the API).
STATUS, D3_TOKENS, FULL_TOKENS = 0, 2, 4
# The first line of each token's tooltip: "step 3 · token 'x' (id 42)" (viz.stream._token_title).
TOKEN_ID = re.compile(r'data-step="(\d+)"[^>]*? title="step \d+ · token [^"]*?\(id (\d+)\)(?=\n|")')
PROMPTS = ("tell me a story about a small red fox", "what is the capital of france?",
           "write a poem about the sea at night", "list three fruits and their colours",
           "explain why the sky looks blue", "how do bees make honey?", "describe a quiet morning in the hills",
           "give me a recipe for bread", "why do cats purr?", "name a few famous rivers",
           "what happens when water boils?", "say something kind to a friend")


_STARTED = time.monotonic()


def progress(message: str) -> None:
    """A progress line on stderr (the report itself goes to stdout)."""
    print(f"[{time.monotonic() - _STARTED:6.0f} s] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- the server


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rss_mib(pid: int) -> float:
    """Resident memory of process `pid` in MiB, from /proc/<pid>/status (NaN if it is gone)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return float("nan")
    match = re.search(r"^VmRSS:\s+(\d+) kB", text, re.M)
    return int(match.group(1)) / 1024 if match else float("nan")


def serve(model: str, port: int) -> None:
    """The server process: the page with the embedded model, or with a tiny random model (`model == "tiny"`)."""
    import app

    if model == TINY:
        import torch

        from d3.engine import Engine
        from d3.live import Caps
        from tests.tiny import tiny_llama, tiny_tokenizer

        torch.set_num_threads(1)  # a tiny model gains nothing from threads, and the machine is shared
        engine = Engine(tiny_llama(6), tiny_tokenizer(), name=TINY)

        def factory(name: str) -> Engine:
            if name != TINY:
                raise ValueError(f"unknown model {name!r}: this server only runs {TINY}")
            return engine

        demo = app.build_demo(factory, caps=Caps.from_env(), public=False, model_names=(TINY,))
    else:
        demo = app.demo  # the page exactly as `python app.py` serves it
    app.launch(demo, server_name="127.0.0.1", server_port=port, quiet=True)


@dataclass
class Server:
    """The app running in a subprocess that this script started (and stops)."""

    proc: subprocess.Popen
    url: str
    log_path: Path

    def rss(self) -> float:
        return rss_mib(self.proc.pid)

    def tracebacks(self) -> int:
        return self.log_path.read_text(errors="replace").count("Traceback (most recent call last)")

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


def _wait_ready(server: Server, timeout: float) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(f"the server exited with status {server.proc.returncode}:\n{server.log_tail()}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(server.url, timeout=5).status_code == 200:
                return
        time.sleep(0.5)
    raise TimeoutError(f"the server did not answer within {timeout:.0f} s:\n{server.log_tail()}")


@contextlib.contextmanager
def running_server(model: str, env: dict[str, str] | None = None, start_timeout: float = 300) -> Iterator[Server]:
    """Start the app on a free loopback port, wait until it answers, and always stop it afterwards."""
    port = free_port()
    log_path = Path(tempfile.mkstemp(prefix="d3-load-server-", suffix=".log")[1])
    cmd = [sys.executable, str(Path(__file__).resolve()), "--serve", "--model", model, "--port", str(port)]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", **(env or {})})
    server = Server(proc, f"http://127.0.0.1:{port}/", log_path)
    try:
        _wait_ready(server, start_timeout)
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=20)
        log_path.unlink(missing_ok=True)


# ---------------------------------------------------------------- one person's request


@dataclass(frozen=True)
class Spec:
    """One person's generation: their own prompt and sampling seed."""

    prompt: str
    seed: int
    tokens: int

    def kwargs(self, model: str, num_layers: int) -> dict[str, Any]:
        core = max(1, num_layers // 8)
        return dict(prompt=self.prompt, model=model, chat_template=True, strategy="d3", alpha=0.95,
                    core_head=core, core_tail=core, start=0, drop_order="middle_out", fill="copy",
                    max_new_tokens=self.tokens, decoding="sample", temperature=0.9, seed=self.seed,
                    attention_layer=num_layers // 2, attention_head=0)


@dataclass(frozen=True)
class Tokens:
    """Token ids of both panes, as the page shows them."""

    d3: tuple[int, ...]
    full: tuple[int, ...]


def token_ids(pane_html: Any) -> tuple[int, ...]:
    """Token ids of a pane, in order, from each token's tooltip."""
    found = sorted((int(step), int(tok)) for step, tok in TOKEN_ID.findall(str(pane_html)))
    if [s for s, _ in found] != list(range(len(found))):
        raise ValueError("the pane's tokens are not numbered 0..n-1")
    return tuple(t for _, t in found)


def tokens_of(final: Sequence[Any]) -> Tokens:
    return Tokens(token_ids(final[D3_TOKENS]), token_ids(final[FULL_TOKENS]))


@dataclass
class Outcome:
    """What one request got: its tokens or the kind of error, and how long it took."""

    spec: Spec
    latency_s: float = float("nan")
    tokens: Tokens | None = None
    updates: int = 0  # streamed updates received
    streamed: list[Tokens] = field(default_factory=list)  # the panes' tokens in each streamed update
    error: str = ""
    exported: tuple[int, ...] | None = None  # D3 token ids in the session's exported trace


def error_kind(err: BaseException) -> str:
    """A short, countable name for what went wrong."""
    message = str(err)
    if isinstance(err, (TimeoutError, concurrent.futures.TimeoutError)):
        return "timeout"
    if "Queue is full" in message:
        return "queue_full"
    if "has not enabled verbose error reporting" in message or not message.strip():
        return "unhandled_server_exception"
    if "Something went wrong on the server" in message:
        return "server_error"
    if type(err).__name__ == "AppError":
        return "app_error: " + message.splitlines()[0][:80]
    return f"client: {type(err).__name__}: {message[:80]}"


def generate(client: Any, spec: Spec, model: str, num_layers: int, timeout: float) -> Outcome:
    """Submit one generation, wait for its last update, and read the tokens off every streamed update."""
    outcome = Outcome(spec)
    started = time.perf_counter()
    job = client.submit(**spec.kwargs(model, num_layers), api_name="/generate")
    try:
        final = job.result(timeout=max(1.0, timeout))  # waits on a future (iterating the job would spin)
        outcome.latency_s = time.perf_counter() - started
        updates = job.outputs()
        outcome.updates = len(updates)
        if "Done." not in str(final[STATUS]):
            raise RuntimeError(f"the run did not finish: {str(final[STATUS])[:120]}")
        outcome.tokens = tokens_of(final)
        if not outcome.tokens.d3 or not outcome.tokens.full:
            raise RuntimeError("no tokens in the final panes")
        outcome.streamed = [tokens_of(update) for update in updates]
    except Exception as err:  # any failure is counted by kind; the load test goes on
        outcome.error = error_kind(err)
        job.cancel()
    return outcome


def is_prefix(part: Tokens, whole: Tokens) -> bool:
    return whole.d3[:len(part.d3)] == part.d3 and whole.full[:len(part.full)] == part.full


def exported_d3_ids(client: Any) -> tuple[int, ...]:
    """The D3 token ids of this session's last run, from its trace export (the session State on the server)."""
    paths = client.predict(api_name="/export_trace")
    d3_path = next(Path(p) for p in paths if Path(p).name == "d3_trace.json")
    return tuple(int(s["token_id"]) for s in json.loads(d3_path.read_text())["steps"])


# ---------------------------------------------------------------- the phases


@dataclass
class Report:
    """The figures the load test prints (and writes with --json)."""

    model: str
    planned: dict[str, int] = field(default_factory=dict)
    completed: dict[str, int] = field(default_factory=dict)
    errors: Counter = field(default_factory=Counter)
    crosstalk: int = 0
    crosstalk_examples: list[str] = field(default_factory=list)
    latency_s: dict[str, dict[str, float]] = field(default_factory=dict)
    rss_mib: dict[str, float] = field(default_factory=dict)
    rss_series_mib: list[float] = field(default_factory=list)
    max_in_flight: int = 0
    distinct_references: int = 0  # different seeds must give different tokens, or cross-talk could hide
    server_tracebacks: int = 0
    server_log_tail: str = ""  # kept when the server logged a traceback
    timed_out: bool = False
    wall_s: float = 0.0
    failures: list[str] = field(default_factory=list)

    @property
    def rss_growth_pct(self) -> float:
        base, end = self.rss_mib.get("after_warmup", float("nan")), self.rss_mib.get("end", float("nan"))
        return (end - base) / base * 100 if base > 0 else float("nan")

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["errors"] = dict(self.errors)
        data["rss_growth_pct"] = self.rss_growth_pct
        return data


def _percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"n": 0, "p50": float("nan"), "p95": float("nan"), "max": float("nan")}
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, max(0, round(0.95 * len(ordered)) - 1))]
    return {"n": len(values), "p50": statistics.median(ordered), "p95": p95, "max": ordered[-1]}


def _check(report: Report, outcome: Outcome, reference: Tokens | None, who: str) -> None:
    """Count the outcome; a finished run whose tokens differ from its solo reference is cross-talk."""
    if outcome.error:
        report.errors[outcome.error] += 1
        return
    if reference is None:
        report.errors["no solo reference to check against"] += 1
        return
    exported_ok = outcome.exported is None or outcome.exported == reference.d3
    streamed_ok = all(is_prefix(t, reference) for t in outcome.streamed)
    if outcome.tokens != reference or not exported_ok or not streamed_ok:
        report.crosstalk += 1
        if len(report.crosstalk_examples) < 5:
            report.crosstalk_examples.append(f"{who}: seed {outcome.spec.seed}: got {outcome.tokens} "
                                             f"(export {outcome.exported}), solo run gave {reference}")


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
        _check(report, outcome, refs.get(outcome.spec), f"client {i}")
        if not outcome.error:
            latencies.append(outcome.latency_s)
            if outcome.updates < 3:
                report.failures.append(f"client {i} got {outcome.updates} updates: the run did not stream")
    report.completed["concurrent"] = len(latencies)
    report.latency_s["concurrent"] = _percentiles(latencies)
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
        _check(report, outcome, refs.get(specs[k]), f"run {i}")
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
    report.latency_s["endurance"] = _percentiles(latencies)


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
    _judge(report, args.max_growth)
    return report


def _num_layers(model: str) -> int:
    from d3.live import KNOWN_FACTS

    if model not in KNOWN_FACTS:
        raise SystemExit(f"--model must be one of {', '.join(KNOWN_FACTS)} (or use --tiny)")
    return KNOWN_FACTS[model].num_layers


def _judge(report: Report, max_growth: float) -> None:
    if report.completed.get("references", 0) > 1 and report.distinct_references < 2:
        report.failures.append("every solo run gave the same tokens: cross-talk would not show")
    if report.crosstalk:
        report.failures.append(f"{report.crosstalk} run(s) differ from their solo reference (cross-talk)")
    if report.errors:
        report.failures.append(f"{sum(report.errors.values())} error(s): {dict(report.errors)}")
    if report.server_tracebacks:
        report.failures.append(f"{report.server_tracebacks} traceback(s) in the server log")
    for phase, planned in report.planned.items():
        if report.completed.get(phase, 0) < planned:
            report.failures.append(f"{phase}: {report.completed.get(phase, 0)} of {planned} completed"
                                   + (" (time limit reached)" if report.timed_out else ""))
    growth = report.rss_growth_pct
    if not growth < max_growth:  # NaN (never measured) fails too
        report.failures.append(f"server RSS grew {growth:.1f}% after the warm-up (target < {max_growth}%)")


def _latency_text(d: dict[str, float] | None) -> str:
    if not d or not d["n"]:
        return "n/a"
    return f"p50 {d['p50']:.2f} s, p95 {d['p95']:.2f} s, max {d['max']:.2f} s (n={d['n']})"


def render(report: Report) -> str:
    lat, rss = report.latency_s, report.rss_mib
    lines = [
        f"model: {report.model}    wall time: {report.wall_s:.0f} s"
        + ("    TIME LIMIT REACHED" if report.timed_out else ""),
        f"requests completed: solo references {report.completed.get('references', 0)}, "
        f"concurrent {report.completed.get('concurrent', 0)}/{report.planned['concurrent']} "
        f"(max {report.max_in_flight} in flight), in a row {report.completed.get('endurance', 0)}/"
        f"{report.planned['endurance']}",
        f"errors: {sum(report.errors.values())}" + (f" {dict(report.errors)}" if report.errors else ""),
        f"cross-talk (streamed tokens or export differ from the solo run): {report.crosstalk}    "
        f"(distinct solo outputs: {report.distinct_references} of {report.completed.get('references', 0)})",
        *[f"  {e}" for e in report.crosstalk_examples],
        f"latency, concurrent: {_latency_text(lat.get('concurrent'))}",
        f"latency, in a row:   {_latency_text(lat.get('endurance'))}",
        "server RSS (MiB): " + ", ".join(f"{k} {v:.1f}" for k, v in rss.items()),
        f"RSS growth after warm-up: {report.rss_growth_pct:+.2f}%    series every 10 runs: {report.rss_series_mib}",
        f"tracebacks in the server log: {report.server_tracebacks}",
        *([report.server_log_tail] if report.server_log_tail else []),
        "RESULT: " + ("PASS" if not report.failures else "FAIL\n  " + "\n  ".join(report.failures)),
    ]
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m", help="a known model name (default smollm2-135m)")
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
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)  # the server subprocess
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.clients < 1 or args.runs < 0 or args.sessions < 1 or args.tokens < 1 or args.run_tokens < 1:
        p.error("--clients, --sessions, --tokens and --run-tokens must be at least 1, --runs at least 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.serve:
        serve(TINY if args.tiny or args.model == TINY else args.model, args.port)
        return 0
    try:
        report = run(args)
    except (RuntimeError, TimeoutError) as err:  # the server did not start
        print(f"load test aborted: {err}", file=sys.stderr)
        return 2
    print(render(report))
    if args.json:
        args.json.write_text(json.dumps(report.to_dict(), indent=2))
    return 0 if not report.failures else 1


if __name__ == "__main__":
    sys.exit(main())
