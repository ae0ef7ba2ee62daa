"""The servers k3desk talks to, and how each one wants a chat request.

Every server speaks "OpenAI-compatible" ``/v1/chat/completions``, but they read different
fields for the same thing.  k3desk tells them apart once, when an endpoint is attached or
a URL is given (:func:`identify` over the answers of a few GET requests), and then builds
each request in the form that server reads (:func:`request_body`):

- ``llama-server`` (llama.cpp, the engine k3desk starts itself): ``GET /props`` answers
  with ``default_generation_settings``/``modalities``; thinking and its effort go in
  ``chat_template_kwargs``; ``stop``, ``seed`` and sampling are honoured; the last stream
  chunk carries ``usage`` and ``timings``.
- ``sparkinfer-bridge`` (the SparkInfer recipe's FastAPI bridge,
  vcruz305/kimi-k3-neuron-tp3-dgxspark-recipe ``api-server/server.py``): ``GET /healthz``
  answers ``{"ok", "model", "vocab_size"}`` and ``GET /readyz`` ``{"ok", "model",
  "engine"}`` (503 with code ``not_ready`` until rank 0's serve port accepts);
  ``/v1/models`` says ``owned_by: "local"``.  It reads a top-level ``"thinking"``
  (default false) and nothing from ``chat_template_kwargs``, so no thinking effort (its
  template's default applies); decoding is greedy (``temperature``/``top_p`` accepted,
  unused); no ``stop``, no ``seed``; ``max_tokens`` defaults to ``K3_DEFAULT_MAX_TOKENS``
  (512) and more than ``K3_MAX_TOKENS`` (512) is refused, as is a prompt plus completion
  over ``K3_MAX_CONTEXT_TOKENS`` (8192); text only; streams carry no ``usage`` and no
  timings; ``/v1/*`` wants ``Authorization: Bearer K3_API_KEY`` when one is set.
- ``vllm``: ``GET /version`` answers ``{"version": ...}``; ``chat_template_kwargs``,
  ``stop``, ``seed``, ``stream_options.include_usage`` are read; the context is
  ``max_model_len`` in ``/v1/models``.
- ``openai``: anything else OpenAI-compatible; k3desk sends the common fields.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from k3desk.core.chat.model import ChatSettings
from k3desk.core.errors import ChatError

DialectId = Literal["llama-server", "sparkinfer-bridge", "vllm", "openai"]
DIALECT_IDS: tuple[DialectId, ...] = ("llama-server", "sparkinfer-bridge", "vllm", "openai")

# The recipe's bridge defaults (api-server/run-api.sh and server.py: K3_DEFAULT_MAX_TOKENS,
# K3_MAX_TOKENS 512, K3_MAX_CONTEXT_TOKENS 8192), used until k3desk learns the real ones.
BRIDGE_DEFAULT_MAX_TOKENS = 512
BRIDGE_MAX_TOKENS = 512
BRIDGE_MAX_CONTEXT_TOKENS = 8192
BRIDGE_MODEL = "kimi-k3-neuron"  # K3_MODEL_NAME's default
# A request the bridge refuses while validating it, before it reaches the engine
# (server.py validate_request: the model, n, then max_tokens against K3_MAX_TOKENS).
LIMIT_PROBE_TOKENS = 2**31 - 1


@dataclass(frozen=True)
class Limits:
    """What a server allows per request (None: it does not say, or there is no limit)."""

    max_tokens: int | None = None  # the most a request may ask for
    default_max_tokens: int | None = None  # what it generates when not told
    context: int | None = None  # prompt plus answer
    source: str = ""  # where the numbers come from, in words

    def to_dict(self) -> dict[str, Any]:
        return {
            "max_tokens": self.max_tokens,
            "default_max_tokens": self.default_max_tokens,
            "context": self.context,
            "source": self.source,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> Limits:
        if not data:
            return cls()
        return cls(
            max_tokens=_opt_int(data.get("max_tokens")),
            default_max_tokens=_opt_int(data.get("default_max_tokens")),
            context=_opt_int(data.get("context")),
            source=str(data.get("source") or ""),
        )


BRIDGE_LIMITS = Limits(
    BRIDGE_MAX_TOKENS,
    BRIDGE_DEFAULT_MAX_TOKENS,
    BRIDGE_MAX_CONTEXT_TOKENS,
    "the recipe's defaults (K3_MAX_TOKENS 512, K3_MAX_CONTEXT_TOKENS 8192)",
)


@dataclass(frozen=True)
class Dialect:
    """What one kind of server reads and reports; ``differs`` is said to the user."""

    id: DialectId
    label: str
    thinking: Literal["template-kwargs", "top-level"]
    effort: bool  # takes a thinking effort
    sampling: bool  # temperature and top-p change the answer
    seed: bool
    stop: Literal["server", "client"]  # who cuts the answer at a stop sequence
    usage_when_streaming: bool
    timings: bool
    images: bool | None  # None: as the server says
    differs: str
    # the quirks of a server with limits of its own (the SparkInfer bridge's K3_* settings)
    fixed_limits: Limits | None = None  # its limits until k3desk learns them; None: it reports
    probe_limits: bool = False  # k3desk learns the limits with a request it refuses
    limits_setting: str = ""  # the server setting that caps an answer, named in messages
    context_covers_answer: bool = False  # refuses prompt + answer over its context
    short_default_answer: bool = False  # answers briefly when not told: ask for its most
    model_name: str | None = None  # the only model name it takes (None: any it lists)
    # the sampling settings beyond temperature and top-p it reads: (setting, field name)
    samplers: tuple[tuple[str, str], ...] = ()


DIALECTS: dict[DialectId, Dialect] = {
    "llama-server": Dialect(
        "llama-server",
        "llama.cpp llama-server",
        thinking="template-kwargs",
        effort=True,
        sampling=True,
        seed=True,
        stop="server",
        usage_when_streaming=True,
        timings=True,
        images=None,
        differs="thinking and effort through chat_template_kwargs; reports usage, timings "
        "and its context (/props); images with a vision projector",
        # tools/server/server-schema.cpp: field_num("top_k"), ("min_p"), ("repeat_penalty")
        samplers=(("top_k", "top_k"), ("min_p", "min_p"), ("repeat_penalty", "repeat_penalty")),
    ),
    "sparkinfer-bridge": Dialect(
        "sparkinfer-bridge",
        "SparkInfer bridge",
        thinking="top-level",
        effort=False,
        sampling=False,
        seed=False,
        stop="client",
        usage_when_streaming=False,
        timings=False,
        images=False,
        differs="a top-level \"thinking\" flag and no effort; greedy decoding (temperature, "
        "top-p and seed have no effect); no stop sequences (k3desk cuts the answer); "
        "max_tokens capped by K3_MAX_TOKENS (default 512) and prompt plus answer by "
        "K3_MAX_CONTEXT_TOKENS (8192); text only; no usage or timings when streaming "
        "(k3desk measures them)",
        fixed_limits=BRIDGE_LIMITS,
        probe_limits=True,
        limits_setting="K3_MAX_TOKENS on the bridge",
        context_covers_answer=True,
        short_default_answer=True,
        model_name=BRIDGE_MODEL,  # server.py refuses any other name with 404
    ),
    "vllm": Dialect(
        "vllm",
        "vLLM",
        thinking="template-kwargs",
        effort=True,
        sampling=True,
        seed=True,
        stop="server",
        usage_when_streaming=True,
        timings=False,
        images=None,
        differs="thinking and effort through chat_template_kwargs; usage but no timings "
        "(k3desk measures tok/s); context from max_model_len",
        # vLLM's sampling extras: top_k, min_p, repetition_penalty
        samplers=(("top_k", "top_k"), ("min_p", "min_p"), ("repeat_penalty", "repetition_penalty")),
    ),
    "openai": Dialect(
        "openai",
        "OpenAI-compatible server",
        thinking="template-kwargs",
        effort=True,
        sampling=True,
        seed=True,
        stop="server",
        usage_when_streaming=True,
        timings=False,
        images=None,
        differs="the common OpenAI fields, thinking through chat_template_kwargs; tok/s "
        "measured by k3desk",
    ),
}


def dialect(dialect_id: str) -> Dialect:
    """The :class:`Dialect` named ``dialect_id`` (a clear error for an unknown name)."""
    found = DIALECTS.get(dialect_id)  # type: ignore[call-overload]
    if found is None:
        raise ChatError(
            f"Unknown server kind {dialect_id!r}.",
            f"Use one of: {', '.join(DIALECT_IDS)} (or auto, to let k3desk find out).",
        )
    result: Dialect = found
    return result


@dataclass(frozen=True)
class ServerInfo:
    """What k3desk found out about a server (or was told by the user)."""

    dialect: DialectId
    detail: str = ""  # "build b11434", "vLLM 0.11.0", "engine 127.0.0.1:29600"
    evidence: str = ""  # how k3desk told, in words
    limits: Limits = Limits()
    problem: str = ""  # the server answers but cannot work, and why
    overridden: bool = False  # the kind was set by the user, not found

    @property
    def kind(self) -> Dialect:
        return DIALECTS[self.dialect]

    def describe(self) -> str:
        """One line for a person: "SparkInfer bridge (engine ...; found by /healthz)"."""
        facts = [f for f in (self.detail,) if f]
        if self.overridden:
            facts.append("set by you")
        elif self.evidence:
            facts.append(f"found by {self.evidence}")
        return self.kind.label + (f" ({'; '.join(facts)})" if facts else "")

    def limits_text(self) -> str:
        lim = self.limits
        parts = []
        if lim.max_tokens is not None:
            parts.append(f"at most {lim.max_tokens:,} tokens per answer")
        if lim.context is not None:
            parts.append(f"{lim.context:,} tokens of context")
        return ", ".join(parts)


# ------------------------------------------------------------------ identification


def from_props(props: Any) -> ServerInfo | None:
    """llama-server's ``/props`` (tools/server: default_generation_settings, modalities)."""
    if not isinstance(props, dict) or not (
        "default_generation_settings" in props or "modalities" in props
    ):
        return None
    build = props.get("build_info")
    dgs = props.get("default_generation_settings")
    n_ctx = dgs.get("n_ctx") if isinstance(dgs, dict) else None
    return ServerInfo(
        "llama-server",
        detail=f"build {build}" if isinstance(build, str) and build else "",
        evidence="/props",
        limits=Limits(context=n_ctx if isinstance(n_ctx, int) and n_ctx > 0 else None,
                      source="/props"),
    )  # fmt: skip


