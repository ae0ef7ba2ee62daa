"""k3desk as a person runs it: real processes, from the repository's root (the helpers
the engine CLI tests use)."""

from __future__ import annotations

from tests.core.engines.test_engine_cli import k3desk, serving

__all__ = ["k3desk", "serving"]
