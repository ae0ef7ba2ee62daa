"""The check before every keyed request to k3desk's own engine, once it has a proof.

The first check lists every socket of every process (psutil); it then keeps the socket
it found listening, and later checks ask the kernel only whether that socket is still the
port's one listener, held by the same process.  Another listener beside it, or in its
place, must still be seen at once: the key goes to whoever accepts the connection.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import closing, contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psutil
import pytest

from k3desk.core.engines.identity import keyed_get, listening_sockets, owner_problem

ENGINE = r"""
import json, sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

keys = []  # the Authorization headers it was sent

class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_GET(self):
        keys.append(self.headers.get("Authorization"))
        body = b"engine"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

class Server(ThreadingHTTPServer):
    allow_reuse_port = True

def listen(port):
    s = Server(("127.0.0.1", port), Handler)
    threading.Thread(target=s.serve_forever, daemon=True).start()
    return s

s = listen(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
port = s.server_address[1]
print(port, flush=True)
for line in sys.stdin:
    if line.strip() == "keys":
        print(json.dumps(keys), flush=True)
        continue
    if line.strip() == "close":
        s.shutdown()
        s.server_close()
    elif line.strip() == "reopen":
        s = listen(port)
    print("done", flush=True)
"""


class Engine:
    """A process that serves HTTP on a port the way llama-server does with --reuse-port
    (so that a second listener may join it, as a squatter of the same user could)."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", ENGINE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None
        self.port = int(self.proc.stdout.readline())

    def say(self, what: str) -> None:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.write(what + "\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == "done"

    def problem(self) -> str:
        return owner_problem(self.proc.pid, self.port)


@pytest.fixture
def engine() -> Iterator[Engine]:
    e = Engine()
    with e.proc:  # its pipes closed after
        yield e
        e.proc.kill()


@contextmanager
def beside(port: int) -> Iterator[list[str | None]]:
    """This test's own process (no descendant of the engine) serving on ``port`` too;
    yields the Authorization headers it is sent."""
    keys: list[str | None] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            keys.append(self.headers.get("Authorization"))
            self.send_response(200)
            self.send_header("Content-Length", "8")
            self.end_headers()
            self.wfile.write(b"squatter")

    class Server(ThreadingHTTPServer):
        allow_reuse_port = True

    server = Server(("127.0.0.1", port), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield keys
    finally:
        server.shutdown()
        server.server_close()


def test_the_kernels_listeners_are_listed_and_nothing_else() -> None:
    """Against psutil's own listing: the listening sockets on a port, IPv4 and IPv6, by
    inode; a connection accepted on that port and a listener on another are not."""
    with closing(socket.socket()) as v4, closing(socket.socket()) as other:
        v4.bind(("127.0.0.1", 0))
        v4.listen()
        port = v4.getsockname()[1]
        other.bind(("127.0.0.1", 0))
        other.listen()
        want = {os.fstat(v4.fileno()).st_ino}
        v6 = None
        if socket.has_ipv6:
            v6 = socket.socket(socket.AF_INET6)
            try:
                v6.bind(("::1", port))
                v6.listen()
                want.add(os.fstat(v6.fileno()).st_ino)
            except OSError:  # no IPv6 loopback on this machine
                v6.close()
                v6 = None
        with socket.create_connection(("127.0.0.1", port)) as client:
            accepted, _ = v4.accept()
            with accepted:
                assert client.getpeername()[1] == port
                assert listening_sockets(port) == want
                seen = psutil.Process().net_connections("tcp")
                listening_here = [
                    c for c in seen if c.status == psutil.CONN_LISTEN and c.laddr.port == port
                ]
                assert len(listening_here) == len(want)
        if v6 is not None:
            v6.close()
        assert listening_sockets(port) == {os.fstat(v4.fileno()).st_ino}
    assert listening_sockets(port) == set()


def test_a_program_listening_beside_a_proven_engine_is_seen_at_once(engine: Engine) -> None:
    assert engine.problem() == ""
    assert engine.problem() == ""  # proven: the quick check
    with beside(engine.port):
        assert engine.problem().startswith(f"another program listens on port {engine.port} (")
        assert engine.problem().startswith("another program listens")
    assert engine.problem() == ""


def test_a_program_listening_in_the_engines_place_is_seen_at_once(engine: Engine) -> None:
    assert engine.problem() == ""
    engine.say("close")
    assert engine.problem() == (
        f"the engine k3desk started (process {engine.proc.pid}) no longer listens on port "
        f"{engine.port}"
    )
    with beside(engine.port):
        assert engine.problem().startswith(f"another program listens on port {engine.port} (")
    engine.say("reopen")  # a new socket of the engine's own: proven again
    assert engine.problem() == ""
    assert engine.problem() == ""


def test_an_engine_that_ended_is_refused_though_it_was_proven(engine: Engine) -> None:
    assert engine.problem() == ""
    engine.proc.kill()
    engine.proc.wait(10)
    with beside(engine.port):
        assert engine.problem() == (
            f"the engine k3desk started (process {engine.proc.pid}) is no longer running"
        )


def test_the_speed_watchers_reads_go_to_no_one_beside_a_proven_engine(engine: Engine) -> None:
    """/metrics is read with the key every 2 s: proven once, each read is quick, and a
    program listening beside the engine gets no read (nor the key) from then on."""
    assert engine.problem() == ""
    assert keyed_get(engine.proc.pid, engine.port, "/metrics", "sk-k3") == (200, b"engine")
    with beside(engine.port) as keys:
        # the kernel spreads connections over both listeners: 20 tries reach each one
        got = [
            keyed_get(engine.proc.pid, engine.port, "/metrics", "sk-k3", timeout=0.5)
            for _ in range(20)
        ]
    assert got == [None] * 20
    assert keys == []
    assert keyed_get(engine.proc.pid, engine.port, "/metrics", "sk-k3") == (200, b"engine")


# In a pid namespace of its own (a user namespace makes that possible without privileges),
# the next pid is chosen by writing ns_last_pid: the engine's pid is given to a squatter.
REUSED = r"""
import json, subprocess, sys, time
from k3desk.core.engines.identity import keyed_get as get, owner_problem

def keyed_get(*args):
    got = get(*args)
    return None if got is None else [got[0], got[1].decode()]

ENGINE = sys.argv[1]

def start(*args):
    p = subprocess.Popen([sys.executable, "-c", ENGINE, *args], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    return p, int(p.stdout.readline())

engine, port = start()
out = {"engine": engine.pid, "port": port, "proven": owner_problem(engine.pid, port),
       "read": keyed_get(engine.pid, port, "/metrics", "sk-k3")}
engine.kill()
engine.wait()
time.sleep(0.05)  # start times are counted in clock ticks
with open("/proc/sys/kernel/ns_last_pid", "w") as f:
    f.write(str(engine.pid - 1))
squatter, _ = start(str(port))
out["squatter"] = squatter.pid
out["problem"] = owner_problem(engine.pid, port)
out["reads"] = [keyed_get(engine.pid, port, "/metrics", "sk-k3") for _ in range(5)]
squatter.stdin.write("keys\n")
squatter.stdin.flush()
out["keys"] = json.loads(squatter.stdout.readline())
squatter.kill()
print(json.dumps(out))
"""


def _namespace() -> list[str]:
    """The command that runs a program as pid 1 of a new pid namespace, with its own /proc;
    the test is skipped where this machine does not allow one."""
    cmd = ["unshare", "--user", "--map-root-user", "--pid", "--fork", "--mount-proc"]
    try:
        ok = subprocess.run([*cmd, "true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    if not ok:
        pytest.skip("no unprivileged pid namespace here (unshare --user --pid)")
    return cmd


def test_a_process_given_the_ended_engines_pid_is_not_taken_for_it() -> None:
    """The engine is proven, then ends; a new process is given its pid and listens on its
    port.  Checked by pid and port alone, that process looks like the engine: it is
    refused by its start time, and neither the chat's check nor a keyed read sends it
    the key."""
    root = str(Path(__file__).resolve().parents[2])
    run = subprocess.run(
        [*_namespace(), sys.executable, "-c", REUSED, ENGINE],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": root},
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert out["proven"] == ""
    assert out["read"] == [200, "engine"]
    assert out["squatter"] == out["engine"]  # the pid was given again
    assert out["problem"] == (
        f"the engine k3desk started (process {out['engine']}) is no longer running"
    )
    assert out["reads"] == [None] * 5
    assert out["keys"] == []
