"""Helpers shared by the robustness tests: live-object counts, RSS, one torch thread."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Iterator

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent


def alive(cls: type) -> int:
    """Instances of `cls` still reachable after a full collection (what a leak would keep)."""
    gc.collect()
    return sum(1 for obj in gc.get_objects() if isinstance(obj, cls))


def rss_mib() -> float:
    """This process's resident memory in MiB (/proc/self/status)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """Tiny models run fastest on one thread, above all on a machine shared with other work."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
