"""The Settings page's access to the Hugging Face token, through the core TokenStore.

Calls may block (the Secret Service can wait on an unlock prompt), so the pages
run them as operations (:meth:`TokenAccess.describe_op` and the others): saving or
removing the token announces :attr:`Change.TOKEN`, and every page that shows the token
shows it again.  Only a masked form ever reaches a widget.
"""

from __future__ import annotations

from k3desk.core.app.downloads import TokenStore, mask
from k3desk.core.app.operations import Change, OpChanges, Operation

TOKEN = OpChanges.of(Change.TOKEN)

SOURCE_NOTES = {
    "HF_TOKEN": "From the HF_TOKEN environment variable (it wins over a saved token).",
    "keyring": "Saved in the system keyring.",
    "session": "Kept for this session only: no usable system keyring was found.",
    "huggingface_hub login": "From your `hf auth login` (huggingface_hub's token file).",
}


class TokenAccess:
    """Blocking helpers (run them through the task manager)."""

    def __init__(self, store: TokenStore) -> None:
        self.store = store

    def describe(self) -> tuple[str, str]:
        """(masked token or "", where it comes from)."""
        token = self.store.get()
        if not token:
            return "", "No token: public repositories download without one."
        source = self.store.source() or ""
        return mask(token), SOURCE_NOTES.get(source, "")

    def save(self, token: str) -> str:
        return self.store.set(token).message

    def remove(self) -> None:
        self.store.clear()

    # ------------------------------------------------------------ operations
    def describe_op(self) -> Operation[tuple[str, str]]:
        """Read what is saved (a read: it changes nothing)."""
        return Operation("token-state", lambda _t: self.describe())

    def save_op(self, token: str) -> Operation[str]:
        """Save ``token``; the result is the message that says where it went."""
        return Operation("token-save", lambda _t: self.save(token), TOKEN)

    def remove_op(self) -> Operation[None]:
        return Operation("token-remove", lambda _t: self.remove(), TOKEN)