def is_bridge_health(obj: Any) -> bool:
    """``/healthz`` of the recipe's bridge: ``{"ok": bool, "model": str, "vocab_size": ...}``."""
    return (
        isinstance(obj, dict)
        and isinstance(obj.get("ok"), bool)
        and isinstance(obj.get("model"), str)
        and "vocab_size" in obj
    )


def from_bridge(health: Any, ready_status: int, ready: Any) -> ServerInfo | None:
    """The recipe's bridge from its ``/healthz`` and ``/readyz`` answers."""
    if not is_bridge_health(health):
        return None
    evidence = "/healthz"
    detail = ""
    if ready_status == 200 and isinstance(ready, dict) and ready.get("engine"):
        detail = f"engine {ready['engine']}"
        evidence = "/healthz and /readyz"
    elif ready_status == 503:
        detail = "engine not ready"
        evidence = "/healthz and /readyz"
    problem = ""
    if health.get("ok") is False:
        problem = "the bridge's tokenizer is not loaded (/healthz says ok: false)"
    return ServerInfo(
        "sparkinfer-bridge", detail=detail, evidence=evidence, limits=BRIDGE_LIMITS,
        problem=problem,
    )  # fmt: skip


def from_version(obj: Any) -> ServerInfo | None:
    """vLLM's ``/version``: ``{"version": "0.11.0"}``."""
    if isinstance(obj, dict) and isinstance(obj.get("version"), str) and len(obj) <= 3:
        return ServerInfo("vllm", detail=f"vLLM {obj['version']}", evidence="/version")
    return None


