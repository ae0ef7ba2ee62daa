"""The chat window: conversation list, message view, composer and a status line."""

from __future__ import annotations

import html
import time
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import QEvent, QObject, QPoint, QRect, QSize, Qt, QUrl
from PySide6.QtGui import QImage, QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QInputDialog,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMenu,
    QMessageBox,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QSplitter,
    QStyle,
    QStyleOptionViewItem,
    QVBoxLayout,
    QWidget,
)

from k3desk.core.app.chat import (
    SAMPLER_LABELS,
    ChatSettings,
    PreparedImage,
    ServerInfo,
    query_words,
    snippet_spans,
)
from k3desk.core.app.folders import Kind, start_folder
from k3desk.core.app.values import EFFORTS, K3Error, safe_file_name
from k3desk.ui import theme
from k3desk.ui.chat.composer import Composer
from k3desk.ui.chat.controller import ChatController, ListEntry, OpenState
from k3desk.ui.chat.picker import ModelPicker
from k3desk.ui.chat.view import MessageView, MessageVM
from k3desk.ui.model_switch import running_shard, switch_to
from k3desk.ui.pages import Navigator, Page, PageKey
from k3desk.ui.widgets import ElidedButton, ElidedLabel, muted, set_enabled

if TYPE_CHECKING:
    from k3desk.core.app.hub_choice import SetDownload
    from k3desk.core.app.library import LocalModel
    from k3desk.ui.context import AppContext
    from k3desk.ui.engine.controller import LaunchRequest

ROLE_ID = Qt.ItemDataRole.UserRole
ROLE_HIT = Qt.ItemDataRole.UserRole + 1  # the message a search found (None: the title)
LAST_CONVERSATION_KEY = "conversation"  # Settings.recent: the one open at exit


def when(ts: float) -> str:
    age = time.time() - ts
    if age < 60:
        return "just now"
    if age < 3600:
        return f"{int(age // 60)} min ago"
    if age < 86400:
        return time.strftime("%H:%M", time.localtime(ts))
    return time.strftime("%d %b", time.localtime(ts))


