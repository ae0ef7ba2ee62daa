"""Is what answers on a port the llama-server k3desk started, and does it take our key?

The checks look at the sockets the child (and its descendants) hold, so another
program squatting on the port is never handed the API key.

Every request that carries an engine's key is sent only after one of two checks:
:func:`owned_connection` for the readiness check, ``/metrics`` for the speed watcher and
the keep-running checks (a connection the process k3desk started is seen to have
accepted), :func:`owner_problem` before each chat request (nothing but that process
listens on the port).  Both keep what they proved, the socket listening there
(:class:`_Proof`), so later checks ask the kernel only about that port.  An engine
restarted on a new port is a new (pid, port); a request for the old one finds no owner
and sends nothing.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import socket
import struct
import threading
import time
from dataclasses import dataclass

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
    pids: set[int], port: int, timeout: float = 2.0, *, owner: int | None = None
) -> http.client.HTTPConnection | None:
    """A connection to ``port`` on loopback that one of ``pids`` is seen holding the
    other end of, with no other program listening there; None otherwise (then no key
    may be sent).  The caller closes it.  ``owner``: the engine process ``pids`` are the
    family of, whose proven listener (:func:`owner_problem`) makes the check for other
    listeners the quick one."""
    if not pids:
        return None
    if not (owner is not None and _proven(owner, port)) and any(
        p not in pids for p in listeners(port)
    ):
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
    if not alive_pid(pid) or _reborn(pid):
        return None
    conn = owned_connection(family(pid), port, timeout, owner=pid)
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
    descendants) do not.  Checked before every keyed chat request to a local engine.

    Once proven, the proof is the listening socket itself (:class:`_Proof`): while it is
    still the port's only listener, held by the same process, the next check asks the
    kernel for the port's listeners and reads that process's open files, instead of
    listing every socket of every process.  A process that has ``pid`` since the engine
    ended (the pid reused) is not the engine, however it listens: its start time differs
    from the one seen when the engine was proven."""
    if not alive_pid(pid) or _reborn(pid):
        return f"the engine k3desk started (process {pid}) is no longer running"
    if _proven(pid, port):
        return ""
    ours = family(pid)
    if any(p not in ours for p in listeners(port)):
        problem = f"another program listens on port {port} ({listener_names(port)})"
    elif not owns_listener(ours, port):
        problem = f"the engine k3desk started (process {pid}) no longer listens on port {port}"
    else:
        problem = ""
        _note_birth(pid)
    _remember(pid, port, None if problem else _Proof.take(pid, ours, port))
    return problem


def _proven(pid: int, port: int) -> bool:
    """Whether the listener proven ``pid``'s on ``port`` is still its one listener."""
    with _proofs_lock:
        proof = _proofs.get((pid, port))
    return proof is not None and proof.still_holds(pid, port)


def remember_owner(pid: int, ours: set[int], port: int) -> None:
    """Keep the proof that ``pid`` (its family ``ours``) holds the one socket listening on
    ``port``, just checked the slow way by a launch: the first request's check is then
    the quick one."""
    _note_birth(pid)
    _remember(pid, port, _Proof.take(pid, ours, port))


def _note_birth(pid: int) -> None:
    """Keep when engine ``pid``, just proven, started: a process given its pid after it
    ended has another start time (:func:`_reborn`)."""
    started = _started(pid)
    if started is None:
        return
    with _proofs_lock:
        _births.pop(pid, None)
        while len(_births) >= 256:  # the oldest go first; an engine proven again returns
            del _births[next(iter(_births))]
        _births[pid] = started


def _reborn(pid: int) -> bool:
    """Whether ``pid``, proven an engine's, now names a process started at another time
    (the engine ended and the pid was given to a new process)."""
    with _proofs_lock:
        born = _births.get(pid)
    return born is not None and _started(pid) != born


def _remember(pid: int, port: int, proof: _Proof | None) -> None:
    with _proofs_lock:
        if len(_proofs) > 64:  # engines restarted on new ports: old entries never match
            _proofs.clear()
        if proof is None:
            _proofs.pop((pid, port), None)
        else:
            _proofs[pid, port] = proof


