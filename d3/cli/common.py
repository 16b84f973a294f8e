"""What every subcommand shares: the one-line error type and checks that run before any work."""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from d3.config import DEFAULT_MODEL, MAX_NEW_TOKENS_CAP, Param, params

# Where every command allows less than the registry (a field's name -> the narrower bounds): a D3 start past the last
# token any run may generate would change nothing, and a number that large is a typing mistake.
CLI_NARROW: dict[str, dict[str, float]] = {"start": {"hi": MAX_NEW_TOKENS_CAP}}


class CliError(Exception):
    """A person's mistake: printed as one line, exit status 2."""


def check_output_file(path: str | Path, flag: str) -> None:
    """Fail now, not after the work, when an output file cannot be written: a directory in the way, a file in
    the way of a directory, or a place this process may not write (tried for real: a permission bit says little
    to root, or on a read-only mount). Nothing is left behind: a probe file is removed at once."""
    path = Path(path)
    try:
        if path.is_dir():
            raise CliError(f"{flag} {path} is a directory; give a file path")
        for parent in path.parents:
            if parent.exists() and not parent.is_dir():
                raise CliError(f"{flag} {path}: {parent} is a file, not a directory")
    except OSError as err:  # a name too long to look at, a loop of links
        raise CliError(f"{flag} {path} cannot be written: {err.strerror or type(err).__name__}") from None
    problem = _unwritable(path)
    if problem:
        raise CliError(f"{flag} {path} cannot be written: {problem}")


def _unwritable(path: Path) -> str | None:
    """Why `path` cannot be written (an existing file opened for appending, else a probe file made where it would
    be), or None."""
    try:
        if path.exists():
            with path.open("ab"):
                return None
        folder = next((p for p in path.absolute().parents if p.exists()), Path("/"))
        if folder == path.parent.absolute():  # the file itself, exactly where it will be (a name too long fails here)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            os.close(fd)
            path.unlink()
        else:  # folders to be made: a probe folder in the nearest one that exists
            probe = Path(tempfile.mkdtemp(prefix=".d3-probe-", dir=folder))
            probe.rmdir()
    except FileExistsError:  # made meanwhile (another process of the same run probing it): the folder is writable
        return None
    except OSError as err:
        return err.strerror or type(err).__name__
    return None


def check_input_file(path: str | Path, flag: str, hint: str = "") -> None:
    """Fail now when an input file is missing or is not a file."""
    path = Path(path)
    if not path.is_file():
        what = "is a directory" if path.is_dir() else "not found"
        raise CliError(f"{flag} {path} {what}" + (f": {hint}" if hint else ""))


def known_layers(model: str) -> int | None:
    """A known model's layer count, read without loading it (None for anything else: a local folder, a hub id)."""
    from d3.models import KNOWN_MODELS  # imports torch: only from a command's run, never from building the parser

    known = KNOWN_MODELS.get(model)
    return None if known is None else int(known.facts.num_layers)


def check_steps(steps: int | None, flag: str, model: str, num_layers: int, head: int, tail: int) -> None:
    """A calibration's greedy removals (`calibrate --steps`, `paper --calibrate-steps`): at most the flex layers the
    core leaves; CliError naming the flag and the range otherwise."""
    flex = num_layers - head - tail
    if steps is not None and steps > flex:
        raise CliError(f"{flag} {steps} is not allowed: {flag} must be an integer in [1, {flex}] (the flex layers of "
                       f"{model}'s {num_layers} with core {head}+{tail})")


def check_device(device: str, flag: str = "--device") -> None:
    """The device is one this machine has (mps without Apple's GPU, cuda:3 on a one-GPU machine: refused now)."""
    from d3.models import resolve_device  # imports torch: only from a command's run

    try:
        resolve_device(device)
    except ValueError as err:
        raise CliError(f"{flag} {device}: {err}") from None


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
            # ASCII only: Python's int() also reads other scripts' digits ("٣"), which no other tool here would
            value = int(text.strip()) if len(text) <= 20 and text.isascii() else None
        except ValueError:
            value = None
        if value is None or value < lo or (hi is not None and value > hi):
            raise argparse.ArgumentTypeError(f"{text[:40]!r} is not allowed: {allowed}")
        return value

    parse.__name__ = "integer"
    return parse


MAX_THREADS = 1024


def add_threads_arg(p: argparse.ArgumentParser, help: str = "torch threads (0: leave torch's default)") -> None:  # noqa: A002
    """--threads, one definition for every command that runs a model: an integer in [0, 1024]."""
    p.add_argument("--threads", type=int_in(0, MAX_THREADS), default=0, help=help)


def add_model_arg(p: argparse.ArgumentParser, help: str = "known model name or a local model directory") -> None:  # noqa: A002
    """--model, defaulting to the one default model (d3.config.DEFAULT_MODEL)."""
    p.add_argument("--model", default=DEFAULT_MODEL, help=f"{help} (default {DEFAULT_MODEL})")


def param_type(prm: Param, flag: str) -> Callable[[str], Any]:
    """An argparse type made from a field's `Param`: the text read as the field's kind and checked against its
    range or choices, so that argparse refuses a bad value in one line naming the flag and what is allowed."""
    def parse(text: str) -> Any:
        if prm.optional and text.strip().lower() in ("auto", "none"):
            return None
        value: Any = text
        if not prm.choices:
            try:  # ASCII only, as for `int_in`; and no more characters than a float can mean
                value = (int(text) if prm.integer else float(text)) if text.isascii() and len(text) <= 40 else None
            except ValueError:
                value = None
        if value is None or not prm.ok(value):
            raise argparse.ArgumentTypeError(f"{text[:40]!r} is not allowed: {flag} must be {prm.allowed()}")
        return value

    parse.__name__ = "value"
    return parse


def describe_param(prm: Param) -> str:
    """A flag's help from its Param: what it does, what it allows and its default."""
    default = "auto" if prm.default is None else prm.default
    return f"{prm.help} ({prm.allowed()}; default {default})".replace("%", "%%")


def add_field_args(p: argparse.ArgumentParser, cls: type, names: tuple[str, ...], *, flags: dict[str, str] | None = None,
                   narrow: dict[str, Param] | None = None, keep_default: bool = True) -> None:
    """One flag per named field of the config class `cls`, derived from the registry (d3.config's `Param`): its
    type, range or choices, default and help are the field's, said once there (transformers' HfArgumentParser).
    flags: a flag named otherwise than --field-name; narrow: a narrower Param where this command allows less;
    keep_default: False leaves the default None (the command tells "not given" from the field's default)."""
    registry = params(cls)
    for name in names:
        prm = (narrow or {}).get(name, registry[name])
        if name in CLI_NARROW:
            prm = prm.narrowed(**CLI_NARROW[name])
        flag = (flags or {}).get(name, "--" + name.replace("_", "-"))
        kind: dict[str, Any] = {"choices": prm.choices} if prm.choices else {"type": param_type(prm, flag)}
        if prm.choices:
            kind["type"] = str
        p.add_argument(flag, dest=name, default=prm.default if keep_default else None, help=describe_param(prm),
                       **kind)
