"""Use-case "run and record a chat turn": one question, its answer streamed, and the
history kept as it happens.

The chat window and ``k3desk chat [--save]`` both run :func:`run_turn`.  With a
:class:`TurnRecord`, the question is in the history before the request goes out, the
answer is stored as soon as the request starts (marked partial), saved every few
seconds while it streams, and completed at the end; a stop, a broken stream, an
engine crash or a killed process leaves the text that arrived, marked partial, with
the reason in ``finish_reason`` (:data:`NOTE_STOPPED`, :data:`NOTE_BROKEN`).

Nothing here touches a shell's state: :func:`run_turn` returns a :class:`TurnOutcome`
and the shell applies it (the window does so on its main thread).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from k3desk.core.app.local_api import KEEP_WAIT
from k3desk.core.chat.client import (
    ChatClient,
    ChatDelta,
    ChatMessage,
    ChatResult,
    ChatStreamError,
    DeltaCallback,
)
from k3desk.core.chat.history import Conversation, HistoryStore, Message
from k3desk.core.chat.images import PreparedImage
from k3desk.core.chat.kept_state import (
    Kept,
    Rate,
    StateKeeper,
    prompt_tokens,
    reading_rate,
    render_prompt,
)
from k3desk.core.chat.model import ChatSettings
from k3desk.core.errors import ChatError
from k3desk.core.progress import CancelToken

log = logging.getLogger(__name__)

SAVE_EVERY_S = 2.0
NOTE_STOPPED = "stopped"  # finish_reason of an answer the person stopped
NOTE_BROKEN = "interrupted"  # ... of one cut off (stream broke, engine gone, process killed)
TITLE_CHARS = 60


def title_for(prompt: str) -> str:
    """A new conversation's title: the first line of its first question (its first 60
    characters), or "Image" for a question that is only an image."""
    first = next((line for line in prompt.splitlines() if line.strip()), "")
    return " ".join(first.split())[:TITLE_CHARS] or "Image"


@dataclass(frozen=True)
class TurnOutcome:
    """How a turn ended: the result (None when refused before any text), the stored
    answer (with a record), the error that cut it short, the server's context size, and
    how many of the conversation's earlier pictures were not sent (a model without
    vision: :func:`without_pictures`)."""

    result: ChatResult | None
    answer: Message | None
    error: ChatError | None
    n_ctx: int | None = None
    withheld: int = 0


def withheld_text(count: int) -> str:
    """What the chat says, once, of pictures a model without vision is not sent."""
    pictures = "1 picture" if count == 1 else f"{count} pictures"
    verb = "is" if count == 1 else "are"
    return f"This model has no vision: {pictures} in this conversation {verb} not sent to it."


def _picture_note(count: int) -> str:
    return f"[{'a picture' if count == 1 else f'{count} pictures'} not sent: no vision]"


def without_pictures(
    client: ChatClient, messages: Sequence[ChatMessage]
) -> tuple[list[ChatMessage], int]:
    """The request for a model that cannot see: the pictures of the earlier messages
    (kept in the history) left out, each such message saying in its text how many were
    not sent, and their number; ``messages`` as they are when the server has vision,
    does not say, or there are none.

    llama-server refuses a whole request when any message holds an image and it was
    started without a projector (llama.cpp b11434 tools/server/server-common.cpp,
    ``oaicompat_content_load_media``: "image input is not supported"), so one picture
    early in a conversation would otherwise break every later question once a model
    without vision is loaded.  The question being asked keeps its pictures: those are
    refused up front, by name (:func:`k3desk.core.chat.images.ensure_vision`)."""
    earlier = list(messages[:-1])
    count = sum(len(m.images) for m in earlier)
    if count == 0:
        return list(messages), 0
    try:
        vision = client.capabilities().vision
    except ChatError:
        return list(messages), 0  # the request itself says what is wrong
    if vision is not False:
        return list(messages), 0
    kept = [
        replace(m, images=(), content=f"{m.content}\n{_picture_note(len(m.images))}".strip())
        if m.images
        else m
        for m in earlier
    ]
    return [*kept, messages[-1]], count


class TurnRecord:
    """One turn's place in the history: its conversation, its question, and its answer.

    Every method may run on a worker thread (the store is thread-safe); nothing here
    reaches a widget.
    """

    def __init__(
        self,
        store: HistoryStore,
        conversation: Conversation,
        question: Message,
        *,
        save_every: float = SAVE_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.conversation = conversation
        self.question = question
        self.answer: Message | None = None
        self.save_every = save_every
        self._clock = clock
        self._last_save = clock()
        self._content: list[str] = []
        self._reasoning: list[str] = []
        self.finished = False

    # ---------------------------------------------------------- start
    @classmethod
    def new_conversation(
        cls,
        store: HistoryStore,
        prompt: str,
        *,
        images: Sequence[PreparedImage] = (),
        system_prompt: str = "",
        settings: ChatSettings | None = None,
        model: str | None = None,
        title: str | None = None,
        save_every: float = SAVE_EVERY_S,
    ) -> TurnRecord:
        """A new conversation with ``prompt`` as its first question (committed now)."""
        conv = store.create_conversation(
            title or title_for(prompt),
            system_prompt=system_prompt,
            settings=settings or ChatSettings(),
            model=model,
        )
        question = store.add_message(conv.id, "user", prompt, images=images)
        return cls(store, conv, question, save_every=save_every)

    @classmethod
    def ask(
        cls,
        store: HistoryStore,
        conversation_id: int,
        prompt: str,
        *,
        images: Sequence[PreparedImage] = (),
        save_every: float = SAVE_EVERY_S,
    ) -> TurnRecord:
        """``prompt`` as the next question of the current branch of a conversation."""
        conv = store.get_conversation(conversation_id)
        question = store.add_message(conv.id, "user", prompt, images=images)
        return cls(store, conv, question, save_every=save_every)

    @classmethod
    def again(
        cls, store: HistoryStore, answer_id: int, *, save_every: float = SAVE_EVERY_S
    ) -> TurnRecord:
        """A new answer to the question ``answer_id`` answered (the old one stays)."""
        old = store.get_message(answer_id)
        if old.parent_id is None:
            raise ChatError("This answer has no question to answer again.")
        conv = store.get_conversation(old.conversation_id)
        return cls(store, conv, store.get_message(old.parent_id), save_every=save_every)

    @classmethod
    def edited(
        cls, store: HistoryStore, message_id: int, text: str, *, save_every: float = SAVE_EVERY_S
    ) -> TurnRecord:
        """An edited copy of question ``message_id`` (a new branch; the old one stays)."""
        new = store.edit_message(message_id, text)
        conv = store.get_conversation(new.conversation_id)
        return cls(store, conv, new, save_every=save_every)

    # ---------------------------------------------------------- the turn
    def branch(self) -> list[Message]:
        """The conversation up to and including the question."""
        return self.store.branch(self.conversation.id, self.question.id)

    def request_messages(self, branch: Sequence[Message] | None = None) -> list[ChatMessage]:
        """What is sent: the system prompt, then the branch up to the question."""
        messages = []
        if self.conversation.system_prompt.strip():
            messages.append(ChatMessage("system", self.conversation.system_prompt))
        for m in self.branch() if branch is None else branch:
            if m.role == "system":
                continue
            messages.append(
                ChatMessage(m.role, m.content, tuple(i.to_prepared() for i in m.images))
            )
        return messages

    def begin(self) -> Message:
        """The answer's row, stored empty and partial (once)."""
        if self.answer is None:
            self.answer = self.store.add_message(
                self.conversation.id, "assistant", "", parent_id=self.question.id, partial=True
            )
            self._last_save = self._clock()
        return self.answer

    @property
    def content(self) -> str:
        return "".join(self._content)

    @property
    def reasoning(self) -> str:
        return "".join(self._reasoning)

    def delta(self, d: ChatDelta) -> None:
        """Text arrived; saved when ``save_every`` seconds passed since the last save."""
        (self._reasoning if d.kind == "reasoning" else self._content).append(d.text)
        now = self._clock()
        if now - self._last_save >= self.save_every:
            self._last_save = now
            self.store.update_message(
                self.begin().id, content=self.content, reasoning=self.reasoning, partial=True
            )

    def finish(self, result: ChatResult, note: str = "") -> Message:
        """The answer as it ended (``note``: :data:`NOTE_STOPPED` / :data:`NOTE_BROKEN`)."""
        if result.cancelled and not note:
            note = NOTE_STOPPED
        final = self.store.update_message(
            self.begin().id,
            content=result.text or self.content,
            reasoning=result.reasoning or self.reasoning,
            usage=result.usage,
            timings=result.timings,
            partial=result.partial or bool(note),
            finish_reason=note or result.finish_reason,
            model=result.model,
        )
        if result.model and result.model != self.conversation.model:
            self.conversation = self.store.update_conversation(
                self.conversation.id, model=result.model
            )
        self.finished = True
        self.answer = final
        return final

    def interrupted(self) -> Message:
        """The turn ended without a result: keep what arrived, marked partial and broken."""
        final = self.store.update_message(
            self.begin().id,
            content=self.content,
            reasoning=self.reasoning,
            partial=True,
            finish_reason=NOTE_BROKEN,
        )
        self.finished = True
        self.answer = final
        return final


