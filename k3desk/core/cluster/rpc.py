"""llama.cpp RPC: ``rpc-server`` workers on the nodes, ``llama-server --rpc`` here.

Each node runs llama.cpp's RPC worker (``rpc-server``; some builds name it
``ggml-rpc-server``) bound to the address the person picks; this machine runs
llama-server, through the engine supervisor, with ``--rpc host:port,...`` so the
layers spread over the workers' memory.  Only this machine needs the model files.

The RPC protocol has no authentication and no encryption (:data:`RPC_WARNING`):
workers belong on a private network, and k3desk refuses wildcard or public bind
addresses unless told otherwise.

:class:`RpcCluster` watches the workers through their ssh connections and the
server through its supervisor: when a worker dies (llama-server would abort at
its next request with "Remote RPC server crashed"), the workers and the server
are restarted together, within a bounded policy.
"""

from __future__ import annotations

import ipaddress
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

from k3desk.core.chat.client import ChatEndpoint
from k3desk.core.cluster.group import (
    EventCallback,
    GroupPolicy,
    GroupSupervisor,
    LaunchFailure,
    stop_remote_processes,
)
from k3desk.core.cluster.nodes import Cluster, ClusterError, Node
from k3desk.core.cluster.ssh import RemoteProcess, SshClient, classify_ssh_failure
from k3desk.core.engines.supervisor import (
    Event,
    LaunchSpec,
    RestartPolicy,
    State,
    Supervisor,
)
from k3desk.core.hardware.nvidia import launch_env
from k3desk.core.paths import AppPaths
from k3desk.core.planning.argv import rpc_base_args, rpc_server_args, rpc_worker_args
from k3desk.core.progress import CancelToken

DEFAULT_RPC_PORT = 50052
RPC_BINARIES = ("rpc-server", "ggml-rpc-server")
RPC_WARNING = (
    "llama.cpp's RPC workers have no authentication and no encryption: anyone who can "
    "reach a worker's port can run computations on that node and read or overwrite its "
    "memory. Bind workers only to a private network you trust (or to 127.0.0.1 behind an "
    "SSH tunnel) and keep the port closed to everything else."
)
# Finds the worker binary under either name when the node does not say which.
_FIND_RPC = (
    'for b in {names}; do if command -v "$b" >/dev/null 2>&1; then exec "$b" "$@"; fi; done; '
    'echo "neither {names_or} is installed (PATH: $PATH)" >&2; exit 127'
)


@dataclass(frozen=True)
class RpcConfig:
    cluster: Cluster
    model: Path  # the first shard, on this machine
    server: Path  # llama-server, on this machine
    server_args: tuple[str, ...] = rpc_base_args(8192)
    port: int = DEFAULT_RPC_PORT  # each worker's port (one worker per node)
    ports: dict[str, int] = field(default_factory=dict)  # per node label, overrides ``port``
    bind: dict[str, str] = field(default_factory=dict)  # per node label; default: its address
    threads: int | None = None  # -t for CPU workers
    cache: bool = False  # -c: workers keep a local tensor cache
    allow_public: bool = False  # bind to wildcard/public addresses anyway
    worker_timeout: float = 30.0
    server_timeout: float | None = None  # None: the supervisor's size-based timeout
    model_bytes: int = 0

    def bind_address(self, node: Node) -> str:
        return self.bind.get(node.label) or node.engine_address

    def connect_address(self, node: Node) -> str:
        """Where llama-server reaches the worker (the node's address if bound to a wildcard)."""
        bind = self.bind_address(node)
        return node.engine_address if bind in ("0.0.0.0", "::") else bind

    def worker_port(self, node: Node) -> int:
        return self.ports.get(node.label, self.port)

    def rpc_list(self) -> str:
        parts = []
        for n in self.cluster.nodes:
            host = self.connect_address(n)
            host = f"[{host}]" if ":" in host else host
            parts.append(f"{host}:{self.worker_port(n)}")
        return ",".join(parts)

    def server_argv(self) -> tuple[str, ...]:
        return rpc_server_args(self.model, self.rpc_list(), self.server_args)


