"""Is what answers on a port the llama-server k3desk started, and does it take our key?

The checks look at the sockets the child (and its descendants) hold, so another
program squatting on the port is never handed the API key.
"""

from __future__ import annotations

import contextlib
import http.client
import time

import psutil

from k3desk.core.engines.ports import LOOPBACK, listener_names, listeners


def family(pid: int) -> set[int]:
    """``pid`` and its descendants (a wrapper script may start the real server)."""
    out = {pid}
    with contextlib.suppress(psutil.Error):
        out |= {c.pid for c in psutil.Process(pid).children(recursive=True)}
    return out


def connections(pids: set[int]) -> list[psutil._common.pconn]:
    conns: list[psutil._common.pconn] = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            conns += psutil.Process(pid).net_connections("tcp")
    return conns


def owns_listener(pids: set[int], port: int) -> bool:
    return any(c.status == psutil.CONN_LISTEN and c.laddr.port == port for c in connections(pids))


def authorized_status(pids: set[int], port: int, api_key: str) -> int | None:
    """HTTP status of an authenticated GET /v1/models on ``port``, sent only once one of
    ``pids`` is seen holding the other end of the connection (None otherwise).

    /v1/models is not among llama-server's public endpoints (/health, /v1/health:
    server-http.cpp in b11434), so a 200 means the key was accepted.
    """
    conn = http.client.HTTPConnection(LOOPBACK, port, timeout=2.0)
    try:
        conn.connect()
        assert conn.sock is not None
        mine = conn.sock.getsockname()[:2]
        deadline = time.monotonic() + 2.0
        while not any(c.raddr and (c.raddr.ip, c.raddr.port) == mine for c in connections(pids)):
            if time.monotonic() > deadline:
                return None  # never seen accepted by our server: the key stays here
            time.sleep(0.002)
        conn.request("GET", "/v1/models", headers={"Authorization": f"Bearer {api_key}"})
        return conn.getresponse().status
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()


def health(port: int) -> int | None:
    """HTTP status of GET /health, or None if nothing answers yet."""
    conn = http.client.HTTPConnection(LOOPBACK, port, timeout=2.0)
    try:
        conn.request("GET", "/health")
        return conn.getresponse().status
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()


def alive_pid(pid: int) -> bool:
    """Whether ``pid`` is a running (not a zombie) process."""
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def ownership_problem(pid: int, port: int, api_key: str) -> str:
    """Why the server on ``port`` is not provably process ``pid``'s ("" when it is).

    The same checks a launch makes before it hands out an endpoint (the supervisor's
    ``_verify``): nothing else listens on the port, ``pid`` (or a descendant) holds the
    listening socket, and the key is accepted on a connection ``pid`` is seen to hold
    (the key is never sent to anything else).
    """
    if not alive_pid(pid):
        return f"process {pid} is no longer running"
    ours = family(pid)
    foreign = [p for p in listeners(port) if p not in ours]
    if foreign:
        return f"another program listens on port {port} ({listener_names(port)})"
    if not owns_listener(ours, port):
        return f"process {pid} does not listen on port {port}"
    status = authorized_status(ours, port, api_key)
    if status != 200:
        why = f"HTTP {status}" if status is not None else "no answer"
        return f"the server on port {port} did not accept the key ({why})"
    return ""
