"""A known model's GGUF conversion in its own process, at low priority on one thread, reporting its stage line by
line: the page's first use of a model never holds up another session's run (`python -m d3.convert RECIPE`)."""

from __future__ import annotations

import importlib
import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from d3.gguf_sources import from_dict, to_dict
from d3.model_cache import cached_conversion

log = logging.getLogger(__name__)
PROGRESS, ERROR = "progress: ", "error: "
HEARTBEAT_S = 5.0  # how often a long stage says it is still going, with its time so far


def convert_apart(name: str, known: Any, key: str, progress: Callable[[str], None]) -> None:
    """Convert `known` (a d3.models.KnownModel) into the cache in a subprocess; each of its stage lines goes to
    `progress`. ValueError with its one-line reason when it fails."""
    recipe = json.dumps({"name": name, "key": key, "source": to_dict(known.source), "converter": known.converter})
    root = str(Path(__file__).resolve().parent.parent)  # where `d3` is importable from, for the child too
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    started = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-m", "d3.convert", recipe], stdout=subprocess.PIPE, text=True, env=env)
    error = ""
    assert child.stdout is not None
    for line in child.stdout:
        line = line.rstrip("\n")
        if line.startswith(PROGRESS):
            progress(line.removeprefix(PROGRESS))
        elif line.startswith(ERROR):
            error = line.removeprefix(ERROR)
    code = child.wait()
    if code != 0:
        raise ValueError(error or f"the conversion of {name} stopped (exit status {code}); the server's log says why")
    log.info("converted %s in a subprocess in %.1f s", name, time.perf_counter() - started)


class _Stage:
    """The stage being worked on, printed when it starts and every HEARTBEAT_S seconds while it lasts."""

    def __init__(self) -> None:
        self.text, self.since, self.lock = "starting", time.monotonic(), threading.Lock()

    def __call__(self, text: str) -> None:
        with self.lock:
            self.text, self.since = text, time.monotonic()
            print(PROGRESS + text, flush=True)

    def beat(self, done: threading.Event) -> None:
        while not done.wait(HEARTBEAT_S):
            with self.lock:
                if time.monotonic() - self.since >= 1:  # a stage that just began has said so already
                    print(f"{PROGRESS}{self.text} ({time.monotonic() - self.since:.0f} s so far)", flush=True)


def _count_tensors(stage: _Stage) -> None:
    """Have transformers' GGUF loader report its tensors as it dequantizes them ("tensor 52 of 339"), through the
    progress bar it iterates them with; without that bar (another transformers version) the stage says less."""
    try:
        import transformers.modeling_gguf_pytorch_utils as gguf_utils
    except ImportError:
        return
    if not callable(getattr(gguf_utils, "tqdm", None)):
        return

    def counted(items: Any, *args: Any, **kwargs: Any) -> Any:
        items = list(items)
        step = max(1, len(items) // 20)
        for i, item in enumerate(items):
            if i % step == 0:
                stage(f"dequantizing the GGUF's tensors: {i} of {len(items)}")
            yield item
        stage("saving the converted weights")

    gguf_utils.tqdm = counted


def run(recipe: dict[str, Any]) -> int:
    """The child: assemble and check the GGUF, convert it, publish it in the cache; 0 when it is there."""
    name, key, source = recipe["name"], recipe["key"], from_dict(recipe["source"])
    module, _, function = recipe["converter"].partition(":")
    convert = getattr(importlib.import_module(module), function)
    stage, done = _Stage(), threading.Event()
    threading.Thread(target=stage.beat, args=(done,), daemon=True).start()
    _count_tensors(stage)

    def converting(gguf: Path, out: Path, model: str) -> None:
        stage(f"converting {gguf.name}: reading its tokenizer and tensors")
        convert(gguf, out, model)
        stage("recording the converted weights' sha256")

    try:
        cached_conversion(name, key, lambda work: source.make(work, stage), converting)
    except ValueError as err:
        print(ERROR + " ".join(str(err).split()), flush=True)
        return 2
    except Exception as err:  # noqa: BLE001 (any failure: one line for the caller, the traceback for the log)
        log.exception("the conversion of %s failed", name)
        print(f"{ERROR}the conversion of {name} failed ({type(err).__name__}: {' '.join(str(err).split())[:300]})",
              flush=True)
        return 1
    finally:
        done.set()
    stage("converted")
    return 0


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="d3.convert: %(message)s")
    try:
        os.nice(10)  # the server's own runs come first
    except OSError:
        pass
    import torch
    from transformers.utils import logging as hf_logging

    torch.set_num_threads(1)  # the other cores stay with the server
    hf_logging.disable_progress_bar()  # its bars would fill the server's log; the stage lines say where it is
    return run(json.loads(argv[0]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
