"""The set-up wizard with "Several machines": its cluster step (the Cluster page's editor,
probe and verdict), tiers judged for the cluster, and the engine started on the cluster.

Nodes are folders on this machine reached through a real OpenSSH server; SparkInfer is
the stand-in under ``tests/fakes/sparkinfer/``; their probe is replaced at the core API
boundary by reports built from the shipped GB10 hardware file (``tests/core/cluster/
reports.py``), as in ``test_cluster_ui.py``.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from PySide6.QtWidgets import QDialogButtonBox, QWizard

from k3desk.core.cluster.nodes import Cluster, Node
from k3desk.core.cluster.sparkinfer import GEOMETRY_ERROR
from k3desk.ui.window import MainWindow
from tests.core.cluster.reports import report
from tests.fixtures.sshd import SshServer
from tests.ui.test_cluster_ui import free_port, spark_nodes, type_into

NEXT = QWizard.WizardButton.NextButton
SPARK_TIER = "vcruz305-ud-iq1s"


def cells(wiz, col: int) -> dict[str, str]:  # type: ignore[no-untyped-def]
    t = wiz.tiers.table
    return {row.tier.id: t.item(r, col).text() for r, row in enumerate(t.rows)}


@pytest.fixture
def gb10_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every node reports a DGX Spark (GB10) holding a complete copy of the recipe tier."""
    monkeypatch.setattr(
        "k3desk.core.app.clusters.probe_cluster",
        lambda cluster, known_hosts, **kw: [report(n) for n in cluster.nodes],
    )


def open_wizard(ctx, qtbot, hardware_file, name: str = "1xRTX5090-256GB"):  # type: ignore[no-untyped-def]
    window = MainWindow(ctx)
    qtbot.addWidget(window)
    window.show()
    hw = ctx.hardware
    hw.load_file(hardware_file(name))
    wiz = window.open_wizard()
    qtbot.waitUntil(lambda: hw.recommendation is not None, timeout=30_000)
    return window, wiz


def test_the_wizard_probes_a_cluster_judges_tiers_for_it_and_starts_sparkinfer_there(  # type: ignore[no-untyped-def]
    ctx, qtbot, hardware_file, sshd: SshServer, gb10_probe: None, monkeypatch
) -> None:
    from k3desk.core.hardware import detect

    real_disk = detect.detect_disk  # this machine has 10 GiB free for the download
    monkeypatch.setattr(
        detect, "detect_disk", lambda p, *a, **kw: replace(real_disk(p, *a, **kw), free=10 * 2**30)
    )
    ctl = ctx.cluster
    # one loopback address for all three (RPC refuses that below); gpu=0: each node is a
    # machine of its own to SparkInfer, as three Sparks are
    nodes = spark_nodes(sshd, "wiz-spark", address="127.0.0.1", gpu="0")
    ctl.save_cluster(Cluster("sparks", tuple(nodes)))
    _window, wiz = open_wizard(ctx, qtbot, hardware_file)
    # one RTX 5090: the SparkInfer tier streams from disk on this machine alone
    machine = {row.tier.id: row.label for row in wiz.hardware.judgement.rows}
    assert machine[SPARK_TIER].startswith("streams from disk:")

    # the first page: one machine by default, several machines lead to the cluster step
    assert wiz.machine.one.isChecked()
    wiz.machine.several.click()
    wiz.next()
    assert wiz.current_key() == "cluster"
    view = wiz.cluster.view
    assert view.current_name() == "sparks"
    assert view.start_btn.isHidden()  # the wizard's engine step starts it
    assert view.nodes.item(0, 5).text() == "not probed"

    # a cluster can be added right here (the Cluster page's editor)
    dlg = view.add_cluster()
    type_into(dlg.name, "more")
    type_into(dlg.fields["host"], "spark9")
    dlg.buttons.button(QDialogButtonBox.StandardButton.Save).click()
    assert [c.name for c in ctl.clusters()] == ["sparks", "more"]
    assert view.current_name() == "more"
    view.list.setCurrentRow(0)
    assert view.current_name() == "sparks"

    # probe: GB10 nodes with complete copies; the core's verdict is shown
    view.probe_btn.click()
    qtbot.waitUntil(lambda: "sparks" in ctl.probes, timeout=30_000)
    assert view.nodes.item(0, 2).text() == "GB10 (sm_121)"
    assert view.verdict.text().startswith("SparkInfer TP3: fits")
    for spin in (view.coord_port, view.serve_port, view.bridge_port):
        spin.setValue(free_port())
    assert wiz.button(NEXT).isEnabled()

    # tiers judged for the cluster: SparkInfer loads vcruz305's tier only, and says so
    wiz.next()
    assert wiz.current_key() == "tiers"
    assert wiz.tiers.table.rowCount() == len(ctx.services.catalog)
    verdicts = cells(wiz, 1)
    assert verdicts[SPARK_TIER].startswith("fits")
    for tier_id, text in verdicts.items():
        if tier_id != SPARK_TIER:
            assert text == "refused: SparkInfer cannot load it", tier_id
    assert wiz.selected_tier().tier.id == SPARK_TIER
    reason = wiz.tiers.reason.text()
    assert reason.startswith("Judged for cluster sparks with SparkInfer TP3.")
    assert "SparkInfer loads only vcruz305's UD-IQ1_S tier" in reason
    assert wiz.tiers.other.isHidden()  # "Plan for other hardware" is about one machine
    wiz.tiers.table.select_tier("grearl-iq1s")
    assert GEOMETRY_ERROR in wiz.tiers.details.toPlainText()
    assert view.tier_id() == "grearl-iq1s"  # the cluster step checks the copies of this one

    # llama.cpp RPC instead: these loopback nodes share one address, which RPC refuses for
    # every tier (the memory verdicts are in the next test)
    wiz.back()
    view.rpc_radio.click()
    wiz.next()
    assert set(cells(wiz, 1).values()) == {
        "refused: Two workers would listen on 127.0.0.1:50052; give them different port…"
    }
    assert "SparkInfer" not in wiz.tiers.reason.text()
    assert "Nothing can start on this cluster yet" in wiz.tiers.reason.text()

    # back to SparkInfer and on: where the files must be, then the engine step
    wiz.back()
    view.spark_radio.click()
    wiz.next()
    assert wiz.selected_tier().tier.id == SPARK_TIER
    wiz.next()
    assert wiz.current_key() == "where"
    note = wiz.where.cluster_note
    assert note.isVisible()
    assert "SparkInfer loads the model from each node's own folder (wiz-spark0:" in note.text.text()
    # too little room here does not stop a cluster whose nodes hold their own copies
    qtbot.waitUntil(lambda: "not enough here" in wiz.where.free.text(), timeout=10_000)
    assert "SparkInfer reads the nodes' own copies" in wiz.where.free.text()
    assert wiz.button(NEXT).isEnabled()
    wiz.next()
    assert wiz.current_key() == "download"
    wiz.download.have.click()  # the probe found complete copies on every node
    assert wiz.current_key() == "engine"
    step = wiz.engine
    assert step.panel.isHidden()  # no local llama-server for a cluster
    launch = step.cluster
    assert launch.isVisible()
    assert launch.title.text() == "vcruz305 UD-IQ1_S on cluster sparks"
    assert launch.verdict.verdict.text().startswith("SparkInfer TP3: fits")
    assert not launch.view.isVisible()  # nothing started yet
    assert launch.start_btn.isEnabled()

    launch.start_btn.click()
    qtbot.waitUntil(lambda: ctl.chat_endpoint() is not None, timeout=120_000)
    assert ctl.group_cluster == "sparks"
    assert ctl.launch_choice.tier_id == SPARK_TIER
    assert ctl.launch_choice.bridge_port == view.bridge_port.value()
    assert launch.view.isVisible()
    qtbot.waitUntil(lambda: launch.view.state.text().startswith("Ready at http://"), timeout=5_000)
    assert launch.view.members.rowCount() == 4  # three ranks and the bridge
    assert not launch.start_btn.isEnabled()
    assert "runs on sparks" in launch.start_btn.toolTip()

    wiz.accept()
    assert ctx.settings.tier_id == SPARK_TIER
    ctl.stop()
    qtbot.waitUntil(lambda: not ctl.group_running and not ctl.stopping, timeout=60_000)