class ChatSettingsDialog(QDialog):
    """System prompt, sampling, thinking, answer length and stop sequences for one
    conversation.  With ``server`` known, what that server does not take is shown
    disabled, with the reason, and its limits bound the answer length."""

    def __init__(
        self,
        prompt: str,
        s: ChatSettings,
        parent: QWidget | None = None,
        server: ServerInfo | None = None,
    ) -> None:
        super().__init__(parent)
        self.setWindowTitle("Conversation settings")
        self.setMinimumWidth(460)
        form = QFormLayout(self)
        self.prompt = QPlainTextEdit(prompt)
        self.prompt.setPlaceholderText("Optional: how Kimi-K3 should behave in this chat")
        self.prompt.setMinimumHeight(90)
        form.addRow("System prompt", self.prompt)
        self._add_sampling(form, s)
        self._add_samplers(form, s)
        self._add_answer(form, s, server)
        self._server = server
        self.server_note = muted("")
        self.server_note.setObjectName("serverNote")
        self.server_note.setWordWrap(True)
        form.addRow(self.server_note)
        self.thinking.toggled.connect(lambda _on: self._enable())
        self._enable()
        self._base = s
        box = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel
        )
        box.accepted.connect(self.accept)
        box.rejected.connect(self.reject)
        form.addRow(box)

    def _add_sampling(self, form: QFormLayout, s: ChatSettings) -> None:
        """Temperature and top-p."""
        self.temperature = QDoubleSpinBox()
        self.temperature.setRange(0.0, 2.0)
        self.temperature.setSingleStep(0.05)
        self.temperature.setValue(s.temperature)
        form.addRow("Temperature", self.temperature)
        self.top_p = QDoubleSpinBox()
        self.top_p.setRange(0.01, 1.0)
        self.top_p.setSingleStep(0.01)
        self.top_p.setValue(s.top_p)
        form.addRow("Top-p", self.top_p)

    def _add_samplers(self, form: QFormLayout, s: ChatSettings) -> None:
        """Top-k, min-p, repeat penalty and seed."""
        # the samplers people set in LM Studio and Jan; the lowest value of each: not sent,
        # the server's own applies
        self.top_k = QSpinBox()
        self.top_k.setObjectName("topK")
        self.top_k.setRange(-1, 1000)
        self.top_k.setSpecialValueText("Server default")
        self.top_k.setValue(-1 if s.top_k is None else s.top_k)
        self.top_k.setToolTip("Pick from the K most likely tokens only (0: no limit)")
        form.addRow("Top-k", self.top_k)
        self.min_p = QDoubleSpinBox()
        self.min_p.setObjectName("minP")
        self.min_p.setRange(-0.01, 1.0)
        self.min_p.setSingleStep(0.01)
        self.min_p.setSpecialValueText("Server default")
        self.min_p.setValue(-0.01 if s.min_p is None else s.min_p)
        self.min_p.setToolTip(
            "Drop tokens less likely than this share of the most likely one (0: off)"
        )
        form.addRow("Min-p", self.min_p)
        self.repeat_penalty = QDoubleSpinBox()
        self.repeat_penalty.setObjectName("repeatPenalty")
        self.repeat_penalty.setRange(0.0, 2.0)
        self.repeat_penalty.setSingleStep(0.05)
        self.repeat_penalty.setSpecialValueText("Server default")
        self.repeat_penalty.setValue(0.0 if s.repeat_penalty is None else s.repeat_penalty)
        self.repeat_penalty.setToolTip("Make repeating recent tokens less likely (1.0: off)")
        form.addRow("Repeat penalty", self.repeat_penalty)
        self.seed = QSpinBox()
        self.seed.setObjectName("seed")
        self.seed.setRange(-1, 2**31 - 1)
        self.seed.setSpecialValueText("Random")
        self.seed.setValue(-1 if s.seed is None else s.seed)
        self.seed.setToolTip("The same seed and settings give the same answer again")
        form.addRow("Seed", self.seed)

    def _add_answer(self, form: QFormLayout, s: ChatSettings, server: ServerInfo | None) -> None:
        """Thinking, its effort, the answer's length and where it stops."""
        self.thinking = QCheckBox("Think before answering")
        self.thinking.setChecked(s.thinking)
        form.addRow("Thinking", self.thinking)
        self.effort = QComboBox()
        for e in EFFORTS:
            self.effort.addItem(e or "Template default", e)
        self.effort.setCurrentIndex(max(0, self.effort.findData(s.thinking_effort or "")))
        form.addRow("Effort", self.effort)
        self.max_tokens = QSpinBox()
        self.max_tokens.setObjectName("maxTokens")
        limit = server.limits.max_tokens if server is not None else None
        self.max_tokens.setRange(0, limit or 1_000_000)
        self.max_tokens.setSpecialValueText("As many as the server allows")
        self.max_tokens.setValue(min(s.max_tokens or 0, self.max_tokens.maximum()))
        form.addRow("Max tokens", self.max_tokens)
        self.stop = QPlainTextEdit("\n".join(s.stop))
        self.stop.setObjectName("stopSequences")
        self.stop.setPlaceholderText("Optional: end the answer where one of these lines would come")
        self.stop.setMaximumHeight(60)
        form.addRow("Stop at", self.stop)

    def _enable(self) -> None:
        """What the server cannot take is disabled, and the note says why (and its limits)."""
        server = self._server
        kind = server.kind if server is not None else None
        effort_ok = kind is None or kind.effort
        sampling_ok = kind is None or kind.sampling
        self.effort.setEnabled(self.thinking.isChecked() and effort_ok)
        self.temperature.setEnabled(sampling_ok)
        self.top_p.setEnabled(sampling_ok)
        taken = {name for name, _wire in kind.samplers} if kind is not None else None
        for name, box in self._samplers():
            box.setEnabled(taken is None or name in taken)
        self.seed.setEnabled(kind is None or kind.seed)
        if server is None or kind is None:
            self.server_note.setText("")
            return
        notes = [f"This chat goes to a {kind.label}."]
        if not effort_ok:
            why = f"The {kind.label} takes no thinking effort (its template's default applies)."
            self.effort.setToolTip(why)
            notes.append(why)
        if not sampling_ok:
            why = f"The {kind.label} decodes greedily: temperature and top-p have no effect."
            for w in (self.temperature, self.top_p):
                w.setToolTip(why)
            notes.append(why)
        unread = [SAMPLER_LABELS[n] for n, box in self._samplers() if not box.isEnabled()]
        if unread:
            why = f"The {kind.label} takes no {', '.join(unread)}: the server's own applies."
            for _name, box in self._samplers():
                if not box.isEnabled():
                    box.setToolTip(why)
            notes.append(why)
        if not kind.seed:
            self.seed.setToolTip(f"The {kind.label} takes no seed.")
        if kind.stop == "client":
            notes.append("It takes no stop sequences: k3desk ends the answer there itself.")
        limits = server.limits_text()
        if limits:
            notes.append(f"It allows {limits}.")
        self.server_note.setText(" ".join(notes))

    def _samplers(self) -> tuple[tuple[str, QSpinBox | QDoubleSpinBox], ...]:
        return (
            ("top_k", self.top_k),
            ("min_p", self.min_p),
            ("repeat_penalty", self.repeat_penalty),
        )

    def values(self) -> tuple[str, ChatSettings]:
        effort = str(self.effort.currentData() or "") or None
        stops = tuple(x for x in self.stop.toPlainText().splitlines() if x)

        def chosen(box: QSpinBox | QDoubleSpinBox) -> float | None:
            # the special value at the bottom of the range: not set
            return None if box.value() == box.minimum() else round(box.value(), 3)

        top_k = chosen(self.top_k)
        seed = chosen(self.seed)
        return self.prompt.toPlainText().strip(), ChatSettings(
            temperature=round(self.temperature.value(), 3),
            top_p=round(self.top_p.value(), 3),
            top_k=None if top_k is None else int(top_k),
            min_p=chosen(self.min_p),
            repeat_penalty=chosen(self.repeat_penalty),
            max_tokens=self.max_tokens.value() or None,
            seed=None if seed is None else int(seed),
            thinking=self.thinking.isChecked(),
            thinking_effort=effort if self.thinking.isChecked() else None,
            stop=stops,
            extra_body=self._base.extra_body,
        )


