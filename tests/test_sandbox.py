"""d3.research.sandbox: a benchmark's program runs in a subprocess that passes a good program and fails a bad one, a
hung one, one that reaches for the network and one past the memory limit."""

from __future__ import annotations

from d3.research.sandbox import run_program


def test_the_sandbox_passes_good_code_and_fails_bad_code() -> None:
    assert run_program("def f(x):\n    return x + 1\nassert f(1) == 2\n").passed
    bad = run_program("def f(x):\n    return x - 1\nassert f(1) == 2\n")
    assert not bad.passed and "AssertionError" in bad.status
    assert run_program("while True:\n    pass\n", timeout=1).status == "timed out (CPU time)"
    assert run_program("import time\ntime.sleep(30)\n", wall=1).status == "timed out (wall clock)"
    net = run_program("import socket\nsocket.create_connection(('127.0.0.1', 9))\n")
    assert not net.passed and "network" in net.status
    assert not run_program("x = bytearray(4 * 2**30)\n").passed  # the memory limit
