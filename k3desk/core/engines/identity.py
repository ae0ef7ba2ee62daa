"""Is what answers on a port the llama-server k3desk started, and does it take our key?

The checks look at the sockets the child (and its descendants) hold, so another
program squatting on the port is never handed the API key.

:func:`owned_connection` is the one place that decides whether a keyed request to a
local engine may be sent: every request that carries an engine's key (the readiness
check, ``/metrics`` for the speed watcher, the keep-running checks) goes over a
connection it returns, one the process k3desk started is seen to have accepted.  An
engine restarted on a new port is a new (pid, port); a request for the old one finds
no owner and sends nothing.
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


def owned_connection(
    pids: set[int], port: int, timeout: float = 2.0
) -> http.client.HTTPConnection | None:
    """A connection to ``port`` on loopback that one of ``pids`` is seen holding the
    other end of, with no other program listening there; None otherwise (then no key
    may be sent).  The caller closes it."""
    if not pids or any(p not in pids for p in listeners(port)):
        return None
    conn = http.client.HTTPConnection(LOOPBACK, port, timeout=timeout)
    try:
        conn.connect()
        assert conn.sock is not None
        mine = conn.sock.getsockname()[:2]
        deadline = time.monotonic() + timeout
        while not any(c.raddr and (c.raddr.ip, c.raddr.port) == mine for c in connections(pids)):
            if time.monotonic() > deadline:
                conn.close()
                return None  # never seen accepted by our server: the key stays here
            time.sleep(0.002)
    except OSError:
        conn.close()
        return None
    return conn


def keyed_get(
    pid: int, port: int, path: str, api_key: str, *, timeout: float = 2.0, limit: int = 1 << 20
) -> tuple[int, bytes] | None:
    """(status, the body's first ``limit`` bytes) of ``GET path`` with the key, sent only
    to process ``pid`` (or a descendant) over a connection it accepted; None when it is
    not running, another program listens there, or it does not answer."""
    if not alive_pid(pid):
        return None
    conn = owned_connection(family(pid), port, timeout)
    if conn is None:
        return None
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {api_key}"})
        resp = conn.getresponse()
        return resp.status, resp.read(limit)
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()


def authorized_status(pids: set[int], port: int, api_key: str) -> int | None:
    """HTTP status of an authenticated GET /v1/models on ``port``, sent only once one of
    ``pids`` is seen holding the other end of the connection (None otherwise).

    /v1/models is not among llama-server's public endpoints (/health, /v1/health:
    server-http.cpp in b11434), so a 200 means the key was accepted.
    """
    conn = owned_connection(pids, port)
    if conn is None:
        return None
    try:
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


def owner_problem(pid: int, port: int) -> str:
    """Why a key for the engine process ``pid`` on ``port`` must not be sent now ("" when
    it may): the process has ended, another program listens there, or ``pid`` (and its
    descendants) do not.  Checked before every keyed chat request to a local engine."""
    if not alive_pid(pid):
        return f"the engine k3desk started (process {pid}) is no longer running"
    ours = family(pid)
    if any(p not in ours for p in listeners(port)):
        return f"another program listens on port {port} ({listener_names(port)})"
    if not owns_listener(ours, port):
        return f"the engine k3desk started (process {pid}) no longer listens on port {port}"
    return ""


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
