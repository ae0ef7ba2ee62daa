"""Secrets (the Hugging Face token, endpoint API keys): the OS keyring, or this session only.

k3desk keeps a secret it is given in the OS keyring under service ``k3desk``,
never in a plaintext file of its own, and never logs it.  Without a usable
keyring backend (headless Linux without a Secret Service) the secret is kept in
memory for this process only; :meth:`SecretStore.set` says which happened so
the caller can tell the user.

The keyring may block (an unlock prompt): GUIs call this off their main thread.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Literal

log = logging.getLogger(__name__)

SERVICE = "k3desk"

SecretPlace = Literal["keyring", "session"]


class SecretStore:
    """Secrets by name (the keyring's user name).  Thread-safe.

    ``keyring_module`` exists for tests; by default the real :mod:`keyring` is
    imported on first use.  A secret kept for the session wins over the
    keyring, so what this run was told is what it uses.
    """

    def __init__(self, *, keyring_module: Any = None, service: str = SERVICE) -> None:
        self.service = service
        self._keyring = keyring_module
        self._session: dict[str, str] = {}
        self._lock = threading.Lock()

    def _kr(self) -> Any:
        if self._keyring is None:
            import keyring

            self._keyring = keyring
        return self._keyring

    def keyring_usable(self) -> bool:
        """True when a real keyring backend (priority >= 1) is available."""
        try:
            backend = self._kr().get_keyring()
            return bool(getattr(backend, "priority", 0) >= 1)
        except Exception as exc:  # noqa: BLE001 - any backend failure means "not usable"
            log.debug("keyring unavailable: %s", type(exc).__name__)
            return False

    def get(self, name: str, *, keyring: bool = True) -> str | None:
        """This session's secret ``name``, else (with ``keyring``) the keyring's; None if neither.

        A locked or failing keyring reads as empty.
        """
        with self._lock:
            session = self._session.get(name)
        if session:
            return session
        if not keyring or not self.keyring_usable():
            return None
        try:
            value = self._kr().get_password(self.service, name)
        except Exception as exc:  # noqa: BLE001 - locked/failed keyring: treat as empty
            log.debug("keyring read failed: %s", type(exc).__name__)
            return None
        return str(value) if value else None

    def set(self, name: str, secret: str, *, what: str = "secret") -> SecretPlace:
        """Save in the keyring; where it cannot be used, keep it for this session only.

        ``what`` names the secret in the log line a failing keyring leaves ("token").
        """
        if self.keyring_usable():
            try:
                self._kr().set_password(self.service, name, secret)
            except Exception as exc:  # noqa: BLE001 - fall back to the session below
                log.warning("could not save the %s in the keyring (%s)", what, type(exc).__name__)
            else:
                with self._lock:
                    self._session.pop(name, None)
                return "keyring"
        with self._lock:
            self._session[name] = secret
        return "session"

    def delete(self, name: str) -> None:
        """Forget ``name`` (session and keyring); nothing stored is fine."""
        with self._lock:
            self._session.pop(name, None)
        if self.keyring_usable():
            try:
                self._kr().delete_password(self.service, name)
            except Exception as exc:  # noqa: BLE001 - already gone, or the keyring is locked
                log.debug("keyring delete: %s", type(exc).__name__)
