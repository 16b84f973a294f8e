"""Run an untrusted Python program (a model's code plus a benchmark's tests) in a subprocess: its own temp dir, a
wall-clock timeout, CPU/memory/file-size/process limits, no network, no standard input.

No network: the program runs in a fresh network namespace (`unshare -n`, when this machine allows it: root or user
namespaces), and in any case a prelude replaces `socket.socket` and friends with a function that raises before the
program's own code runs. The program's exit status decides: 0 is a pass, anything else (an assertion, an exception,
the timeout, a limit) a fail, with the reason kept.
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass

TIMEOUT_S = 10.0  # CPU seconds per program (HumanEval's own harness uses 3 s of wall clock on a faster machine)
# Wall-clock seconds: only a backstop for a program that sleeps or waits. A wall-clock limit alone fails correct
# programs on a loaded machine (here at load 20-30 a 10 s wall limit timed out `return x + y`), so the verdict's limit
# is CPU time, which other jobs do not eat.
WALL_S = 300.0
MEMORY_BYTES = 2 * 2**30  # address space
FILE_BYTES = 16 * 2**20  # largest file the program may write

PRELUDE = """\
import socket as _s
def _no_network(*a, **k):
    raise OSError("network access is disabled in the sandbox")
for _n in ("socket", "create_connection", "create_server", "socketpair", "getaddrinfo", "fromfd"):
    setattr(_s, _n, _no_network)
del _s, _n
"""


@dataclass(frozen=True)
class Outcome:
    passed: bool
    status: str  # "passed", "failed: <last line of stderr>", "timed out", ...


@functools.lru_cache(maxsize=1)
def network_namespace() -> list[str]:
    """["unshare", "-n"] where a fresh network namespace can be made here, else [] (the prelude still applies)."""
    tool = shutil.which("unshare")
    if tool is None:
        return []
    try:
        ok = subprocess.run([tool, "-n", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return []
    return [tool, "-n"] if ok else []


def _limits(timeout: float, memory: int) -> None:  # pragma: no cover (runs in the child)
    import resource

    cpu = max(1, int(timeout))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_BYTES, FILE_BYTES))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    os.setsid()


def run_program(source: str, timeout: float = TIMEOUT_S, memory: int = MEMORY_BYTES, wall: float = WALL_S) -> Outcome:
    """Run `source` (Python) in a subprocess sandbox; passed when it exits with status 0 within `timeout` CPU
    seconds (and `wall` seconds of wall clock)."""
    with tempfile.TemporaryDirectory(prefix="d3-sandbox-") as tmp:
        path = os.path.join(tmp, "program.py")
        with open(path, "w", encoding="utf-8") as f:
            f.write(PRELUDE + "\n" + source)
        env = {"PATH": "/usr/bin:/bin", "HOME": tmp, "TMPDIR": tmp, "PYTHONHASHSEED": "0", "LANG": "C.UTF-8"}
        cmd = [*network_namespace(), sys.executable, "-I", path]
        child = subprocess.Popen(cmd, cwd=tmp, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, preexec_fn=lambda: _limits(timeout, memory))
        try:
            _, err = child.communicate(timeout=wall)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(child.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            child.communicate()
            return Outcome(False, "timed out (wall clock)")
    if child.returncode == 0:
        return Outcome(True, "passed")
    if child.returncode in (-signal.SIGXCPU, -signal.SIGKILL):
        return Outcome(False, "timed out (CPU time)")
    lines = [ln for ln in err.decode("utf-8", "replace").strip().splitlines() if ln.strip()]
    why = lines[-1][:200] if lines else f"exit status {child.returncode}"
    return Outcome(False, f"failed: {why}")
