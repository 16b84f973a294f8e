"""What every subcommand shares: the one-line error type and checks that run before any work."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Callable


class CliError(Exception):
    """A person's mistake: printed as one line, exit status 2."""


def check_output_file(path: str | Path, flag: str) -> None:
    """Fail now, not after the work, when an output file cannot be written because a directory is in the way."""
    path = Path(path)
    if path.is_dir():
        raise CliError(f"{flag} {path} is a directory; give a file path")
    for parent in path.parents:
        if parent.exists() and not parent.is_dir():
            raise CliError(f"{flag} {path}: {parent} is a file, not a directory")


def check_input_file(path: str | Path, flag: str, hint: str = "") -> None:
    """Fail now when an input file is missing or is not a file."""
    path = Path(path)
    if not path.is_file():
        what = "is a directory" if path.is_dir() else "not found"
        raise CliError(f"{flag} {path} {what}" + (f": {hint}" if hint else ""))


def set_threads(threads: int) -> None:
    """torch.set_num_threads(threads) when threads > 0."""
    if threads:
        import torch  # only commands that run a model get here; the parser itself stays free of torch

        torch.set_num_threads(threads)


def int_in(lo: int, hi: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer in [lo, hi] (hi None: no upper bound). argparse names the flag in the error."""
    allowed = f"an integer >= {lo}" if hi is None else f"an integer in [{lo}, {hi}]"

    def parse(text: str) -> int:
        try:
            value = int(text.strip()) if len(text) <= 20 else None
        except ValueError:
            value = None
        if value is None or value < lo or (hi is not None and value > hi):
            raise argparse.ArgumentTypeError(f"{text[:40]!r} is not allowed: {allowed}")
        return value

    parse.__name__ = "integer"
    return parse
