"""Plain data shared by the chat client and the conversation store."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

Role = Literal["system", "user", "assistant"]
ROLES: tuple[Role, ...] = ("system", "user", "assistant")

# The Kimi-K3 model cards recommend these sampling defaults.
DEFAULT_TEMPERATURE = 1.0
DEFAULT_TOP_P = 0.95


@dataclass(frozen=True)
class ChatSettings:
    """Sampling and template options for one request (and stored per conversation).

    ``thinking`` and ``thinking_effort`` go to the Kimi-K3 chat template, in the field the
    server reads (:mod:`k3desk.core.chat.dialects`).  ``max_tokens`` None: as much as the
    server allows.  ``stop``: sequences that end the answer.  ``extra_body`` is merged into
    the request as is, for servers that want fields of their own.
    """

    temperature: float = DEFAULT_TEMPERATURE
    top_p: float = DEFAULT_TOP_P
    max_tokens: int | None = None
    seed: int | None = None
    thinking: bool = True
    thinking_effort: str | None = None
    stop: tuple[str, ...] = ()
    extra_body: Mapping[str, Any] = field(default_factory=dict)
    # None: the server's own (llama-server: top-k 40, min-p 0.05, repeat penalty 1.0 = off;
    # common/common.h common_params_sampling)
    top_k: int | None = None
    min_p: float | None = None
    repeat_penalty: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "min_p": self.min_p,
            "repeat_penalty": self.repeat_penalty,
            "max_tokens": self.max_tokens,
            "seed": self.seed,
            "thinking": self.thinking,
            "thinking_effort": self.thinking_effort,
            "stop": list(self.stop),
            "extra_body": dict(self.extra_body),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ChatSettings:
        """Build settings from a stored dict; unknown keys are ignored, missing ones defaulted."""
        d = cls()
        extra = data.get("extra_body") or {}
        stop = data.get("stop") or ()
        return cls(
            temperature=float(data.get("temperature", d.temperature)),
            top_p=float(data.get("top_p", d.top_p)),
            max_tokens=_opt_int(data.get("max_tokens")),
            seed=_opt_int(data.get("seed")),
            top_k=_opt_int(data.get("top_k")),
            min_p=_opt_float(data.get("min_p")),
            repeat_penalty=_opt_float(data.get("repeat_penalty")),
            thinking=bool(data.get("thinking", d.thinking)),
            thinking_effort=(
                str(data["thinking_effort"]) if data.get("thinking_effort") is not None else None
            ),
            stop=tuple(str(x) for x in stop if x) if isinstance(stop, list | tuple) else (),
            extra_body=dict(extra) if isinstance(extra, Mapping) else {},
        )


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _opt_float(value: Any) -> float | None:
    return None if value is None else float(value)


@dataclass(frozen=True)
class Usage:
    """Token counts; ``estimated``: counted by k3desk, the server reported none."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    estimated: bool = False

    def to_dict(self) -> dict[str, int | bool]:
        out: dict[str, int | bool] = {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.total_tokens,
        }
        if self.estimated:
            out["estimated"] = True
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Usage:
        prompt = int(data.get("prompt_tokens") or 0)
        completion = int(data.get("completion_tokens") or 0)
        total = int(data.get("total_tokens") or prompt + completion)
        return cls(prompt, completion, total, estimated=data.get("estimated") is True)


@dataclass(frozen=True)
class Timings:
    """llama-server's per-request timings (absent from most other servers).

    ``by_client``: measured by k3desk from when the answer's pieces arrived, for a server
    that reports no timings.
    """

    prompt_n: int
    prompt_ms: float
    predicted_n: int
    predicted_ms: float
    predicted_per_second: float
    prompt_per_second: float = 0.0
    cache_n: int = 0
    by_client: bool = False

    def to_dict(self) -> dict[str, float | int | bool]:
        out: dict[str, float | int | bool] = {
            "prompt_n": self.prompt_n,
            "prompt_ms": self.prompt_ms,
            "predicted_n": self.predicted_n,
            "predicted_ms": self.predicted_ms,
            "predicted_per_second": self.predicted_per_second,
            "prompt_per_second": self.prompt_per_second,
            "cache_n": self.cache_n,
        }
        if self.by_client:
            out["by_client"] = True
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Timings:
        return cls(
            prompt_n=int(data.get("prompt_n") or 0),
            prompt_ms=float(data.get("prompt_ms") or 0.0),
            predicted_n=int(data.get("predicted_n") or 0),
            predicted_ms=float(data.get("predicted_ms") or 0.0),
            predicted_per_second=float(data.get("predicted_per_second") or 0.0),
            prompt_per_second=float(data.get("prompt_per_second") or 0.0),
            cache_n=int(data.get("cache_n") or 0),
            by_client=data.get("by_client") is True,
        )