def test_rpc_tiers_by_the_workers_memory_and_one_machine_again(  # type: ignore[no-untyped-def]
    ctx, qtbot, hardware_file, this_machine, llama_server, gb10_probe: None
) -> None:
    ctx.update_settings(engine_binary=str(llama_server))
    # llama.cpp RPC runs llama-server here: this machine has the eight H100 (the stand-in
    # for detection); the pages judge the same machine from its file
    this_machine(hardware_file("8xH100-2TB"))
    window, wiz = open_wizard(ctx, qtbot, hardware_file, "8xH100-2TB")
    wiz.machine.several.click()
    wiz.next()
    view = wiz.cluster.view
    # no cluster yet: the step says what to do and Next waits for one
    assert view.empty.isVisible()
    assert not wiz.button(NEXT).isEnabled()
    nodes = tuple(
        Node(host=f"rack{i}", address=f"10.0.0.{i + 1}", model_path="/m") for i in range(3)
    )
    ctx.cluster.save_cluster(Cluster("racks", nodes))
    assert view.current_name() == "racks"
    assert wiz.button(NEXT).isEnabled()
    wiz.next()
    # not probed: SparkInfer can start the one tier it loads; the summary asks for a probe
    assert cells(wiz, 1)[SPARK_TIER] == "can start (probe for the memory plan)"
    assert "Probe the cluster on the previous step" in wiz.tiers.reason.text()

    # llama.cpp RPC over three probed GB10 workers (about 116 GiB usable each) plus this
    # machine's eight H100: tiers are judged by the memory they offer together
    wiz.back()
    view.rpc_radio.click()
    view.probe_btn.click()
    qtbot.waitUntil(lambda: "racks" in ctx.cluster.probes, timeout=30_000)
    wiz.next()
    verdicts = cells(wiz, 1)
    assert verdicts[SPARK_TIER] == "fits on the cluster"
    assert verdicts["atomicchat-iq2xxs"].startswith("fits")
    for big in ("atomicchat-q3ks", "atomicchat-q8_0"):
        assert verdicts[big].startswith("won't fit: the nodes offer 976.3 GiB together"), big
    assert "SparkInfer" not in wiz.tiers.reason.text()
    # the best quality that fits, in the order the one-machine recommendation uses
    rec = wiz.hardware.recommendation
    order = [tv.tier.id for tv in rec.verdicts if not tv.tier.reference]
    fitting = [t for t in order if verdicts[t].startswith("fits")]
    assert wiz.selected_tier().tier.id == fitting[0]

    # back to one machine: the machine's own verdicts and recommendation again
    wiz.back()
    wiz.back()
    assert wiz.current_key() == "machine"
    wiz.machine.one.click()
    wiz.next()
    assert wiz.current_key() == "tiers"
    rec = wiz.hardware.recommendation
    assert cells(wiz, 1) == {row.tier.id: row.label for row in wiz.hardware.judgement.rows}
    assert wiz.selected_tier().tier.id == rec.best.tier.id
    assert wiz.tiers.reason.text() == rec.summary
    wiz.next()
    assert not wiz.where.cluster_note.isVisible()

    # closing the main window closes the wizard with it
    window.close()
    assert not wiz.isVisible()
