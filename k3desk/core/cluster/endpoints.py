"""Attached endpoints: any OpenAI-compatible server, used exactly like a local engine.

A person attaches a URL (a vLLM TP3 server, a SparkInfer bridge, another
machine's llama-server, a hosted API) with an optional API key; k3desk asks it
what it is (``/props``, else ``/v1/models``), remembers it in
``<config>/endpoints.json`` and chats with it through the core chat client.

API keys never go into that file: they are kept in the OS keyring (service
``k3desk``) or read from an environment variable the endpoint names
(``key_env``).  Without a usable keyring a key given on the spot is kept for
this session only, and :meth:`EndpointStore.add` says so.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from k3desk.core.chat.client import (
    Capabilities,
    ChatClient,
    ChatEndpoint,
    EngineUnavailableError,
)
from k3desk.core.cluster.nodes import ClusterError
from k3desk.core.errors import ChatError
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

    @property
    def keyring_user(self) -> str:
        return f"endpoint:{self.name}"


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
        if not self.file.exists():
            return []
        try:
            data = json.loads(self.file.read_text(encoding="utf-8"))
            items = data["endpoints"]
            return [RemoteEndpoint(**item) for item in items]
        except (OSError, ValueError, KeyError, TypeError) as exc:
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
    ) -> tuple[RemoteEndpoint, str]:
        """Attach ``url`` as ``name``; returns the endpoint and where its key went (in words).

        With ``check`` the server must answer now (its capabilities are recorded).
        """
        if not _NAME_RE.fullmatch(name):
            raise ClusterError(
                f"Endpoint name {name!r} may use only letters, digits, '.', '_' and '-'."
            )
        if not re.match(r"https?://[^/\s]+", url.strip()):
            raise ClusterError(
                f"{url!r} is not an http(s) URL.",
                "Example: http://10.0.0.21:8008 (with or without /v1).",
            )
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
        )
        where = "no API key"
        if key_env:
            where = f"API key read from ${key_env} when used"
            if api_key is None:
                api_key = self._environ().get(key_env) or None
        if check:
            caps = self._capabilities(ep, api_key)
            ep = RemoteEndpoint(
                **{**asdict(ep), "n_ctx": caps.n_ctx, "vision": caps.vision,
                   "model": model or (caps.model or "")}
            )  # fmt: skip
        if api_key and not key_env:
            if self._secrets.set(ep.keyring_user, api_key, what="key") == "keyring":
                ep = RemoteEndpoint(**{**asdict(ep), "key_in_keyring": True})
                where = "API key saved in the system keyring (service 'k3desk')"
            else:
                where = (
                    "no usable system keyring: the API key is kept for this session only "
                    "(k3desk never writes it to a plain file); use --key-env VAR to read it "
                    "from the environment instead"
                )
        others = [e for e in self.load() if e.name != name]
        self._save([*others, ep])
        return ep, where

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
        ep = self.get(name)
        return ChatEndpoint(ep.url, self.api_key(ep), ep.model or None)

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
        return EndpointStatus(ep, True, caps, latency_s=time.monotonic() - t0)

    # ------------------------------------------------------------ internals
    def _environ(self) -> Mapping[str, str]:
        return os.environ if self._env is None else self._env

    def _capabilities(self, ep: RemoteEndpoint, api_key: str | None) -> Capabilities:
        with ChatClient(ChatEndpoint(ep.url, api_key, ep.model or None), timeout=10.0) as c:
            try:
                return c.capabilities()
            except EngineUnavailableError as exc:
                raise EngineUnavailableError(
                    f"Endpoint {ep.name!r} is not answering: {exc.message}",
                    "Check that the server is running and reachable from this machine; "
                    "if it moved, attach it again with the new URL.",
                ) from None
