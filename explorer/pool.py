"""The models shared by every session: each engine built once, on first use, and kept for the process."""

from __future__ import annotations

import gc
import threading
from typing import Any, Callable, Mapping

from d3.engine import Engine
from d3.models import KNOWN_MODELS, ModelFacts
from explorer.caps import Caps
from explorer.parse import shown

KNOWN_FACTS: dict[str, ModelFacts] = {name: known.facts for name, known in KNOWN_MODELS.items()}


def _default_factory(caps: Caps, public: bool) -> Callable[[str], Engine]:
    def build(name: str) -> Engine:
        from d3.models import get_model

        loaded = get_model(name, allow_paths=not public)
        engine = Engine(loaded.model, loaded.tokenizer, name=loaded.name, max_prompt_tokens=caps.max_prompt_tokens)
        gc.freeze()  # the model lives as long as the process: keep its objects out of every full GC pass
        return engine

    return build


class ModelPool:
    """Engines by model name: each built once, on first use, and shared read-only by every session.

    The engine's own lock serialises forward steps, so concurrent streams interleave safely.
    """

    def __init__(self, factory: Callable[[str], Engine] | None = None, *, caps: Caps | None = None,
                 public: bool = False, names: tuple[str, ...] = tuple(KNOWN_MODELS),
                 facts: Mapping[str, ModelFacts] | None = None) -> None:
        self.caps = caps or Caps()
        self.public = public
        self.names = names
        self._factory = factory or _default_factory(self.caps, public)
        # Injected factories (tests) get no table: their facts come from the engine itself.
        self._facts = dict(KNOWN_FACTS if factory is None and facts is None else facts or {})
        self._engines: dict[str, Engine] = {}
        self._lock = threading.Lock()

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
        """The engine for `name`, loading the model the first time (thread-safe, once per name)."""
        name = self.check_name(name)
        with self._lock:
            if name not in self._engines:
                self._engines[name] = self._factory(name)
            return self._engines[name]

    def is_loaded(self, name: str) -> bool:
        return name in self._engines

    def facts(self, name: str) -> ModelFacts:
        """Layer and head counts of `name`: from the loaded engine, else the known table, else by loading it."""
        name = self.check_name(name)
        if name not in self._engines and name in self._facts:
            return self._facts[name]
        engine = self.engine(name)
        return ModelFacts(engine.num_layers, engine.adapter.num_heads, engine.has_chat_template)
