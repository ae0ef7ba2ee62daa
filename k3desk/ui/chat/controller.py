"""Chat logic for the window, over the core HistoryStore and the chat-turn use-case.

Every database call and every request runs through the task manager (history
writes on its serial pool, streams on the shared pool); this object only turns
results into view models and signals, and only on the main thread: a turn's worker
hands what it built to the main thread (``run_on_main``, the task's ``on_done``)
and writes nothing of this object's state.  The turn itself, stored as soon as it
starts (marked partial), saved every few seconds while it streams and finalised at
the end, is the core's :func:`k3desk.core.app.chat_turn.run_turn`, the same one
``k3desk chat --save`` runs.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtGui import QImage

from k3desk.core.app.chat import (
    ChatClient,
    ChatDelta,
    ChatEndpoint,
    ChatSettings,
    Conversation,
    HistoryStore,
    Kept,
    Message,
    PreparedImage,
    SearchHit,
    ServerInfo,
    Timings,
    ensure_vision,
    keeper_for,
    load_image,
    prepare_image,
)
from k3desk.core.app.chat_turn import (
    NOTE_BROKEN,
    NOTE_STOPPED,
    SAVE_EVERY_S,
    ConversationStates,
    TurnOutcome,
    TurnRecord,
    delete_conversation,
    run_turn,
    withheld_text,
)
from k3desk.core.app.hub_choice import SetDownload, projector_download
from k3desk.core.app.local_api import KEEP_WAIT
from k3desk.core.app.operations import Change, OpChanges, Operation
from k3desk.core.app.values import CancelToken, ChatError, GiB
from k3desk.ui.bridge import StreamBuffer
from k3desk.ui.chat.view import ImageVM, MessageVM

if TYPE_CHECKING:
    from k3desk.core.app.chat import Capabilities
    from k3desk.ui.context import AppContext
    from k3desk.ui.engine.controller import EngineController

log = logging.getLogger(__name__)
CHATS = OpChanges.of(Change.CHATS)

THUMB_HEIGHT = 192


@dataclass
class OpenState:
    conversation: Conversation
    messages: list[Message]
    vms: list[MessageVM]
    thumbs: dict[str, QImage] = field(default_factory=dict)


@dataclass(frozen=True)
class ListEntry:
    """A row of the conversation list: the conversation and, while searching, where the
    words were found (the first matching message and its snippet)."""

    conversation: Conversation
    snippet: str = ""
    message_id: int | None = None


@dataclass
class Figures:
    """One conversation's footer figures: its last answer's speed and the context used."""

    timings: Timings | None = None
    context: tuple[int, int | None] | None = None
    estimated: bool = False


@dataclass(frozen=True)
class StreamState:
    """The answer being written (ids known once the worker stored the question)."""

    conversation_id: int | None = None
    message_id: int | None = None
    started: float = field(default_factory=time.monotonic)


MEASURED = "measured by k3desk"  # said of figures the server did not report


def tps_text(timings: Timings | None) -> str:
    """ "42.1 tok/s", or "≈ 11.8 tok/s (measured by k3desk)" where the server said none."""
    if timings is None or timings.predicted_per_second <= 0:
        return ""
    if timings.by_client:
        return f"≈ {timings.predicted_per_second:.1f} tok/s ({MEASURED})"
    return f"{timings.predicted_per_second:.1f} tok/s"


def stats_text(m: Message) -> str:
    parts = []
    tps = tps_text(m.timings)
    if tps:
        parts.append(tps)
    if m.usage is not None and m.usage.completion_tokens:
        about = "≈ " if m.usage.estimated else ""
        parts.append(f"{about}{m.usage.completion_tokens} tokens")
    if m.finish_reason == "length" and not m.partial:
        parts.append("stopped at the token limit")
    return " · ".join(parts)


def partial_note(m: Message) -> str:
    if not m.partial:
        return ""
    if m.finish_reason == NOTE_STOPPED:
        return "stopped before the end."
    if m.finish_reason == NOTE_BROKEN:
        return "the engine stopped answering mid-way; this is what arrived."
    return "this answer did not complete."


def to_vm(m: Message, branch: tuple[int, int] = (1, 1)) -> MessageVM:
    return MessageVM(
        id=str(m.id),
        role=m.role,
        content=m.content,
        reasoning=m.reasoning,
        images=[ImageVM(img.sha256, img.name or img.path.name) for img in m.images],
        partial=m.partial,
        partial_note=partial_note(m),
        branch=branch,
        stats=stats_text(m),
    )


def load_thumb(path: Path, height: int = THUMB_HEIGHT) -> QImage:
    img = QImage(str(path))
    if img.isNull():
        return img
    if img.height() > height:
        img = img.scaledToHeight(height, Qt.TransformationMode.SmoothTransformation)
    return img


class ChatController(QObject):
    """Signals:
    conversations(object): list[ListEntry] for the list (after changes or a search).
    opened(object): an OpenState (the conversation and its current branch).
    stream_started(object): the MessageVM of the answer now streaming.
    stream_update(object): the same MessageVM with more text (at most 30 Hz).
    stream_finished(object): the final MessageVM.
    status(str): tok/s and context use of the last answer.
    busy(bool): an answer is streaming.
    image_ready(object, object): an attachment passed the checks (PreparedImage, thumbnail).
    image_refused(str): why an attachment was refused.
    projector_missing(object): with a refusal, the SetDownload of the running set's
        projector where it was downloaded without one (None: nothing to offer).
    withheld(str): the model answering has no vision, and the conversation's pictures
        were not sent to it (said once per conversation and engine).
    engine_state(str, bool): before an answer, where its prompt comes from: the
        conversation's saved engine state ("Resumed from saved state ...", True) or read
        again ("Re-reading N tokens (about T) ...", False); "" when the engine still holds
        it (what was said of an earlier answer no longer holds); after it, a state its
        disk could not take (False).
    exported(object): the Path a conversation was exported to.
    """

    conversations = Signal(object)
    opened = Signal(object)
    stream_started = Signal(object)
    stream_update = Signal(object)
    stream_finished = Signal(object)
    status = Signal(str)
    busy = Signal(bool)
    image_ready = Signal(object, object)  # PreparedImage, QImage thumbnail
    image_refused = Signal(str)
    projector_missing = Signal(object)  # SetDownload | None
    withheld = Signal(str)
    engine_state = Signal(str, bool)
    exported = Signal(object)

    def __init__(
        self, ctx: AppContext, engine: EngineController, parent: QObject | None = None
    ) -> None:
        super().__init__(parent)
        self.ctx = ctx
        self.engine = engine
        self._store: HistoryStore | None = None
        self._store_lock = threading.Lock()
        self.current: OpenState | None = None
        self.stream: StreamState | None = None
        self._vm: MessageVM | None = None
        self._task: Any = None
        self._buffer = StreamBuffer(hz=30, parent=self)
        self._buffer.batch.connect(self._on_batch)
        self.page_size = 150
        # the footer's figures belong to the conversation shown (a new chat has none)
        self.figures = Figures()
        self._figures: dict[int, Figures] = {}
        # one client per chat target, so what the server is is found out once
        self._client: ChatClient | None = None
        self._client_lock = threading.Lock()
        self._closed = False  # closed: no new client (a late background task gets a ChatError)
        # (conversation, engine) pairs already told that pictures are not sent there
        self._told: set[tuple[int, str]] = set()
        self.search_text = ""
        self._pending_settings: tuple[str, ChatSettings] | None = None
        self._states: ConversationStates | None = None
        ctx.ops.did_execute.connect(self._changed)
        # the engine stops only once the last answer's state is kept (or given up on)
        engine.before_stop.append(lambda: self.settle_kept(KEEP_WAIT))

    def settle_kept(self, timeout: float | None = None) -> bool:
        """Wait (up to ``timeout`` s) for the last answer's engine state being kept:
        before the engine stops or the chat closes.  False when that ran out."""
        states = self._states
        return states.settle(timeout) if states is not None else True

    def _changed(self, changes: OpChanges, _initiator: object) -> None:
        # renamed, deleted, answered, a branch chosen (a closed chat opens no store again)
        if changes.touches(Change.CHATS) and not self._closed:
            self.refresh_list()

    # ------------------------------------------------------------ store
    def store(self) -> HistoryStore:
        """The history (opened once, on first use, from whichever worker needs it first)."""
        with self._store_lock:
            if self._store is None:
                self._store = HistoryStore(self.ctx.services.paths.history_db)
            return self._store

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self.settle_kept(KEEP_WAIT)  # the last answer's state, before the client goes
        with self._client_lock:
            client, self._client = self._client, None
            self._closed = True
        if client is not None:
            client.close()
        if self._store is not None:
            self._store.close()
            self._store = None

    def reopen(self) -> None:
        """The window closed with the engine kept opens again: the chat goes on (a new
        client and store on first use)."""
        with self._client_lock:
            self._closed = False
        self.refresh_list()

    @property
    def streaming(self) -> bool:
        return self.stream is not None

    @property
    def last_timings(self) -> Timings | None:
        return self.figures.timings

    @property
    def last_context(self) -> tuple[int, int | None] | None:
        return self.figures.context

    def client(self, endpoint: ChatEndpoint) -> ChatClient:
        """The chat client for ``endpoint`` (kept while the chat goes there)."""
        with self._client_lock:
            if self._closed:
                raise ChatError("The chat window is closed.")
            old = self._client
            if old is not None and old.endpoint == endpoint:
                return old
            self._client = ChatClient(endpoint)
            client = self._client
        if old is not None:
            old.close()
        return client

    def _cached_caps(self) -> Capabilities | None:
        """What the current client already found out about the chat's server (None: not
        yet, or the client talks to another endpoint than the chat goes to now)."""
        endpoint = self.engine.chat_endpoint()
        with self._client_lock:
            client = self._client
        if endpoint is None or client is None or client.endpoint != endpoint:
            return None
        return client.cached_capabilities()

    def server(self) -> ServerInfo | None:
        """What the chat's server is, when already found out (else None)."""
        caps = self._cached_caps()
        return caps.server if caps is not None else None

    def _server_context(self) -> int | None:
        """The context size of the server the chat goes to, when already found out."""
        caps = self._cached_caps()
        return caps.n_ctx if caps is not None else None

    def find_server(self, on_done: Any = None) -> None:
        """Find out what the chat's server is (in the background); ``on_done(ServerInfo)``."""
        endpoint = self.engine.chat_endpoint()
        if endpoint is None:
            return

        def work(_t: CancelToken) -> ServerInfo | None:
            try:  # asked again: an engine restarted on the same port may differ now
                return self.client(endpoint).capabilities(refresh=True).server
            except ChatError:
                return None

        def done(info: ServerInfo | None) -> None:
            if on_done is not None and info is not None:
                on_done(info)

        self.ctx.ops.run(Operation("chat-server", work), on_success=done)

    def answer_stats(self) -> list[str]:
        """The last answer's speed and the context it used, for the status line."""
        parts = []
        tps = tps_text(self.last_timings)
        if tps:
            parts.append(f"last answer {tps}")
        if self.last_context is not None:
            used, total = self.last_context
            # an answer read back from the history has no limit stored: the server's
            total = total or self._server_context()
            about = "≈ " if self.figures.estimated else ""
            text = f"context {about}{used:,} / {total:,}" if total else f"context {about}{used:,}"
            if self.figures.estimated:
                text += " (estimated by k3desk)"
            parts.append(text)
        return parts

    # ------------------------------------------------------ conversations
    def refresh_list(self) -> None:
        query = self.search_text.strip()

        def work(_t: CancelToken) -> list[ListEntry]:
            store = self.store()
            if not query:
                return [ListEntry(c) for c in store.list_conversations(limit=500)]
            first: dict[int, SearchHit] = {}
            for hit in store.search(query, limit=200):
                seen = first.get(hit.conversation_id)
                # a message's words say more than the title's: the first message hit wins
                if seen is None or (seen.message_id is None and hit.message_id is not None):
                    first[hit.conversation_id] = hit
            return [
                ListEntry(store.get_conversation(cid), h.snippet, h.message_id)
                for cid, h in first.items()
            ]

        op = Operation("chat-list", work, serial=True)
        self.ctx.ops.run(op, on_success=self.conversations.emit)

    def search(self, text: str) -> None:
        self.search_text = text
        self.refresh_list()

    def open(self, conversation_id: int, quiet: bool = False) -> None:
        """Show a conversation; ``quiet``: one that is gone is no error (the one open at
        the last exit, since deleted elsewhere)."""

        def work(_t: CancelToken) -> OpenState:
            conv, msgs = self.store().open_conversation(conversation_id)
            return self._open_state(conv, msgs)

        def failed(exc: BaseException) -> None:
            if not quiet:
                self.ctx.reporter.report(exc)

        def done(state: OpenState) -> None:
            if quiet and (self.current is not None or self.streaming):
                return  # the person moved on meanwhile
            self._opened(state)

        self.ctx.ops.run(
            Operation("chat-open", work, serial=True), on_success=done, on_failure=failed
        )

    def new_conversation(self) -> None:
        """Show an empty conversation (it is created in the store on first send); the
        next message starts it, and the footer has no figures yet."""
        self.current = None
        self._pending_settings = None
        self.figures = Figures()
        self.opened.emit(None)
        self._emit_status()

    def rename(self, conversation_id: int, title: str) -> None:
        def done(conv: Conversation) -> None:
            if self.current is not None and self.current.conversation.id == conv.id:
                self.current.conversation = conv

        op = Operation(
            "chat-rename",
            lambda _t: self.store().rename_conversation(conversation_id, title),
            CHATS,
            serial=True,
        )
        self.ctx.ops.run(op, on_success=done)

    def delete(self, conversation_id: int) -> None:
        def done(_r: object) -> None:
            if self.current is not None and self.current.conversation.id == conversation_id:
                self.new_conversation()

        states = self._conversation_states()
        op = Operation(
            "chat-delete",
            lambda _t: delete_conversation(self.store(), states, conversation_id),
            CHATS,
            serial=True,
        )
        self.ctx.ops.run(op, on_success=done)

    def export(self, conversation_id: int, target: Path, fmt: str) -> None:
        op = Operation(
            "chat-export",
            lambda _t: self.store().write_export(conversation_id, target, fmt=fmt),
            serial=True,
        )
        self.ctx.ops.run(op, on_success=self.exported.emit)

    def update_settings(self, system_prompt: str, settings: ChatSettings) -> None:
        if self.current is None:
            self._pending_settings = (system_prompt, settings)
            return
        cid = self.current.conversation.id
        op = Operation(
            "chat-settings",
            lambda _t: self.store().update_conversation(
                cid, system_prompt=system_prompt, settings=settings
            ),
            serial=True,
        )
        self.ctx.ops.run(op, on_success=self._settings_saved)

    def _settings_saved(self, conv: Conversation) -> None:
        if self.current is not None and self.current.conversation.id == conv.id:
            self.current.conversation = conv

    def conversation_settings(self) -> tuple[str, ChatSettings]:
        if self.current is not None:
            c = self.current.conversation
            return c.system_prompt, c.settings
        if self._pending_settings is not None:
            return self._pending_settings
        return self.ctx.settings.system_prompt, self.default_settings()

    def default_settings(self) -> ChatSettings:
        s = self.ctx.settings
        return ChatSettings(
            temperature=s.temperature,
            top_p=s.top_p,
            thinking=s.thinking,
            thinking_effort=s.thinking_effort or None,
        )

    # ------------------------------------------------------------ images
    def prepare_files(self, paths: list[str]) -> None:
        """Validate and thumbnail image files; refuse them when the engine has no vision."""
        self._prepare(lambda: [load_image(p) for p in paths])

    def prepare_bytes(self, data: bytes, name: str) -> None:
        self._prepare(lambda: [prepare_image(data, name=name)])

    def _prepare(self, make: Any) -> None:
        endpoint = self.engine.chat_endpoint()
        request = self.engine.request

        def work(_t: CancelToken) -> list[tuple[PreparedImage, QImage]]:
            if request is not None and self.engine.endpoint() is not None and not request.vision:
                ensure_vision(False, where=self.engine.endpoint().url)  # type: ignore[union-attr]
            elif endpoint is not None:
                with ChatClient(endpoint) as client:
                    try:
                        caps = client.capabilities()
                    except ChatError:
                        caps = None
                if caps is not None:
                    ensure_vision(caps.vision, where=endpoint.root)
            out = []
            for img in make():
                thumb = QImage.fromData(img.data)
                if thumb.height() > THUMB_HEIGHT:
                    thumb = thumb.scaledToHeight(THUMB_HEIGHT)
                out.append((img, thumb))
            return out

        def done(items: list[tuple[PreparedImage, QImage]]) -> None:
            for img, thumb in items:
                self.image_ready.emit(img, thumb)

        def error(exc: BaseException) -> None:
            if isinstance(exc, ChatError):
                self.image_refused.emit(f"{exc.message} {exc.hint}".strip())
                self.projector_missing.emit(self._projector_offer())
            else:
                self.ctx.reporter.report(exc)

        self.ctx.ops.run(Operation("chat-image", work), on_success=done, on_failure=error)

    def _projector_offer(self) -> SetDownload | None:
        """The download of the running set's projector, where the set was downloaded
        without it (None: none to offer)."""
        request = self.engine.request
        if request is None or request.shard is None or request.vision:
            return None
        return projector_download(request.shard)

    # ------------------------------------------------------------ sending
    def send(self, text: str, images: list[PreparedImage]) -> None:
        """Append a user message to the current branch and stream the answer."""
        current = self.current
        system_prompt, settings = self.conversation_settings()

        def prepare(store: HistoryStore) -> TurnRecord:
            if current is None:
                return TurnRecord.new_conversation(
                    store,
                    text,
                    images=images,
                    system_prompt=system_prompt,
                    settings=settings,
                    save_every=SAVE_EVERY_S,
                )
            return TurnRecord.ask(
                store, current.conversation.id, text, images=images, save_every=SAVE_EVERY_S
            )

        self._pending_settings = None
        self._run_answer(prepare)

    def regenerate(self, message_id: int) -> None:
        """A new answer to the same question, kept beside the old one."""
        self._run_answer(lambda store: TurnRecord.again(store, message_id, save_every=SAVE_EVERY_S))

    def edit_and_resend(self, message_id: int, text: str) -> None:
        """Send an edited copy of a user message; the old branch stays reachable."""
        self._run_answer(
            lambda store: TurnRecord.edited(store, message_id, text, save_every=SAVE_EVERY_S)
        )

    def switch_branch(self, message_id: int, delta: int) -> None:
        def work(_t: CancelToken) -> OpenState:
            store = self.store()
            sibs = store.siblings(message_id)
            idx = next(i for i, m in enumerate(sibs) if m.id == message_id)
            target = sibs[max(0, min(len(sibs) - 1, idx + delta))]
            store.select_branch(target.id)
            conv, msgs = store.open_conversation(target.conversation_id)
            return self._open_state(conv, msgs)

        # the branch chosen is stored: the list shows the conversation as it is now
        op = Operation("chat-branch", work, CHATS, serial=True)
        self.ctx.ops.run(op, on_success=self._opened)

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    def _run_answer(self, prepare: Callable[[HistoryStore], TurnRecord]) -> None:
        """Run a chat turn (the core's :func:`run_turn`) on a worker; every result reaches
        this object's state on the main thread (:meth:`_begin`, :meth:`_finished`)."""
        if self.streaming:
            raise ChatError("An answer is still being written.", "Stop it first (Esc).")
        endpoint = self.engine.chat_endpoint()
        if endpoint is None:
            raise ChatError(
                "No engine is running.",
                "Start one on the Engine page (Ctrl+4), or run Kimi-K3 across machines or "
                "attach a remote server on the Cluster page (Ctrl+6).",
            )
        token = CancelToken()
        self.stream = StreamState()  # set here, on the main thread: one answer at a time
        client = self.client(endpoint)
        run_on_main = self.ctx.tasks.run_on_main
        buffer = self._buffer
        states = self._conversation_states()

        def work(tok: CancelToken) -> TurnOutcome:
            # worker thread: the store and the client only; the view state it builds is
            # handed to the main thread, never written into this object from here
            store = self.store()
            record = prepare(store)
            answer = record.begin()
            branch = record.branch()
            state = self._open_state(record.conversation, [*branch, answer])
            run_on_main(lambda: self._begin(state, answer))
            messages = record.request_messages(branch)

            def on_delta(delta: ChatDelta) -> None:
                buffer.append(delta.kind, delta.text)

            settings = record.conversation.settings
            back = states.before(client, record.conversation.id, messages, settings)
            said = back.said() if back is not None else ""
            if said:
                log.info("conversation %d: %s", record.conversation.id, said)
            resumed = back is not None and back.done
            run_on_main(lambda: self.engine_state.emit(said, resumed))
            outcome = run_turn(
                client, messages, settings, cancel=tok, on_delta=on_delta, record=record
            )
            if outcome.error is not None:
                log.warning("answer cut short: %s", outcome.error.message)
            elif not tok.cancelled:
                # for the next question, after a restart or another conversation: the
                # answer is read into the engine's slot now instead of then, while the
                # person reads it (the next question withdraws that, and needs it not)
                cid = record.conversation.id

                def on_kept(kept: Kept) -> None:
                    log.info("conversation %d: %s", cid, kept.text("engine state kept"))
                    if kept.disk:  # the person would otherwise only see it read again
                        run_on_main(lambda: self.engine_state.emit(kept.why, False))

                states.keep_later(client, record, settings, on_kept=on_kept)
            return outcome

        self.busy.emit(True)
        # the turn is stored (its conversation moves to the top of the list)
        self._task = self.ctx.ops.run(
            Operation("chat-stream", work, CHATS, token=token),
            on_success=self._finished,
            on_failure=self._failed,
            on_cancelled=self._cancelled_before_start,
        )

    def _conversation_states(self) -> ConversationStates:
        """Conversations' engine states (within Settings' disk budget, read now), with the
        running launch's predicted reading rate."""
        budget = self.ctx.settings.kept_state_gib
        if self._states is not None and self._states.keeper.budget != budget * GiB:
            # the budget changed: the same states (a keep may be running), a new keeper
            self._states.keeper = keeper_for(self.ctx.services.paths.cache, budget)
        if self._states is None:
            states = ConversationStates(keeper_for(self.ctx.services.paths.cache, budget))
            # the engine's one slot is shared with tools' conversations through the local
            # API: each keeps its own before the other takes the slot, and brings it back
            front = self.engine.api
            states.on_take = lambda: front.slot_taken()
            front.on_tool_turn = states.slot_taken
            self._states = states
        request = self.engine.request
        plan = request.plan if request is not None else None
        self._states.planned_tps = plan.speed.prompt_tps if plan is not None else 0.0
        return self._states

    # -------------------------------------------------------- main thread
    def _open_state(self, conv: Conversation, msgs: list[Message]) -> OpenState:
        """View models for a branch (sibling counts and thumbnails for the shown part)."""
        store = self.store()
        start = max(0, len(msgs) - self.page_size)
        vms = [to_vm(m) for m in msgs]
        thumbs: dict[str, QImage] = {}
        for i in range(start, len(msgs)):
            m = msgs[i]
            if m.parent_id is not None or i == 0:
                sibs = store.siblings(m.id)
                if len(sibs) > 1:
                    idx = next(j for j, s in enumerate(sibs) if s.id == m.id)
                    vms[i].branch = (idx + 1, len(sibs))
            for img in m.images:
                if img.sha256 not in thumbs:
                    thumbs[img.sha256] = load_thumb(img.path)
        return OpenState(conv, msgs, vms, thumbs)

    def _opened(self, state: OpenState | None) -> None:
        self.current = state
        self.figures = self._figures_of(state) if state is not None else Figures()
        self.opened.emit(state)
        self._emit_status()

    def _figures_of(self, state: OpenState) -> Figures:
        """The figures of ``state``'s conversation: those of its last answer this session,
        else what its last stored answer says (its speed, the tokens it used)."""
        known = self._figures.get(state.conversation.id)
        if known is not None:
            return known
        last = next((m for m in reversed(state.messages) if m.role == "assistant"), None)
        if last is None:
            return Figures()
        timings = last.timings if last.timings and last.timings.predicted_per_second > 0 else None
        usage = last.usage
        context = (usage.total_tokens, None) if usage is not None and usage.total_tokens else None
        return Figures(timings, context, bool(usage and usage.estimated))

    def _begin(self, state: OpenState, answer: Message) -> None:
        self.stream = StreamState(state.conversation.id, answer.id)
        if self.current is None or self.current.conversation.id != state.conversation.id:
            self.figures = self._figures.get(state.conversation.id, Figures())
        vm = state.vms[-1]
        vm.streaming = True
        vm.partial = False
        vm.partial_note = ""
        self._vm = vm
        self.current = state
        self.opened.emit(state)
        self.stream_started.emit(vm)
        self.ctx.ops.announce(CHATS)  # a new conversation, or one moved to the top

    def _on_batch(self, batch: dict[str, Any]) -> None:
        vm = self._vm
        if vm is None:
            return
        vm.content += batch.get("content", "")
        vm.reasoning += batch.get("reasoning", "")
        self.stream_update.emit(vm)

    def _finished(self, outcome: TurnOutcome) -> None:
        self._buffer.flush()
        vm = self._vm
        self.stream = None
        self._task = None
        self._vm = None
        result, final = outcome.result, outcome.answer
        assert final is not None  # a turn run with a record ends with its answer
        if result is not None:
            figures = Figures(self.figures.timings, self.figures.context, self.figures.estimated)
            if result.timings is not None and result.timings.predicted_per_second > 0:
                figures.timings = result.timings
            if result.usage is not None:
                figures.context = (result.usage.total_tokens, outcome.n_ctx)
                figures.estimated = result.usage.estimated
            self.figures = figures
            self._figures[final.conversation_id] = figures
        done = to_vm(final, vm.branch if vm is not None else (1, 1))
        if self.current is not None and self.current.vms and self.current.vms[-1].id == done.id:
            self.current.vms[-1] = done
            self.current.messages[-1] = final
        self.stream_finished.emit(done)
        self.busy.emit(False)
        self._emit_status()
        self._tell_withheld(final.conversation_id, outcome.withheld)

    def _tell_withheld(self, conversation_id: int, count: int) -> None:
        endpoint = self.engine.chat_endpoint()
        where = endpoint.root if endpoint is not None else ""
        if count and (conversation_id, where) not in self._told:
            self._told.add((conversation_id, where))
            self.withheld.emit(withheld_text(count))

    def _failed(self, exc: BaseException) -> None:
        self._buffer.flush()
        vm = self._vm
        self.stream = None
        self._task = None
        self._vm = None
        self.busy.emit(False)
        if vm is not None:
            vm.partial = True
            vm.partial_note = "no answer arrived."
            self.stream_finished.emit(vm)
        self.ctx.reporter.report(exc)

    def _cancelled_before_start(self) -> None:
        self.stream = None
        self._task = None
        self._vm = None
        self.busy.emit(False)

    def _emit_status(self) -> None:
        self.status.emit(" · ".join(self.answer_stats()))
