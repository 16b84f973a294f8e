"""The known models made ready once, in the background, when a public server starts: each one converted from its
packages or downloaded from the hub, one after another, so that no visitor's run converts or downloads a model.

Until a model is ready a run asked for on it is answered at once with its progress ("qwen2.5-coder-1.5b is being
prepared: 40% (dequantizing the GGUF's tensors)"), which the page also shows at its top. A local server prepares
nothing: its first use of a model converts it, as before."""

from __future__ import annotations

import functools
import html
import logging
import re
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)
Prepare = Callable[[str, Callable[[str], None]], None]  # (model name, report a stage line) -> when ready
EVERY_S = 2.0  # how often the page's line is refreshed while something is being prepared
_COUNT = re.compile(r"(\d[\d,]*) of (\d[\d,]*)")
_PERCENT = re.compile(r"(\d+(?:\.\d+)?)%")


def prepare_known(name: str, report: Callable[[str], None]) -> None:
    """Make the known model `name` loadable with nothing left to convert or download (`d3.models.prepare`)."""
    from d3.models import prepare

    prepare(name, report)


def prepare_order(names: tuple[str, ...]) -> tuple[str, ...]:
    """The known models in the order to prepare them: those with nothing to do first (converted already, or in the
    hub cache), then downloads, then conversions (minutes of CPU each), so that a quick one never waits behind a
    slow one. Names that are not known models keep their place at the end."""
    from d3.model_cache import ready_conversion
    from d3.models import KNOWN_MODELS, hub_cached, hub_fallback, known_key

    def cost(name: str) -> int:
        if name not in KNOWN_MODELS:
            return 3
        hub = hub_fallback(name)
        if hub is not None:
            return 0 if hub_cached(hub) else 1
        try:
            return 0 if ready_conversion(name, known_key(name)) is not None else 2
        except ValueError:  # its source is not installed: preparing it fails at once, and says so
            return 0

    return tuple(sorted(names, key=cost))


def percent(stage: str) -> int | None:
    """How far a stage line says it is: "120 of 339" or "35%" in it; None when it says nothing countable."""
    found = _PERCENT.search(stage)
    if found:
        return min(100, int(float(found.group(1))))
    found = _COUNT.search(stage)
    if found:
        done, total = (int(g.replace(",", "")) for g in found.groups())
        return min(100, 100 * done // total) if total else None
    return None


class Preparation:
    """The known models' preparation on a public server: one background thread takes them in turn (`start`), and
    `message(name)` says why a model cannot run yet (None once it is ready, or when nothing was started)."""

    def __init__(self, names: tuple[str, ...], prepare: Prepare | None = None) -> None:
        self.names = names
        self._prepare = prepare or prepare_known
        self._stage: dict[str, str] = {}  # name -> its latest stage line, while it is prepared
        self._ready: set[str] = set()
        self._failed: dict[str, str] = {}  # name -> why (one line)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def start(self) -> Preparation:
        """Begin preparing every model in the background (once; later calls do nothing)."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="prepare-models", daemon=True)
                self._thread.start()
        return self

    @property
    def started(self) -> bool:
        return self._thread is not None

    def done(self) -> bool:
        """Every model is ready or has failed (or nothing was started)."""
        with self._lock:
            return self._thread is None or len(self._ready) + len(self._failed) == len(self.names)

    def _run(self) -> None:
        for name in self.names:
            self._report(name, "starting")
            try:
                self._prepare(name, functools.partial(self._report, name))
            except Exception as err:  # noqa: BLE001 (one model's failure is said on the page; the others go on)
                log.warning("could not prepare model %r: %s: %s", name, type(err).__name__, str(err)[:300])
                with self._lock:
                    self._failed[name] = str(err).splitlines()[0][:300] if str(err) else type(err).__name__
                    self._stage.pop(name, None)
                continue
            with self._lock:
                self._ready.add(name)
                self._stage.pop(name, None)
            log.info("model %r is ready", name)

    def _report(self, name: str, line: str) -> None:
        with self._lock:
            self._stage[name] = line.strip()

    def message(self, name: str) -> str | None:
        """Why `name` cannot run yet on this server, in one line; None when it can (or is not one of ours)."""
        with self._lock:
            if self._thread is None or name not in self.names or name in self._ready:
                return None
            if name in self._failed:
                return f"{name} could not be prepared on this server ({self._failed[name]}): try another model"
            stage = self._stage.get(name)
        if stage is None:
            return f"{name} is waiting to be prepared (the models are prepared one after another): try again soon"
        done = percent(stage)
        shown = f"{done}% ({stage})" if done is not None else stage
        return f"{name} is being prepared: {shown}. Try again when it is ready"

    def line(self) -> str:
        """One line for the top of the page: each model not ready yet and how far it is; empty once all are."""
        if self.done():
            failed = [self.message(n) for n in self.names if n in self._failed]
            return " ".join(m for m in failed if m)
        parts = []
        for name in self.names:
            with self._lock:
                ready, stage = name in self._ready, self._stage.get(name)
            if ready:
                parts.append(f"{name} ready")
            elif stage is not None:
                done = percent(stage)
                parts.append(f"{name} is being prepared: {done}%" if done is not None else f"{name}: {stage}")
            else:
                parts.append(f"{name} waiting")
        return "Preparing the models once for this server: " + "; ".join(parts)

    def html(self) -> str:
        text = self.line()
        return f'<div class="d3-preparing" role="status">{html.escape(text)}</div>' if text else ""
