"""The Cluster page, the cluster engine in the Engine view, and attached servers in the chat.

Nodes are folders on this machine reached through a real OpenSSH server
(``tests/fixtures/sshd.py``); SparkInfer is the stand-in under
``tests/fakes/sparkinfer/``; where GB10 hardware is needed, the probe is replaced
at the core API boundary by reports built from the shipped GB10 hardware file.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QDialogButtonBox, QLineEdit

from k3desk.core.chat.model import ChatSettings
from k3desk.core.cluster.assess import RPC_NEEDS_MODEL
from k3desk.core.cluster.endpoints import EndpointStore
from k3desk.core.cluster.nodes import Cluster, Node
from k3desk.core.cluster.rpc import RPC_WARNING
from k3desk.core.cluster.sparkinfer import GEOMETRY_ERROR
from k3desk.ui.chat.page import ChatPage
from k3desk.ui.cluster.page import ClusterPage
from k3desk.ui.window import MainWindow
from tests.core.cluster.reports import report
from tests.core.cluster.twin import write_recipe_twin
from tests.fakes.sparkinfer.stand_in import install_recipe, write_model_extras
from tests.fixtures.hub import FakeKeyringModule, MemoryKeyring
from tests.fixtures.sshd import SshServer

FAKES = Path(__file__).resolve().parents[1] / "fakes" / "sparkinfer"
SAVE = QDialogButtonBox.StandardButton.Save


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def type_into(edit: QLineEdit, text: str) -> None:
    """What typing does: the text and the textEdited signal (setText alone sends no edit)."""
    edit.setText(text)
    edit.textEdited.emit(text)


def gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_the_page_adds_probes_and_judges_a_cluster_over_ssh(  # type: ignore[no-untyped-def]
    ctx, qtbot, sshd: SshServer
) -> None:
    window = MainWindow(ctx)
    qtbot.addWidget(window)
    window.show()
    page: ClusterPage = window.show_page("cluster")
    assert page.empty.isVisible()
    assert not page.start_btn.isEnabled()
    assert page.start_btn.toolTip() == "Add a cluster first."

    # three loopback nodes: two hold header twins of the SparkInfer tier, the third nothing
    nodes = [sshd.node(f"ui-n{i}") for i in range(3)]
    for n in nodes[:2]:
        write_recipe_twin(Path(n.model_path))
    dlg = page.add_cluster()
    type_into(dlg.name, "loop")
    assert "host '' is not a host name or address" in dlg.problems.text()
    assert not dlg.buttons.button(SAVE).isEnabled()
    for i, n in enumerate(nodes):
        if i:
            dlg.add_btn.click()
        for attr in ("host", "user", "identity", "model_path", "address", "name", "workdir"):
            type_into(dlg.fields[attr], str(getattr(n, attr)))
        dlg.port.setValue(n.port)
    assert dlg.problems.text() == ""
    dlg.buttons.button(SAVE).click()
    ctl = ctx.cluster
    assert ctl.store.get("loop").nodes == tuple(nodes)  # saved in rank order
    assert page.current_name() == "loop"
    assert page.nodes.rowCount() == 3
    assert page.nodes.item(1, 1).text() == f"{sshd.user}@127.0.0.1:{sshd.port}"
    assert page.nodes.item(1, 5).text() == "not probed"
    # not probed yet: GB10 assumed, nothing refused
    assert page.verdict.text() == "SparkInfer TP3: can start (probe for the memory plan)"
    assert "Node ui-n0: hardware not probed; GB10 is assumed." in page.warnings.text()

    # the probe runs over ssh in the background and fills the table
    page.probe_btn.click()
    assert not page.probe_btn.isEnabled()
    qtbot.waitUntil(lambda: "loop" in ctl.probes, timeout=120_000)
    qtbot.waitUntil(lambda: page.probe_btn.isEnabled(), timeout=5_000)
    assert "Probed 3 of 3 nodes" in page.probe_note.text()
    for row in range(3):
        assert page.nodes.item(row, 2).text().startswith("none")  # no NVIDIA GPU here
        assert " free" in page.nodes.item(row, 3).text()
        assert " free at " in page.nodes.item(row, 4).toolTip()
    # the twins have the tier's headers and names, not its 330 GB: the size check says so
    for row in (0, 1):
        copy = page.nodes.item(row, 5).text()
        assert copy.startswith("incomplete: the parts add up to ")
        assert copy.endswith("bytes, the publisher lists 330167807328")
    assert page.nodes.item(2, 5).text().startswith("not there (no file of the set in")

    # the verdict and the refusals are the core's, verbatim
    expected = ctl.assess("loop", page.choice())
    assert page.refusals.text().splitlines() == [f"✗ {r}" for r in expected.refusals]
    text = page.refusals.text()
    assert "Node ui-n0 has no NVIDIA GPU: SparkInfer's recipe runs on GB10 / DGX Spark" in text
    assert "Node ui-n0 has no complete copy of the model (incomplete: the parts add up" in text
    assert "Node ui-n2 has no complete copy of the model (not there" in text
    # the probe looked on rank 0 for what the bridge reads: the twins came without them
    assert (
        f"Rank 0 (ui-n0) has no tokenizer folder (K3_TOKENIZER_DIR) at "
        f"{Path(nodes[0].model_path).parent}/tokenizer: there is nothing there." in text
    )
    assert f"{nodes[0].model_path}/k3_chat_template.jinja: there is nothing there." in text
    assert page.verdict.text() == "SparkInfer TP3: refused"
    assert page.plan.rowCount() == 3
    assert page.plan.item(0, 1).text() == "rank 0 (coordinator, bridge)"
    assert not page.start_btn.isEnabled()
    assert page.start_btn.toolTip() == f"{len(expected.refusals)} refusals above."

    # another tier: SparkInfer refuses it by its geometry; copies need a new probe
    page.tier.setCurrentIndex(page.tier.findData("grearl-iq1s"))
    assert GEOMETRY_ERROR in page.refusals.text()
    assert "tier 'grearl-iq1s'" in page.refusals.text()
    assert page.nodes.item(0, 5).text() == "probe again to check this tier"
    page.tier.setCurrentIndex(page.tier.findData("vcruz305-ud-iq1s"))

    # an IPv6 engine address, entered through the editor
    edit = page.edit_cluster()
    assert edit is not None
    edit.list.setCurrentRow(1)
    assert edit.fields["host"].text() == "127.0.0.1"
    type_into(edit.fields["address"], "fd00::2")
    edit.buttons.button(SAVE).click()
    assert (
        "Node ui-n1: SparkInfer takes IPv4 literals only for --listen/--coord, and 'fd00::2' "
        "is an IPv6 address; set address=<its IPv4 address> for this node."
    ) in page.refusals.text()
    assert "Node ui-n1: hardware not probed; GB10 is assumed." in page.warnings.text()

    # llama.cpp RPC: the unauthenticated-protocol warning, and what it still needs
    page.rpc_radio.click()
    assert page.verdict.text().startswith("llama.cpp RPC (3 workers)")
    assert f"! {RPC_WARNING}" in page.warnings.text().splitlines()
    assert f"✗ {RPC_NEEDS_MODEL}" in page.refusals.text().splitlines()
    assert not page.card_card.isVisible()

    # the model card's SparkInfer command, explained
    page.spark_radio.click()
    assert page.card_card.isVisible()
    assert not page.card_explain.isVisible()
    page.card_toggle.click()
    assert page.card_explain.isVisible()
    explained = page.card_explain.toPlainText()
    assert "There is no `sparkinfer` program: the binary is `kimi_k3_dist_generate`" in explained
    assert "`--tp N` does not exist" in explained
    assert "Nothing listens on port 9000" in explained
    page.card_input.setPlainText(
        "kimi_k3_dist_generate --rank 0 --world 3 --listen 10.0.0.11:29500 "
        "--model /m/Kimi-K3-UD-IQ1_S-00001-of-00009.gguf --max-ctx 8192"
    )
    assert page.card_explain.toPlainText().startswith(
        "That command has none of the model card's known mistakes."
    )

    # the commands k3desk would run are the verified ones
    page.commands_btn.click()
    assert "--rank 0 --world 3 --listen" in page.commands.toPlainText()
    bridge_line = page.commands.toPlainText().splitlines()[-1]  # the recipe's bridge, last
    assert bridge_line.startswith(
        f"ui-n0: env CUDA_DEVICE_ORDER=PCI_BUS_ID "
        f"K3_TOKENIZER_DIR={Path(nodes[0].model_path).parent}/tokenizer "
        f"K3_CHAT_TEMPLATE={nodes[0].model_path}/k3_chat_template.jinja "
    )
    assert bridge_line.endswith(
        f" bash {nodes[0].workdir}/kimi-k3-neuron-tp3-dgxspark-recipe/api-server/run-api.sh"
    )

    page.remove_btn.click()
    assert page.list.count() == 0
    assert page.empty.isVisible()
    assert ctl.store.load() == []


def spark_nodes(sshd: SshServer, tag: str, **fields: str) -> list[Node]:
    """Three loopback nodes with the recipe tier, the SparkInfer stand-in and its bridge;
    each its own engine address (127.0.0.1-3), as three DGX Sparks have (ranks that share
    an address share a machine, and its GPUs); ``fields`` set on every node."""
    nodes = []
    for i in range(3):
        node = sshd.node(
            f"{tag}{i}",
            sparkinfer_bin=str(FAKES / "kimi_k3_dist_generate"),
            python="/usr/bin/python3",
            **{"address": f"127.0.0.{1 + i}", **fields},
        )
        write_recipe_twin(Path(node.model_path))
        write_model_extras(node.model_path)  # the chat template and tokenizer/, as the recipe
        nodes.append(node)
    install_recipe(nodes[0].workdir)  # the recipe's clone with its api-server
    return nodes


def test_sparkinfer_runs_with_phases_ranks_speed_chat_restart_and_stop(  # type: ignore[no-untyped-def]
    ctx, qtbot, sshd: SshServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    nodes = spark_nodes(sshd, "ui-spark")
    ctl = ctx.cluster
    ctl.save_cluster(Cluster("sparks", tuple(nodes)))
    # the nodes are folders here; their probe reports DGX Sparks (GB10) with complete copies
    monkeypatch.setattr(
        "k3desk.core.app.clusters.probe_cluster",
        lambda cluster, known_hosts, **kw: [report(n) for n in cluster.nodes],
    )
    window = MainWindow(ctx)
    qtbot.addWidget(window)
    window.show()
    view = window.page("engine").cluster
    assert not view.isVisible()  # no cluster engine yet
    page: ClusterPage = window.show_page("cluster")
    page.probe_btn.click()
    qtbot.waitUntil(lambda: "sparks" in ctl.probes, timeout=30_000)
    assert page.nodes.item(0, 2).text() == "GB10 (sm_121)"
    assert (
        "NVIDIA GB10, Blackwell (sm_121), memory unified with RAM"
        in page.nodes.item(0, 2).toolTip()
    )
    assert page.nodes.item(0, 5).text() == "complete (9 files, headers checked)"
    assert page.refusals.isHidden()
    assert page.verdict.text().startswith("SparkInfer TP3: fits")
    for spin in (page.coord_port, page.serve_port, page.bridge_port):
        spin.setValue(free_port())
    bridge = page.bridge_port.value()
    assert page.start_btn.isEnabled()

    seen: list[tuple[str, str, str]] = []
    ctl.group_changed.connect(
        lambda: seen.append((view.bar.format(), view.phases.text(), view.state.text()))
    )
    page.start_btn.click()
    assert window.current_page() == "engine"
    assert view.isVisible()
    assert view.title.text() == "Cluster engine: SparkInfer TP3 on sparks"
    qtbot.waitUntil(lambda: ctl.chat_endpoint() is not None, timeout=120_000)
    qtbot.waitUntil(lambda: view.state.text().startswith("Ready at http://"), timeout=5_000)

    # the readiness phases went by as progress, shard by shard
    formats = [f for f, _p, _s in seen]
    assert "rank 0 waiting for workers: 2 workers to connect" in formats
    for i in range(1, 10):
        assert f"workers connected (NCCL ready), loading weights: rank 0: shard {i}/9 mapped" in (
            formats
        )
    assert any("●</span> rank 0 waiting for workers" in p for _f, p, _s in seen)
    assert view.phases.text().count("✓") == 7
    assert view.bar.format() == "ready"
    # every rank and the bridge, with host, role and state
    rows = [
        [view.members.item(r, c).text() for c in range(view.members.columnCount())]
        for r in range(view.members.rowCount())
    ]
    host = f"{sshd.user}@127.0.0.1:{sshd.port}"
    assert [r[:5] for r in rows] == [
        ["rank 0", "ui-spark0", host, "coordinator (--listen)", "running"],
        ["rank 1", "ui-spark1", host, "worker (--coord)", "running"],
        ["rank 2", "ui-spark2", host, "worker (--coord)", "running"],
        ["bridge", "ui-spark0", host, f"OpenAI-compatible HTTP at http://127.0.0.1:{bridge}",
         "running"],
    ]  # fmt: skip
    assert all(r[5].isdigit() for r in rows)
    assert view.url.edit.text() == f"http://127.0.0.1:{bridge}/v1"
    assert window.status_engine.text() == "SparkInfer TP3 on sparks: ready"

    # the chat answers through the cluster, reasoning included (the bridge's own flag)
    chat: ChatPage = window.show_page("chat")
    chat.composer.edit.setPlainText("hello over three sparks")
    qtbot.keyClick(chat.composer.edit, Qt.Key.Key_Return)
    qtbot.waitUntil(
        lambda: len(chat.view.messages()) == 2 and not chat.chat.streaming, timeout=60_000
    )
    answer = chat.view.messages()[1]
    assert "hello over three sparks" in answer.content
    assert answer.reasoning.startswith("The user wrote")
    assert not answer.partial
    # rank 0's serve line gives the speed
    qtbot.waitUntil(lambda: view.speed.text().startswith("Last answer:"), timeout=10_000)
    assert ctl.last_stats is not None
    assert f"{ctl.last_stats.generated_tokens} tokens at" in view.speed.text()

    # restart the whole set: every process is new
    before = [m.pid for m in ctl.members()]
    old_group = ctl.group
    view.restart_btn.click()
    qtbot.waitUntil(
        lambda: ctl.group is not old_group and ctl.chat_endpoint() is not None, timeout=120_000
    )
    after = [m.pid for m in ctl.members()]
    assert all(pid is not None for pid in after)
    assert not set(before) & set(after)
    assert all(gone(pid) for pid in before if pid is not None)

    # stop the whole set: nothing is left running, and the chat has nowhere to go
    view.stop_btn.click()
    qtbot.waitUntil(lambda: not ctl.group_running and not ctl.stopping, timeout=60_000)
    assert [m.state for m in ctl.members()] == ["stopped"] * 4
    assert [view.members.item(r, 4).text() for r in range(4)] == ["stopped"] * 4
    assert all(gone(pid) for pid in after if pid is not None)
    assert ctx.engine.chat_endpoint() is None
    assert not chat.composer.send_btn.isEnabled()


@pytest.fixture
def remote_server(llama_server: Path, tiny_k3_single, tmp_path: Path) -> Iterator[str]:  # type: ignore[no-untyped-def]
    """llama-server on the tiny K3 with an API key, started by the test (k3desk does not own it)."""
    port = free_port()
    log = (tmp_path / "remote.log").open("wb")
    proc = subprocess.Popen(
        [str(llama_server), "-m", str(tiny_k3_single.first_part), "--host", "127.0.0.1",
         "--port", str(port), "-c", "1024", "--jinja", "--no-warmup", "-ngl", "0",
         "--api-key", "sekrit-key", "--alias", "tiny-remote"],
        stdout=log, stderr=log,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail((tmp_path / "remote.log").read_text())
            time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.mark.engine
def test_an_attached_server_answers_in_the_chat(ctx, qtbot, remote_server: str) -> None:  # type: ignore[no-untyped-def]
    ring = MemoryKeyring()
    ctl = ctx.cluster
    ctl.endpoints = EndpointStore(ctx.services.paths, keyring_module=FakeKeyringModule(ring))
    page = ClusterPage(ctx)
    qtbot.addWidget(page)
    page.show()
    page.tabs.setCurrentIndex(1)
    chat = ChatPage(ctx)
    qtbot.addWidget(chat)
    # random weights: a fixed seed, a bounded length and ignore_eos make an answer arrive
    chat.chat.update_settings(
        "", ChatSettings(thinking=False, max_tokens=16, seed=1, extra_body={"ignore_eos": True})
    )
    chat.composer.edit.setPlainText("hello")
    assert not chat.composer.send_btn.isEnabled()
    assert "No engine is running" in chat.composer.send_btn.toolTip()

    servers = page.servers
    assert not servers.attach_btn.isEnabled()
    type_into(servers.name, "remote")
    type_into(servers.url, f"{remote_server}/v1")
    servers.key.setText("sekrit-key")
    servers.attach_btn.click()
    qtbot.waitUntil(lambda: servers.result.text().startswith("Attached"), timeout=30_000)
    assert "model tiny-remote" in servers.result.text()
    assert "API key saved in the system keyring" in servers.result.text()
    assert ring.store[("k3desk", "endpoint:remote")] == "sekrit-key"
    endpoints_file = ctx.services.paths.config / "endpoints.json"
    assert "sekrit-key" not in endpoints_file.read_text()
    qtbot.waitUntil(lambda: ctx.engine.chat_endpoint() is not None, timeout=10_000)
    assert ctx.settings.recent["chat_endpoint"] == "remote"
    assert "sekrit-key" not in ctx.store.path.read_text()
    assert servers.table.item(0, 0).text() == "remote"
    assert servers.table.item(0, 5).text() == "in use"
    assert servers.table.item(0, 2).text().startswith("llama.cpp llama-server")
    assert servers.chat_state.text() == (f"The chat uses Attached server remote ({remote_server}).")
    assert chat.status.text().startswith(f"Attached server remote ({remote_server})")

    # the chat talks to it exactly as to the local engine (the key goes along)
    assert httpx.get(f"{remote_server}/v1/models").status_code == 401
    assert chat.composer.send_btn.isEnabled()
    qtbot.keyClick(chat.composer.edit, Qt.Key.Key_Return)
    qtbot.waitUntil(
        lambda: len(chat.view.messages()) == 2 and not chat.chat.streaming, timeout=60_000
    )
    answer = chat.view.messages()[1]
    assert answer.content
    assert not answer.partial

    # not used any more: the chat has nowhere to go
    servers.unuse_btn.click()
    qtbot.waitUntil(lambda: ctx.engine.chat_endpoint() is None, timeout=5_000)
    assert "chat_endpoint" not in ctx.settings.recent
    assert servers.table.item(0, 5).text() == ""
    chat.composer.edit.setPlainText("again")
    assert not chat.composer.send_btn.isEnabled()
    servers.table.selectRow(0)
    servers.detach_btn.click()
    qtbot.waitUntil(lambda: servers.table.rowCount() == 0, timeout=5_000)
    assert ring.store == {}


@pytest.mark.engine
def test_rpc_workers_and_llama_server_start_from_the_page(  # type: ignore[no-untyped-def]
    ctx, qtbot, sshd: SshServer, llama_server: Path, tiny_k3_single
) -> None:
    rpc_bin = llama_server.with_name("ggml-rpc-server")
    assert rpc_bin.is_file(), f"llama.cpp's RPC worker is not beside {llama_server}"
    ctx.update_settings(engine_binary=str(llama_server))
    node = sshd.node("ui-rpc", rpc_server_bin=str(rpc_bin))
    ctl = ctx.cluster
    ctl.save_cluster(Cluster("workers", (node,)))
    window = MainWindow(ctx)
    qtbot.addWidget(window)
    window.show()
    page: ClusterPage = window.show_page("cluster")
    page.rpc_radio.click()
    assert f"✗ {RPC_NEEDS_MODEL}" in page.refusals.text().splitlines()
    page.model.setText(str(tiny_k3_single.first_part))
    # a wildcard address is refused until allowed explicitly, and then still warned about
    ctl.save_cluster(Cluster("workers", (replace(node, address="0.0.0.0"),)), "workers")
    exposed = (
        "Node ui-rpc: binding the RPC worker to 0.0.0.0 opens it to every network interface of "
        "the node, and RPC has no authentication."
    )
    assert f"✗ {exposed} Pick the node's private address (bind=...), or allow it explicitly." in (
        page.refusals.text().splitlines()
    )
    page.allow_public.click()
    assert page.refusals.isHidden()
    assert f"! {exposed}" in page.warnings.text().splitlines()
    page.allow_public.click()
    ctl.save_cluster(Cluster("workers", (node,)), "workers")
    page.ctx_size.setValue(2048)
    port = free_port()
    page.rpc_port.setValue(port)
    assert page.refusals.isHidden()
    assert page.warnings.text() == f"! {RPC_WARNING}"
    assert page.verdict.text() == "llama.cpp RPC (1 worker): can start (probe for the memory plan)"
    page.start_btn.click()
    view = window.page("engine").cluster
    assert view.title.text() == "Cluster engine: llama.cpp RPC (1 worker) on workers"
    qtbot.waitUntil(lambda: ctl.chat_endpoint() is not None, timeout=120_000)
    qtbot.waitUntil(lambda: view.members.item(1, 4).text() == "ready", timeout=5_000)
    rows = [
        [view.members.item(r, c).text() for c in range(5)] for r in range(view.members.rowCount())
    ]
    ep = ctl.chat_endpoint()
    assert rows == [
        ["rpc worker", "ui-rpc", f"{sshd.user}@127.0.0.1:{sshd.port}",
         f"RPC worker at 127.0.0.1:{port}", "running"],
        ["llama-server", "this machine", ep.root, "main (--rpc)", "ready"],
    ]  # fmt: skip
    assert "starting llama-server with --rpc" in view.log.toPlainText()
    server = ctl.group.server
    assert server is not None
    assert f"127.0.0.1:{port}" in server.history[-1].argv

    # the chat answers through llama-server and the worker
    chat: ChatPage = window.show_page("chat")
    chat.chat.update_settings(
        "", ChatSettings(thinking=False, max_tokens=8, seed=1, extra_body={"ignore_eos": True})
    )
    chat.composer.edit.setPlainText("Hello")
    qtbot.keyClick(chat.composer.edit, Qt.Key.Key_Return)
    qtbot.waitUntil(
        lambda: len(chat.view.messages()) == 2 and not chat.chat.streaming, timeout=60_000
    )
    assert chat.view.messages()[1].content

    worker_pid = ctl.members()[0].pid
    view.stop_btn.click()
    qtbot.waitUntil(lambda: not ctl.group_running and not ctl.stopping, timeout=60_000)
    assert worker_pid is not None
    assert gone(worker_pid)
    assert [m.state for m in ctl.members()] == ["stopped", "stopped"]
