"""Child process: one ``hf_hub_download`` (hf_xet when offered), progress as JSON lines.

Started by :func:`k3desk.core.hub.transfer.child_attempt` with :func:`command`:
``python -m k3desk.core.hub._hfchild``, or, in a frozen (PyInstaller) build
where ``sys.executable`` is the app itself, the app with the hidden first
argument ``--hub-child`` (``k3desk.app.main`` hands that straight here).

Reads one JSON line on stdin describing the file; writes ``{"n": bytes}`` lines
while bytes arrive, then ``{"done": path}`` or ``{"error": ...}``.  The token, if any,
comes in the ``HF_TOKEN`` environment variable.  When stdin closes (the parent
went away or wants it gone) the process exits at once.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from typing import Any

HUB_CHILD_FLAG = "--hub-child"

_out_lock = threading.Lock()


def command() -> list[str]:
    """The command line that starts this child from the running program."""
    if getattr(sys, "frozen", False):
        return [sys.executable, HUB_CHILD_FLAG]
    return [sys.executable, "-m", "k3desk.core.hub._hfchild"]


def _say(msg: dict[str, Any]) -> None:
    with _out_lock:
        sys.stdout.write(json.dumps(msg) + "\n")
        sys.stdout.flush()


class _Bar:
    """The tqdm-like object huggingface_hub drives; forwards byte counts to the parent."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.n = int(kwargs.get("initial") or 0)
        self.total = kwargs.get("total")
        self.format_dict: dict[str, Any] = {}
        if self.n:
            _say({"n": self.n})

    def update(self, n: float | None = 1) -> None:
        k = int(n or 0)
        self.n += k
        if k:
            _say({"n": k})

    def update_transfer(self, n: float | None = 1) -> None:
        """Xet network bytes: bytes written are what we count (via update)."""

    def set_transfer_postfix_str(self, *args: Any, **kwargs: Any) -> None:
        pass

    def set_description(self, *args: Any, **kwargs: Any) -> None:
        pass

    def set_postfix_str(self, *args: Any, **kwargs: Any) -> None:
        pass

    def refresh(self, *args: Any, **kwargs: Any) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> _Bar:
        return self

    def __exit__(self, *args: object) -> None:
        self.close()


def _watch_stdin() -> None:
    sys.stdin.read()  # returns at EOF: the parent closed the pipe or died
    os._exit(3)


def main() -> int:
    spec = json.loads(sys.stdin.readline())
    threading.Thread(target=_watch_stdin, daemon=True).start()
    from huggingface_hub import hf_hub_download

    from k3desk.core.hub.session import guard_session

    guard_session()  # a redirect's body is read whole: bounded, as in the parent

    try:
        path = hf_hub_download(
            spec["repo"],
            spec["path"],
            revision=spec["revision"],
            endpoint=spec["endpoint"],
            local_dir=spec["local_dir"],
            token=None if spec.get("use_token") else False,
            tqdm_class=_Bar,
        )
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which maps it
        response = getattr(exc, "response", None)
        headers = getattr(response, "headers", None) or {}
        retry_after = headers.get("Retry-After")
        _say(
            {
                "error": type(exc).__name__,
                "status": getattr(response, "status_code", None),
                "error_code": headers.get("X-Error-Code"),
                "message": (str(exc).strip().splitlines() or [type(exc).__name__])[0],
                "retry_after": float(retry_after) if retry_after else None,
            }
        )
        return 1
    _say({"done": str(path)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