class ChatPage(Page):
    def __init__(self, ctx: AppContext, window: Navigator | None = None) -> None:
        super().__init__()
        self.ctx = ctx
        self.nav = window
        self.engine = ctx.engine
        self.chat = ChatController(ctx, self.engine, self)
        self._editing: int | None = None
        self._jump: tuple[int, str] | None = None  # a search hit to show once it is open

        root = QHBoxLayout(self)
        root.setContentsMargins(0, 0, 0, 0)
        split = QSplitter()
        root.addWidget(split)

        split.addWidget(self._conversation_list())
        split.addWidget(self._conversation())
        split.setStretchFactor(1, 1)
        split.setSizes([260, 1000])
        self._wire()
        self._engine_changed()
        self.chat.refresh_list()
        self.chat.new_conversation()
        last = ctx.settings.recent.get(LAST_CONVERSATION_KEY)
        if isinstance(last, int):
            self.chat.open(last, quiet=True)  # where the person left off (if still there)

    # ------------------------------------------------------------ building
    def _conversation_list(self) -> QWidget:
        """New chat, the search, and the conversations."""
        left = QWidget()
        left.setMinimumWidth(220)
        llay = QVBoxLayout(left)
        llay.setContentsMargins(10, 12, 6, 10)
        self.new_btn = QPushButton("New chat")
        self.new_btn.setToolTip("Start a new conversation (Ctrl+N)")
        self.new_btn.setObjectName("newChat")
        theme.set_icon(self.new_btn, "plus")
        llay.addWidget(self.new_btn)
        self.search = QLineEdit()
        self.search.setObjectName("chatSearch")
        self.search.setPlaceholderText("Search conversations (Ctrl+F)")
        self.search.setClearButtonEnabled(True)
        llay.addWidget(self.search)
        self.list = QListWidget()
        self.list.setObjectName("convList")
        self.list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.list.setToolTip("Right-click for rename, export and delete; Delete deletes")
        # a long title is elided at the list's edge, never scrolled to sideways
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.list.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.list.viewport().installEventFilter(self)
        llay.addWidget(self.list, 1)
        self.list_empty = muted("No conversations yet. Type below to start one.")
        self.list_empty.setAlignment(Qt.AlignmentFlag.AlignCenter)
        llay.addWidget(self.list_empty)
        return left

    def _conversation(self) -> QWidget:
        """The open conversation: its header, the messages, the composer and the status."""
        right = QWidget()
        rlay = QVBoxLayout(right)
        rlay.setContentsMargins(16, 10, 16, 8)
        rlay.setSpacing(6)
        rlay.addLayout(self._header())
        self.view = MessageView()
        rlay.addWidget(self.view, 1)
        self.editing_bar = muted("")
        self.editing_bar.hide()
        rlay.addWidget(self.editing_bar)
        self.composer = Composer()
        self.composer.start_folder = lambda: str(
            start_folder(Kind.IMAGE, self.ctx.settings, self.ctx.services.paths)
        )
        rlay.addWidget(self.composer)
        self.status = muted("")
        self.status.setObjectName("chatStatus")
        rlay.addWidget(self.status)
        # "Exported to <file>" with a link that opens it
        self.notice = QLabel("")
        self.notice.setObjectName("chatNotice")
        self.notice.setTextFormat(Qt.TextFormat.RichText)
        self.notice.setOpenExternalLinks(True)
        self.notice.setWordWrap(True)
        self.notice.hide()
        rlay.addWidget(self.notice)
        return right

    def _header(self) -> QHBoxLayout:
        """The title, the model answering, Relaunch, Export, Delete and Chat settings."""
        head = QHBoxLayout()
        titles = QVBoxLayout()
        titles.setSpacing(0)
        self.title = ElidedLabel("New chat", "sectionTitle")  # a long title elided
        titles.addWidget(self.title)
        # which model answers here (the engine's, the cluster's or the attached server's)
        self.model_label = muted("")
        self.model_label.setObjectName("chatModel")
        self.model_label.setToolTip("The model answering in this chat")
        titles.addWidget(self.model_label)
        # the model loaded now, and the others of My models one choice away: shown in the
        # label's place (the label keeps the text, read by the automation hook)
        self.picker = ModelPicker(self.ctx)
        titles.addWidget(self.picker, 0, Qt.AlignmentFlag.AlignLeft)
        # the model launched last, one click away when nothing runs: under the picker, its
        # name elided where the header is narrow (a 1024x700 screen), never cut
        self.relaunch_btn = ElidedButton("")
        self.relaunch_btn.setObjectName("relaunchModel")
        theme.set_icon(self.relaunch_btn, "engine")
        self.relaunch_btn.hide()
        self._relaunching = ""  # the composer's "Relaunching …" notice while it is shown
        self._state_said = ""  # the composer's notice of where the last prompt came from
        titles.addSpacing(4)
        titles.addWidget(self.relaunch_btn, 0, Qt.AlignmentFlag.AlignLeft)
        head.addLayout(titles, 1)
        self.export_btn = QPushButton("Export")
        self.export_btn.setObjectName("exportChat")
        export_menu = QMenu(self.export_btn)
        export_menu.addAction("As Markdown… (Ctrl+E)", lambda: self.export_current("md"))
        export_menu.addAction("As JSON…", lambda: self.export_current("json"))
        self.export_btn.setMenu(export_menu)
        head.addWidget(self.export_btn)
        self.delete_btn = QPushButton("Delete")
        self.delete_btn.setObjectName("deleteChat")
        head.addWidget(self.delete_btn)
        self.settings_btn = QPushButton("Chat settings…")
        self.settings_btn.setObjectName("chatSettings")
        self.settings_btn.setToolTip("System prompt, sampling and thinking for this conversation")
        head.addWidget(self.settings_btn)
        return head

    def _wire(self) -> None:
        """The controls drive the controller; its news reach the page."""
        self.new_btn.clicked.connect(self.new_chat)
        self.search.textChanged.connect(self.chat.search)
        self.list.currentItemChanged.connect(self._select)
        self.list.customContextMenuRequested.connect(self._menu)
        self.settings_btn.clicked.connect(self.edit_settings)
        self.delete_btn.clicked.connect(self.delete_current)
        self.relaunch_btn.clicked.connect(self.relaunch)
        self.picker.chosen.connect(self.switch_model)
        self.chat.exported.connect(self._exported)
        self._shortcuts()
        self._header_buttons()
        self.view.action.connect(self._action)
        self.composer.send_requested.connect(self._send)
        self.composer.stop_requested.connect(self._stop)
        self.composer.files_added.connect(self.chat.prepare_files)
        self.composer.image_pasted.connect(self.chat.prepare_bytes)
        self.chat.image_ready.connect(self._image_ready)
        self.chat.image_refused.connect(self.composer.show_notice)
        self.chat.projector_missing.connect(self._offer_projector)
        self.chat.withheld.connect(self.composer.show_notice)
        self.chat.engine_state.connect(self._engine_state)
        self.chat.conversations.connect(self._fill_list)
        self.chat.opened.connect(self._show)
        self.chat.stream_started.connect(self.view.begin_stream)
        self.chat.stream_update.connect(self.view.update_stream)
        self.chat.stream_finished.connect(self._finished)
        self.chat.busy.connect(self.composer.set_streaming)
        self.chat.status.connect(lambda _s: self._update_status())
        self.engine.state_changed.connect(lambda _s, _m: self._engine_changed())
        # another model starts a new conversation unless the person chose to continue
        last = self.engine.request.shard if self.engine.request is not None else None
        if last is None:  # what runs now, launched with its -m given directly
            last = running_shard(self.engine)
        if last is None:
            known = self.engine.last_model()
            last = Path(known.shard) if known is not None else None
        self._loaded_shard: Path | None = last
        self.engine.launched.connect(self._model_launched)
        self.ctx.settings_changed.connect(lambda _s: self._engine_changed())
        if self.ctx.theme is not None:
            self.ctx.theme.changed.connect(self._restyle)

    def _offer_projector(self, offer: SetDownload | None) -> None:
        """An image refused for a set downloaded without its projector: a button that
        downloads it into the set's folder (the same download `k3desk download
        --projector-for` makes), then Downloads shows it."""
        if offer is None:
            return

        def fetch() -> None:
            try:
                self.ctx.downloads.start(offer.request, offer.target)
            except Exception as exc:  # noqa: BLE001 - shown to the user
                self.ctx.reporter.report(exc)
                return
            self.composer.show_notice(
                f"Downloading the projector into {offer.target}: once it is verified, "
                "launch the model again (My models) and it reads images.",
                warn=False,
            )
            if self.nav is not None:
                self.nav.show_page(PageKey.DOWNLOADS)

        self.composer.offer("Download the projector", fetch)

    def _shortcuts(self) -> None:
        """Ctrl+N new chat, Ctrl+F search, Ctrl+E export, Delete (in the list) delete."""
        ctx = Qt.ShortcutContext.WidgetWithChildrenShortcut
        for keys, slot in (
            ("Ctrl+N", self.new_chat),
            ("Ctrl+F", self.focus_search),
            ("Ctrl+E", lambda: self.export_current("md")),
        ):
            sc = QShortcut(QKeySequence(keys), self)
            sc.setContext(ctx)
            sc.activated.connect(slot)
        delete = QShortcut(QKeySequence(QKeySequence.StandardKey.Delete), self.list)
        delete.setContext(Qt.ShortcutContext.WidgetShortcut)
        delete.activated.connect(self._delete_selected)

    def focus_search(self) -> None:
        self.search.setFocus()
        self.search.selectAll()

    def _header_buttons(self) -> None:
        has = self.chat.current is not None
        why = "Nothing to export or delete yet: this chat starts with its first message."
        set_enabled(self.export_btn, has, why, "Save this conversation to a file (Ctrl+E)")
        set_enabled(self.delete_btn, has, why, "Delete this conversation and all its branches")

    # ------------------------------------------------------------- engine
    def relaunch(self) -> None:
        """Launch the model launched last (checked and planned as on the Engine page)."""
        last = self.engine.relaunch_last(on_error=self._relaunch_failed)
        if last is not None:
            self.relaunch_btn.setEnabled(False)
            self._relaunching = f"Relaunching {last.name or Path(last.shard).name}…"
            self.composer.show_notice(self._relaunching, warn=False)

    def _engine_state(self, text: str, resumed: bool) -> None:
        """Where this answer's prompt comes from (``resumed``: from its kept state, news
        that asks nothing); what was said of an earlier one goes."""
        if text:
            self.composer.show_notice(text, warn=not resumed)
        elif self._state_said and self.composer.notice.text() == self._state_said:
            self.composer.show_notice("")
        self._state_said = text

    def _end_relaunch_notice(self) -> None:
        """The "Relaunching …" notice goes once the engine is ready or gave up."""
        text, self._relaunching = self._relaunching, ""
        if text and self.composer.notice.text() == text:
            self.composer.show_notice("")

    def switch_model(self, model: LocalModel) -> None:
        """Load ``model`` (from the header's picker): checked and planned for this machine,
        then switched to as "Chat with it" on My models does (asked with its load time when
        a model runs; a new conversation unless the person continues this one)."""
        from k3desk.core.app.operations import Operation
        from k3desk.ui.engine.controller import prepare_engine_request
        from k3desk.ui.engine.page import confirm_slow_launch

        engine = self.engine
        ctx = self.ctx
        self.composer.show_notice(
            f"Checking {model.name} and planning it for this machine…", warn=False
        )

        def done(req: LaunchRequest) -> None:
            open_now = self.chat.current
            pictures = sum(len(m.images) for m in open_now.messages) if open_now else 0
            if switch_to(self, engine, req, pictures) is None:
                self.composer.show_notice(
                    f"{engine.model_name()} keeps running; {model.name} was not loaded."
                )
                return
            self.composer.show_notice(f"Loading {model.name}…", warn=False)

        def error(exc: BaseException) -> None:
            from k3desk.core.app.launch import SlowLaunchError

            slow = confirm_slow_launch(self, exc)
            if slow is not None:
                done(slow)
            elif not isinstance(exc, SlowLaunchError):
                self.composer.show_notice("")
                ctx.reporter.report(exc)

        op = Operation(
            "prepare-launch", lambda t: prepare_engine_request(ctx, model.shard, model.projector, t)
        )
        ctx.ops.run(op, on_success=done, on_failure=error)

    def _relaunch_failed(self, exc: BaseException) -> None:
        """A relaunch that streams from disk is started once accepted (the same
        confirmation as the Engine page's); any other failure is reported."""
        from k3desk.core.app.launch import SlowLaunchError
        from k3desk.ui.engine.page import confirm_slow_launch

        slow = confirm_slow_launch(self, exc)
        if slow is not None:
            self.engine.launch(slow)
            return
        self._end_relaunch_notice()
        if not isinstance(exc, SlowLaunchError):
            self.ctx.reporter.report(exc)
        else:
            self.relaunch_btn.setEnabled(True)

    def _relaunch_offer(self) -> None:
        last = None if self.engine.running else self.engine.last_model()
        show = last is not None and self.engine.chat_endpoint() is None
        self.relaunch_btn.setVisible(show)
        if last is None or not show:
            return
        self.relaunch_btn.setEnabled(True)
        name = last.name or Path(last.shard).name
        load = last.load_text()
        self.relaunch_btn.setText(f"Relaunch {name}")
        self.relaunch_btn.setToolTip(
            f"Start {last.shard} again, as it was launched last" + (f"; it {load}" if load else "")
        )

    def relaunch_text(self) -> str:
        """The one-click relaunch offered ("" when none), as the person reads it."""
        if self.relaunch_btn.isHidden():
            return ""
        return f"{self.relaunch_btn.text()} ({self.relaunch_btn.toolTip()})"

    def _engine_changed(self) -> None:
        self._relaunch_offer()
        ep = self.engine.chat_endpoint()
        if ep is not None or not self.engine.running:
            self._end_relaunch_notice()  # ready, or it gave up
        if ep is None:
            self.composer.set_availability(False, self._why_no_chat())
        else:
            self.composer.set_availability(True)
            # what it is decides how requests are built and what the settings offer
            self.chat.find_server(lambda _info: self._update_status())
        self._update_status()
        if not self.view.messages():
            self._show_empty()

    def _why_no_chat(self) -> str:
        """Why Send is closed, in the words the status bar and the Engine page use."""
        engine = self.engine
        if engine.running:  # starting or loading: one loading state everywhere
            name = engine.model_name() or "The model"
            return (
                f"{name} is loading ({engine.state_text()}): Send opens when it is ready. "
                "You can type meanwhile."
            )
        if not self.relaunch_btn.isHidden():
            return (
                f"Nothing runs now: press {self.relaunch_btn.text()} above, or start another "
                "model on the Engine page (Ctrl+4)."
            )
        return (
            "No engine is running: start Kimi-K3 on the Engine page (Ctrl+4), or run it "
            "across machines or attach a remote server on the Cluster page (Ctrl+6)."
        )

    def _restyle(self, _colors: object) -> None:
        """Draw the conversation again in the theme's colours (text, code, links)."""
        if self.view.messages():
            self.view.restyle()
        else:
            self._show_empty()

    def _show_empty(self) -> None:
        last = None if self.engine.running else self.engine.last_model()
        if self.engine.chat_endpoint() is None and last is not None:
            name = last.name or Path(last.shard).name
            load = last.load_text()
            self.view.set_empty_text(
                f"Nothing runs now. {name} was launched last" + (f"; it {load}." if load else "."),
                links=((f"Relaunch {name}", "relaunch"), ("Open the Engine page", "engine")),
            )
        elif self.engine.chat_endpoint() is None:
            self.view.set_empty_text(
                "Nothing to chat with yet. Start Kimi-K3 on the Engine page (Ctrl+4), run it "
                "across several machines or attach a remote server on the Cluster page "
                "(Ctrl+6), or run the set-up wizard from Settings.",
                links=(("Open the Engine page", "engine"), ("Open the Cluster page", "cluster")),
            )
        else:
            self.view.set_empty_text(
                "Ask Kimi-K3 anything. Attach images with the clip, drop or paste them."
            )

    def _update_status(self) -> None:
        server = self.chat.server()
        # the local engine's state is the status bar's (said once); the line names the
        # place the chat goes only when it is elsewhere (a cluster, an attached server)
        external = self.engine.endpoint() is None and self.engine.chat_endpoint() is not None
        where = self.engine.state_text() if external else ""
        if server is not None and external:
            where += f": {server.kind.label}"
        parts = [where, *self.chat.answer_stats()]
        self.status.setText("  ·  ".join(p for p in parts if p))
        model = self.engine.model_text()
        self.model_label.setText(model)
        self.model_label.hide()
        self.picker.set_loaded_text(model)

    def _model_launched(self, req: LaunchRequest) -> None:
        before, shard = self._loaded_shard, req.shard
        if shard is None:
            return
        self._loaded_shard = shard
        if before is None or shard == before or req.continue_chat:
            return
        if self.chat.current is not None and not self.chat.streaming:
            # a new conversation for the new model; what is typed in the composer stays
            self.list.blockSignals(True)
            self.list.clearSelection()
            self.list.setCurrentRow(-1)
            self.list.blockSignals(False)
            self._cancel_edit()
            self.chat.new_conversation()

    # ------------------------------------------------------ conversations
    def new_chat(self) -> None:
        if self.chat.streaming:
            return
        self.list.blockSignals(True)
        self.list.clearSelection()
        self.list.setCurrentRow(-1)
        self.list.blockSignals(False)
        self._cancel_edit()
        self.composer.clear()
        self.chat.new_conversation()
        self.composer.edit.setFocus()

    def _fill_list(self, entries: list[ListEntry]) -> None:
        current = self.chat.current.conversation.id if self.chat.current else None
        query = self.chat.search_text.strip()
        c = theme.current()
        self.list.blockSignals(True)
        self.list.clear()
        for e in entries:
            conv = e.conversation
            item = QListWidgetItem(f"{conv.title}\n{when(conv.updated)}")
            item.setData(ROLE_ID, conv.id)
            item.setData(ROLE_HIT, e.message_id)
            item.setToolTip(conv.title)
            self.list.addItem(item)
            if query:
                # the title, and the words found, marked, in what surrounds them
                spans = snippet_spans(e.snippet or conv.title, query)
                found = "".join(
                    f'<b style="background:{c.mark}; color:{c.mark_text};">{html.escape(t)}</b>'
                    if hit
                    else html.escape(t)
                    for t, hit in spans
                )
                cell = QLabel(
                    f"<b>{html.escape(conv.title)}</b><br/>"
                    f'<span style="color:{c.muted};">{found}</span>'
                )
                cell.setObjectName("searchHit")
                cell.setWordWrap(True)
                cell.setContentsMargins(6, 4, 6, 4)
                cell.setAttribute(Qt.WidgetAttribute.WA_TransparentForMouseEvents)
                item.setText("")
                self.list.setItemWidget(item, cell)
            if conv.id == current:
                self.list.setCurrentItem(item)
        self.list.blockSignals(False)
        self._fit_hits()
        searching = bool(self.chat.search_text.strip())
        self.list_empty.setText(
            "No conversation matches."
            if searching
            else "No conversations yet. Type below to start one."
        )
        self.list_empty.setVisible(not entries)

    def _fit_hits(self) -> None:
        """Each search result as tall as its wrapped text at the list's width (a size
        taken before the text wraps cuts the snippet off)."""
        width = self.list.viewport().width()
        # the room inside an item's margin and padding (app.qss: #convList::item)
        opt = QStyleOptionViewItem()
        opt.rect = QRect(0, 0, width, 1000)
        inner = self.list.style().subElementRect(
            QStyle.SubElement.SE_ItemViewItemText, opt, self.list
        )
        for i in range(self.list.count()):
            item = self.list.item(i)
            cell = self.list.itemWidget(item)
            if isinstance(cell, QLabel):
                high = cell.heightForWidth(inner.width()) + 1000 - inner.height()
                item.setSizeHint(QSize(width, high))

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if watched is self.list.viewport() and event.type() == QEvent.Type.Resize:
            self._fit_hits()
        return super().eventFilter(watched, event)

    def _select(self, item: QListWidgetItem | None, _prev: object = None) -> None:
        if item is None or self.chat.streaming:
            return
        hit = item.data(ROLE_HIT)
        query = self.chat.search_text.strip()
        self._jump = (int(hit), query) if hit is not None and query else None
        self.chat.open(int(item.data(ROLE_ID)))

    def search_hit_text(self, row: int) -> str:
        """The text a search result shows (title and snippet), as plain text."""
        item = self.list.item(row)
        cell = self.list.itemWidget(item) if item is not None else None
        if isinstance(cell, QLabel):
            from PySide6.QtGui import QTextDocument

            doc = QTextDocument()
            doc.setHtml(cell.text())
            return doc.toPlainText()
        return item.text() if item is not None else ""

    def _menu(self, pos: QPoint) -> None:
        item = self.list.itemAt(pos)
        if item is None:
            return
        cid = int(item.data(ROLE_ID))
        menu = QMenu(self)
        menu.addAction("Rename…", lambda: self.rename(cid))
        menu.addAction("Export as Markdown…", lambda: self.export(cid, "md"))
        menu.addAction("Export as JSON…", lambda: self.export(cid, "json"))
        menu.addSeparator()
        menu.addAction("Delete…", lambda: self.delete(cid))
        menu.popup(self.list.mapToGlobal(pos))

    def rename(self, cid: int, title: str | None = None) -> None:
        if title is None:
            old = next(
                (
                    self.list.item(i).toolTip()
                    for i in range(self.list.count())
                    if self.list.item(i).data(ROLE_ID) == cid
                ),
                "",
            )
            title, ok = QInputDialog.getText(self, "Rename conversation", "Title", text=old)
            if not ok:
                return
        if title.strip():
            self.chat.rename(cid, title)
            if self.chat.current and self.chat.current.conversation.id == cid:
                self.title.setText(title.strip())

    def current_id(self) -> int | None:
        return self.chat.current.conversation.id if self.chat.current is not None else None

    def delete_current(self) -> None:
        cid = self.current_id()
        if cid is not None:
            self.delete(cid)

    def _delete_selected(self) -> None:
        item = self.list.currentItem()
        if item is not None:
            self.delete(int(item.data(ROLE_ID)))

    def _title_of(self, cid: int) -> str:
        if self.chat.current is not None and self.chat.current.conversation.id == cid:
            return self.title.text()  # as shown (a rename shows at once)
        return next(
            (
                self.list.item(i).toolTip()
                for i in range(self.list.count())
                if self.list.item(i).data(ROLE_ID) == cid
            ),
            "",
        )

    def delete(self, cid: int, confirm: bool = True) -> None:
        if confirm:
            title = self._title_of(cid)
            named = f"“{title}”" if title else "this conversation"
            answer = QMessageBox.question(
                self,
                "Delete conversation",
                f"Delete {named} and all its branches? This cannot be undone.",
                QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.Cancel,
                QMessageBox.StandardButton.Cancel,
            )
            if answer != QMessageBox.StandardButton.Yes:
                return
        self.chat.delete(cid)

    def export_name(self, cid: int, fmt: str) -> Path:
        """Where the export dialog proposes to save: the title as a file name, in the
        documents folder."""
        suffix = "md" if fmt == "md" else "json"
        folder = start_folder(Kind.EXPORT, self.ctx.settings, self.ctx.services.paths)
        return folder / safe_file_name(self._title_of(cid), suffix)

    def export_current(self, fmt: str = "md") -> None:
        cid = self.current_id()
        if cid is not None:
            self.export(cid, fmt)

    def export(self, cid: int, fmt: str, target: Path | None = None) -> None:
        if target is None:
            name, _ = QFileDialog.getSaveFileName(
                self,
                "Export conversation",
                str(self.export_name(cid, fmt)),
                "Markdown (*.md)" if fmt == "md" else "JSON (*.json)",
            )
            if not name:
                return
            target = Path(name)
        self.chat.export(cid, target, fmt)

    def _exported(self, path: object) -> None:
        p = Path(str(path))
        url = QUrl.fromLocalFile(str(p)).toString()
        folder = QUrl.fromLocalFile(str(p.parent)).toString()
        self.notice.setText(
            f'Exported to <a href="{html.escape(url)}">{html.escape(str(p))}</a>'
            f' &nbsp;·&nbsp; <a href="{html.escape(folder)}">open the folder</a>'
        )
        self.notice.show()

    def edit_settings(self) -> None:
        prompt, s = self.chat.conversation_settings()
        dlg = ChatSettingsDialog(prompt, s, self, server=self.chat.server())
        if dlg.exec() == QDialog.DialogCode.Accepted:
            self.chat.update_settings(*dlg.values())

    # ------------------------------------------------------------ showing
    def _show(self, state: OpenState | None) -> None:
        self._cancel_edit()
        self.notice.hide()
        self._header_buttons()
        self._update_status()
        if state is None:
            self.title.setText("New chat")
            self.view.set_messages([])
            self.view.highlight([])
            self._show_empty()
            return
        self.title.setText(state.conversation.title)
        for key, img in state.thumbs.items():
            if not img.isNull():
                self.view.add_image(key, img)
        self.view.set_messages(state.vms)
        jump, self._jump = self._jump, None
        if jump is not None:
            mid, query = jump
            self.view.highlight(query_words(query), str(mid))
        else:
            self.view.highlight([])

    def _finished(self, vm: MessageVM) -> None:
        self.view.end_stream(vm)
        self._update_status()

    # ------------------------------------------------------------ actions
    def _action(self, verb: str, mid: str, arg: int) -> None:
        try:
            if verb == "regenerate":
                self.chat.regenerate(int(mid))
            elif verb == "edit":
                self.start_edit(int(mid))
            elif verb == "branch":
                self.chat.switch_branch(int(mid), arg)
            elif verb == "page" and mid == "relaunch":
                self.relaunch()
            elif verb == "page" and self.nav is not None and mid in set(PageKey):
                self.nav.show_page(PageKey(mid))
        except K3Error as exc:
            self.ctx.reporter.report(exc)

    def start_edit(self, mid: int) -> None:
        vm = next((m for m in self.view.messages() if m.id == str(mid)), None)
        if vm is None or self.chat.streaming:
            return
        self._editing = mid
        self.composer.edit.setPlainText(vm.content)
        self.editing_bar.setText(
            "Editing a message: sending starts a new branch (the old one stays). "
            "Esc cancels the edit."
        )
        self.editing_bar.show()
        self.composer.edit.setFocus()

    def _cancel_edit(self) -> None:
        self._editing = None
        self.editing_bar.hide()

    def _send(self, text: str) -> None:
        images: list[PreparedImage] = [a.image for a in self.composer.attachments]
        try:
            if self._editing is not None:
                self.chat.edit_and_resend(self._editing, text)
            else:
                self.chat.send(text, images)
        except K3Error as exc:
            self.ctx.reporter.report(exc)
            return
        self._cancel_edit()
        self.composer.clear()
        self.composer.show_notice("")

    def _stop(self) -> None:
        if self.chat.streaming:
            self.chat.stop()
        elif self._editing is not None:
            self._cancel_edit()
            self.composer.clear()

    def _image_ready(self, image: PreparedImage, thumb: QImage) -> None:
        self.composer.add_attachment(image, thumb)
        self.view.add_image(image.sha256, thumb)

    # ------------------------------------------------------------- window
    def activated(self) -> None:
        self.composer.edit.setFocus()

    def closing(self) -> None:
        self.ctx.remember(**{LAST_CONVERSATION_KEY: self.current_id()})
        self.chat.close()

    def reopening(self) -> None:
        self.chat.reopen()

    def controller(self) -> ChatController:
        return self.chat