def from_models(models: Any) -> ServerInfo:
    """The last resort: ``/v1/models``'s ``owned_by`` (vLLM says "vllm")."""
    data = models.get("data") if isinstance(models, dict) else None
    first = data[0] if isinstance(data, list) and data and isinstance(data[0], dict) else {}
    if first.get("owned_by") == "vllm":
        return ServerInfo("vllm", evidence="owned_by in /v1/models")
    return ServerInfo("openai", evidence="none of /props, /healthz, /version")


_LIMIT_RE = re.compile(r"limit of (\d+) tokens")


def learn_bridge_limits(limits: Limits, status: int, error: tuple[str, str]) -> tuple[Limits, str]:
    """What the bridge's answer to the limit probe tells: (limits, problem).

    The probe asks for :data:`LIMIT_PROBE_TOKENS`; server.py refuses it with HTTP 400
    ``max_tokens_exceeded`` ("requested completion exceeds server limit of N tokens")
    before the engine is involved, and before that refuses a prompt its tokenizer cannot
    render ("prompt rendering/tokenize failed: ...").
    """
    message, code = error
    found = _LIMIT_RE.search(message)
    if status == 400 and code == "max_tokens_exceeded" and found:
        n = int(found.group(1))
        return replace(
            limits, max_tokens=n, default_max_tokens=min(limits.default_max_tokens or n, n),
            source="the bridge's own answer (K3_MAX_TOKENS) and the recipe's context default",
        ), ""  # fmt: skip
    if status == 400 and code == "context_length_exceeded" and found:
        return replace(limits, context=int(found.group(1))), ""
    if status == 400 and "prompt rendering/tokenize failed" in message:
        return limits, bridge_render_problem(message)
    return limits, ""


