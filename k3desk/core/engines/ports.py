"""Which local port llama-server gets: free ones, and why a chosen one cannot be used."""

from __future__ import annotations

import errno
import socket

import psutil

from k3desk.core.errors import EngineError

LOOPBACK = "127.0.0.1"
ANY_HOST = "0.0.0.0"  # every IPv4 interface (loopback included)


def free_port(host: str = LOOPBACK) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_problem(port: object, host: str = LOOPBACK) -> tuple[str, str]:
    """(what is wrong, what to do) when llama-server cannot listen on ``port``; ("", "") if
    it can.  Checked before every launch: a port that is out of range or already taken is
    refused then, instead of trusting whatever answers on it."""
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        return (
            f"Port {port} is out of range: a TCP port is a number from 1 to 65535.",
            "Pass a port from 1 to 65535 with --port, or --port 0 for a free one.",
        )
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # as llama-server binds (SO_REUSEADDR, server-http.cpp): connections of an earlier
        # server still in TIME_WAIT do not count, a listening socket does
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except PermissionError:
            return (
                f"Port {port} on {host} needs administrator rights (ports below 1024 are "
                "privileged).",
                "Use a port from 1024 up, or --port 0 for a free one.",
            )
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                return (f"Port {port} on {host} cannot be used: {exc.strerror or exc}.", "")
            who = listener_names(port)
            return (
                f"Port {port} on {host} is already in use{' by ' + who if who else ''}.",
                "Stop that program, choose another port with --port, or --port 0 for a free one.",
            )
    return "", ""


def check_port(port: int, host: str = LOOPBACK) -> None:
    """Raise :class:`EngineError` when llama-server could not listen on ``port``."""
    problem, hint = port_problem(port, host)
    if problem:
        raise EngineError(problem, hint)


def listeners(port: int) -> list[int | None]:
    """Pids of the processes listening on TCP ``port`` (None: one this user cannot see)."""
    try:
        conns = psutil.net_connections("tcp")
    except (psutil.AccessDenied, OSError):
        return []
    return [c.pid for c in conns if c.status == psutil.CONN_LISTEN and c.laddr.port == port]


def listener_names(port: int) -> str:
    names = []
    for pid in listeners(port):
        if pid is None:
            names.append("a process of another user")
            continue
        try:
            names.append(f"{psutil.Process(pid).name()} (pid {pid})")
        except psutil.Error:
            names.append(f"pid {pid}")
    return ", ".join(dict.fromkeys(names))
