"""The Hugging Face access token: where it lives and where it comes from.

k3desk keeps a token the user gives it in the OS keyring (service ``k3desk``),
never in a plaintext file of its own, and never logs it.  Without a usable
keyring backend (headless Linux without a Secret Service) the token is kept in
memory for this session only, and :meth:`TokenStore.set` says so.

Look-up order: the ``HF_TOKEN`` environment variable (an explicit choice for
this run), then the token stored by k3desk (keyring, or this session's memory),
then huggingface_hub's own login (``hf auth login`` writes ``$HF_HOME/token``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from k3desk.core.secrets import SERVICE as SERVICE  # where the keyring keeps them
from k3desk.core.secrets import SecretStore

USERNAME = "huggingface-token"

TokenSource = Literal["HF_TOKEN", "keyring", "session", "huggingface_hub login"]


@dataclass(frozen=True)
class TokenSaved:
    where: Literal["keyring", "session"]
    message: str


def mask(token: str | None) -> str:
    """A form of the token that is safe to show: ``hf_…9xQz`` (never the secret itself)."""
    if not token:
        return "(none)"
    return f"{token[:3]}…{token[-4:]}" if len(token) > 12 else "…"


class TokenStore:
    """Get, set and clear the Hugging Face token.  Thread-safe.

    ``keyring_module`` and ``env`` exist for tests; by default the real
    :mod:`keyring` and :data:`os.environ` are used.  The keyring may block
    (an unlock prompt): GUIs call this off their main thread.
    """

    def __init__(self, *, env: Mapping[str, str] | None = None, keyring_module: Any = None) -> None:
        self._env = env
        self._secrets = SecretStore(keyring_module=keyring_module)

    def keyring_usable(self) -> bool:
        """True when a real keyring backend (priority >= 1) is available."""
        return self._secrets.keyring_usable()

    # -------------------------------------------------------------- public
    def _environ(self) -> Mapping[str, str]:
        return os.environ if self._env is None else self._env

    def _lookup(self) -> tuple[str | None, TokenSource | None]:
        env_token = (self._environ().get("HF_TOKEN") or "").strip()
        if env_token:
            return env_token, "HF_TOKEN"
        session = self._secrets.get(USERNAME, keyring=False)
        if session:
            return session, "session"
        stored = self._secrets.get(USERNAME)
        if stored:
            return stored, "keyring"
        hf = _hf_login_token(self._environ())
        if hf:
            return hf, "huggingface_hub login"
        return None, None

    def get(self) -> str | None:
        return self._lookup()[0]

    def source(self) -> TokenSource | None:
        """Where :meth:`get` finds the token, or None when there is none."""
        return self._lookup()[1]

    def set(self, token: str) -> TokenSaved:
        """Store ``token`` in the keyring; without a usable keyring, for this session only."""
        token = token.strip()
        if not token or any(c.isspace() for c in token):
            from k3desk.core.errors import HubError

            raise HubError(
                "That is not a Hugging Face token: it is empty or contains spaces.",
                "Copy a read token from https://huggingface.co/settings/tokens.",
            )
        if self._secrets.set(USERNAME, token, what="token") == "keyring":
            return TokenSaved("keyring", "Saved in the system keyring (service 'k3desk').")
        return TokenSaved(
            "session",
            "No usable system keyring was found, so the token is kept for this session only "
            "and will be asked for again next time (k3desk never writes it to a plain file). "
            "Alternatively set HF_TOKEN in your environment.",
        )

    def clear(self) -> None:
        """Forget the token k3desk stored (keyring and session); HF_TOKEN and hf login stay."""
        self._secrets.delete(USERNAME)


def _hf_login_token(env: Mapping[str, str]) -> str | None:
    """The token huggingface_hub's login wrote to ``$HF_HOME/token`` (read at call time)."""
    from pathlib import Path

    token_path = env.get("HF_TOKEN_PATH")
    if token_path:
        path = Path(token_path)
    else:
        home = env.get("HF_HOME") or str(
            Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "huggingface"
        )
        path = Path(home) / "token"
    try:
        value = path.read_text(encoding="utf-8").strip()
    except OSError:
        return None
    return value or None
