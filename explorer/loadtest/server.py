"""The app under load, served in a subprocess that the load test starts, watches (RSS, log) and stops."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from explorer.caps import Caps
from explorer.page import build_demo, free_port, launch, tune_process

ROOT = Path(__file__).resolve().parents[2]
TINY = "tiny"


def serve(model: str, port: int) -> None:
    """The server process: the page with the embedded model, or with a tiny random model (`model == "tiny"`)."""
    if model == TINY:
        import torch

        from d3.engine import Engine
        from d3.testing import tiny_llama, tiny_tokenizer

        torch.set_num_threads(1)  # a tiny model gains nothing from threads, and the machine is shared
        engine = Engine(tiny_llama(6), tiny_tokenizer(), name=TINY)

        def factory(name: str) -> Engine:
            if name != TINY:
                raise ValueError(f"unknown model {name!r}: this server only runs {TINY}")
            return engine

        demo = build_demo(factory, caps=Caps.from_env(), public=False, model_names=(TINY,))
    else:
        import logging

        import app

        logging.basicConfig(level=logging.INFO)  # the page exactly as `python app.py` serves it (app.py's main)
        tune_process()  # D3_TORCH_THREADS, and the garbage collector's full passes kept off what lives now
        demo = app.demo
    launch(demo, server_name="127.0.0.1", server_port=port, quiet=True)


def rss_mib(pid: int) -> float:
    """Resident memory of process `pid` in MiB, from /proc/<pid>/status (NaN if it is gone)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return float("nan")
    match = re.search(r"^VmRSS:\s+(\d+) kB", text, re.M)
    return int(match.group(1)) / 1024 if match else float("nan")




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
    cmd = [sys.executable, "-m", "explorer.loadtest", "--serve", "--model", model, "--port", str(port)]
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