def nothing_rendered(result: ChatResult) -> ChatStreamError | None:
    """An answer to nothing: the server counted 0 prompt tokens (the model's chat template
    or tokenizer turned the conversation into no tokens), or it finished without a
    single token or character.  Either is an error to name, not an answer."""
    if result.cancelled or result.partial:
        return None
    usage = result.usage
    if usage is not None and not usage.estimated and usage.prompt_tokens == 0:
        return ChatStreamError(
            "The server read the conversation as 0 prompt tokens: the model's chat template "
            "or tokenizer rendered nothing, so there was nothing to answer.",
            "Check the model file's chat template and tokenizer (llama-server renders "
            "tokenizer.chat_template with --jinja); a file whose vocabulary spells none of "
            "the text cannot be chatted with.",
            result,
        )
    if not result.text and not result.reasoning and (usage is None or usage.completion_tokens == 0):
        return ChatStreamError(
            "The server finished without generating anything (an empty reply).",
            "Ask again; if it repeats, the model ends every answer at once (check its chat "
            "template and end-of-turn tokens).",
            result,
        )
    return None


def run_turn(
    client: ChatClient,
    messages: Sequence[ChatMessage],
    settings: ChatSettings | None = None,
    *,
    cancel: CancelToken | None = None,
    on_delta: DeltaCallback | None = None,
    record: TurnRecord | None = None,
) -> TurnOutcome:
    """Send ``messages``, pass each delta to ``on_delta`` (and to ``record``), and end the
    record as the answer ended.

    Returns the outcome of an answer that started, even one cut short (its ``error``
    says why); raises the :class:`ChatError` of a request refused before any text, and
    whatever interrupts it (``KeyboardInterrupt``), after ending the record.
    """
    if record is not None:
        record.begin()
    result: ChatResult | None = None
    error: ChatStreamError | None = None
    try:
        messages, withheld = without_pictures(client, messages)
        with client.stream(messages, settings, cancel) as st:
            for d in st:
                if record is not None:
                    record.delta(d)
                if on_delta is not None:
                    on_delta(d)
        result = st.result
    except ChatStreamError as exc:
        result, error = exc.result, exc
    except BaseException:
        if record is not None and not record.finished:
            record.interrupted()
        raise
    assert result is not None
    if error is None:
        error = nothing_rendered(result)
    answer = None
    if record is not None:
        answer = record.finish(result, NOTE_BROKEN if error is not None else "")
    caps = client.cached_capabilities()
    n_ctx = caps.n_ctx if caps is not None else None
    return TurnOutcome(result, answer, error, n_ctx, withheld)