def worker_argv(config: RpcConfig, node: Node) -> list[str]:
    args = rpc_worker_args(
        config.bind_address(node), config.worker_port(node), config.threads, config.cache
    )
    if node.rpc_server_bin:
        return [node.rpc_server_bin, *args]
    names = " ".join(RPC_BINARIES)
    script = _FIND_RPC.format(names=names, names_or=" nor ".join(RPC_BINARIES))
    return ["sh", "-c", script, "rpc-server", *args]


def _is_exposed(address: str) -> str:
    """Why binding to ``address`` exposes the worker beyond a private network ('' if not)."""
    if address in ("0.0.0.0", "::", ""):
        return "every network interface of the node"
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return ""  # a host name: whatever it resolves to on the node
    if ip.is_global:
        return "a public internet address"
    return ""


def check_rpc(config: RpcConfig) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(refusals, warnings) before launching; the RPC warning is always among the warnings."""
    refusals: list[str] = []
    warnings: list[str] = [RPC_WARNING]
    if not config.cluster.nodes:
        refusals.append(f"Cluster {config.cluster.name!r} has no nodes to run RPC workers on.")
    seen: set[tuple[str, int]] = set()
    for node in config.cluster.nodes:
        bind = config.bind_address(node)
        exposed = _is_exposed(bind)
        if exposed:
            msg = (
                f"Node {node.label}: binding the RPC worker to {bind} opens it to {exposed}, "
                "and RPC has no authentication."
            )
            if config.allow_public:
                warnings.append(msg)
            else:
                refusals.append(
                    msg + " Pick the node's private address (bind=...), or allow it explicitly."
                )
        key = (config.connect_address(node), config.worker_port(node))
        if key in seen:
            refusals.append(
                f"Two workers would listen on {key[0]}:{key[1]}; give them different ports."
            )
        seen.add(key)
    if not config.model.is_file():
        refusals.append(f"The model file {config.model} does not exist on this machine.")
    if not config.server.is_file():
        refusals.append(f"llama-server was not found at {config.server}.")
    return tuple(refusals), tuple(warnings)


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


class RpcCluster(GroupSupervisor):
    kind = "llama.cpp RPC cluster"

    def __init__(
        self,
        config: RpcConfig,
        paths: AppPaths,
        known_hosts: Path,
        *,
        policy: GroupPolicy | None = None,
        on_event: EventCallback | None = None,
        connect_timeout: int = 10,
    ) -> None:
        super().__init__(policy=policy, on_event=on_event)
        refusals, self.warnings = check_rpc(config)
        if refusals:
            raise ClusterError("RPC cannot start: " + " ".join(refusals), RPC_WARNING)
        self.config = config
        self.paths = paths
        self.known_hosts = known_hosts
        self._connect_timeout = connect_timeout
        self._workers: list[RemoteProcess] = []
        self._server: Supervisor | None = None

    @property
    def workers(self) -> list[RemoteProcess]:
        with self._lock:
            return list(self._workers)

    @property
    def server(self) -> Supervisor | None:
        with self._lock:
            return self._server

    def _log_path(self, attempt: int, what: str) -> Path:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        d = self.paths.logs_dir / "cluster" / self.config.cluster.name
        return d / f"rpc-{stamp}-a{attempt}-{what}.log"

    def _launch(self, attempt: int, cancel: CancelToken) -> ChatEndpoint:
        cfg = self.config
        nodes = cfg.cluster.nodes
        total = len(nodes) + 2
        self._phase("starting RPC workers", 0, total, RPC_WARNING)
        for node in nodes:
            proc = RemoteProcess(
                SshClient(node, self.known_hosts, connect_timeout=self._connect_timeout),
                worker_argv(cfg, node),
                name="rpc worker",
                env=launch_env(),
                cwd=node.workdir,
                log_path=self._log_path(attempt, f"worker-{node.label}"),
                on_exit=self._worker_exit,
                tie_to_thread=True,
            )
            with self._lock:
                self._workers.append(proc)
            proc.start()
        for i, (node, proc) in enumerate(zip(nodes, self.workers, strict=True)):
            host, port = cfg.connect_address(node), cfg.worker_port(node)
            deadline = time.monotonic() + cfg.worker_timeout + self._connect_timeout
            while not (proc.remote_pid is not None and _port_open(host, port)):
                if proc.ended:
                    raise self._worker_failure(proc)
                self._check_running(cancel)
                if time.monotonic() > deadline:
                    raise LaunchFailure(
                        f"the RPC worker on {node.label} did not accept connections on "
                        f"{host}:{port} within {cfg.worker_timeout:.0f} s",
                        "Check the node's firewall and that the address belongs to the node.",
                    )
                time.sleep(0.05)
            self._phase("RPC worker ready", i + 1, total, f"{node.label} at {host}:{port}")
        self._phase("starting llama-server with --rpc", len(nodes), total, cfg.rpc_list())
        server = Supervisor(
            LaunchSpec(
                cfg.server,
                cfg.server_argv(),
                model_bytes=cfg.model_bytes,
                ready_timeout=cfg.server_timeout,
            ),
            self.paths,
            # one crash is the group's business: restart workers and server together
            policy=RestartPolicy(max_failures=1, stop_grace=self.policy.stop_grace),
            on_event=self._server_event,
        )
        with self._lock:
            self._server = server
        server.start()
        while True:
            ep = server.endpoint
            if ep is not None and server.state is State.READY:
                break
            if server.wait_stopped(0):
                crash = server.last_crash
                why = crash.describe() if crash else "it stopped"
                raise LaunchFailure(
                    f"llama-server did not start: {why}",
                    f"See its log: {server.log_file}",
                    fatal=crash is not None and crash.recovery == "none",
                )
            self._check_running(cancel)
            time.sleep(0.05)
        self._phase("ready", total, total, ep.url)
        return ChatEndpoint(ep.url, ep.api_key)

    def _worker_failure(self, proc: RemoteProcess) -> LaunchFailure:
        where = f"the RPC worker on {proc.node.label}"
        last = proc.tail(1)[0] if proc.tail(1) else ""
        if proc.ssh_returncode == 255 and proc.remote_pid is None:
            err = classify_ssh_failure(proc.node, "\n".join(proc.tail(5)), self.known_hosts)
            return LaunchFailure(err.message, err.hint)
        if proc.exit_status == 127:
            detail = proc.describe_exit() if proc.node.rpc_server_bin else last
            return LaunchFailure(
                f"{where}: {detail or proc.describe_exit()}",
                "Install llama.cpp built with -DGGML_RPC=ON on the node, or set rpc=PATH "
                "for that node.",
                fatal=True,
            )
        if "bind" in last.lower() or "address already in use" in last.lower():
            return LaunchFailure(
                f"{where} cannot listen: {last}",
                "Pick another port, or an address that belongs to the node.",
                fatal=True,
            )
        return LaunchFailure(f"{where} {proc.describe_exit()}: {last}")

    def _worker_exit(self, proc: RemoteProcess) -> None:
        if proc.stopping:
            return
        last = proc.tail(1)
        tail = f" ({last[0]})" if last else ""
        self.fault(f"the RPC worker on {proc.node.label} {proc.describe_exit()}{tail}")

    def _server_event(self, event: Event) -> None:
        if event.state is State.CRASHED:
            self.fault(f"llama-server stopped: {event.message}")

    def _teardown(self) -> None:
        with self._lock:
            server, workers = self._server, list(self._workers)
            self._server, self._workers = None, []
        if server is not None:
            server.stop()
        stop_remote_processes(workers, self.policy.stop_grace)
