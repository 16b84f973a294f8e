"""explorer/caps.py: the limits a deployment enforces, read from the environment (malformed values fall back or are
clamped), and whether a deployment is public. What the page does with them is in tests/test_robustness.py."""

from __future__ import annotations

import pytest

from explorer.caps import Caps, is_public


@pytest.mark.parametrize("env, expected", [
    ({"D3_MAX_NEW_TOKENS": "lots", "D3_QUEUE_SIZE": "-4"}, (Caps().max_new_tokens, 1)),
    ({"D3_MAX_NEW_TOKENS": "99999999", "D3_QUEUE_SIZE": "10**9"}, (1024, Caps().queue_size)),
    ({"D3_MAX_NEW_TOKENS": " 32 ", "D3_QUEUE_SIZE": ""}, (32, Caps().queue_size)),
])
def test_caps_from_a_malformed_environment_fall_back_or_clamp(env, expected) -> None:
    caps = Caps.from_env(env)
    assert (caps.max_new_tokens, caps.queue_size) == expected


def test_a_local_deployment_is_not_public(monkeypatch) -> None:
    for name in ("D3_PUBLIC", "SPACE_ID"):
        monkeypatch.delenv(name, raising=False)
    assert not is_public() and not is_public({"D3_PUBLIC": "0"}) and is_public({"D3_PUBLIC": " Yes "})
