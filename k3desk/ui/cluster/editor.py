"""The dialog that adds or edits a cluster: its name and its nodes, rank 0 first.

Each node is what ``ssh`` needs (host, user, port, identity file) plus where the
model lives on it; the core's own checks (:meth:`Cluster.problems`) are shown as
the person types and the store refuses what they refuse.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from k3desk.core.app.clusters import Cluster, Node
from k3desk.core.app.values import K3Error
from k3desk.ui.widgets import label, muted

if TYPE_CHECKING:
    from k3desk.ui.cluster.controller import ClusterController

# (attribute, label, placeholder)
TEXT_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("host", "Host", "name or address ssh connects to, e.g. spark1 or 10.0.0.11"),
    ("user", "SSH user", "empty: ssh's default (your user name or ~/.ssh/config)"),
    ("identity", "Identity file", "empty: the ssh agent and ssh's default keys"),
    ("model_path", "Model folder", "on the node, e.g. /models/k3 (holds the shard files)"),
    ("address", "Engine address", "IPv4 the engines use between nodes; empty: the host"),
    ("name", "Name", "label shown in k3desk; empty: the host"),
    ("workdir", "Work folder", "on the node, for logs and the bridge; empty: the login folder"),
    ("sparkinfer_bin", "SparkInfer binary", "kimi_k3_dist_generate"),
    ("rpc_server_bin", "RPC worker binary", "empty: rpc-server or ggml-rpc-server"),
    ("gpu", "SparkInfer GPU", "empty: GPU 0; ranks sharing an engine address take 0, 1, 2, 3"),
)


def node_line(rank: int, node: Node) -> str:
    who = f"{node.destination}:{node.port}" if node.port != 22 else node.destination
    return f"{rank}. {node.label}  ({who or 'no host yet'})"


class ClusterEditor(QDialog):
    """Add a cluster (``cluster`` None) or edit one."""

    def __init__(
        self,
        controller: ClusterController,
        cluster: Cluster | None = None,
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self.controller = controller
        self.old_name = cluster.name if cluster is not None else None
        self.saved: Cluster | None = None
        self.setObjectName("clusterEditor")
        self.setWindowTitle("Edit cluster" if cluster is not None else "Add a cluster")
        self.resize(860, 560)
        self.nodes: list[Node] = list(cluster.nodes) if cluster is not None else []
        self._note = cluster.note if cluster is not None else ""
        self._loading = False

        lay = QVBoxLayout(self)
        top = QFormLayout()
        self.name = QLineEdit(cluster.name if cluster is not None else "")
        self.name.setObjectName("clusterName")
        self.name.setPlaceholderText("e.g. sparks (letters, digits, '.', '_' and '-')")
        top.addRow("Cluster name", self.name)
        lay.addLayout(top)
        lay.addWidget(
            muted(
                "Nodes in rank order: SparkInfer starts rank 0 (the coordinator and the HTTP "
                "bridge) on the first node. k3desk logs in with SSH keys only, never a password."
            )
        )

        body = QHBoxLayout()
        body.addLayout(self._node_list(), 2)
        body.addWidget(self._node_form(), 3)
        lay.addLayout(body, 1)

        self.problems = label("", "errorText", selectable=True)
        self.problems.setTextFormat(Qt.TextFormat.PlainText)
        lay.addWidget(self.problems)
        self.buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Save | QDialogButtonBox.StandardButton.Cancel
        )
        lay.addWidget(self.buttons)

        self.add_btn.clicked.connect(self.add_node)
        self.remove_btn.clicked.connect(self._remove)
        self.up_btn.clicked.connect(lambda: self._move(-1))
        self.down_btn.clicked.connect(lambda: self._move(1))
        self.list.currentRowChanged.connect(self._select)
        self.name.textEdited.connect(lambda _t: self._check())
        self.buttons.accepted.connect(self.save)
        self.buttons.rejected.connect(self.reject)
        self._fill_list(0 if self.nodes else -1)
        if not self.nodes:
            self.add_node()
        self._check()

    # ------------------------------------------------------------- building
    def _node_list(self) -> QVBoxLayout:
        """The nodes in rank order, and Add node / Remove / Up / Down."""
        left = QVBoxLayout()
        self.list = QListWidget()
        self.list.setObjectName("nodeList")
        left.addWidget(self.list, 1)
        row = QHBoxLayout()
        self.add_btn = QPushButton("Add node")
        self.add_btn.setObjectName("addNode")
        self.remove_btn = QPushButton("Remove")
        self.up_btn = QPushButton("Up")
        self.down_btn = QPushButton("Down")
        for b in (self.add_btn, self.remove_btn, self.up_btn, self.down_btn):
            row.addWidget(b)
        left.addLayout(row)
        return left

    def _node_form(self) -> QWidget:
        """The selected node's fields (the SSH port right after the user)."""
        form_w = QWidget()
        form = QFormLayout(form_w)
        self.fields: dict[str, QLineEdit] = {}
        for attr, text, hint in TEXT_FIELDS:
            edit = QLineEdit()
            edit.setObjectName(f"node-{attr}")
            edit.setPlaceholderText(hint)
            edit.textEdited.connect(lambda _t, a=attr: self._field_changed(a))
            self.fields[attr] = edit
            if attr == "identity":
                browse = QPushButton("Browse…")
                browse.clicked.connect(self._browse_identity)
                r = QHBoxLayout()
                r.addWidget(edit, 1)
                r.addWidget(browse)
                form.addRow(text, r)
            else:
                form.addRow(text, edit)
            if attr == "user":
                self.port = QSpinBox()
                self.port.setObjectName("node-port")
                self.port.setRange(1, 65535)
                self.port.setValue(22)
                self.port.valueChanged.connect(lambda _v: self._field_changed("port"))
                form.addRow("SSH port", self.port)
        return form_w

    # ---------------------------------------------------------------- nodes
    def current(self) -> int:
        return self.list.currentRow()

    def add_node(self) -> None:
        """A new node; it inherits user, key and folders of the selected one."""
        i = self.current()
        base = self.nodes[i] if 0 <= i < len(self.nodes) else None
        node = Node(host="")
        if base is not None:
            node = replace(
                base, host="", address="", name="", port=base.port
            )  # same user, key, folders and binaries
        self.nodes.append(node)
        self._fill_list(len(self.nodes) - 1)
        self.fields["host"].setFocus()
        self._check()

    def _remove(self) -> None:
        i = self.current()
        if 0 <= i < len(self.nodes):
            del self.nodes[i]
            self._fill_list(min(i, len(self.nodes) - 1))
            self._check()

    def _move(self, delta: int) -> None:
        i = self.current()
        j = i + delta
        if 0 <= i < len(self.nodes) and 0 <= j < len(self.nodes):
            self.nodes[i], self.nodes[j] = self.nodes[j], self.nodes[i]
            self._fill_list(j)
            self._check()

    def _fill_list(self, select: int) -> None:
        self.list.blockSignals(True)
        self.list.clear()
        for rank, node in enumerate(self.nodes):
            self.list.addItem(QListWidgetItem(node_line(rank, node)))
        self.list.blockSignals(False)
        self.list.setCurrentRow(select)
        self._select(select)

    def _select(self, i: int) -> None:
        has = 0 <= i < len(self.nodes)
        self._loading = True
        for attr, edit in self.fields.items():
            edit.setEnabled(has)
            edit.setText(str(getattr(self.nodes[i], attr)) if has else "")
        self.port.setEnabled(has)
        self.port.setValue(self.nodes[i].port if has else 22)
        self._loading = False
        self.remove_btn.setEnabled(has)
        self.up_btn.setEnabled(has and i > 0)
        self.down_btn.setEnabled(has and i < len(self.nodes) - 1)

    def _field_changed(self, attr: str) -> None:
        i = self.current()
        if self._loading or not 0 <= i < len(self.nodes):
            return
        changes: dict[str, Any] = {
            attr: self.port.value() if attr == "port" else self.fields[attr].text().strip()
        }
        self.nodes[i] = replace(self.nodes[i], **changes)
        item = self.list.item(i)
        if item is not None:
            item.setText(node_line(i, self.nodes[i]))
        self._check()

    def _browse_identity(self) -> None:
        ssh = Path.home() / ".ssh"
        start = self.fields["identity"].text() or (str(ssh) if ssh.is_dir() else str(Path.home()))
        f, _ = QFileDialog.getOpenFileName(self, "SSH private key", start, "All files (*)")
        if f:
            self.fields["identity"].setText(f)
            self._field_changed("identity")

    # ----------------------------------------------------------------- save
    def cluster(self) -> Cluster:
        return Cluster(self.name.text().strip(), tuple(self.nodes), note=self._note)

    def _check(self) -> list[str]:
        problems = self.cluster().problems()
        self.problems.setText("\n".join(f"• {p}" for p in problems))
        save = self.buttons.button(QDialogButtonBox.StandardButton.Save)
        if save is not None:
            save.setEnabled(not problems)
            save.setToolTip("Fix the problems listed above first." if problems else "")
        return problems

    def save(self) -> None:
        if self._check():
            return
        try:
            self.saved = self.controller.save_cluster(self.cluster(), self.old_name)
        except K3Error as exc:
            self.problems.setText(f"{exc.message} {exc.hint}".strip())
            return
        self.accept()