def listening_sockets(port: int) -> set[int] | None:
    """Inodes of the TCP sockets listening on ``port`` (IPv4 and IPv6) in this network
    namespace; None where the kernel cannot be asked (not Linux).

    Asked as ``ss -lt`` does, over netlink (sock_diag, linux/inet_diag.h), for listening
    sockets only: a few dozen records, where /proc/net/tcp walks every socket's hash slot
    (about 5 ms a file on a large-memory machine, for one listener)."""
    found: set[int] = set()
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG) as nl:
            nl.settimeout(2.0)
            for fam in (socket.AF_INET, socket.AF_INET6):
                # inet_diag_req_v2: family, protocol, ext, pad, states; an empty sockid
                req = struct.pack("=BBBBI", fam, socket.IPPROTO_TCP, 0, 0, 1 << _TCP_LISTEN)
                req += bytes(_SOCKID)
                head = struct.pack("=IHHII", 16 + len(req), _SOCK_DIAG_BY_FAMILY, 0x301, 1, 0)
                nl.send(head + req)  # 0x301: NLM_F_REQUEST | NLM_F_DUMP
                if not _read_listeners(nl, port, found) and (
                    fam == socket.AF_INET or os.path.exists("/proc/net/tcp6")
                ):
                    return None  # not asked where IPv6 is on: the full check instead
    except (OSError, AttributeError):  # AttributeError: no AF_NETLINK on this system
        return None
    return found


def _read_listeners(nl: socket.socket, port: int, found: set[int]) -> bool:
    """Read one dump's records into ``found`` (inodes of those on ``port``); False when
    the kernel answered with an error (no IPv6, or no sock_diag)."""
    while data := nl.recv(1 << 16):
        off = 0
        while off + 16 <= len(data):
            size, kind = struct.unpack_from("=IH", data, off)
            if kind == 3:  # NLMSG_DONE
                return True
            if kind == 2 or size < 16 + _DIAG_MSG:  # NLMSG_ERROR, or not a record
                return False
            # inet_diag_msg: family, state, timer, retrans, sockid (sport first, big
            # endian), expires, rqueue, wqueue, uid, inode
            (sport,) = struct.unpack_from(">H", data, off + 20)
            (inode,) = struct.unpack_from("=I", data, off + 16 + 4 + _SOCKID + 16)
            if sport == port:
                found.add(inode)
            off += (size + 3) & ~3
    return False  # the kernel closed the dump without its end


_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_TCP_LISTEN = 10
_SOCKID = 48  # struct inet_diag_sockid
_DIAG_MSG = 4 + _SOCKID + 20  # struct inet_diag_msg


def holds_socket(pid: int, inode: int) -> bool:
    """Whether process ``pid`` has socket ``inode`` among its open files."""
    target = f"socket:[{inode}]"
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                return True
    return False


def _started(pid: int) -> float | None:
    try:
        return float(psutil.Process(pid).create_time())
    except psutil.Error:
        return None


@dataclass(frozen=True)
class _Proof:
    """The one socket listening on a port, seen held by ``holder`` (the engine or a
    descendant), both processes named with their start times so a reused pid is not
    taken for them."""

    owner_started: float
    holder: int
    holder_started: float
    inode: int

    @classmethod
    def take(cls, pid: int, ours: set[int], port: int) -> _Proof | None:
        """The proof for a port just checked the slow way; None when it is not one
        socket held by ``ours`` (then every check stays the slow one)."""
        inodes = listening_sockets(port)
        if inodes is None or len(inodes) != 1:
            return None
        (inode,) = inodes
        owner_started = _started(pid)
        if owner_started is None:
            return None
        for holder in sorted(ours):
            if holds_socket(holder, inode) and (started := _started(holder)) is not None:
                return cls(owner_started, holder, started, inode)
        return None

    def still_holds(self, pid: int, port: int) -> bool:
        """Whether the port's listeners are still exactly this socket, held by the same
        holder, under an owner started when it was."""
        return (
            listening_sockets(port) == {self.inode}
            and _started(pid) == self.owner_started
            and _started(self.holder) == self.holder_started
            and holds_socket(self.holder, self.inode)
        )


_proofs: dict[tuple[int, int], _Proof] = {}  # (engine pid, port): its proven listener
_births: dict[int, float] = {}  # engine pid: its start time when it was proven
_proofs_lock = threading.Lock()


def ownership_problem(pid: int, port: int, api_key: str) -> str:
    """Why the server on ``port`` is not provably process ``pid``'s ("" when it is).

    The same checks a launch makes before it hands out an endpoint (the supervisor's
    ``_verify``): nothing else listens on the port, ``pid`` (or a descendant) holds the
    listening socket, and the key is accepted on a connection ``pid`` is seen to hold
    (the key is never sent to anything else).  A proof afresh of whatever has ``pid``
    now (its start time is kept anew): the caller knows it for the engine otherwise (a
    launch, as its child; a kept engine's take-up, by its parent).
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
    remember_owner(pid, ours, port)
    return ""
