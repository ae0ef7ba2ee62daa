"""One desktop app per person: the running app listens on a local socket (Qt's
``QLocalServer``, named by :func:`k3desk.core.app.instance.socket_name`, in the private
runtime folder); a second start sends it one JSON line and exits once it answers.

A request is ``{"cmd": "show", "page": "chat"}``; the answer ``{"ok": true, "pid": N}``
comes once the running app has brought its window forward (reopening it when it was
closed with "Keep it running").  Which process may listen is decided by the lock
(:func:`k3desk.core.app.instance.claim`), never by the socket: the holder of the lock
removes whatever socket file a killed app left and listens afresh.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QObject
from PySide6.QtNetwork import QLocalServer, QLocalSocket

log = logging.getLogger(__name__)
LINE_LIMIT = 64 * 1024


class InstanceServer(QObject):
    """Listens for second starts and hands each request to ``on_request`` (main thread)."""

    def __init__(
        self, name: str, on_request: Callable[[dict[str, Any]], None], parent: QObject | None
    ) -> None:
        super().__init__(parent)
        self.on_request = on_request
        self.server = QLocalServer(self)
        self.server.setSocketOptions(QLocalServer.SocketOption.UserAccessOption)
        QLocalServer.removeServer(name)  # a socket left by a killed app: the lock is ours
        if not self.server.listen(name):
            log.warning("second starts cannot reach this app: %s", self.server.errorString())
        self.server.newConnection.connect(self._accept)

    @property
    def listening(self) -> bool:
        return self.server.isListening()

    def _accept(self) -> None:
        while self.server.hasPendingConnections():
            sock = self.server.nextPendingConnection()
            buf = bytearray()

            def read(sock: QLocalSocket = sock, buf: bytearray = buf) -> None:
                buf += bytes(sock.readAll().data())
                if b"\n" not in buf and len(buf) < LINE_LIMIT:
                    return
                sock.readyRead.disconnect()
                self._answer(sock, bytes(buf).split(b"\n", 1)[0])

            sock.readyRead.connect(read)
            sock.disconnected.connect(sock.deleteLater)

    def _answer(self, sock: QLocalSocket, line: bytes) -> None:
        try:
            request = json.loads(line)
            if not isinstance(request, dict):
                raise ValueError("not an object")
            self.on_request(request)
            answer: dict[str, Any] = {"ok": True, "pid": os.getpid()}
        except ValueError as exc:
            answer = {"ok": False, "error": f"unreadable request: {exc}"}
        sock.write((json.dumps(answer) + "\n").encode())
        sock.flush()
        sock.disconnectFromServer()


def ask_running(
    name: str, request: dict[str, Any], timeout: float = 20.0, *, connect_for: float | None = None
) -> dict[str, Any] | None:
    """Send ``request`` to the app listening on ``name``; its answer, or None when none
    came within ``timeout`` seconds, or no connection could be made within
    ``connect_for`` (the app may still be starting: connecting is retried until then)."""
    deadline = time.monotonic() + timeout
    connect_by = deadline if connect_for is None else time.monotonic() + connect_for
    while True:
        sock = QLocalSocket()
        sock.connectToServer(name)
        if sock.waitForConnected(1000):
            return _exchange(sock, request, deadline)
        if time.monotonic() > min(deadline, connect_by):
            return None
        time.sleep(0.2)


def _exchange(
    sock: QLocalSocket, request: dict[str, Any], deadline: float
) -> dict[str, Any] | None:
    sock.write((json.dumps(request) + "\n").encode())
    sock.flush()
    buf = b""
    while b"\n" not in buf:
        left_ms = int((deadline - time.monotonic()) * 1000)
        if left_ms <= 0 or not sock.waitForReadyRead(min(left_ms, 1000)):
            if sock.state() != QLocalSocket.LocalSocketState.ConnectedState or left_ms <= 0:
                break
            continue
        buf += bytes(sock.readAll().data())
    buf += bytes(sock.readAll().data())  # what came with the hang-up
    sock.abort()
    try:
        answer = json.loads(buf.split(b"\n", 1)[0])
    except ValueError:
        return None
    return answer if isinstance(answer, dict) else None
