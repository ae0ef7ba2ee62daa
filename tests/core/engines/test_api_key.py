"""The key k3desk prints for a launch can be pasted after --api-key as it is."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from k3desk.core.engines.supervisor import LaunchSpec, Supervisor
from k3desk.core.paths import default_paths


def test_a_fresh_key_never_starts_with_a_dash(monkeypatch: pytest.MonkeyPatch) -> None:
    """One key in 64 drawn at random starts with "-"; `k3desk chat --api-key -Xy...` then
    says "expected one argument".  Such a draw is thrown away."""
    draws: Iterator[str] = iter(["-starts-like-an-option", "_fine-key"])
    monkeypatch.setattr(secrets, "token_urlsafe", lambda n=None: next(draws))
    sup = Supervisor(LaunchSpec(Path("/nonexistent/llama-server"), ()), default_paths())
    assert sup.api_key == "_fine-key"