def bridge_render_problem(message: str) -> str:
    """Why a bridge that answers ``prompt rendering/tokenize failed`` cannot chat."""
    if "did not return a token-id list" in message:
        return (
            "the bridge cannot turn a chat into tokens: its transformers is 5.x, whose "
            "apply_chat_template(tokenize=True) returns a BatchEncoding, not the token-id list "
            "server.py needs; install transformers<5 in the bridge's Python "
            "(api-server/.venv/bin/pip install 'transformers>=4.45,<5') and restart it"
        )
    return f"the bridge cannot turn a chat into tokens ({message})"


# ------------------------------------------------------------------ tokens (estimates)

# <|open|>message role="user"<|sep|> ... <|close|>message<|sep|><|end_of_msg|>
MESSAGE_OVERHEAD = 10
PROMPT_OVERHEAD = 8  # the generation prompt


def estimate_tokens(text: str) -> int:
    """About how many tokens ``text`` is (K3's tokenizer: ~4 bytes of English a token)."""
    return math.ceil(len(text.encode("utf-8")) / 4)


def lowest_tokens(text: str) -> int:
    """Fewer tokens than ``text`` can be (no BPE token is longer than ~8 bytes of prose)."""
    return len(text.encode("utf-8")) // 8


def highest_tokens(text: str) -> int:
    """More tokens than ``text`` can be: a byte-level BPE (K3's) never yields more tokens
    than the text has UTF-8 bytes."""
    return len(text.encode("utf-8"))


def message_texts(messages: Sequence[Mapping[str, Any]]) -> list[str]:
    out = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            out.append(" ".join(str(p.get("text", "")) for p in content if isinstance(p, dict)))
        else:
            out.append(str(content or ""))
    return out


def estimate_prompt(
    messages: Sequence[Mapping[str, Any]], *, lowest: bool = False, highest: bool = False
) -> int:
    count = lowest_tokens if lowest else highest_tokens if highest else estimate_tokens
    texts = message_texts(messages)
    return sum(count(t) for t in texts) + len(texts) * MESSAGE_OVERHEAD + PROMPT_OVERHEAD


# ------------------------------------------------------------------ requests


def check_request(
    info: ServerInfo, messages: Sequence[Mapping[str, Any]], settings: ChatSettings
) -> None:
    """Raise :class:`ChatError` for a request ``info``'s server would refuse, before sending."""
    from k3desk.core.chat.client import ContextOverflowError

    if info.problem:
        raise ChatError(
            f"The {info.kind.label} answers but cannot chat: {info.problem}.",
            "Fix the server, then send again.",
        )
    lim = info.limits
    want = settings.max_tokens
    where = f" ({info.kind.limits_setting})" if info.kind.limits_setting else ""
    if want is not None and lim.max_tokens is not None and want > lim.max_tokens:
        raise ChatError(
            f"This conversation asks for up to {want:,} tokens per answer, and the "
            f"{info.kind.label} allows at most {lim.max_tokens:,}{where}; it would refuse "
            "the request.",
            f"Set Max tokens to {lim.max_tokens:,} or less (or leave it empty for the most "
            "the server allows), or restart the server with a larger limit.",
        )
    if lim.context is not None and info.kind.context_covers_answer:
        low = estimate_prompt(messages, lowest=True)
        if low + 1 > lim.context:
            raise ContextOverflowError(
                f"The conversation is too long for the {info.kind.label}: it is at least "
                f"{low:,} tokens, and the bridge takes {lim.context:,} "
                "(K3_MAX_CONTEXT_TOKENS) for the prompt and the answer together.",
                "Start a new conversation or remove earlier messages, or restart the "
                "bridge with a larger K3_MAX_CONTEXT_TOKENS (no more than rank 0's --max-ctx).",
                low,
                lim.context,
            )


