"""A conversation's engine state, kept so that continuing it does not read it again.

Kimi-K3 reads a prompt slowly on the machines that run it (tens of tokens a second with
its experts in RAM, seconds per token when it streams from disk), so a long conversation
continued after a restart costs minutes to hours before its first new word.  llama-server
b11434 saves a slot's state to a file and restores it (``--slot-save-path DIR``,
``POST /slots/0?action=save|restore``, tools/server/server-context.cpp); k3desk keeps one
such file per conversation.

What is saved is exactly the part the next request begins with.  K3's KDA layers are
recurrent: the engine cannot take a state back to an earlier token, so a restored state
is used only when the next prompt extends it token for token (otherwise the engine reads
the whole prompt again).  The state is therefore made for the conversation as the next
question will see it: the chat template (the engine's own, ``/apply-template``) renders
the history with two different next questions, and their common beginning -- everything up
to where the next question's text starts -- is read into slot 0 (``/completion`` with
``n_predict`` 0) and saved.  Measured on the tiny K3: continued from a restored state the
engine read only the new question's 33 tokens instead of 136, and answered the same.

Pictures are kept with the text: the prefix is read into the slot with them
(``multimodal_data``), and b11434 saves a slot's picture chunks in its state file
(``server_tokens::serialize``, tools/server/server-common.cpp) and compares them by their
bytes' hash when a request reuses the slot.  A prompt marks each picture with a marker
random to the engine's process, so a kept prefix is known by its text with each marker
made :data:`PICTURE` and by its pictures' SHA-256: the same words with another picture are
another conversation.  A picture sent as a link (the engine fetches it) is not kept.

A saved state is used only where it is valid, and checked before the engine sees it:
- the engine that made it, the model's files (each part's size and the SHA-256 of its
  first MiB), the projector, the context per slot and the cache types must all be the
  running engine's (read from its own command line and ``/props``);
- the conversation must still begin with what was saved (an edit makes a new branch);
- the file must be a regular file of the size and SHA-256 recorded when it was made, so a
  truncated, damaged, swapped or planted file is refused and deleted, never restored.
A state that does not match is not loaded: the conversation is read again, and the
result says why, with how many tokens that is and, where the engine's reading rate is
known, how long.

Each answer's state is kept beside the conversation's earlier ones (the last
:data:`PER_CONVERSATION`): an edited question or a regenerated answer begins like an
earlier turn, so the longest kept state the new prompt still begins with is restored
(a state is a whole snapshot at a turn's end, recurrent part included, so this is exact:
the same answer as reading it all again, measured in tests/core/chat/test_kept_state.py).

The files live in a private folder (``<cache>/states``, 0700) under a disk budget
(Settings; least recently used first out).  The chat's turns go to slot 0 whatever else
the engine answers at once (``id_slot``: :meth:`ChatClient.build_body`), so with several
slots (``--parallel``, the local API's tools) its state is still read, restored and
saved there; a tool's request the engine put in slot 0 between the read and the save is
seen in the count saved (``n_saved``) and nothing is kept.  A tool's request is not
pinned, so a tool's conversation (:meth:`StateKeeper.keep_body`,
:meth:`StateKeeper.bring_back_body`) is kept and restored only where the engine has one
slot.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import secrets
import shutil
import stat
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import psutil

from k3desk.core.chat.client import ChatClient, ChatMessage
from k3desk.core.chat.model import ChatSettings
from k3desk.core.errors import Cancelled, ChatError
from k3desk.core.private import private_dir, write_private
from k3desk.core.progress import CancelToken
from k3desk.core.units import GiB, fmt_bytes, fmt_duration

STATES_DIR = "states"
NOTHING_KEPT = "No engine state was kept for this conversation."
DEFAULT_BUDGET = 16 * GiB  # Settings.kept_state_gib's default
INDEX = "index.json"
# states kept per conversation (one per answer, the newest): regenerating an answer or
# editing one of the last questions restores the state from the turn before it
PER_CONVERSATION = 4
HEAD_BYTES = 1 << 20  # a model file is known by its size and its first MiB
_FILE = re.compile(r"k3c-[0-9a-f]{16}\.bin")
# a state file no index lists (k3desk was killed, or the power went, between the engine
# writing it and the index listing it) is deleted once it is this old: a younger one may
# be another k3desk process's keep, listed as soon as it has read the file back
ORPHAN_AGE = 3600.0
_SPLIT = re.compile(r"^(?P<stem>.*)-(?P<n>\d{5})-of-(?P<total>\d{5})\.gguf$")
_ALIASES = {
    "-m": "model", "--model": "model",
    "-mm": "mmproj", "--mmproj": "mmproj",
    "-ctk": "ctk", "--cache-type-k": "ctk",
    "-ctv": "ctv", "--cache-type-v": "ctv",
    "--slot-save-path": "slots",
}  # fmt: skip
# where a picture is in a prompt: llama-server marks each with a marker random to its
# process (get_media_marker, tools/server/server-common.cpp; /props "media_marker"), so a
# kept prefix is known by its text with each marker made this, and its pictures' SHA-256
PICTURE = "\x00picture\x00"
LINKED = "a picture in it is a link the engine fetches, not data k3desk can read into it"
# a keep cancelled because the conversation's next question came first: the engine's slot
# holds the conversation, and that question reads what the keep would have
OVERTAKEN = "Not kept: the next question came first (the engine's slot holds the conversation)."


DELETED = "Not kept: its conversation was deleted."
# forget() calls in this process, per (kept states' folder, conversation): a keep that
# began before one lists nothing (whichever StateKeeper of that folder made it)
_FORGETS: dict[tuple[str, str], int] = {}
_FORGETS_LOCK = threading.Lock()


def _forgets(folder: Path, conversation: str) -> int:
    with _FORGETS_LOCK:
        return _FORGETS.get((str(folder.absolute()), conversation), 0)


def states_dir(cache: Path) -> Path:
    """Where the engine saves states (``--slot-save-path``): private to the person."""
    return cache / STATES_DIR


@dataclass(frozen=True)
class Kept:
    """What keeping or bringing back a conversation's state did."""

    done: bool
    why: str = ""  # why not (when not done)
    tokens: int = 0  # tokens the state covers
    size: int = 0  # bytes of the state file
    seconds: float = 0.0  # how long restoring or keeping it took
    reread: int = 0  # tokens of the prompt the engine reads (not restored), when counted
    predicted_s: float | None = None  # how long that reading takes, where the rate is known
    rate: Rate | None = None  # the engine's prompt reading measured while keeping it
    prefix: str = field(default="", repr=False)  # the prompt a kept state begins (keep)
    disk: bool = False  # not kept: its disk would not take it (full, or failing)

    def text(self, action: str) -> str:
        if self.done:
            return f"{action}: {self.tokens:,} tokens ({fmt_bytes(self.size)})."
        return self.why

    def said(self) -> str:
        """What the chat says before the answer: where its prompt comes from."""
        if self.done:
            took = "under 0.1 s" if self.seconds < 0.1 else f"{self.seconds:.1f} s"
            return f"Resumed from saved state ({self.tokens:,} tokens, {took})."
        if self.reread <= 0:
            return self.why
        about = "" if self.predicted_s is None else f" (about {fmt_duration(self.predicted_s)})"
        return f"Re-reading {self.reread:,} tokens{about}. {self.why}"


