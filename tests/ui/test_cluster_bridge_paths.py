"""The Cluster page sets where SparkInfer's bridge finds the model's tokenizer folder and
chat template on rank 0: empty means beside the shards (shown as the placeholder), a
path typed there reaches the bridge's environment in "Commands k3desk will run"."""

from __future__ import annotations

from PySide6.QtWidgets import QLineEdit

from k3desk.core.cluster.nodes import Cluster, Node
from k3desk.ui.cluster.page import ClusterPage


def type_into(edit: QLineEdit, text: str) -> None:
    edit.setText(text)
    edit.textEdited.emit(text)


def bridge_line(page: ClusterPage) -> str:
    return page.commands.toPlainText().splitlines()[-1]  # the bridge starts last


def test_custom_tokenizer_and_template_paths_reach_the_bridge_env(ctx, qtbot) -> None:  # type: ignore[no-untyped-def]
    nodes = tuple(
        Node(f"10.0.0.{11 + i}", user="k3", model_path=f"/models/k3-{i}", workdir="/srv/k3")
        for i in range(3)
    )
    ctx.cluster.save_cluster(Cluster("sparks", nodes))
    page = ClusterPage(ctx)
    qtbot.addWidget(page)
    page.show()
    page.commands_btn.click()
    assert page.spark_radio.isChecked()
    assert page.tokenizer_dir.isVisible()
    assert page.chat_template.isVisible()

    # empty: the recipe's defaults on rank 0 (the chat template with the shards, the tokenizer
    # beside their folder), said as placeholders and used by the bridge
    assert page.tokenizer_dir.text() == ""
    assert page.chat_template.text() == ""
    assert page.tokenizer_dir.placeholderText() == "/models/tokenizer"
    assert page.chat_template.placeholderText() == "/models/k3-0/k3_chat_template.jinja"
    assert bridge_line(page).startswith(
        "10.0.0.11: env CUDA_DEVICE_ORDER=PCI_BUS_ID K3_TOKENIZER_DIR=/models/tokenizer "
        "K3_CHAT_TEMPLATE=/models/k3-0/k3_chat_template.jinja "
    )

    # custom paths on rank 0: the bridge gets exactly those
    type_into(page.tokenizer_dir, "/opt/k3/tok")
    type_into(page.chat_template, "/opt/k3/chat.jinja")
    assert bridge_line(page).startswith(
        "10.0.0.11: env CUDA_DEVICE_ORDER=PCI_BUS_ID K3_TOKENIZER_DIR=/opt/k3/tok "
        "K3_CHAT_TEMPLATE=/opt/k3/chat.jinja "
    )
    # ranks are unaffected; only the bridge reads them
    assert "/opt/k3" not in "\n".join(page.commands.toPlainText().splitlines()[:-1])
    choice = page.choice()
    ctl = ctx.cluster
    cfg = ctl.sparkinfer_config(ctl.cluster("sparks"), choice)
    assert (cfg.tokenizer_path, cfg.chat_template_path) == ("/opt/k3/tok", "/opt/k3/chat.jinja")

    # cleared again: back to the defaults
    type_into(page.tokenizer_dir, "  ")
    type_into(page.chat_template, "")
    assert "K3_TOKENIZER_DIR=/models/tokenizer " in bridge_line(page)
    assert "K3_CHAT_TEMPLATE=/models/k3-0/k3_chat_template.jinja " in bridge_line(page)

    # the RPC engine has no bridge: the fields go away with the other SparkInfer options
    page.rpc_radio.setChecked(True)
    assert not page.tokenizer_dir.isVisible()