class ConversationStates:
    """Each conversation's engine state between turns, for a shell
    (:mod:`k3desk.core.chat.kept_state`): :meth:`before` a turn brings back the longest
    kept state the request begins with, unless the engine's slot already holds a
    beginning of it (the same conversation, not edited above the slot's point); when none
    is brought back it counts what the engine reads again and predicts how long, from
    the reading rate measured on that engine (else when a state was kept, else the
    plan's prediction).  :meth:`after` an answer keeps its state for the next question;
    :meth:`keep_later` does that on a thread of its own, so that the next question can
    be asked at once (the engine's read of the answer into the slot takes tens of
    seconds where it streams its experts from disk: 43 s on the twin): that question
    cancels it, since the slot holds its conversation and it reads what the keep would
    have; another conversation's
    turn, a tool's, and the engine stopping wait for it (:meth:`settle`).  Only for an
    engine k3desk started (``owner_pid``): what an attached server runs is not known.
    Thread-safe."""

    def __init__(self, keeper: StateKeeper, planned_tps: float = 0.0) -> None:
        self.keeper = keeper
        # the plan's predicted reading rate for the engine the shell runs (0: none): said
        # when nothing was measured yet (set again by a shell that launches another)
        self.planned_tps = planned_tps
        self._lock = threading.Lock()
        # engine (pid, address) -> (the conversation its slot holds, how that begins:
        # the kept state's prompt, None when not known)
        self._in_slot: dict[tuple[int, str], tuple[int, str | None]] = {}
        # each engine's reading rate, from the longest read measured on it
        self._rate: dict[tuple[int, str], Rate] = {}
        # called before a turn takes an engine's slot, for another user of that slot (a
        # tool's conversation through the local API's front) to keep its state first
        self.on_take: Callable[[], object] = lambda: None
        # the keep running on a thread of its own (keep_later): its conversation, the
        # token that withdraws it, and set when it has ended
        self._keeping: tuple[int, CancelToken, threading.Event] | None = None
        self._taken = 0  # how many times another user took the slot (slot_taken)

    def slot_taken(self, timeout: float | None = KEEP_WAIT) -> None:
        """Another user (a tool, through the local API) is about to take the engines' slot:
        the chat's state being kept is waited for (up to ``timeout`` s), and what the chat
        believed each holds is no longer known, so a conversation's next turn brings its
        kept state back."""
        self.settle(timeout)
        with self._lock:
            self._taken += 1
            self._in_slot.clear()

    def settle(self, timeout: float | None = None, *, asking: int | None = None) -> bool:
        """Wait for the state being kept by :meth:`keep_later`, if any (False when that
        took more than ``timeout`` seconds); the next question of conversation ``asking``
        withdraws its own conversation's keep first."""
        with self._lock:
            keeping = self._keeping
        if keeping is None:
            return True
        conversation, token, ended = keeping
        if asking is not None and conversation == asking:
            token.cancel()
        return ended.wait(timeout)

    def forget(self, conversation_id: int) -> None:
        """The conversation was deleted: its keep, if running, is withdrawn (and waited
        for, up to :data:`KEEP_WAIT`), and every state kept for it is deleted."""
        self.settle(KEEP_WAIT, asking=conversation_id)
        self.keeper.forget(str(conversation_id))
        with self._lock:
            for engine, (held, _) in list(self._in_slot.items()):
                if held == conversation_id:
                    del self._in_slot[engine]

    def keep_later(
        self,
        client: ChatClient,
        record: TurnRecord,
        settings: ChatSettings | None = None,
        on_kept: Callable[[Kept], object] = lambda _kept: None,
    ) -> None:
        """:meth:`after`, on a thread of its own; ``on_kept`` is given what it kept (on
        that thread).  A keep still running is waited for first."""
        self.settle()
        token, ended = CancelToken(), threading.Event()
        keeping = (record.conversation.id, token, ended)
        with self._lock:
            self._keeping = keeping

        def run() -> None:
            try:
                kept = self.after(client, record, settings, cancel=token)
                if kept is not None:
                    on_kept(kept)
            except Exception as exc:  # on a thread of its own: said, and in the log
                log.exception("conversation %d: its state was not kept", record.conversation.id)
                on_kept(Kept(False, f"Not kept: {type(exc).__name__}: {exc} (in the log)."))
            finally:
                with self._lock:
                    if self._keeping is keeping:
                        self._keeping = None
                ended.set()

        threading.Thread(target=run, name="keep-conversation-state", daemon=True).start()

    @staticmethod
    def _engine(client: ChatClient) -> tuple[int, str] | None:
        ep = client.endpoint
        return None if ep.owner_pid is None else (ep.owner_pid, ep.root)

    def before(
        self,
        client: ChatClient,
        conversation_id: int,
        messages: Sequence[ChatMessage],
        settings: ChatSettings | None = None,
    ) -> Kept | None:
        """Restore the conversation's kept state, unless the slot already holds what the
        request begins with (None) or the engine is not k3desk's (None)."""
        self.settle(asking=conversation_id)  # the slot is this turn's from here
        settings = settings or ChatSettings()
        engine = self._engine(client)
        if engine is None or self.keeper.budget <= 0:
            return None
        self.on_take()
        if len(messages) < 2:
            return None
        messages, _ = without_pictures(client, messages)  # as run_turn will send them
        with self._lock:
            held = self._in_slot.get(engine)
            self._in_slot[engine] = (conversation_id, None)  # after this turn, whatever happens
        try:
            if (
                held is not None
                and held[0] == conversation_id
                and (held[1] is None or _begins_with(client, messages, settings, held[1]))
            ):
                with self._lock:
                    self._in_slot[engine] = held
                return None
            kept = self.keeper.bring_back(client, str(conversation_id), messages, settings)
        except ChatError as exc:
            kept = Kept(False, f"The kept state is not used: {exc.message}")
        if kept.done:
            return kept
        return self._reading(client, engine, str(conversation_id), messages, settings, kept)

    def _reading(
        self,
        client: ChatClient,
        engine: tuple[int, str],
        conversation: str,
        messages: Sequence[ChatMessage],
        settings: ChatSettings,
        kept: Kept,
    ) -> Kept:
        """``kept`` (not restored) with the tokens read again and how long that takes."""
        n = prompt_tokens(client, messages, settings)
        if n is None:
            return kept
        with self._lock:
            measured = self._rate.get(engine)
        rate = measured.tps if measured is not None else None
        rate = rate or self.keeper.rate(conversation)
        rate = rate or (self.planned_tps if self.planned_tps > 0 else None)
        return replace(kept, reread=n, predicted_s=n / rate if rate else None)

    def after(
        self,
        client: ChatClient,
        record: TurnRecord,
        settings: ChatSettings | None = None,
        cancel: CancelToken | None = None,
    ) -> Kept | None:
        """Keep the state of ``record``'s conversation, its answer included (None: not an
        engine k3desk started, or keeping is off); ``cancel`` withdraws it."""
        engine = self._engine(client)
        if engine is None or self.keeper.budget <= 0 or record.answer is None:
            return None
        timings = record.answer.timings
        read = (
            reading_rate({"prompt_n": timings.prompt_n, "prompt_per_second":
                          timings.prompt_per_second})
            if timings is not None and not timings.by_client else None
        )  # fmt: skip
        with self._lock:
            taken = self._taken
        branch = record.store.branch(record.conversation.id, record.answer.id)
        messages, _ = without_pictures(client, record.request_messages(branch))  # as sent
        prefix: str | None = None
        try:
            kept = self.keeper.keep(
                client, str(record.conversation.id), messages, settings, cancel=cancel
            )
            prefix = kept.prefix if kept.done else None
        except ChatError as exc:
            kept = Kept(False, f"Not kept: {exc.message}")
        with self._lock:
            if self._taken == taken:  # else a tool took the slot meanwhile: not known
                self._in_slot[engine] = (record.conversation.id, prefix)
            for r in (read, kept.rate):
                known = self._rate.get(engine)
                if r is not None and (known is None or r.tokens >= known.tokens):
                    self._rate[engine] = r
        return kept


def delete_conversation(
    store: HistoryStore, states: ConversationStates, conversation_id: int
) -> None:
    """Delete a conversation from the history, and every engine state kept for it: a
    kept state holds the tokens the engine read, so the conversation's words."""
    store.delete_conversation(conversation_id)
    states.forget(conversation_id)


def _begins_with(
    client: ChatClient, messages: Sequence[ChatMessage], settings: ChatSettings, prefix: str
) -> bool:
    """Whether the engine's prompt for ``messages`` begins with ``prefix``."""
    return render_prompt(client, messages, settings).startswith(prefix)
