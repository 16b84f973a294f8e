"""The models shared by every session: each engine built once, on first use, kept while it is recently used.

One slow or failing load never stalls anyone else: each model has its own lock (only callers that need that
model wait for it), a failed load is remembered for a while so retries answer at once, and beyond
`caps.max_models` the least recently used engine is dropped. A dropped engine that a run still streams from is
pinned: it counts against `caps.max_models` until the run lets it go, and a request for its model gets it back
instead of loading a second copy."""

from __future__ import annotations

import gc
import logging
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from d3.engine import Engine
from d3.models import KNOWN_MODELS, ModelFacts
from explorer.caps import Caps
from explorer.memory import SessionMemory
from explorer.parse import shown

log = logging.getLogger(__name__)
KNOWN_FACTS: dict[str, ModelFacts] = {name: known.facts for name, known in KNOWN_MODELS.items()}
FAILED_LOAD_TTL_S = 60.0  # a failed load is answered from memory this long, then tried again


def _default_factory(caps: Caps, public: bool, report: Callable[[str, str], None]) -> Callable[[str], Engine]:
    def build(name: str) -> Engine:
        # load_model, not get_model: get_model's process-wide cache would keep evicted models alive, and its
        # one lock would make every load wait for any other. A first use converts in a subprocess (d3.convert):
        # minutes of CPU and gigabytes of float32 that never hold up another session's run.
        from d3.models import load_model

        loaded = load_model(name, allow_paths=not public, max_parameters=caps.max_parameters,
                            progress=lambda line: report(name, line), convert_apart=True)
        return Engine(loaded.model, loaded.tokenizer, name=loaded.name, max_prompt_tokens=caps.max_prompt_tokens)

    return build


