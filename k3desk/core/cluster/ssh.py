"""Reaching nodes with the system ``ssh`` client.

Every connection runs non-interactively (``BatchMode=yes``: keys from the agent
or from files, never a password prompt), learns new host keys into k3desk's own
known_hosts file (``StrictHostKeyChecking=accept-new``: a *changed* key is still
refused) and gives up after ``ConnectTimeout``.

:class:`SshClient.run` runs one command and returns its output.
:class:`RemoteProcess` keeps a long-running program (an engine rank, an RPC
worker, a bridge) alive on a node: its output streams back into a local log and
to line callbacks, its exit is noticed at once (the ssh child ends with it), and
stopping closes the connection's stdin, which makes a small wrapper on the node
terminate the program.  If the connection drops, the node-side wrapper also
ends the program: nothing is left running behind k3desk's back.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from k3desk.core.cluster.nodes import ClusterError, Node
from k3desk.core.private import open_private, private_dir
from k3desk.core.progress import CancelToken


class SshError(ClusterError):
    """ssh could not connect to a node or the command could not run there."""


DEFAULT_CONNECT_TIMEOUT = 10
MARKER = "@@k3desk "

# Runs on the node (POSIX sh): start the program, report its pid, and end it when
# our stdin closes (stop, or a lost connection); report its exit status.
# $1 the working folder; $2 a folder to put before LD_LIBRARY_PATH ("" = none); $3 how
# many secrets follow on stdin, one line each, and $4.. their names; then the command.
# Secrets travel on stdin, not on a command line other users of the node can read.
_WRAPPER = r"""
mkdir -p -- "$1" 2>/dev/null
cd -- "$1" || { echo "@@k3desk nofolder=$1"; exit 97; }
if [ -n "$2" ]; then
  LD_LIBRARY_PATH="$2${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; export LD_LIBRARY_PATH
fi
n=$3
shift 3
while [ "$n" -gt 0 ]; do
  IFS= read -r value || value=
  export "$1=$value"
  shift
  n=$((n - 1))
done
exec 3<&0
"$@" </dev/null 2>&1 &
pid=$!
echo "@@k3desk pid=$pid"
( cat <&3 >/dev/null 2>&1
  kill -TERM "$pid" 2>/dev/null; sleep 5; kill -KILL "$pid" 2>/dev/null
) </dev/null >/dev/null 2>&1 &
watch=$!
exec 3<&-
wait "$pid"
rc=$?
echo "@@k3desk exit=$rc"
kill "$watch" 2>/dev/null
exit $rc
"""


@dataclass(frozen=True)
class SshResult:
    returncode: int
    stdout: bytes
    stderr: bytes

    @property
    def text(self) -> str:
        return self.stdout.decode("utf-8", "replace")

    @property
    def error_text(self) -> str:
        return self.stderr.decode("utf-8", "replace").strip()


def ssh_executable() -> str:
    found = shutil.which("ssh")
    if found is None:
        raise SshError(
            "The ssh client is not installed on this machine.",
            "Install OpenSSH (Debian/Ubuntu: sudo apt install openssh-client).",
        )
    return found


SECRET_MASK = "********"


def remote_command(
    argv: Sequence[str],
    env: Mapping[str, str] | None = None,
    *,
    library_path: str = "",
    secrets: Sequence[str] = (),
) -> str:
    """One shell-quoted command line (ssh hands a single string to the remote shell).

    ``library_path`` goes before the node's own LD_LIBRARY_PATH; ``secrets`` are
    variables shown masked (their values never appear in the text).
    """
    parts = list(argv)
    shown = {**(env or {}), **dict.fromkeys(secrets, SECRET_MASK)}
    if shown:
        parts = ["env", *(f"{k}={v}" for k, v in shown.items()), *parts]
    text = " ".join(shlex.quote(p) for p in parts)
    if library_path:
        prefix = shlex.quote(library_path) + "${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        text = f"LD_LIBRARY_PATH={prefix} {text}"
    return text


def classify_ssh_failure(node: Node, stderr: str, known_hosts: Path) -> SshError:
    """Turn ssh's own error text (exit status 255) into a message a person can act on."""
    where = f"{node.destination} (port {node.port})"
    low = stderr.lower()
    last = stderr.strip().splitlines()[-1] if stderr.strip() else "no error text"
    if "remote host identification has changed" in low or "host key verification failed" in low:
        return SshError(
            f"The SSH host key of {where} does not match the one k3desk saw before.",
            f"If the node was reinstalled, remove its line from {known_hosts} "
            f"(ssh-keygen -R {node.host} -f {known_hosts}); otherwise do not connect.",
        )
    if "permission denied" in low or "too many authentication failures" in low:
        key = f" with the key {node.identity}" if node.identity else ""
        return SshError(
            f"{where} refused the SSH login{key} ({last}).",
            "k3desk logs in with keys only (agent or identity file), never a password: "
            f"add your public key to ~{node.user or ''}/.ssh/authorized_keys on the node, "
            "or set identity= to the right private key.",
        )
    if "could not resolve hostname" in low or "name or service not known" in low:
        return SshError(
            f"The node name {node.host!r} does not resolve ({last}).",
            "Check the spelling, or give the node's address instead.",
        )
    if "connection refused" in low:
        return SshError(
            f"Nothing accepts SSH connections at {where} (connection refused).",
            "Start the SSH server on the node (sudo systemctl start ssh) or check the port.",
        )
    if "timed out" in low or "no route to host" in low or "network is unreachable" in low:
        return SshError(
            f"{where} cannot be reached ({last}).",
            "Check that the node is on and on the same network, and the firewall allows SSH.",
        )
    if "bad permissions" in low or "unprotected private key" in low:
        return SshError(
            f"ssh will not use the key {node.identity or '(default)'}: {last}",
            "Make the private key readable only by you: chmod 600 KEYFILE.",
        )
    if "no such file" in low and node.identity:
        return SshError(
            f"The identity file {node.identity} for {where} does not exist.",
            "Fix identity= in the node's description.",
        )
    return SshError(f"ssh to {where} failed: {last}")


