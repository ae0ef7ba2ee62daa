"""What the conversation store holds: conversations, messages, their images, search hits."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final

from k3desk.core.chat.images import MIME, ImageFormat, PreparedImage
from k3desk.core.chat.model import ChatSettings, Role, Timings, Usage
from k3desk.core.errors import ChatError


class HistoryError(ChatError):
    """The conversation store cannot be opened, or a record does not exist."""


class _Keep:
    """Marker: leave this field unchanged."""


KEEP: Final = _Keep()


@dataclass(frozen=True)
class StoredImage:
    sha256: str
    format: ImageFormat
    width: int
    height: int
    size: int
    path: Path
    name: str = ""

    @property
    def mime(self) -> str:
        return MIME[self.format]

    def read_bytes(self) -> bytes:
        return self.path.read_bytes()

    def to_prepared(self) -> PreparedImage:
        """The image as the chat client sends it (for resending a stored message)."""
        data = self.read_bytes()
        return PreparedImage(data, self.format, self.width, self.height, self.name, len(data))


@dataclass(frozen=True)
class Message:
    id: int
    conversation_id: int
    parent_id: int | None
    role: Role
    content: str
    reasoning: str = ""
    created: float = 0.0
    images: tuple[StoredImage, ...] = ()
    usage: Usage | None = None
    timings: Timings | None = None
    partial: bool = False
    finish_reason: str | None = None
    model: str | None = None


@dataclass(frozen=True)
class Conversation:
    id: int
    title: str
    created: float
    updated: float
    system_prompt: str
    settings: ChatSettings
    tier: str | None
    model: str | None
    current_leaf: int | None


@dataclass(frozen=True)
class SearchHit:
    conversation_id: int
    title: str
    message_id: int | None  # None when the title matched
    role: Role | None
    snippet: str