class ModelPool:
    """Engines by model name: each built once, on first use, and shared read-only by every session.

    The engine's own lock serialises forward steps, so concurrent streams interleave safely. A stream holds
    its engine, so evicting it from the pool only lets it go once nobody streams from it any more: until then it
    is pinned (`pinned`), counts against the cap and is what a request for its model gets.
    """

    def __init__(self, factory: Callable[[str], Engine] | None = None, *, caps: Caps | None = None,
                 public: bool = False, names: tuple[str, ...] = tuple(KNOWN_MODELS),
                 facts: Mapping[str, ModelFacts] | None = None) -> None:
        self.caps = caps or Caps()
        self.public = public
        self.names = names
        self._factory = factory or _default_factory(self.caps, public, self.report)
        self._real_loader = factory is None
        # Injected factories (tests) get no table: their facts come from the engine itself.
        self._facts = dict(KNOWN_FACTS if factory is None and facts is None else facts or {})
        self._engines: OrderedDict[str, Engine] = OrderedDict()  # least recently used first
        # Engines evicted while something still held them (a run streaming): alive only as long as it does.
        self._pinned: weakref.WeakValueDictionary[str, Engine] = weakref.WeakValueDictionary()
        self._failed: dict[str, tuple[float, str]] = {}  # name -> (when, the message shown)
        self._loading: dict[str, threading.Lock] = {}
        self._progress: dict[str, str] = {}  # name -> the stage its load is at (while it loads)
        self._changed = threading.Condition()  # notified when a stage or a load ends
        self._lock = threading.Lock()  # guards the dicts above; never held while a model loads
        # On a public server, why a model cannot run yet (being prepared at startup: explorer/prepare.py), or None.
        self.preparing: Callable[[str], str | None] | None = None
        # What every session keeps of its runs, under one budget (explorer.memory): shared like the engines.
        self.sessions = SessionMemory(self.caps.session_memory_mib * 2**20)

    def check_name(self, name: Any) -> str:
        """A model name this deployment may load; ValueError otherwise (public: known models only)."""
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"model={shown(name)} is not allowed: choose one of {', '.join(self.names)}")
        name = name.strip()
        if name in self.names:
            return name
        if self.public:
            raise ValueError(f"model={shown(name)} is not allowed here: this deployment only runs {', '.join(self.names)}")
        if len(name) > 300 or not name.isprintable():
            raise ValueError("model names are at most 300 printable characters")
        return name

    def engine(self, name: str) -> Engine:
        """The engine for `name`, loading the model the first time; only callers of the same name wait. A model
        still pinned by a run is handed back, never loaded twice; a load that would pass `caps.max_models` with
        every other model pinned is refused (ValueError) until a run ends."""
        name = self.check_name(name)
        self._refuse_unprepared(name)
        with self._lock:
            lock = self._loading.setdefault(name, threading.Lock())
        with lock:
            with self._lock:
                engine = self._engines.get(name)
                engine = self._pinned.pop(name, None) if engine is None else engine
                if engine is not None:
                    self._engines[name] = engine
                    self._engines.move_to_end(name)
                else:
                    self._raise_if_failed_recently(name)
            if engine is not None:
                self._shrink()
                return engine
            self._make_room()
            try:
                engine = self._load(name)
            finally:
                with self._changed:
                    self._progress.pop(name, None)
            with self._lock:
                self._engines[name] = engine
        self._shrink()
        return engine

    def _make_room(self) -> None:
        """Before a load: evict down to one below the cap, and refuse when the models pinned by runs fill it."""
        self._shrink(room=1)
        with self._lock:
            held = len(self._engines) + len(self._pinned)
            if held >= self.caps.max_models and not self._engines:
                raise ValueError(f"{held} model{'s are' if held > 1 else ' is'} in use by runs that have not ended "
                                 f"(this server keeps at most {self.caps.max_models}): try again when one ends")

    def _shrink(self, room: int = 0) -> None:
        """Evict one engine at a time, each let go before the next is chosen (one that no run holds is gone then
        and no longer counts), until the loaded and pinned ones leave `room` under the cap."""
        while True:
            with self._lock:
                evicted = self._evict(room, at_most=1)
            if not evicted:
                return
            self._release(evicted)

    def report(self, name: str, line: str) -> None:
        """The stage `name`'s load is at (called by the loader, from its thread)."""
        with self._changed:
            self._progress[name] = line
            self._changed.notify_all()

    def loading(self, name: str, *, every_s: float = 1.0) -> Iterator[str]:
        """Load `name` in a worker thread, yielding a line whenever its stage changes (and every `every_s` with its
        time so far) until it is loaded; its error, if it fails, is raised here (and remembered, as `engine`
        does). A model already loaded yields nothing."""
        name = self.check_name(name)
        if self.is_loaded(name):
            return
        self._refuse_unprepared(name)
        failure: list[BaseException] = []
        done = threading.Event()

        def load() -> None:
            try:
                self.engine(name)
            except BaseException as err:  # noqa: BLE001 (raised again in the caller's thread, below)
                failure.append(err)
            finally:
                done.set()
                with self._changed:
                    self._changed.notify_all()

        started = time.monotonic()
        threading.Thread(target=load, name=f"load-{name}", daemon=True).start()
        while not done.is_set():
            with self._changed:
                self._changed.wait(every_s)
                stage = self._progress.get(name, "loading the model")
            if not done.is_set():
                yield f"{stage}: {time.monotonic() - started:.0f} s"
        if failure:
            raise failure[0]

    def _refuse_unprepared(self, name: str) -> None:
        """A model a public server is still preparing is refused at once with how far it is; never prepared here."""
        message = self.preparing(name) if self.preparing is not None and not self.is_loaded(name) else None
        if message is not None:
            raise ValueError(message)

    def _raise_if_failed_recently(self, name: str) -> None:
        failed = self._failed.get(name)
        if failed is not None and time.monotonic() - failed[0] < FAILED_LOAD_TTL_S:
            raise ValueError(failed[1])
        self._failed.pop(name, None)

    def _load(self, name: str) -> Engine:
        """Build the engine; a name that is not one of ours fails with one message whatever the reason, so an
        error never tells whether some directory exists on the server, and never shows a traceback."""
        try:
            engine = self._factory(name)
        except Exception as err:
            if name in self.names and not isinstance(err, (ValueError, OSError)):
                raise  # one of our own models failed for a reason nobody typed: a server fault, logged in full
            log.warning("could not load model %r: %s: %s", name, type(err).__name__, str(err)[:300])
            message = self._load_failure(name, err)
            with self._lock:
                now = time.monotonic()
                self._failed = {n: f for n, f in self._failed.items() if now - f[0] < FAILED_LOAD_TTL_S}
                self._failed[name] = (now, message)
                self._loading.pop(name, None)  # bounded by the names that load, not by every name ever tried
            raise ValueError(message) from None
        if self._real_loader:
            gc.freeze()  # the model may live as long as the process: keep its objects out of every full GC pass
        return engine

    def _load_failure(self, name: str, err: Exception) -> str:
        """What a person is told when `name` does not load (the details go to the log)."""
        if name not in self.names:
            return (f"unknown model {shown(name)}, or not one this server can load: use one of the known models "
                    f"({', '.join(self.names)}) or a local directory with a config.json and its weights")
        if isinstance(err, ValueError):
            return str(err)
        return f"model {name!r} could not be loaded on this server (the details are in its log): try again later"

    def _evict(self, room: int = 0, at_most: int = 1 << 30) -> list[Engine]:
        """Drop least recently used engines until the loaded and the pinned ones leave `room` under the cap
        (called with the lock held). Each dropped one is kept weakly: pinned while a run still holds it."""
        out = []
        while (self._engines and len(out) < at_most
               and len(self._engines) + len(self._pinned) + room > self.caps.max_models):
            name, engine = self._engines.popitem(last=False)
            self._loading.pop(name, None)
            log.info("evicted model %r (more than %d loaded)", name, self.caps.max_models)
            try:
                self._pinned[name] = engine
            except TypeError:  # an engine that cannot be weakly referenced (a test's stand-in) is not tracked
                pass
            out.append(engine)
        return out

    def _release(self, engines: list[Engine]) -> None:
        """Let the evicted engines go; those that no run holds are collected now (they leave `pinned`)."""
        if not engines:
            return
        del engines[:]
        if self._real_loader:  # frozen objects are never collected: let the evicted model's cycles go
            gc.unfreeze()
            gc.collect()
            gc.freeze()
        else:
            gc.collect()

    def pinned(self) -> tuple[str, ...]:
        """Names of the models evicted from the pool that a run still holds (they count against the cap)."""
        return tuple(n for n in list(self._pinned) if n not in self._engines)

    def is_loaded(self, name: str) -> bool:
        """Loaded now: in the pool, or pinned by a run (a request gets it back at once)."""
        return name in self._engines or name in self._pinned

    def loaded(self) -> tuple[str, ...]:
        """Names of the loaded models, least recently used first."""
        with self._lock:
            return tuple(self._engines)

    def missing(self, name: str) -> str | None:
        """Why one of the known models cannot load here (not installed), in one line with the command that installs
        it, or how far its preparation is (a public server); None otherwise (a stat per file: for the model picker,
        which answers at once)."""
        preparing = self.preparing(name) if self.preparing is not None and not self.is_loaded(name) else None
        if preparing is not None:
            return preparing
        if not self._real_loader or name not in KNOWN_MODELS or self.is_loaded(name):
            return None
        from d3.models import missing

        return missing(name)

    def known_facts(self, name: str) -> ModelFacts | None:
        """Layer and head counts of `name` if they are known without loading it (table or loaded engine), else
        None. For handlers that must answer at once (the slider preview)."""
        name = self.check_name(name)
        with self._lock:
            engine = self._engines.get(name)
        if engine is not None:
            return ModelFacts(engine.num_layers, engine.adapter.num_heads, engine.has_chat_template)
        return self._facts.get(name)

    def facts(self, name: str) -> ModelFacts:
        """Layer and head counts of `name`: from the loaded engine, else the known table, else by loading it."""
        return self.known_facts(name) or self._facts_by_loading(name)

    def _facts_by_loading(self, name: str) -> ModelFacts:
        engine = self.engine(name)
        return ModelFacts(engine.num_layers, engine.adapter.num_heads, engine.has_chat_template)
