"""Chat for the shells: the client that talks to a server, the dialects it speaks, the
history it keeps, the images it sends and the settings of a conversation.

A turn itself (send, stream, record) is :mod:`k3desk.core.app.chat_turn`.
"""

from __future__ import annotations

from k3desk.core.chat.client import (
    THINKING_EFFORTS,
    Capabilities,
    ChatClient,
    ChatDelta,
    ChatEndpoint,
    ChatMessage,
    ChatResult,
)
from k3desk.core.chat.dialects import (
    DIALECT_IDS,
    DIALECTS,
    SAMPLER_LABELS,
    ServerInfo,
    ignored_settings,
)
from k3desk.core.chat.history import (
    Conversation,
    HistoryStore,
    Message,
    SearchHit,
    query_words,
    snippet_spans,
)
from k3desk.core.chat.images import (
    ImageError,
    PreparedImage,
    ensure_vision,
    load_image,
    prepare_image,
)
from k3desk.core.chat.kept_state import Kept, StateKeeper, keeper_for
from k3desk.core.chat.model import DEFAULT_TEMPERATURE, DEFAULT_TOP_P, ChatSettings, Timings

__all__ = [
    "DEFAULT_TEMPERATURE",
    "DEFAULT_TOP_P",
    "DIALECTS",
    "DIALECT_IDS",
    "SAMPLER_LABELS",
    "THINKING_EFFORTS",
    "Capabilities",
    "ChatClient",
    "ChatDelta",
    "ChatEndpoint",
    "ChatMessage",
    "ChatResult",
    "ChatSettings",
    "Conversation",
    "HistoryStore",
    "ImageError",
    "Kept",
    "Message",
    "PreparedImage",
    "SearchHit",
    "ServerInfo",
    "StateKeeper",
    "Timings",
    "ensure_vision",
    "ignored_settings",
    "keeper_for",
    "load_image",
    "prepare_image",
    "query_words",
    "snippet_spans",
]
