"""Who is in a running engine group, where, and in what state: a snapshot for views.

:func:`group_members` lists every process a SparkInfer cluster or an RPC cluster
runs or will run (ranks and the bridge; RPC workers and the local llama-server),
before, during and after a launch, so a view can show the whole set at any time.
:func:`launch_fraction` turns a group's launch progress (its phases, and within
SparkInfer's loading phase the shards rank 0 has mapped) into one number.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from k3desk.core.cluster.group import GroupState, GroupSupervisor
from k3desk.core.cluster.rpc import RpcCluster
from k3desk.core.cluster.sparkinfer import PHASE_TEXT, SparkInferCluster
from k3desk.core.cluster.ssh import RemoteProcess
from k3desk.core.progress import Progress

LOCAL = "this machine"


@dataclass(frozen=True)
class Member:
    """One process of a group."""

    name: str  # "rank 0", "bridge", "rpc worker", "llama-server"
    role: str  # what it does, in words
    node: str  # the node's label, or "this machine"
    host: str  # where it runs: user@host:port for ssh, the address it serves on
    state: str  # "waiting", "connecting", "running", "stopped", "ended: ..."
    alive: bool = False
    pid: int | None = None  # on its node
    log: str = ""  # local log file of its output


def _remote(
    proc: RemoteProcess | None,
    name: str,
    role: str,
    node_label: str,
    host: str,
    group_state: GroupState,
) -> Member:
    if proc is None:
        state = {
            GroupState.STOPPED: "stopped",
            GroupState.FAILED: "stopped (the group gave up)",
            GroupState.STOPPING: "stopping",
        }.get(group_state, "waiting")
        return Member(name, role, node_label, host, state)
    if proc.ended:
        state = "stopped" if proc.stopping else f"ended: {proc.describe_exit()}"
    elif proc.stopping:
        state = "stopping"
    elif proc.remote_pid is None:
        state = "connecting"
    else:
        state = "running"
    log = str(proc.log_path) if proc.log_path is not None else ""
    return Member(name, role, node_label, host, state, proc.alive, proc.remote_pid, log)


def _ssh_host(destination: str, port: int) -> str:
    return f"{destination}:{port}" if port != 22 else destination


def group_members(group: GroupSupervisor) -> list[Member]:
    """Every process of ``group``, in start order (a rank not started yet is "waiting")."""
    state = group.state
    out: list[Member] = []
    if isinstance(group, SparkInferCluster):
        cfg = group.config
        started = {p.name: p for p in group.ranks}
        for rank, node in enumerate(cfg.cluster.nodes):
            role = "coordinator (--listen)" if rank == 0 else "worker (--coord)"
            proc = started.get(f"rank {rank}")
            host = _ssh_host(node.destination, node.port)
            out.append(_remote(proc, f"rank {rank}", role, node.label, host, state))
        node = cfg.rank0
        bridge = group.bridge
        out.append(
            _remote(
                bridge,
                "bridge",
                f"OpenAI-compatible HTTP at {cfg.url}",
                node.label,
                _ssh_host(node.destination, node.port),
                state,
            )
        )
        return out
    if isinstance(group, RpcCluster):
        rcfg = group.config
        workers = group.workers
        for i, node in enumerate(rcfg.cluster.nodes):
            proc = workers[i] if i < len(workers) else None
            where = f"{rcfg.connect_address(node)}:{rcfg.worker_port(node)}"
            out.append(
                _remote(
                    proc,
                    "rpc worker",
                    f"RPC worker at {where}",
                    node.label,
                    _ssh_host(node.destination, node.port),
                    state,
                )
            )
        server = group.server
        if server is None:
            starting = state in (GroupState.STARTING, GroupState.RESTARTING)
            s_state = "waiting" if starting else "stopped"
            out.append(Member("llama-server", "main (--rpc)", LOCAL, "127.0.0.1", s_state))
        else:
            ep = server.endpoint
            out.append(
                Member(
                    "llama-server",
                    "main (--rpc)",
                    LOCAL,
                    ep.url if ep is not None else "127.0.0.1",
                    server.state.value,
                    alive=server.pid is not None,
                    pid=server.pid,
                    log=str(server.log_file or ""),
                )
            )
        return out
    return out


_SHARD_RE = re.compile(r"shard (\d+)/(\d+) mapped")
_LOADING = PHASE_TEXT[2]


def launch_fraction(progress: Progress) -> float:
    """0..1 through a group's launch; SparkInfer's loading phase advances shard by shard."""
    if progress.total <= 0:
        return 0.0
    done = float(progress.done)
    m = _SHARD_RE.search(progress.detail)
    if progress.stage == _LOADING and m is not None:
        i, n = int(m.group(1)), int(m.group(2))
        if n > 0:
            done += min(i, n) / n
    return max(0.0, min(1.0, done / progress.total))
