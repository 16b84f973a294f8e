"""Research tools built on the engine: calibrated drop orders, the depth oracle, sweeps, the paper's protocol,
benchmarks, and the tasks and data they read. They import the core (`d3.*`); the core never imports them."""

from collections.abc import Callable

ShouldStop = Callable[[], bool]  # checked between a measurement's steps: True ends it (a time limit, a caller gone)


class Stopped(Exception):
    """A measurement ended before its end because its `should_stop()` said so."""


def stop_if(should_stop: ShouldStop | None) -> None:
    """Raise Stopped when `should_stop()` says so (None: never)."""
    if should_stop is not None and should_stop():
        raise Stopped()