class SshClient:
    """Runs commands on one node through the system ``ssh``."""

    def __init__(
        self,
        node: Node,
        known_hosts: Path,
        *,
        connect_timeout: int = DEFAULT_CONNECT_TIMEOUT,
        ssh_bin: str | None = None,
        extra_options: Sequence[str] = (),
    ) -> None:
        self.node = node
        self.known_hosts = known_hosts
        self.connect_timeout = connect_timeout
        self._ssh_bin = ssh_bin
        self.extra_options = tuple(extra_options)

    def argv(self, command: str | None = None) -> list[str]:
        """The full ssh command line for ``command`` (None: only the options)."""
        n = self.node
        args = [
            self._ssh_bin or ssh_executable(),
            "-T",
            "-o", "BatchMode=yes",
            "-o", "StrictHostKeyChecking=accept-new",
            "-o", f"UserKnownHostsFile={self.known_hosts}",
            "-o", f"ConnectTimeout={self.connect_timeout}",
            "-o", "ServerAliveInterval=5",
            "-o", "ServerAliveCountMax=3",
            "-o", "LogLevel=ERROR",
            "-p", str(n.port),
        ]  # fmt: skip
        if n.identity:
            args += ["-i", str(Path(n.identity).expanduser()), "-o", "IdentitiesOnly=yes"]
        args += list(self.extra_options)
        args += ["--", n.destination]
        if command is not None:
            args.append(command)
        return args

    def run(
        self,
        command: str,
        *,
        stdin: bytes | None = None,
        timeout: float = 60.0,
        cancel: CancelToken | None = None,
    ) -> SshResult:
        """Run ``command`` on the node; raise :class:`SshError` if ssh itself fails."""
        private_dir(self.known_hosts.parent)
        proc = subprocess.Popen(
            self.argv(command),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        if cancel is not None:
            cancel.on_cancel(lambda: _kill(proc))
        try:
            out, err = proc.communicate(stdin or b"", timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill(proc)
            proc.communicate()
            raise SshError(
                f"The command on {self.node.label} did not finish within {timeout:.0f} s.",
                "The node may be overloaded or the network slow; try again.",
            ) from None
        if cancel is not None:
            cancel.raise_if_cancelled()
        result = SshResult(proc.returncode, out, err)
        if proc.returncode == 255:
            raise classify_ssh_failure(self.node, result.error_text, self.known_hosts)
        return result

    def check(self, timeout: float = 30.0) -> str:
        """Log in and return the node's host name (a reachability check)."""
        return self.run("hostname", timeout=timeout).text.strip()


def _load_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
        return prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _load_prctl()
_PR_SET_PDEATHSIG = 1


def _die_with_parent(parent_pid: int) -> Callable[[], None] | None:
    """A preexec_fn: the kernel SIGKILLs the child when the thread that forked it ends.

    A killed ssh client drops its connection, and the node-side wrapper then
    ends the program: a crashed or killed k3desk leaves nothing running.
    """
    prctl = _PRCTL
    if prctl is None:
        return None

    def setup() -> None:  # runs in the child between fork and exec
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os._exit(1)

    return setup


def _kill(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()


LineCallback = Callable[["RemoteProcess", str], None]
ExitCallback = Callable[["RemoteProcess"], None]


class RemoteProcess:
    """A program kept running on a node over one ssh connection.

    ``on_line`` gets every output line (stdout and stderr together) as it arrives;
    ``on_exit`` runs once, from the reader thread, when the program has ended or
    the connection is gone.  With ``tie_to_thread`` (Linux) the ssh client is
    killed by the kernel when the thread that called :meth:`start` ends, so the
    program cannot outlive a killed k3desk; start it from a thread that lives as
    long as the program should (the group supervisors' monitor threads do).
    """

    def __init__(
        self,
        client: SshClient,
        argv: Sequence[str],
        *,
        name: str,
        env: Mapping[str, str] | None = None,
        secret_env: Mapping[str, str] | None = None,
        library_path: str = "",
        cwd: str = "",
        log_path: Path | None = None,
        on_line: LineCallback | None = None,
        on_exit: ExitCallback | None = None,
        tail_lines: int = 200,
        tie_to_thread: bool = False,
    ) -> None:
        self.client = client
        self.node = client.node
        self.argv = list(argv)
        self.name = name
        self.env = dict(env or {})
        # exported by the node-side wrapper from lines sent on stdin; shown masked
        self.secret_env = dict(secret_env or {})
        for key, value in self.secret_env.items():
            if "\n" in value or "\r" in value:
                raise ValueError(f"the secret {key} must be one line")
        self.library_path = library_path
        self.cwd = cwd or "."
        self.log_path = log_path
        self._on_line = on_line
        self._on_exit = on_exit
        self._tail: collections.deque[str] = collections.deque(maxlen=tail_lines)
        self._cond = threading.Condition()
        self._proc: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None
        self.remote_pid: int | None = None
        self.exit_status: int | None = None  # the program's own status (from the node)
        self.ssh_returncode: int | None = None
        self.stopping = False
        self.started_at = 0.0
        self.ended_at: float | None = None
        self._lines_seen = 0
        self.missing_folder = False
        self.tie_to_thread = tie_to_thread

    # ------------------------------------------------------------ lifecycle
    @property
    def command_line(self) -> str:
        """The command as a person would type it (secrets masked)."""
        return remote_command(
            self.argv, self.env, library_path=self.library_path, secrets=list(self.secret_env)
        )

    def start(self) -> RemoteProcess:
        if self._proc is not None:
            raise RuntimeError("already started")
        remote = remote_command(
            [
                "sh",
                "-c",
                _WRAPPER,
                "k3desk-wrap",
                self.cwd,
                self.library_path,
                str(len(self.secret_env)),
                *self.secret_env,
                *(["env", *(f"{k}={v}" for k, v in self.env.items())] if self.env else []),
                *self.argv,
            ]
        )
        private_dir(self.client.known_hosts.parent)
        log: IO[str] | None = None
        if self.log_path is not None:
            log = open_private(self.log_path, "a")
            log.write(
                f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} {self.node.label}: {self.command_line}\n"
            )
            log.flush()
        self.started_at = time.monotonic()
        try:
            self._proc = subprocess.Popen(
                self.client.argv(remote),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent(os.getpid()) if self.tie_to_thread else None,
            )
        except OSError:
            if log is not None:
                log.close()
            raise
        if self.secret_env and self._proc.stdin is not None:
            with contextlib.suppress(OSError):  # a dead connection shows in the reader
                self._proc.stdin.write("".join(f"{v}\n" for v in self.secret_env.values()).encode())
                self._proc.stdin.flush()
        self._reader = threading.Thread(
            target=self._read, args=(self._proc, log), name=f"ssh-{self.name}", daemon=True
        )
        self._reader.start()
        return self

    def _read(self, proc: subprocess.Popen[bytes], log: IO[str] | None) -> None:
        assert proc.stdout is not None
        try:
            for raw in proc.stdout:
                line = raw.decode("utf-8", "replace").rstrip("\r\n")
                if line.startswith(MARKER):
                    self._marker(line[len(MARKER) :])
                    continue
                if log is not None:
                    log.write(line + "\n")
                    log.flush()
                with self._cond:
                    self._tail.append(line)
                    self._lines_seen += 1
                    self._cond.notify_all()
                if self._on_line is not None:
                    self._on_line(self, line)
        finally:
            rc = proc.wait()
            for stream in (proc.stdout, proc.stdin):
                if stream is not None:
                    with contextlib.suppress(OSError):
                        stream.close()
            with self._cond:
                self.ssh_returncode = rc
                self.ended_at = time.monotonic()
                self._cond.notify_all()
            if log is not None:
                log.write(f"=== ended: {self.describe_exit()}\n")
                log.close()
            if self._on_exit is not None:
                self._on_exit(self)

    def _marker(self, text: str) -> None:
        key, _, value = text.partition("=")
        with self._cond:
            if key == "pid" and value.isdigit():
                self.remote_pid = int(value)
            elif key == "exit" and value.lstrip("-").isdigit():
                self.exit_status = int(value)
            elif key == "nofolder":
                self.missing_folder = True
            self._cond.notify_all()

    @property
    def alive(self) -> bool:
        return self._proc is not None and self.ssh_returncode is None

    @property
    def ended(self) -> bool:
        return self.ssh_returncode is not None

    def tail(self, n: int = 20) -> list[str]:
        with self._cond:
            return list(self._tail)[-n:]

    def describe_exit(self) -> str:
        """How the program ended, in words."""
        if self.ssh_returncode is None:
            return "still running"
        if self.missing_folder:
            return f"the working folder {self.cwd} cannot be created or entered on the node"
        st = self.exit_status
        if st is None:
            if self.ssh_returncode == 255:
                return "the ssh connection to the node was lost"
            if self.ssh_returncode < 0:
                return f"the local ssh client was ended by signal {-self.ssh_returncode}"
            return f"ssh ended with status {self.ssh_returncode} before the program reported"
        if st == 127:
            return f"{self.argv[0]} was not found on the node (exit 127)"
        if st == 126:
            return f"{self.argv[0]} is not executable on the node (exit 126)"
        if st > 128:
            sig = st - 128
            try:
                sig_name = signal.Signals(sig).name
            except ValueError:
                sig_name = f"signal {sig}"
            return f"killed by {sig_name} (exit {st})"
        return f"exited with status {st}"

    def wait_started(self, timeout: float = 30.0) -> int:
        """Wait until the node reports the program's pid (the login worked)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self.remote_pid is None and self.ssh_returncode is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            pid, rc = self.remote_pid, self.ssh_returncode
        if pid is not None:
            return pid
        if rc == 255:
            raise classify_ssh_failure(self.node, "\n".join(self.tail(5)), self.client.known_hosts)
        if rc is not None:
            raise SshError(
                f"{self.name} on {self.node.label} did not start: {self.describe_exit()}."
            )
        raise SshError(f"{self.name} on {self.node.label} did not start within {timeout:.0f} s.")

    def wait_for_line(
        self,
        pattern: re.Pattern[str] | str,
        timeout: float,
        cancel: CancelToken | None = None,
    ) -> re.Match[str] | None:
        """Block until an output line matches (None: it ended or the time ran out)."""
        rx = re.compile(pattern) if isinstance(pattern, str) else pattern
        deadline = time.monotonic() + timeout
        seen = 0
        with self._cond:
            while True:
                lines = list(self._tail)
                new = min(self._lines_seen - seen, len(lines))
                for line in lines[len(lines) - new :] if new > 0 else []:
                    m = rx.search(line)
                    if m:
                        return m
                seen = self._lines_seen
                if self.ssh_returncode is not None:
                    return None
                if cancel is not None and cancel.cancelled:
                    return None
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(min(left, 0.2))

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the end; True if it ended."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self.ssh_returncode is None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left if left is not None else 1.0)
        if self._reader is not None:
            self._reader.join(timeout=5)
        return True

    def stop(self, grace: float = 8.0) -> None:
        """End the program: close stdin (the node-side wrapper sends TERM, then KILL)."""
        self.stopping = True
        proc = self._proc
        if proc is None:
            return
        if proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()
        if self.wait(grace):
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
        if self.wait(3.0):
            return
        _kill(proc)
        self.wait(3.0)
