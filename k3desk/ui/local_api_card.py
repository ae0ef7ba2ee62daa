"""Settings > Local API: the port the person's tools connect to, and their named keys."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import shiboken6
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (
    QCheckBox,
    QFormLayout,
    QHBoxLayout,
    QInputDialog,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMenu,
    QMessageBox,
    QPushButton,
    QSpinBox,
    QToolButton,
    QWidget,
)

from k3desk.core.app.local_api import (
    DEFAULT_PORT,
    MAX_PARALLEL,
    RESTART_NOTE,
    ClientKey,
    LocalApi,
    create_key,
    key_secret,
    lan_addresses,
    local_api,
    revoke_key,
    tool_settings,
)
from k3desk.core.app.operations import Operation
from k3desk.core.app.tool_settings import ToolSnippet, tool_snippets
from k3desk.ui.widgets import Card, label, muted, say_copied, set_enabled

if TYPE_CHECKING:
    from k3desk.ui.context import AppContext

FREE = 1023  # the spin box's lowest value stands for "a free port each launch" (0)


class LocalApiCard(Card):
    """The port (saved with the page's other settings) and the keys (saved at once:
    a key is made or revoked when the person says so, off the GUI thread, as the keyring
    may ask to be unlocked)."""

    def __init__(self, ctx: AppContext, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.ctx = ctx
        self.setObjectName("localApiCard")
        self.body.addWidget(label("Local API for your tools", "sectionTitle"))
        self.body.addWidget(
            muted(
                "Coding agents, IDE plugins and scripts reach Kimi-K3 at one address, "
                "OpenAI- and Anthropic-compatible, with a key of their own that stays valid "
                "until you revoke it."
            )
        )
        self.body.addLayout(self._settings_form())
        self.address = muted("")
        self.address.setObjectName("apiAddress")
        self.body.addWidget(self.address)
        self._key_rows()
        self._api: LocalApi | None = None
        self.refresh()

    def _settings_form(self) -> QFormLayout:
        """Port, requests at once, network and web origin: saved with the page."""
        form = QFormLayout()
        self.port = QSpinBox()
        self.port.setObjectName("apiPort")
        self.port.setRange(FREE, 65535)
        self.port.setSpecialValueText("A free one at each launch")
        self.port.setToolTip(f"The port tools connect to on 127.0.0.1 (default {DEFAULT_PORT})")
        form.addRow("Port", self.port)
        self.parallel = QSpinBox()
        self.parallel.setObjectName("apiParallel")
        self.parallel.setRange(1, MAX_PARALLEL)
        self.parallel.setToolTip(
            "Requests the engine answers at once (--parallel). Each gets its share of the "
            "context and its own state (about 443 MiB for Kimi-K3); more wait their turn. "
            "The launch plan counts them. With more than one, tools' conversations are "
            "read again after a restart (the engine puts them in any slot); the chat "
            "window's are still kept."
        )
        form.addRow("Requests at once", self.parallel)
        self.lan = QCheckBox("Reachable from other devices on your networks")
        self.lan.setObjectName("apiLan")
        self.lan.setToolTip(
            "The engine listens on every network interface of this machine from its next "
            "start; every request still needs one of your keys."
        )
        form.addRow("Network", self.lan)
        self.origin = QLineEdit()
        self.origin.setObjectName("apiCorsOrigin")
        self.origin.setPlaceholderText(
            "None: only pages of this machine (e.g. http://10.0.0.5:3000)"
        )
        self.origin.setToolTip("The one web origin whose pages may read answers")
        form.addRow("Web origin", self.origin)
        self.port.valueChanged.connect(lambda _v: self._show_address())
        self.lan.toggled.connect(lambda _on: self._show_address())
        return form

    def _key_rows(self) -> None:
        """The keys list and what can be done with the selected key."""
        self.keys = QListWidget()
        self.keys.setObjectName("apiKeys")
        self.keys.setMaximumHeight(110)
        self.body.addWidget(self.keys)
        row = QHBoxLayout()
        self.new_key = QPushButton("New key…")
        self.new_key.setObjectName("newApiKey")
        self.copy_key = QPushButton("Copy key")
        self.copy_key.setObjectName("copyApiKey")
        self.copy_for = QToolButton()
        self.copy_for.setObjectName("copyApiSettings")
        self.copy_for.setText("Copy settings for…")
        self.copy_for.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        menu = QMenu(self.copy_for)
        for n, snippet in enumerate(tool_snippets("http://127.0.0.1", "")):
            action = menu.addAction(snippet.label)
            action.triggered.connect(lambda _=False, n=n: self._copy_settings(n))
        self.copy_for.setMenu(menu)
        self.revoke = QPushButton("Revoke")
        self.revoke.setObjectName("revokeApiKey")
        self.revoke.setProperty("danger", True)
        for w in (self.new_key, self.copy_key, self.copy_for, self.revoke):
            row.addWidget(w)
        row.addStretch(1)
        self.body.addLayout(row)
        self.note = muted("")
        self.note.setObjectName("apiNote")
        self.body.addWidget(self.note)
        self.new_key.clicked.connect(self._new_key)
        self.copy_key.clicked.connect(self._copy_key)
        self.revoke.clicked.connect(self._revoke)
        self.keys.currentRowChanged.connect(lambda _r: self._buttons())

    # ------------------------------------------------------------------ values
    def set_port(self, port: int) -> None:
        self.port.setValue(port or FREE)
        self._show_address()

    def port_value(self) -> int:
        value = self.port.value()
        return 0 if value == FREE else value

    def _show_address(self) -> None:
        port = self.port_value()
        self.origin.setEnabled(self.lan.isChecked())
        if not port:
            self.address.setText("The address changes at each launch: tools lose it.")
        elif self.lan.isChecked():
            others = ", ".join(f"http://{a}:{port}/v1" for a in lan_addresses()) or "none now"
            self.address.setText(
                "Warning: other devices that hold one of your keys can use Kimi-K3 here: "
                f"{others} (and http://127.0.0.1:{port}/v1 on this machine)."
            )
        else:
            self.address.setText(
                f"OpenAI SDK: http://127.0.0.1:{port}/v1  ·  Anthropic SDK: "
                f"http://127.0.0.1:{port}  ·  this machine only"
            )

    # ------------------------------------------------------------------ keys
    def refresh(self) -> None:
        """Read the keys (off the GUI thread) and list them."""
        op = Operation("api-keys", lambda _token: local_api(self.ctx.services, self.ctx.settings))
        self.ctx.ops.run(op, on_success=self._show_keys)

    def _show_keys(self, api: LocalApi) -> None:
        if not shiboken6.isValid(self):
            return
        self._api = api
        current = self.selected()
        self.keys.clear()
        for key in api.keys:
            made = time.strftime("%Y-%m-%d", time.localtime(key.created))
            item = QListWidgetItem(f"{key.name}    {key.shown}    made {made}")
            kept = "the system keyring" if key.place == "keyring" else "a private file"
            item.setToolTip(f"Kept in {kept}")
            self.keys.addItem(item)
            if current is not None and key.id == current.id:
                self.keys.setCurrentItem(item)
        if not api.keys:
            self.keys.addItem("No keys yet: New key… makes one for a tool.")
        if api.warning:
            self.note.setText(api.warning)
        self._buttons()

    def selected(self) -> ClientKey | None:
        api, row = self._api, self.keys.currentRow()
        if api is None or not 0 <= row < len(api.keys):
            return None
        return api.keys[row]

    def _buttons(self) -> None:
        has_keys = bool(self._api and self._api.keys)
        chosen = self.selected() is not None
        set_enabled(self.copy_key, chosen, "Select a key first.")
        set_enabled(self.revoke, chosen, "Select a key first.")
        set_enabled(self.copy_for, has_keys, "Make a key first: New key…")

    def _new_key(self) -> None:
        name, ok = QInputDialog.getText(
            self, "New API key", "What is the key for? (for example: vscode, my-agent)"
        )
        if not ok or not name.strip():
            return

        def made(result: tuple[ClientKey, str]) -> None:
            key, secret = result
            QGuiApplication.clipboard().setText(secret)
            self._say(f"Made key {key.name!r} and copied it. {self._restart_note()}")
            self.refresh()

        op = Operation("api-key-create", lambda _token: create_key(self.ctx.services, name))
        self.ctx.ops.run(op, on_success=made, on_failure=self._failed)

    def _copy_key(self) -> None:
        key = self.selected()
        if key is None:
            return

        def copy(secret: str) -> None:
            QGuiApplication.clipboard().setText(secret)
            say_copied(self.copy_key)

        op = Operation("api-key-copy", lambda _token: key_secret(self.ctx.services, key.name))
        self.ctx.ops.run(op, on_success=copy, on_failure=self._failed)

    def _copy_settings(self, index: int) -> None:
        key = self.selected()
        name = key.name if key is not None else ""
        port = self.port_value()
        url = f"http://127.0.0.1:{port}" if port else ""

        def copy(snippets: tuple[ToolSnippet, ...]) -> None:
            QGuiApplication.clipboard().setText(snippets[index].text)
            say_copied(self.copy_for)

        def work(_token: object) -> tuple[ToolSnippet, ...]:
            return tool_settings(self.ctx.services, self.ctx.settings, name, url=url)

        op = Operation("api-settings-copy", work)
        self.ctx.ops.run(op, on_success=copy, on_failure=self._failed)

    def _revoke(self) -> None:
        key = self.selected()
        if key is None:
            return
        answer = QMessageBox.question(
            self,
            "Revoke the key?",
            f"Tools using the key {key.name!r} ({key.shown}) will be refused.",
        )
        if answer != QMessageBox.StandardButton.Yes:
            return

        def done(gone: ClientKey) -> None:
            self._say(f"Revoked key {gone.name!r}. {self._restart_note()}")
            self.refresh()

        op = Operation("api-key-revoke", lambda _token: revoke_key(self.ctx.services, key.name))
        self.ctx.ops.run(op, on_success=done, on_failure=self._failed)

    def _restart_note(self) -> str:
        running = self.ctx.engine.endpoint() is not None
        return RESTART_NOTE.split(" (")[0] + " (Relaunch)." if running else ""

    def _say(self, text: str) -> None:
        if shiboken6.isValid(self):
            self.note.setText(text)

    def _failed(self, exc: BaseException) -> None:
        message = getattr(exc, "message", str(exc))
        hint = getattr(exc, "hint", "")
        self._say(f"{message} {hint}".strip())
