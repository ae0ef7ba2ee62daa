"""The Settings page's access to the Hugging Face token, through the core TokenStore.

Calls may block (the Secret Service can wait on an unlock prompt), so the page
runs them through the task manager.  Only a masked form ever reaches a widget.
"""

from __future__ import annotations

from k3desk.core.app.downloads import TokenStore, mask

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
