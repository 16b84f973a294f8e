"""Server-side bounds of the page and whether this deployment is public, read from the environment."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass

from d3.config import MAX_NEW_TOKENS_CAP, MAX_PROMPT_TOKENS_CAP
from d3.models import MAX_PARAMETERS

log = logging.getLogger(__name__)


def _env_int(env: Mapping[str, str], name: str, default: int, lo: int, hi: int) -> int:
    """An integer from the environment, clamped to [lo, hi]; a malformed value falls back to the default."""
    raw = env.get(name, "")
    try:
        value = int(raw) if raw.strip() else default
    except ValueError:
        log.warning("%s=%r is not an integer; using %d", name, raw, default)
        value = default
    return max(lo, min(hi, value))


@dataclass(frozen=True)
class Caps:
    """Server-side bounds, enforced in the handlers whatever the page or an API call sends."""

    max_new_tokens: int = 256
    max_prompt_chars: int = 8000
    max_prompt_tokens: int = 1024
    queue_size: int = 16
    concurrency: int = 2
    figure_every: int = 8  # heavy figures are redrawn every this many tokens while streaming
    session_ttl_s: int = 3600  # a session unused this long is forgotten, with all it kept (explorer.expiry)
    max_sessions: int = 200  # sessions kept at once; beyond it the least recently used is forgotten
    max_models: int = 2  # models kept loaded at once; beyond it the least recently used is dropped
    max_run_s: int = 180  # a run (generate, fills, sweep) stops after this long, whether or not anyone reads it
    max_parameters: int = 4 * 10**9  # a local model whose config describes more is refused before it is built
    session_memory_mib: int = 4096  # what all sessions keep of their runs' attention together (explorer.memory)
    events_per_address: int = 4  # public: runs and measurements one address has running or waiting (explorer.fair)
    max_wait_s: int = 60  # public: a run or measurement that would wait longer for a slot is refused (explorer.fair)

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> Caps:
        """D3_MAX_NEW_TOKENS, D3_MAX_PROMPT_CHARS, D3_MAX_PROMPT_TOKENS, D3_QUEUE_SIZE, D3_CONCURRENCY,
        D3_FIGURE_EVERY, D3_SESSION_TTL, D3_MAX_SESSIONS, D3_MAX_MODELS, D3_MAX_RUN_S, D3_MAX_PARAMETERS,
        D3_SESSION_MEMORY_MIB, D3_EVENTS_PER_ADDRESS, D3_MAX_WAIT_S; defaults suit a CPU Space (16 GB: three models
        take 5.2 GiB, the sessions' budget 4 GiB)."""
        d = cls()
        return cls(
            max_new_tokens=_env_int(env, "D3_MAX_NEW_TOKENS", d.max_new_tokens, 1, MAX_NEW_TOKENS_CAP),
            max_prompt_chars=_env_int(env, "D3_MAX_PROMPT_CHARS", d.max_prompt_chars, 16, 200_000),
            max_prompt_tokens=_env_int(env, "D3_MAX_PROMPT_TOKENS", d.max_prompt_tokens, 8, MAX_PROMPT_TOKENS_CAP),
            queue_size=_env_int(env, "D3_QUEUE_SIZE", d.queue_size, 1, 1000),
            concurrency=_env_int(env, "D3_CONCURRENCY", d.concurrency, 1, 64),
            figure_every=_env_int(env, "D3_FIGURE_EVERY", d.figure_every, 1, 1000),
            session_ttl_s=_env_int(env, "D3_SESSION_TTL", d.session_ttl_s, 60, 7 * 24 * 3600),
            max_sessions=_env_int(env, "D3_MAX_SESSIONS", d.max_sessions, 4, 100_000),
            max_models=_env_int(env, "D3_MAX_MODELS", d.max_models, 1, 16),
            max_run_s=_env_int(env, "D3_MAX_RUN_S", d.max_run_s, 5, 24 * 3600),
            max_parameters=_env_int(env, "D3_MAX_PARAMETERS", d.max_parameters, 10**6, MAX_PARAMETERS),
            session_memory_mib=_env_int(env, "D3_SESSION_MEMORY_MIB", d.session_memory_mib, 16, 1 << 20),
            events_per_address=_env_int(env, "D3_EVENTS_PER_ADDRESS", d.events_per_address, 1, 10_000),
            max_wait_s=_env_int(env, "D3_MAX_WAIT_S", d.max_wait_s, 1, 24 * 3600),
        )

    def describe(self) -> str:
        return (f"prompts up to {self.max_prompt_chars:,} characters and {self.max_prompt_tokens:,} tokens; "
                f"at most {self.max_new_tokens} new tokens and {self.max_run_s} s per run; {self.concurrency} "
                f"generations at a time, {self.queue_size} more waiting")


def is_public(env: Mapping[str, str] = os.environ) -> bool:
    """A public deployment: D3_PUBLIC=1, or running on Hugging Face Spaces (SPACE_ID is set)."""
    return env.get("D3_PUBLIC", "").strip().lower() in ("1", "true", "yes") or bool(env.get("SPACE_ID"))