@dataclass(frozen=True)
class _Engine:
    """The running engine, as far as a state depends on it."""

    identity: str  # SHA-256 of every fact below
    slots: Path  # its --slot-save-path
    marker: str = ""  # where a prompt the engine renders holds a picture
    n_slots: int = 1  # requests it answers at once (/props total_slots)

    def normal(self, prompt: str) -> str | None:
        """``prompt`` with this engine's picture marker made :data:`PICTURE`; None where its
        words hold :data:`PICTURE` themselves (then a picture could not be told from them)."""
        if PICTURE in prompt:
            return None
        return prompt.replace(self.marker, PICTURE) if self.marker else prompt


def _options(argv: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for i, a in enumerate(argv):
        key, eq, inline = a.partition("=")
        name = _ALIASES.get(key if eq else a)
        if name is None:
            continue
        if eq:
            out[name] = inline
        elif i + 1 < len(argv):
            out[name] = argv[i + 1]
    return out


def _file_facts(path: Path) -> list[Any]:
    """Each part of a (split) GGUF: its name, size and the SHA-256 of its first MiB."""
    m = _SPLIT.match(path.name)
    parts = [path]
    if m is not None:
        total = int(m.group("total"))
        parts = [path.with_name(f"{m.group('stem')}-{n:05d}-of-{total:05d}.gguf")
                 for n in range(1, total + 1)]  # fmt: skip
    facts: list[Any] = []
    for part in parts:
        with part.open("rb") as f:
            head = f.read(HEAD_BYTES)
            facts.append(
                [part.name, os.fstat(f.fileno()).st_size, hashlib.sha256(head).hexdigest()]
            )
    return facts


# an engine process's identity, by (pid, start time): what it runs does not change while
# it runs (its files are read at start), so each turn need not hash them again
_IDENTITIES: dict[tuple[int, float], _Engine] = {}


def _engine(client: ChatClient) -> _Engine | str:
    """The identity of the engine ``client`` talks to, or why no state can be kept."""
    pid = client.endpoint.owner_pid
    if pid is None:
        return "the server was not started by k3desk here, so what it runs is not known"
    try:
        proc = psutil.Process(pid)
        key = (pid, proc.create_time())
    except psutil.Error as exc:
        return f"the engine's process could not be read ({exc})"
    known = _IDENTITIES.get(key)
    if known is None:
        found = _identify(client, proc)
        if isinstance(found, str):
            return found
        known = _IDENTITIES[key] = found
    return known


def _identify(client: ChatClient, proc: psutil.Process) -> _Engine | str:
    """What :func:`_engine` says of a process not seen before."""
    try:
        argv = proc.cmdline()
        exe = Path(argv[0]) if argv else Path(proc.exe())
        opts = _options(argv)
        if "slots" not in opts:
            return "the engine was started without a folder for saved states"
        if "model" not in opts:
            return "the engine serves several models (a router), not one"
        status, props = client.call("GET", "/props")
        if status != 200 or not isinstance(props, dict):
            return "the engine did not describe itself (/props)"
        settings = props.get("default_generation_settings")
        n_ctx = settings.get("n_ctx") if isinstance(settings, dict) else None
        exe_stat = exe.stat()
        facts = {
            "engine": [str(exe.resolve()), exe_stat.st_size, exe_stat.st_mtime_ns,
                       str(props.get("build_info", ""))],
            "model": _file_facts(Path(opts["model"])),
            "projector": _file_facts(Path(opts["mmproj"])) if "mmproj" in opts else None,
            "n_ctx": n_ctx,
            "cache": [opts.get("ctk", "f16"), opts.get("ctv", "f16")],
        }  # fmt: skip
    except (psutil.Error, OSError) as exc:
        return f"the engine's files could not be read ({exc})"
    digest = hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()
    marker = props.get("media_marker")
    n_slots = props.get("total_slots")
    return _Engine(digest, Path(opts["slots"]), marker if isinstance(marker, str) else "",
                   n_slots if isinstance(n_slots, int) else 0)  # fmt: skip


# a tool's request (unlike the chat's, pinned to slot 0 by ChatClient) goes to whichever
# slot the engine picks (get_available_slot, tools/server/server-context.cpp)
ANY_SLOT = "the engine answers several requests at once and puts a tool's in any slot"


def _engine_in_slot_0(client: ChatClient, pinned: bool) -> _Engine | str:
    """:func:`_engine`, or why a request not ``pinned`` to slot 0 is not kept there."""
    engine = _engine(client)
    if isinstance(engine, _Engine) and not pinned and engine.n_slots != 1:
        return ANY_SLOT
    return engine


@dataclass(frozen=True)
class Prompt:
    """A prompt as the engine renders it, and its pictures in order (each one's base64
    data; None where one is a link)."""

    text: str
    pictures: tuple[str, ...] | None = ()


def pictures_of(messages: Any) -> tuple[str, ...] | None:
    """The base64 data of every picture in a Chat Completions request's ``messages``, in
    the order the prompt holds them; None where one is not data (a link the engine
    fetches, or a part that is neither text nor picture)."""
    found: list[str] = []
    for m in messages if isinstance(messages, list) else ():
        content = m.get("content") if isinstance(m, dict) else None
        for part in content if isinstance(content, list) else ():
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "text":
                continue
            image = part.get("image_url") if kind == "image_url" else None
            url = image.get("url") if isinstance(image, dict) else None
            head, sep, data = url.partition(";base64,") if isinstance(url, str) else ("", "", "")
            if not sep or not head.startswith("data:"):
                return None
            found.append(data)
    return tuple(found)


def _prefix_digest(normal: str, pictures: Sequence[str]) -> str:
    """What a prefix (its text with :data:`PICTURE` marks) is known by: the SHA-256 of its
    text and of each picture it holds (text alone: as before pictures were kept)."""
    h = hashlib.sha256(normal.encode())
    for data in pictures[: normal.count(PICTURE)]:
        h.update(hashlib.sha256(data.encode()).digest())
    return h.hexdigest()


def render_prompt(
    client: ChatClient, messages: Sequence[ChatMessage], settings: ChatSettings
) -> str:
    """The prompt the engine builds for ``messages`` (its own chat template)."""
    return _rendered(client, messages, settings).text


def _rendered(
    client: ChatClient, messages: Sequence[ChatMessage], settings: ChatSettings
) -> Prompt:
    body = client.build_body(messages, settings)
    ask = {"messages": body["messages"]}
    if "chat_template_kwargs" in body:
        ask["chat_template_kwargs"] = body["chat_template_kwargs"]
    return Prompt(render_body(client, ask), pictures_of(body["messages"]))


def next_prefix(
    client: ChatClient, history: Sequence[ChatMessage], settings: ChatSettings
) -> Prompt:
    """What every next question's prompt begins with: the history rendered, up to where
    that question's own text starts (and the history's pictures)."""
    a = _rendered(client, [*history, ChatMessage("user", "a")], settings)
    b = render_prompt(client, [*history, ChatMessage("user", "b")], settings)
    return Prompt(_common(a.text, b), a.pictures)


def _common(a: str, b: str) -> str:
    n = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    return a[:n]


# what of a tool's Chat Completions request makes its prompt (llama-server's /apply-template
# reads them as /v1/chat/completions does: oaicompat_chat_params_parse, server-common.cpp)
PROMPT_FIELDS = ("messages", "tools", "tool_choice", "parallel_tool_calls", "chat_template_kwargs")


def render_body(client: ChatClient, body: Mapping[str, Any]) -> str:
    """The prompt the engine builds for a Chat Completions request ``body`` as a tool sent
    it (tools and template options included)."""
    ask = {k: body[k] for k in PROMPT_FIELDS if k in body}
    status, got = client.call("POST", "/apply-template", ask)
    if status != 200 or not isinstance(got, dict) or not isinstance(got.get("prompt"), str):
        raise ChatError("The engine did not render the conversation (/apply-template).")
    prompt: str = got["prompt"]
    return prompt


def body_next_prefix(
    client: ChatClient, body: Mapping[str, Any], answer: Mapping[str, Any]
) -> Prompt:
    """What the next request's prompt of a tool's conversation begins with: ``body``'s
    messages and the assistant's ``answer`` to it, rendered, up to where the next message's
    own content starts: a question, or after tool calls the first call's result."""
    said = [*body["messages"], dict(answer)]
    calls = answer.get("tool_calls") or []

    def then(content: str) -> dict[str, Any]:
        if not calls:
            return {"role": "user", "content": content}
        result = {"role": "tool", "content": content}
        return {**result, "tool_call_id": calls[0]["id"]} if calls[0].get("id") else result

    a = render_body(client, {**body, "messages": [*said, then("a")]})
    b = render_body(client, {**body, "messages": [*said, then("b")]})
    return Prompt(_common(a, b), pictures_of(said))


# a reading rate measured on fewer tokens says little: a request's fixed costs (its
# template, the first batch) dominate, and a re-read is one long batch
MIN_RATE_TOKENS = 64


@dataclass(frozen=True)
class Rate:
    """How fast an engine read a prompt: ``tps`` tokens/s over ``tokens`` tokens."""

    tokens: int
    tps: float


def reading_rate(timings: Any) -> Rate | None:
    """A request's prompt reading (llama-server's ``timings``), when it read enough
    tokens to say how fast a long re-read goes."""
    if not isinstance(timings, dict):
        return None
    n, tps = timings.get("prompt_n"), timings.get("prompt_per_second")
    if isinstance(n, int) and n >= MIN_RATE_TOKENS and isinstance(tps, (int, float)) and tps > 0:
        return Rate(n, float(tps))
    return None


def prompt_tokens(
    client: ChatClient, messages: Sequence[ChatMessage], settings: ChatSettings
) -> int | None:
    """How many tokens the engine reads for ``messages`` with nothing reused (its own
    template and tokenizer, and each picture as many tokens as its projector makes of it);
    None when it does not say."""
    try:
        prompt = _rendered(client, messages, settings)
        if not prompt.pictures:
            return None if prompt.pictures is None else _tokens(client, prompt.text, True)
        return _tokens_with_pictures(client, prompt.text, prompt.pictures)
    except ChatError:
        return None  # the engine is gone: the turn itself says so


def _tokens(client: ChatClient, text: str, add_special: bool) -> int | None:
    status, got = client.call("POST", "/tokenize", {"content": text, "add_special": add_special})
    tokens = got.get("tokens") if status == 200 and isinstance(got, dict) else None
    return len(tokens) if isinstance(tokens, list) else None


def _tokens_with_pictures(client: ChatClient, text: str, pictures: Sequence[str]) -> int | None:
    """A prompt's tokens as b11434 makes them of a prompt with pictures (mtmd_tokenize,
    tools/mtmd/mtmd.cpp): the text between its picture markers tokenized piece by piece,
    special tokens added to the first alone, and each picture's tokens, counted by the
    engine's ``/v1/messages/count_tokens`` (which prepares a picture without encoding it:
    a few ms) as a message of that picture less an empty one."""
    status, props = client.call("GET", "/props")
    marker = props.get("media_marker") if status == 200 and isinstance(props, dict) else None
    if not isinstance(marker, str) or not marker or text.count(marker) != len(pictures):
        return None
    pieces = [_tokens(client, piece, i == 0) for i, piece in enumerate(text.split(marker))]
    empty = _counted(client, "")
    seen = [_counted(client, data) for data in pictures]
    if None in pieces or empty is None or None in seen:
        return None
    return sum(n for n in pieces if n) + sum(n - empty for n in seen if n)


def _counted(client: ChatClient, picture: str) -> int | None:
    """The engine's count of a Messages request of one user message: ``picture`` (base64
    data), or an empty text where that is empty."""
    source = {"type": "base64", "media_type": "image/png", "data": picture}  # any type reads
    part = {"type": "image", "source": source} if picture else {"type": "text", "text": ""}
    body = {"model": "k3", "messages": [{"role": "user", "content": [part]}]}
    status, got = client.call("POST", "/v1/messages/count_tokens", body)
    n = got.get("input_tokens") if status == 200 and isinstance(got, dict) else None
    return n if isinstance(n, int) else None


def _error_message(body: Any) -> str | None:
    """The message of an engine's error answer (``{"error": {"message": ...}}``)."""
    error = body.get("error") if isinstance(body, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    return message[:200] if isinstance(message, str) and message else None


def _sha256_file(path: Path, size: int) -> str | None:
    """SHA-256 of a regular file of ``size`` bytes, opened without following a link;
    None when it is anything else."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_size != size:
            return None
        h = hashlib.sha256()
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
        return h.hexdigest()


@dataclass(frozen=True)
class _Entry:
    conversation: str
    file: str
    sha256: str
    size: int
    tokens: int
    prefix_sha256: str
    prefix_chars: int
    engine: str
    used: float
    read_tps: float = 0.0  # the engine's prompt reading rate when it primed this state

    @classmethod
    def parse(cls, raw: Any) -> _Entry | None:
        try:
            e = cls(**raw)
        except TypeError:
            return None
        ok = (
            isinstance(e.file, str)
            and _FILE.fullmatch(e.file) is not None
            and all(isinstance(v, str) for v in (e.conversation, e.sha256, e.prefix_sha256))
            and isinstance(e.engine, str)
            and all(isinstance(v, int) and v >= 0 for v in (e.size, e.tokens, e.prefix_chars))
            and isinstance(e.used, (int, float))
            and isinstance(e.read_tps, (int, float))
        )
        return e if ok else None


class StateKeeper:
    """The kept states of one folder (the engine's ``--slot-save-path``) and their index,
    within ``budget`` bytes."""

    def __init__(self, folder: Path, budget: int = DEFAULT_BUDGET) -> None:
        self.folder = folder
        self.budget = budget

    # ------------------------------------------------------------ the index
    @contextlib.contextmanager
    def _locked(self) -> Iterator[dict[str, _Entry]]:
        """The index (file name -> entry), locked against other k3desk processes;
        written back on exit."""
        private_dir(self.folder)
        fd = os.open(self.folder / "index.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            entries = self._read()
            self._sweep(entries)
            before = dict(entries)
            yield entries
            if entries != before:
                rows = [vars(e) for e in sorted(entries.values(), key=lambda e: e.used)]
                write_private(self.folder / INDEX, json.dumps(rows, indent=1))
        finally:
            os.close(fd)

    def _sweep(self, entries: dict[str, _Entry]) -> None:
        """Delete the state files ``entries`` does not list that are older than
        :data:`ORPHAN_AGE`: no budget counts them, so they would hold their space for good."""
        now = time.time()
        try:
            names = os.listdir(self.folder)
        except OSError:
            return
        for name in names:
            if _FILE.fullmatch(name) is None or name in entries:
                continue
            with contextlib.suppress(OSError):
                st = os.lstat(self.folder / name)
                if now - st.st_mtime > ORPHAN_AGE:
                    os.unlink(self.folder / name)

    def _read(self) -> dict[str, _Entry]:
        try:
            fd = os.open(self.folder / INDEX, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            with os.fdopen(fd, "rb") as f:
                raw = json.loads(f.read(16 << 20))
        except (OSError, ValueError):
            return {}  # none yet, or damaged: every state is then unknown, so unused
        rows = [_Entry.parse(r) for r in raw] if isinstance(raw, list) else []
        return {e.file: e for e in rows if e is not None}

    def entries(self) -> list[tuple[str, int, int]]:
        """(conversation, tokens, bytes) of every kept state, least recently used first."""
        rows = sorted(self._read().values(), key=lambda e: e.used)
        return [(e.conversation, e.tokens, e.size) for e in rows]

    def forget(self, conversation: str) -> None:
        """Delete every state kept for ``conversation`` (the conversation was deleted: a
        state holds its tokens, so its words).  The files go even when the index cannot
        be written (a full disk); it then lists states that are gone, which are refused
        when asked for, as any missing file is."""
        with _FORGETS_LOCK:  # first: a keep of it running now lists nothing (_keep)
            key = (str(self.folder.absolute()), conversation)
            _FORGETS[key] = _FORGETS.get(key, 0) + 1
        for e in self._read().values():
            if e.conversation == conversation:
                (self.folder / e.file).unlink(missing_ok=True)
        with contextlib.suppress(OSError), self._locked() as entries:
            for e in [e for e in entries.values() if e.conversation == conversation]:
                self._drop(entries, e)

    def _drop(self, entries: dict[str, _Entry], e: _Entry) -> None:
        entries.pop(e.file, None)
        (self.folder / e.file).unlink(missing_ok=True)

    # ------------------------------------------------------------ keep
    def keep(
        self,
        client: ChatClient,
        conversation: str,
        history: Sequence[ChatMessage],
        settings: ChatSettings | None = None,
        cancel: CancelToken | None = None,
    ) -> Kept:
        """Save the engine state of ``history`` (a whole conversation, its last answer
        included) for the conversation's next question.  Cancelling ``cancel`` withdraws
        the engine's read of it (the part that takes time) and keeps nothing
        (:data:`OVERTAKEN`)."""
        settings = settings or ChatSettings()
        return self._keep(
            client, conversation, lambda: next_prefix(client, history, settings), cancel
        )

    def keep_body(
        self,
        client: ChatClient,
        conversation: str,
        body: Mapping[str, Any],
        answer: Mapping[str, Any],
    ) -> Kept:
        """Save the engine state of a tool's conversation: its Chat Completions request
        ``body`` and the assistant's message ``answer`` it was given, for the
        conversation's next request."""
        return self._keep(
            client, conversation, lambda: body_next_prefix(client, body, answer), pinned=False
        )

    def _keep(
        self,
        client: ChatClient,
        conversation: str,
        prefix_of: Callable[[], Prompt],
        cancel: CancelToken | None = None,
        pinned: bool = True,
    ) -> Kept:
        if self.budget <= 0:
            return Kept(False, "keeping conversation states is off (Settings)")
        engine = _engine_in_slot_0(client, pinned)
        if isinstance(engine, str):
            return Kept(False, f"Not kept: {engine}.")
        if engine.slots.resolve() != self.folder.resolve():
            return Kept(False, "Not kept: the engine saves states in another folder.")
        t0 = time.monotonic()
        forgets = _forgets(self.folder, conversation)
        prompt = prefix_of()
        prefix, normal = prompt.text, engine.normal(prompt.text)
        if prompt.pictures is None:
            return Kept(False, f"Not kept: {LINKED}.")
        if normal is None or normal.count(PICTURE) != len(prompt.pictures):
            return Kept(False, "Not kept: the engine's prompt does not hold its pictures.")
        try:
            status, primed = _prime(client, prefix, prompt.pictures, cancel)
        except Cancelled:
            return Kept(False, OVERTAKEN)
        if cancel is not None and cancel.cancelled:
            return Kept(False, OVERTAKEN)  # read, but the question waits: no save
        if status != 200 or not isinstance(primed, dict):
            return Kept(False, f"Not kept: the engine did not read the conversation ({status}).")
        tokens = primed.get("tokens_evaluated")
        if not isinstance(tokens, int):
            return Kept(False, "Not kept: the engine did not say how much it read.")
        rate = reading_rate(primed.get("timings"))
        saved = self._save(client, tokens)
        if isinstance(saved, Kept):
            return saved
        name, size, digest = saved
        prefix_sha = _prefix_digest(normal, prompt.pictures)
        entry = _Entry(conversation, name, digest, size, tokens, prefix_sha, len(normal),
                       engine.identity, time.time(), rate.tps if rate else 0.0)  # fmt: skip
        try:
            with self._locked() as entries:
                if _forgets(self.folder, conversation) != forgets:
                    # its conversation was deleted meanwhile: checked under the index's
                    # lock, so a forget() before this is final and one after it finds it
                    (self.folder / name).unlink(missing_ok=True)
                    return Kept(False, DELETED)
                self._add(entries, entry)
                added = name in entries
        except OSError as exc:
            # the index could not be written (a full disk): a state it does not list is
            # never used and would hold its space unseen, so it goes
            (self.folder / name).unlink(missing_ok=True)
            return Kept(False, f"Not kept: its index could not be written "
                               f"({exc.strerror or exc}){self._free()}.", disk=True)  # fmt: skip
        if not added:
            return Kept(
                False,
                f"Not kept: its state ({fmt_bytes(size)}) is over the "
                f"budget for kept states ({fmt_bytes(self.budget)}).",
            )
        return Kept(
            True, tokens=tokens, size=size, seconds=time.monotonic() - t0, rate=rate, prefix=prefix
        )

    def _save(self, client: ChatClient, tokens: int) -> tuple[str, int, str] | Kept:
        """Have the engine write its slot (``tokens`` read) to a new file: its name, size
        and SHA-256, or why nothing was kept (the file, if any, deleted)."""
        name = f"k3c-{secrets.token_hex(8)}.bin"
        path = self.folder / name
        try:
            status, saved = client.call(
                "POST", "/slots/0?action=save", {"filename": name}, slow=True
            )
        except BaseException:
            # the engine stopped or went away while writing it: no part of a state stays
            path.unlink(missing_ok=True)
            raise
        if status != 200 or not isinstance(saved, dict):
            # llama_state_seq_save_file failed ("Unable to save slot": a write error,
            # such as a full disk; tools/server/server-context.cpp, SLOT_SAVE)
            path.unlink(missing_ok=True)
            said = _error_message(saved) or f"status {status}"
            return Kept(False, f"Not kept: the engine could not write the state ({said})"
                               f"{self._free()}.", disk=True)  # fmt: skip
        if saved.get("n_saved") != tokens:
            # another request took the slot between the two calls: what it holds is not ours
            path.unlink(missing_ok=True)
            return Kept(False, "Not kept: the engine's slot was busy with another request.")
        try:
            size = path.lstat().st_size
        except OSError:
            return Kept(False, "Not kept: the engine wrote no state file.")
        if saved.get("n_written") != size:
            # the engine's file is closed unchecked (llama_file's destructor, in
            # src/llama-mmap.cpp): its last buffered bytes can be lost to a full disk
            # while it says it wrote them all
            path.unlink(missing_ok=True)
            wrote = saved.get("n_written")
            said = f"{wrote:,}" if isinstance(wrote, int) else "?"
            return Kept(False, f"Not kept: the engine's state file holds {size:,} of the "
                               f"{said} bytes it said it wrote{self._free()}.",
                        disk=True)  # fmt: skip
        digest = _sha256_file(path, size)
        if digest is None:
            path.unlink(missing_ok=True)
            return Kept(False, "Not kept: the engine's state file could not be read back.")
        os.chmod(path, 0o600)
        return name, size, digest

    def _free(self) -> str:
        """'; N free on its disk' for the kept states' folder ('' when not known)."""
        try:
            free = shutil.disk_usage(self.folder).free
        except OSError:
            return ""
        return f"; {fmt_bytes(free)} free on the disk that holds kept states"

    def rate(self, conversation: str) -> float | None:
        """The reading rate (tokens/s) measured when the newest of the conversation's
        states that measured one was made."""
        rows = [e for e in self._read().values() if e.conversation == conversation]
        newest = max((e for e in rows if e.read_tps > 0), key=lambda e: e.used, default=None)
        return newest.read_tps if newest is not None else None

    def _add(self, entries: dict[str, _Entry], new: _Entry) -> None:
        """``new`` in, replacing a state of the same point of the same conversation; the
        conversation's oldest beyond :data:`PER_CONVERSATION` out; then the budget."""
        same = [e for e in entries.values() if e.conversation == new.conversation]
        for e in same:
            if (e.prefix_sha256, e.engine) == (new.prefix_sha256, new.engine):
                self._drop(entries, e)
        entries[new.file] = new
        same = sorted(
            (e for e in entries.values() if e.conversation == new.conversation),
            key=lambda e: e.used,
        )
        for e in same[:-PER_CONVERSATION]:
            self._drop(entries, e)
        self._evict(entries, keep=new.file)

    def _evict(self, entries: dict[str, _Entry], keep: str) -> None:
        """Least recently used first, until the kept states fit the budget (the one just
        made last, and alone only when it is over the budget by itself)."""
        order = sorted(entries.values(), key=lambda e: (e.file == keep, e.used))
        total = sum(e.size for e in order)
        for e in order:
            if total <= self.budget:
                break
            self._drop(entries, e)
            total -= e.size

    # ------------------------------------------------------------ bring back
    def bring_back(
        self,
        client: ChatClient,
        conversation: str,
        messages: Sequence[ChatMessage],
        settings: ChatSettings | None = None,
    ) -> Kept:
        """Restore into the engine's slot the longest state kept for ``conversation``
        that ``messages`` (the request about to be sent) begins with, on this engine."""
        settings = settings or ChatSettings()
        return self._bring_back(client, conversation, lambda: _rendered(client, messages, settings))

    def bring_back_body(
        self, client: ChatClient, conversation: str, body: Mapping[str, Any]
    ) -> Kept:
        """:meth:`bring_back` for a tool's Chat Completions request ``body``."""

        def prompt_of() -> Prompt:
            return Prompt(render_body(client, body), pictures_of(body.get("messages")))

        return self._bring_back(client, conversation, prompt_of, pinned=False)

    def _bring_back(
        self,
        client: ChatClient,
        conversation: str,
        prompt_of: Callable[[], Prompt],
        pinned: bool = True,
    ) -> Kept:
        kept = [e for e in self._read().values() if e.conversation == conversation]
        if not kept:
            return Kept(False, NOTHING_KEPT)
        engine = _engine_in_slot_0(client, pinned)
        if isinstance(engine, str):
            return Kept(False, f"The kept state is not used: {engine}.")
        kept = [e for e in kept if e.engine == engine.identity]
        if not kept:
            return Kept(
                False,
                "The kept state was made by another engine, model, projector, "
                "context or cache type: the conversation is read again.",
            )
        prompt = prompt_of()
        normal, pictures = engine.normal(prompt.text) or "", prompt.pictures or ()
        fits = [e for e in kept if len(normal) >= e.prefix_chars and e.prefix_sha256
                == _prefix_digest(normal[: e.prefix_chars], pictures)]  # fmt: skip
        if not fits:
            return Kept(
                False, "The conversation changed since its state was kept: it is read again."
            )
        t0 = time.monotonic()
        entry = None
        for e in sorted(fits, key=lambda e: e.prefix_chars, reverse=True):  # longest first
            if _sha256_file(self.folder / e.file, e.size) == e.sha256:
                entry = e
                break
            (self.folder / e.file).unlink(missing_ok=True)  # damaged or replaced: deleted
            with contextlib.suppress(OSError), self._locked() as entries:  # unread; the next
                self._drop(entries, e)
        if entry is None:
            return Kept(
                False,
                "The kept state's file is damaged or was replaced (its size "
                "or SHA-256 differs): it was deleted unread, and the "
                "conversation is read again.",
            )
        status, got = client.call(
            "POST", "/slots/0?action=restore", {"filename": entry.file}, slow=True
        )
        if status != 200 or not isinstance(got, dict) or got.get("n_restored") != entry.tokens:
            return Kept(
                False,
                f"The engine did not restore the kept state ({status}): the "
                "conversation is read again.",
            )
        with contextlib.suppress(OSError), self._locked() as entries:  # orders eviction only
            if entry.file in entries:
                entries[entry.file] = replace(entries[entry.file], used=time.time())
        return Kept(True, tokens=entry.tokens, size=entry.size, seconds=time.monotonic() - t0)


def _prime(
    client: ChatClient, prefix: str, pictures: Sequence[str], cancel: CancelToken | None
) -> tuple[int, Any]:
    """Have the engine's slot read ``prefix`` (with ``pictures``), to be saved."""
    # the pictures go with their markers (/completion's multimodal_data, read into the
    # slot with the text; a saved slot holds them: server_tokens::serialize)
    read = {"prompt_string": prefix, "multimodal_data": list(pictures)}
    # the engine reads what its slot lacks of the prefix (from its last checkpoint at
    # best; seconds a token on a machine streaming its experts from disk): no read limit
    return client.call(
        "POST", "/completion",
        {"prompt": read if pictures else prefix, "n_predict": 0, "id_slot": 0,
         "cache_prompt": True},
        slow=True, cancel=cancel,
    )  # fmt: skip


def keeper_for(cache: Path, budget_gib: float) -> StateKeeper:
    return StateKeeper(states_dir(cache), int(budget_gib * GiB))