def answer_budget(
    info: ServerInfo, messages: Sequence[Mapping[str, Any]], settings: ChatSettings
) -> int | None:
    """The ``max_tokens`` to send: what the user set, else as much as the server allows."""
    lim = info.limits
    if not info.kind.short_default_answer:
        return settings.max_tokens
    # the bridge generates only K3_DEFAULT_MAX_TOKENS when not told: ask for its limit,
    # but no more than the context leaves after the prompt (it refuses prompt + answer
    # over K3_MAX_CONTEXT_TOKENS)
    n = settings.max_tokens or lim.max_tokens or lim.default_max_tokens
    if n is not None and lim.context is not None:
        # what the prompt cannot exceed leaves room the bridge surely accepts; only when
        # that leaves nothing is the usual estimate trusted
        room = lim.context - estimate_prompt(messages, highest=True)
        if room < 1:
            room = lim.context - estimate_prompt(messages)
        n = max(1, min(n, room))
    return n


def request_body(
    info: ServerInfo,
    messages: Sequence[Mapping[str, Any]],
    settings: ChatSettings,
    model: str | None,
) -> dict[str, Any]:
    """The JSON request in the form ``info``'s server reads."""
    kind = info.kind
    body: dict[str, Any] = {"messages": list(messages), "stream": True}
    if model:
        body["model"] = model
    if kind.usage_when_streaming:
        body["stream_options"] = {"include_usage": True}
    body["temperature"] = settings.temperature
    body["top_p"] = settings.top_p
    if kind.thinking == "top-level":
        body["thinking"] = settings.thinking  # server.py: ChatCompletionRequest.thinking
    else:
        kwargs: dict[str, Any] = {"thinking": settings.thinking}
        if settings.thinking and settings.thinking_effort:
            kwargs["thinking_effort"] = settings.thinking_effort
        body["chat_template_kwargs"] = kwargs
    n = answer_budget(info, messages, settings)
    if n is not None:
        body["max_tokens"] = n
    if settings.seed is not None and kind.seed:
        body["seed"] = settings.seed
    for name, wire in kind.samplers:
        value = getattr(settings, name)
        if value is not None:  # None: the server's own default
            body[wire] = value
    if settings.stop and kind.stop == "server":
        body["stop"] = list(settings.stop)
    body.update(settings.extra_body)
    return body


def ignored_settings(info: ServerInfo, settings: ChatSettings) -> list[str]:
    """Settings ``info``'s server will not honour, each said in one sentence."""
    from k3desk.core.chat.model import DEFAULT_TEMPERATURE, DEFAULT_TOP_P

    kind = info.kind
    out = []
    if settings.thinking and settings.thinking_effort and not kind.effort:
        out.append(
            f"The {kind.label} takes no thinking effort: its chat template's default (max) applies."
        )
    if not kind.sampling and (
        settings.temperature != DEFAULT_TEMPERATURE or settings.top_p != DEFAULT_TOP_P
    ):
        out.append(f"The {kind.label} decodes greedily: temperature and top-p have no effect.")
    if settings.seed is not None and not kind.seed:
        out.append(f"The {kind.label} takes no seed (its answers are greedy, so repeatable).")
    taken = {name for name, _wire in kind.samplers}
    unread = [
        SAMPLER_LABELS[name]
        for name in SAMPLER_LABELS
        if getattr(settings, name) is not None and name not in taken
    ]
    if unread:
        out.append(f"The {kind.label} takes no {', '.join(unread)}: the server's own applies.")
    return out


SAMPLER_LABELS = {"top_k": "top-k", "min_p": "min-p", "repeat_penalty": "repeat penalty"}


def _opt_int(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


__all__ = [
    "BRIDGE_LIMITS",
    "DIALECTS",
    "DIALECT_IDS",
    "Dialect",
    "DialectId",
    "Limits",
    "ServerInfo",
    "check_request",
    "dialect",
    "estimate_prompt",
    "estimate_tokens",
    "ignored_settings",
    "request_body",
]
