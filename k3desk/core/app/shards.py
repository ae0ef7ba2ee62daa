"""Shard sets for the shells: find the parts of a GGUF set, read its layout, and inspect a
set against the reference tier (``k3desk validate``)."""

from __future__ import annotations

from k3desk.core.gguf.model import ModelLayout
from k3desk.core.gguf.shards import discover
from k3desk.core.gguf.validate import REFERENCE, inspect_shard_set

__all__ = ["REFERENCE", "ModelLayout", "discover", "inspect_shard_set"]
