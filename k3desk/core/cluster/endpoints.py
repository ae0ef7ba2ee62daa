"""Attached endpoints: any OpenAI-compatible server, used exactly like a local engine.

A person attaches a URL (a vLLM TP3 server, a SparkInfer bridge, another
machine's llama-server, a hosted API) with an optional API key; k3desk asks it
what it is (llama-server's ``/props``, the SparkInfer bridge's ``/healthz`` and
``/readyz``, vLLM's ``/version``, else a generic OpenAI-compatible server: see
:mod:`k3desk.core.chat.dialects`), remembers that with it in ``<config>/endpoints.json``
and chats with it through the core chat client, in that server's dialect.  The person
can say what it is instead (``server``), and what it allows (``max_tokens_limit``,
``context_limit``), where k3desk cannot find out.

API keys never go into that file: they are kept in the OS keyring (service
``k3desk``) or read from an environment variable the endpoint names
(``key_env``).  Without a usable keyring a key given on the spot is kept for
this session only, and :meth:`EndpointStore.add` says so.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any
from urllib.parse import urlsplit

from k3desk.core.chat import dialects
from k3desk.core.chat.client import (
    Capabilities,
    ChatClient,
    ChatEndpoint,
    EngineUnavailableError,
    check_url,
)
from k3desk.core.chat.dialects import Limits
from k3desk.core.cluster.nodes import ClusterError
from k3desk.core.errors import ChatError
from k3desk.core.localfiles import DamagedRecord, load_json, set_aside
from k3desk.core.paths import AppPaths
from k3desk.core.private import write_private
from k3desk.core.secrets import SERVICE as SERVICE  # where the keyring keeps them
from k3desk.core.secrets import SecretStore

_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


@dataclass(frozen=True)
class RemoteEndpoint:
    name: str
    url: str
    model: str = ""  # the model id to send; "" = whatever the server names first
    key_env: str = ""  # read the API key from this environment variable
    key_in_keyring: bool = False
    # what the server said when it was attached (informational)
    n_ctx: int | None = None
    vision: bool | None = None
    added: str = ""
    # what kind of server it is (dialects.DIALECT_IDS); "" = not known yet
    server: str = ""
    server_set: bool = False  # the person said so (k3desk does not look again)
    server_detail: str = ""  # how it was told, in words
    server_problem: str = ""  # it answers but cannot chat, and why
    # limits the person gave (None: as the server says, or the recipe's defaults)
    max_tokens_limit: int | None = None
    context_limit: int | None = None

    @property
    def keyring_user(self) -> str:
        return f"endpoint:{self.name}"

    @property
    def limits(self) -> Limits | None:
        if self.max_tokens_limit is None and self.context_limit is None:
            return None
        return Limits(self.max_tokens_limit, None, self.context_limit, "set by you")

    def server_text(self) -> str:
        """What kind of server it is, in words ("" when not known)."""
        if not self.server:
            return ""
        text = self.server_detail or dialects.DIALECTS[self.server].label  # type: ignore[index]
        return text + (f" — {self.server_problem}" if self.server_problem else "")


@dataclass(frozen=True)
class EndpointStatus:
    endpoint: RemoteEndpoint
    up: bool
    capabilities: Capabilities | None = None
    error: str = ""
    latency_s: float = 0.0


class EndpointStore:
    """Attached endpoints (``<config>/endpoints.json``) and their keys.  Thread-safe."""

    def __init__(
        self,
        paths: AppPaths,
        *,
        keyring_module: Any = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.paths = paths
        self.file = paths.config / "endpoints.json"
        self._env = env
        self._secrets = SecretStore(keyring_module=keyring_module)

    def keyring_usable(self) -> bool:
        return self._secrets.keyring_usable()

    # ------------------------------------------------------------ file
    def load(self) -> list[RemoteEndpoint]:
        try:
            data = load_json(self.file, what="endpoint list")
        except DamagedRecord as exc:
            if not exc.content:  # a pipe, a device, a huge file
                raise ClusterError(
                    set_aside(self.file, exc.why, what="endpoint list", warn=False),
                    "`k3desk cluster endpoint add` writes a new one.",
                ) from None
            data, error = None, exc.why
        except OSError as exc:
            data, error = None, exc.strerror or str(exc)
        else:
            if data is None:
                return []
            error = ""
        try:
            if error:
                raise ValueError(error)
            items = data["endpoints"]
            out = [RemoteEndpoint(**item) for item in items]
            for e in out:
                if not isinstance(e.name, str) or not isinstance(e.url, str):
                    raise TypeError("an endpoint's name and url must be text")
            return out
        except (ValueError, KeyError, TypeError) as exc:
            raise ClusterError(
                f"The endpoint list {self.file} cannot be read: {exc}",
                "Fix or delete the file; `k3desk cluster endpoint add` writes a new one.",
            ) from exc

    def _save(self, endpoints: list[RemoteEndpoint]) -> None:
        body = {"schema": 1, "endpoints": [asdict(e) for e in endpoints]}
        write_private(self.file, json.dumps(body, indent=2) + "\n")

    def get(self, name: str) -> RemoteEndpoint:
        for e in self.load():
            if e.name == name:
                return e
        known = [e.name for e in self.load()]
        raise ClusterError(
            f"There is no attached endpoint named {name!r}.",
            f"Attached: {', '.join(known)}."
            if known
            else "Attach one with `k3desk cluster endpoint add NAME URL`.",
        )

    # ------------------------------------------------------------ public
    def add(
        self,
        name: str,
        url: str,
        *,
        api_key: str | None = None,
        key_env: str = "",
        model: str = "",
        check: bool = True,
        replace_existing: bool = False,
        server: str | None = None,
        max_tokens_limit: int | None = None,
        context_limit: int | None = None,
    ) -> tuple[RemoteEndpoint, str]:
        """Attach ``url`` as ``name``; returns the endpoint and where its key went (in words).

        With ``check`` the server must answer now (what it is and can do is recorded).
        ``server``: what kind of server it is (None or "auto": k3desk finds out).
        """
        _check_name_and_url(name, url)
        if server == "auto":
            server = None
        if server is not None:
            dialects.dialect(server)  # a clear error for an unknown kind
        for what, value in (("max tokens", max_tokens_limit), ("context", context_limit)):
            if value is not None and value < 1:
                raise ClusterError(f"The {what} limit must be a positive number, not {value}.")
        existing = [e for e in self.load() if e.name == name]
        if existing and not replace_existing:
            raise ClusterError(
                f"An endpoint named {name!r} is already attached ({existing[0].url}).",
                "Remove it first, or pass --replace.",
            )
        ep = RemoteEndpoint(
            name=name,
            url=url.strip().rstrip("/"),
            model=model,
            key_env=key_env,
            added=time.strftime("%Y-%m-%d %H:%M:%S"),
            server=server or "",
            server_set=server is not None,
            max_tokens_limit=max_tokens_limit,
            context_limit=context_limit,
        )
        where = "no API key"
        if key_env:
            where = f"API key read from ${key_env} when used"
            if api_key is None:
                api_key = self._environ().get(key_env) or None
        if check:
            caps = self._capabilities(ep, api_key)
            ep = _with_capabilities(ep, caps, model=model or (caps.model or ""))
        if api_key and not key_env:
            ep, where = self._keep_key(ep, api_key)
        others = [e for e in self.load() if e.name != name]
        self._save([*others, ep])
        return ep, where

    def _keep_key(self, ep: RemoteEndpoint, api_key: str) -> tuple[RemoteEndpoint, str]:
        """Put ``api_key`` in the system keyring (or this session only); returns the
        endpoint as recorded and where the key went (in words)."""
        if self._secrets.set(ep.keyring_user, api_key, what="key") == "keyring":
            ep = RemoteEndpoint(**{**asdict(ep), "key_in_keyring": True})
            return ep, "API key saved in the system keyring (service 'k3desk')"
        return ep, (
            "no usable system keyring: the API key is kept for this session only "
            "(k3desk never writes it to a plain file); use --key-env VAR to read it "
            "from the environment instead"
        )

    def set_server(self, name: str, server: str | None) -> RemoteEndpoint:
        """Say what kind of server ``name`` is (None: let k3desk find out again)."""
        if server is not None:
            dialects.dialect(server)
        ep = self.get(name)
        ep = replace(
            ep,
            server=server or "",
            server_set=server is not None,
            server_detail="" if server is not None else ep.server_detail,
            server_problem="",
        )
        if server is None:
            ep = replace(ep, server="", server_detail="")
        self._save([e if e.name != name else ep for e in self.load()])
        return ep

    def remember(self, name: str, caps: Capabilities) -> RemoteEndpoint:
        """Keep what a check found (the kind of server, its context, images)."""
        ep = _with_capabilities(self.get(name), caps, model=None)
        self._save([e if e.name != name else ep for e in self.load()])
        return ep

    def remove(self, name: str) -> RemoteEndpoint:
        ep = self.get(name)
        self._secrets.delete(ep.keyring_user)
        self._save([e for e in self.load() if e.name != name])
        return ep

    def api_key(self, ep: RemoteEndpoint) -> str | None:
        if ep.key_env:
            value = self._environ().get(ep.key_env)
            if not value:
                raise ClusterError(
                    f"Endpoint {ep.name!r} reads its API key from ${ep.key_env}, which is not set.",
                    f"export {ep.key_env}=... and try again.",
                )
            return value
        value = self._secrets.get(ep.keyring_user, keyring=ep.key_in_keyring)
        if value:
            return value
        if ep.key_in_keyring:
            raise ClusterError(
                f"The API key of endpoint {ep.name!r} is not in the keyring any more.",
                "Attach it again with --key, or use --key-env.",
            )
        return None

    def chat_endpoint(self, name: str) -> ChatEndpoint:
        return _chat_endpoint(self.get(name), self.api_key(self.get(name)))

    def client(self, name: str) -> ChatClient:
        """A chat client for the attached endpoint ``name`` (close it when done)."""
        return ChatClient(self.chat_endpoint(name))

    def status(self, name: str) -> EndpointStatus:
        """Is it up?  Never raises for a down server (see ``error``)."""
        ep = self.get(name)
        t0 = time.monotonic()
        try:
            caps = self._capabilities(ep, self.api_key(ep))
        except ChatError as exc:
            return EndpointStatus(ep, False, error=str(exc), latency_s=time.monotonic() - t0)
        latency = time.monotonic() - t0
        with contextlib.suppress(ClusterError, OSError):  # unwritable: the check still tells
            ep = self.remember(name, caps)
        return EndpointStatus(ep, True, caps, latency_s=latency)

    # ------------------------------------------------------------ internals
    def _environ(self) -> Mapping[str, str]:
        return os.environ if self._env is None else self._env

    def _capabilities(self, ep: RemoteEndpoint, api_key: str | None) -> Capabilities:
        with ChatClient(_chat_endpoint(ep, api_key), timeout=10.0) as c:
            try:
                return c.capabilities()
            except EngineUnavailableError as exc:
                raise EngineUnavailableError(
                    f"Endpoint {ep.name!r} is not answering: {exc.message}",
                    "Check that the server is running and reachable from this machine; "
                    "if it moved, attach it again with the new URL.",
                ) from None


def _chat_endpoint(ep: RemoteEndpoint, api_key: str | None) -> ChatEndpoint:
    """How the chat client reaches ``ep``: the kind the person set (else found per client)."""
    return ChatEndpoint(
        ep.url,
        api_key,
        ep.model or None,
        dialect=ep.server if ep.server_set and ep.server else None,
        limits=ep.limits,
    )


def _with_capabilities(
    ep: RemoteEndpoint, caps: Capabilities, *, model: str | None
) -> RemoteEndpoint:
    info = caps.server
    return replace(
        ep,
        n_ctx=caps.n_ctx,
        vision=caps.vision,
        model=ep.model if model is None else model,
        server=info.dialect,
        server_detail=info.describe(),
        server_problem=info.problem,
    )


def _check_name_and_url(name: str, url: str) -> None:
    """A name k3desk can keep, and an http(s) URL without a user or password in it."""
    if not _NAME_RE.fullmatch(name):
        raise ClusterError(
            f"Endpoint name {name!r} may use only letters, digits, '.', '_' and '-'."
        )
    if not re.match(r"https?://[^/\s]+", url.strip()):
        raise ClusterError(
            f"{url!r} is not an http(s) URL.",
            "Example: http://10.0.0.21:8008 (with or without /v1).",
        )
    try:
        check_url(url.strip())  # e.g. http://[::1 (an unclosed bracket)
    except ChatError as exc:
        raise ClusterError(exc.message, exc.hint) from None
    try:
        parts = urlsplit(url.strip())
        parts.port  # noqa: B018 - raises ValueError for a port that is no number
    except ValueError as exc:
        raise ClusterError(
            f"{url!r} is not a URL k3desk can use: {exc}.",
            "Example: http://10.0.0.21:8008 (with or without /v1).",
        ) from None
    if "@" in parts.netloc:
        raise ClusterError(
            "The URL carries a user name or password (user:pass@host); k3desk never "
            "keeps a password in its files, so it was not attached.",
            "Attach the URL without it and give the secret as an API key "
            "(--api-key, kept in the system keyring, or --key-env VAR).",
        )
