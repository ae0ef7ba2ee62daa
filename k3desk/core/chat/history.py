"""The conversation store: SQLite (WAL, versioned schema), messages kept as a tree.

Every message has a parent, so editing a message and sending it again starts a new
branch while the old one stays; each conversation remembers its current leaf.
Opening a conversation walks from that leaf to the root by primary key, so it
costs the length of the branch, not the size of the store.  Attached images are
stored once each, by content hash, as files next to the database.

One connection serves every thread, guarded by a lock (WAL lets other processes
read meanwhile); every public method is safe to call from a worker thread.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Final, cast

from k3desk.core.chat import history_export
from k3desk.core.chat.history_export import EXPORT_FORMAT as EXPORT_FORMAT
from k3desk.core.chat.history_schema import FTS_V1, SCHEMA_V1, split_sql
from k3desk.core.chat.history_schema import fts5_available as fts5_available
from k3desk.core.chat.images import EXTENSION, ImageFormat, PreparedImage
from k3desk.core.chat.model import ROLES, ChatSettings, Role, Timings, Usage
from k3desk.core.chat.records import KEEP as KEEP
from k3desk.core.chat.records import Conversation as Conversation
from k3desk.core.chat.records import HistoryError as HistoryError
from k3desk.core.chat.records import Message as Message
from k3desk.core.chat.records import SearchHit as SearchHit
from k3desk.core.chat.records import StoredImage as StoredImage
from k3desk.core.chat.records import _Keep
from k3desk.core.private import make_private, private_dir, private_file, write_private
from k3desk.core.safepaths import display_name, scrub

SCHEMA_VERSION: Final = 1
IMAGES_DIRNAME: Final = "history-images"

_MSG_COLS = (
    "m.id, m.conversation_id, m.parent_id, m.role, m.content, m.reasoning, m.created, "
    "m.usage, m.timings, m.partial, m.finish_reason, m.model"
)
_CONV_COLS = "id, title, created, updated, system_prompt, settings, tier, model, current_leaf"


class HistoryStore:
    """Conversations and their message trees in one SQLite file.

    ``use_fts`` None picks FTS5 when SQLite has it (search falls back to LIKE).
    """

    def __init__(self, path: Path | str, *, use_fts: bool | None = None) -> None:
        self.path = Path(path)
        self.images_dir = self.path.parent / IMAGES_DIRNAME
        self._lock = threading.RLock()
        self._depth = 0
        try:
            # private conversations: the file (SQLite gives its -wal and -shm files the
            # same mode) and the folders are the user's alone
            private_file(self.path)
            for extra in ("-wal", "-shm"):
                make_private(self.path.with_name(self.path.name + extra))
        except OSError as exc:
            raise HistoryError(
                f"Cannot create the chat history {self.path}: {exc.strerror or exc}.",
                "Check that the folder is writable (or set K3DESK_HOME elsewhere).",
            ) from None
        try:
            self._con = sqlite3.connect(
                self.path, check_same_thread=False, isolation_level=None, timeout=10.0
            )
        except sqlite3.Error as exc:
            raise self._open_error(exc) from None
        try:
            self._setup(use_fts)
        except sqlite3.DatabaseError as exc:
            self._con.close()
            raise self._open_error(exc) from None
        except HistoryError:
            self._con.close()
            raise

    def _disk_full(self) -> bool:
        """SQLite says "disk I/O error" when it cannot even make its -wal/-shm files."""
        try:
            return shutil.disk_usage(self.path.parent).free < 1024 * 1024
        except OSError:
            return False

    def _open_error(self, exc: sqlite3.Error) -> HistoryError:
        if self._disk_full():
            return HistoryError(
                f"Cannot open the chat history {self.path}: the disk holding it is full ({exc}).",
                "Free some disk space and try again; what was saved before is kept.",
            )
        return HistoryError(
            f"Cannot open the chat history {self.path}: {exc}.",
            "If the file is damaged, move it aside (k3desk then starts an empty history) "
            "or restore it from a backup.",
        )

    def _schema_version(self) -> int:
        version = int(self._con.execute("PRAGMA user_version").fetchone()[0])
        if version > SCHEMA_VERSION:
            raise HistoryError(
                f"The chat history {self.path} was written by a newer k3desk "
                f"(schema {version}; this version reads up to {SCHEMA_VERSION}).",
                "Update k3desk, or move the file aside to start an empty history.",
            )
        return version

    def _journal_mode(self, mode: str) -> str:
        """Switch the journal mode; returns the mode now in force.

        SQLite answers "database is locked" at once, without waiting out the busy
        timeout, when two connections switch a new file to WAL together (two
        threads, or two app instances, opening the history for the first time):
        so retry for as long as the busy timeout would have waited.
        """
        deadline = time.monotonic() + 10.0
        while True:
            try:
                row = self._con.execute(f"PRAGMA journal_mode = {mode}").fetchone()
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.01)
                continue
            return str(row[0]).lower()

    def _setup(self, use_fts: bool | None) -> None:
        con = self._con
        con.execute("PRAGMA foreign_keys = ON")
        con.execute("PRAGMA busy_timeout = 10000")
        if self._journal_mode("WAL") != "wal":
            # e.g. a file system without shared memory; the store still works
            self._journal_mode("DELETE")
        con.execute("PRAGMA synchronous = NORMAL")
        version = self._schema_version()
        if version < SCHEMA_VERSION:
            want_fts = fts5_available() if use_fts is None else use_fts
            # BEGIN IMMEDIATE: one opener at a time; whoever comes second (another
            # thread or process opening the same new file) finds the schema made
            with self._tx():
                version = self._schema_version()
                if version == 0:
                    for stmt in split_sql(SCHEMA_V1 + (FTS_V1 if want_fts else "")):
                        con.execute(stmt)
                    con.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
                # future migrations go here, on the version read inside this transaction:
                # `if version < 2: ...`
        self.has_fts = (
            con.execute(
                "SELECT 1 FROM sqlite_master WHERE type='table' AND name='messages_fts'"
            ).fetchone()
            is not None
        )
        if self.has_fts and use_fts is False:
            self.has_fts = False

    # ---------------------------------------------------------- lifecycle

    def close(self) -> None:
        with self._lock:
            with contextlib.suppress(sqlite3.Error):
                self._con.execute("PRAGMA optimize")
            self._con.close()

    def __enter__(self) -> HistoryStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction: all of it is committed, or none of it (and what was
        committed before stays).  SQLite's failures (a full disk, a read-only or damaged
        file) become a :class:`HistoryError` that says so."""
        with self._lock:
            outer = self._depth == 0
            try:
                if outer:
                    self._con.execute("BEGIN IMMEDIATE")
                self._depth += 1
                try:
                    yield self._con
                except BaseException:
                    self._depth -= 1
                    if outer:
                        with contextlib.suppress(sqlite3.Error):
                            self._con.execute("ROLLBACK")
                    raise
                self._depth -= 1
                if outer:
                    try:
                        self._con.execute("COMMIT")
                    except sqlite3.Error:
                        with contextlib.suppress(sqlite3.Error):
                            self._con.execute("ROLLBACK")
                        raise
            except sqlite3.Error as exc:
                raise self._write_error(exc) from None

    def _write_error(self, exc: sqlite3.Error) -> HistoryError:
        text = str(exc)
        if "full" in text or self._disk_full():
            text = f"the disk holding it is full ({text})"
            hint = "Free some disk space and try again; what was saved before is kept."
        elif "readonly" in text or "read-only" in text:
            hint = "Check the file's and the folder's permissions."
        else:
            hint = "If the file is damaged, move it aside (k3desk then starts an empty history)."
        return HistoryError(f"Cannot write to the chat history {self.path}: {text}.", hint)

    @contextlib.contextmanager
    def batch(self) -> Iterator[HistoryStore]:
        """Group many writes into one transaction (all or nothing, and much faster)."""
        with self._tx():
            yield self

    # ---------------------------------------------------------- conversations

    def create_conversation(
        self,
        title: str = "New chat",
        *,
        system_prompt: str = "",
        settings: ChatSettings | None = None,
        tier: str | None = None,
        model: str | None = None,
    ) -> Conversation:
        now = time.time()
        with self._tx() as con:
            cur = con.execute(
                "INSERT INTO conversations (title, created, updated, system_prompt, settings, "
                "tier, model) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    scrub(title),
                    now,
                    now,
                    scrub(system_prompt),
                    json.dumps((settings or ChatSettings()).to_dict()),
                    _scrub_opt(tier),
                    _scrub_opt(model),
                ),
            )
            cid = int(cur.lastrowid or 0)
        return self.get_conversation(cid)

    def get_conversation(self, conversation_id: int) -> Conversation:
        with self._lock:
            row = self._con.execute(
                f"SELECT {_CONV_COLS} FROM conversations WHERE id = ?", (conversation_id,)
            ).fetchone()
        if row is None:
            raise HistoryError(f"There is no conversation {conversation_id} in {self.path}.")
        return _conversation(row)

    def list_conversations(self, limit: int | None = None, offset: int = 0) -> list[Conversation]:
        """Conversations, most recently updated first."""
        with self._lock:
            rows = self._con.execute(
                f"SELECT {_CONV_COLS} FROM conversations ORDER BY updated DESC, id DESC "
                "LIMIT ? OFFSET ?",
                (-1 if limit is None else limit, offset),
            ).fetchall()
        return [_conversation(r) for r in rows]

    def rename_conversation(self, conversation_id: int, title: str) -> Conversation:
        title = title.strip()
        if not title:
            raise HistoryError("A conversation title cannot be empty.")
        return self.update_conversation(conversation_id, title=title)

    def update_conversation(
        self,
        conversation_id: int,
        *,
        title: str | _Keep = KEEP,
        system_prompt: str | _Keep = KEEP,
        settings: ChatSettings | _Keep = KEEP,
        tier: str | _Keep | None = KEEP,
        model: str | _Keep | None = KEEP,
    ) -> Conversation:
        sets: list[str] = []
        values: list[Any] = []
        for col, val in (
            ("title", title),
            ("system_prompt", system_prompt),
            ("tier", tier),
            ("model", model),
        ):
            if not isinstance(val, _Keep):
                sets.append(f"{col} = ?")
                values.append(_scrub_opt(val))
        if isinstance(settings, ChatSettings):
            sets.append("settings = ?")
            values.append(json.dumps(settings.to_dict()))
        if sets:
            sets.append("updated = ?")
            values.append(time.time())
            with self._tx() as con:
                cur = con.execute(
                    f"UPDATE conversations SET {', '.join(sets)} WHERE id = ?",
                    (*values, conversation_id),
                )
                if cur.rowcount == 0:
                    raise HistoryError(
                        f"There is no conversation {conversation_id} in {self.path}."
                    )
        return self.get_conversation(conversation_id)

    def delete_conversation(self, conversation_id: int) -> None:
        """Delete a conversation, its messages, and images nothing else refers to."""
        with self._tx() as con:
            shas = [
                r[0]
                for r in con.execute(
                    "SELECT DISTINCT i.sha256 FROM message_images i JOIN messages m "
                    "ON m.id = i.message_id WHERE m.conversation_id = ?",
                    (conversation_id,),
                )
            ]
            cur = con.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))
            if cur.rowcount == 0:
                raise HistoryError(f"There is no conversation {conversation_id} in {self.path}.")
            orphans = [
                sha
                for sha in shas
                if con.execute("SELECT 1 FROM message_images WHERE sha256 = ?", (sha,)).fetchone()
                is None
            ]
        for sha in orphans:
            if not _SHA256.fullmatch(sha):
                continue  # a damaged or forged row names no file of ours
            for p in self.images_dir.glob(f"{sha[:2]}/{sha}.*"):
                with contextlib.suppress(OSError):
                    p.unlink()

    # ---------------------------------------------------------- messages

    def add_message(
        self,
        conversation_id: int,
        role: Role,
        content: str,
        *,
        parent_id: int | _Keep | None = KEEP,
        reasoning: str = "",
        images: Sequence[PreparedImage] = (),
        usage: Usage | None = None,
        timings: Timings | None = None,
        partial: bool = False,
        finish_reason: str | None = None,
        model: str | None = None,
    ) -> Message:
        """Append a message (by default under the current leaf) and make it the leaf."""
        if role not in ROLES:
            raise HistoryError(f"Unknown message role {role!r}; use one of {', '.join(ROLES)}.")
        stored = [self._store_image(img) for img in images]
        content, reasoning, model = scrub(content), scrub(reasoning), _scrub_opt(model)
        now = time.time()
        with self._tx() as con:
            parent = self._parent(con, conversation_id, parent_id)
            cur = con.execute(
                "INSERT INTO messages (conversation_id, parent_id, role, content, reasoning, "
                "created, usage, timings, partial, finish_reason, model) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    conversation_id,
                    parent,
                    role,
                    content,
                    reasoning,
                    now,
                    json.dumps(usage.to_dict()) if usage else None,
                    json.dumps(timings.to_dict()) if timings else None,
                    int(partial),
                    finish_reason,
                    model,
                ),
            )
            mid = int(cur.lastrowid or 0)
            if stored:
                _insert_images(con, mid, stored)
            con.execute(
                "UPDATE conversations SET current_leaf = ?, updated = ? WHERE id = ?",
                (mid, now, conversation_id),
            )
        return Message(
            mid,
            conversation_id,
            parent,
            role,
            content,
            reasoning,
            now,
            tuple(stored),
            usage,
            timings,
            partial,
            finish_reason,
            model,
        )

    def _parent(
        self, con: sqlite3.Connection, conversation_id: int, parent_id: int | _Keep | None
    ) -> int | None:
        """The parent a new message gets: the conversation's leaf (``KEEP``) or
        ``parent_id``, which must be a message of that conversation."""
        conv = con.execute(
            "SELECT current_leaf FROM conversations WHERE id = ?", (conversation_id,)
        ).fetchone()
        if conv is None:
            raise HistoryError(f"There is no conversation {conversation_id} in {self.path}.")
        parent: int | None = conv[0] if isinstance(parent_id, _Keep) else parent_id
        if parent is not None:
            owner = con.execute(
                "SELECT conversation_id FROM messages WHERE id = ?", (parent,)
            ).fetchone()
            if owner is None or owner[0] != conversation_id:
                raise HistoryError(
                    f"Message {parent} is not part of conversation {conversation_id}."
                )
        return parent

    def update_message(
        self,
        message_id: int,
        *,
        content: str | _Keep = KEEP,
        reasoning: str | _Keep = KEEP,
        usage: Usage | _Keep | None = KEEP,
        timings: Timings | _Keep | None = KEEP,
        partial: bool | _Keep = KEEP,
        finish_reason: str | _Keep | None = KEEP,
        model: str | _Keep | None = KEEP,
    ) -> Message:
        """Change a stored message in place (e.g. a streamed answer as it completes)."""
        sets: list[str] = []
        values: list[Any] = []
        if not isinstance(content, _Keep):
            sets.append("content = ?")
            values.append(scrub(content))
        if not isinstance(reasoning, _Keep):
            sets.append("reasoning = ?")
            values.append(scrub(reasoning))
        if not isinstance(usage, _Keep):
            sets.append("usage = ?")
            values.append(json.dumps(usage.to_dict()) if usage else None)
        if not isinstance(timings, _Keep):
            sets.append("timings = ?")
            values.append(json.dumps(timings.to_dict()) if timings else None)
        if not isinstance(partial, _Keep):
            sets.append("partial = ?")
            values.append(int(partial))
        if not isinstance(finish_reason, _Keep):
            sets.append("finish_reason = ?")
            values.append(finish_reason)
        if not isinstance(model, _Keep):
            sets.append("model = ?")
            values.append(_scrub_opt(model))
        if sets:
            with self._tx() as con:
                cur = con.execute(
                    f"UPDATE messages SET {', '.join(sets)} WHERE id = ?", (*values, message_id)
                )
                if cur.rowcount == 0:
                    raise HistoryError(f"There is no message {message_id} in {self.path}.")
                con.execute(
                    "UPDATE conversations SET updated = ? WHERE id = "
                    "(SELECT conversation_id FROM messages WHERE id = ?)",
                    (time.time(), message_id),
                )
        return self.get_message(message_id)

    def edit_message(
        self,
        message_id: int,
        content: str,
        *,
        images: Sequence[PreparedImage] | None = None,
    ) -> Message:
        """Edit-and-resend: a new sibling of ``message_id`` with ``content`` becomes the leaf.

        The original message and everything after it stay as another branch.
        ``images`` None keeps the original's images.
        """
        old = self.get_message(message_id)
        if images is None:
            images = [img.to_prepared() for img in old.images]
        return self.add_message(
            old.conversation_id, old.role, content, parent_id=old.parent_id, images=images
        )

    def get_message(self, message_id: int) -> Message:
        with self._lock:
            row = self._con.execute(
                f"SELECT {_MSG_COLS} FROM messages m WHERE m.id = ?", (message_id,)
            ).fetchone()
            if row is None:
                raise HistoryError(f"There is no message {message_id} in {self.path}.")
            images = self._images_for([message_id])
        return self._message(row, images)

    def branch(self, conversation_id: int, leaf_id: int | None = None) -> list[Message]:
        """The messages from the root to ``leaf_id`` (default: the current leaf)."""
        with self._lock:
            if leaf_id is None:
                conv = self._con.execute(
                    "SELECT current_leaf FROM conversations WHERE id = ?", (conversation_id,)
                ).fetchone()
                if conv is None:
                    raise HistoryError(
                        f"There is no conversation {conversation_id} in {self.path}."
                    )
                leaf_id = conv[0]
                if leaf_id is None:
                    return []
            rows = self._con.execute(
                "WITH RECURSIVE path(id, parent_id, depth) AS ("
                " SELECT id, parent_id, 0 FROM messages WHERE id = ? AND conversation_id = ?"
                " UNION ALL"
                " SELECT m.id, m.parent_id, p.depth + 1 FROM messages m"
                " JOIN path p ON m.id = p.parent_id"
                f") SELECT {_MSG_COLS} FROM path p JOIN messages m ON m.id = p.id"
                " ORDER BY p.depth DESC",
                (leaf_id, conversation_id),
            ).fetchall()
            if not rows:
                raise HistoryError(
                    f"Message {leaf_id} is not part of conversation {conversation_id}."
                )
            images = self._images_for([r[0] for r in rows])
        return [self._message(r, images) for r in rows]

    def open_conversation(self, conversation_id: int) -> tuple[Conversation, list[Message]]:
        """The conversation and its current branch, read in one consistent snapshot."""
        with self._lock:
            return self.get_conversation(conversation_id), self.branch(conversation_id)

    def children(self, message_id: int) -> list[Message]:
        with self._lock:
            rows = self._con.execute(
                f"SELECT {_MSG_COLS} FROM messages m WHERE m.parent_id = ? ORDER BY m.id",
                (message_id,),
            ).fetchall()
            images = self._images_for([r[0] for r in rows])
        return [self._message(r, images) for r in rows]

    def siblings(self, message_id: int) -> list[Message]:
        """``message_id`` and the other versions of it (same parent), oldest first."""
        msg = self.get_message(message_id)
        with self._lock:
            rows = self._con.execute(
                f"SELECT {_MSG_COLS} FROM messages m WHERE m.conversation_id = ? AND "
                "m.parent_id IS ? ORDER BY m.id",
                (msg.conversation_id, msg.parent_id),
            ).fetchall()
            images = self._images_for([r[0] for r in rows])
        return [self._message(r, images) for r in rows if r[3] == msg.role]

    def select_branch(self, message_id: int) -> list[Message]:
        """Make the branch through ``message_id`` current (following its newest replies)."""
        msg = self.get_message(message_id)
        with self._tx() as con:
            leaf = message_id
            while True:
                nxt = con.execute(
                    "SELECT MAX(id) FROM messages WHERE parent_id = ?", (leaf,)
                ).fetchone()[0]
                if nxt is None:
                    break
                leaf = int(nxt)
            con.execute(
                "UPDATE conversations SET current_leaf = ? WHERE id = ?",
                (leaf, msg.conversation_id),
            )
        return self.branch(msg.conversation_id)

    # ---------------------------------------------------------- search

    def search(self, query: str, limit: int = 50) -> list[SearchHit]:
        """Conversations whose title or messages contain every word of ``query``."""
        words = query_words(query)
        if not words:
            return []
        hits: list[SearchHit] = []
        with self._lock:
            title_where = " AND ".join("title LIKE ? ESCAPE '\\'" for _ in words)
            for cid, title in self._con.execute(
                f"SELECT id, title FROM conversations WHERE {title_where} "
                "ORDER BY updated DESC LIMIT ?",
                (*[f"%{_like_escape(w)}%" for w in words], limit),
            ):
                hits.append(SearchHit(int(cid), str(title), None, None, str(title)))
            remaining = max(0, limit - len(hits))
            if remaining:
                if self.has_fts:
                    match = " ".join(f'"{w}"*' for w in words)
                    rows = self._con.execute(
                        "SELECT m.conversation_id, c.title, m.id, m.role, "
                        "snippet(messages_fts, -1, '[', ']', '…', 12) "
                        "FROM messages_fts f JOIN messages m ON m.id = f.rowid "
                        "JOIN conversations c ON c.id = m.conversation_id "
                        "WHERE messages_fts MATCH ? ORDER BY f.rank LIMIT ?",
                        (match, remaining),
                    ).fetchall()
                else:
                    where = " AND ".join(
                        "(m.content LIKE ? ESCAPE '\\' OR m.reasoning LIKE ? ESCAPE '\\')"
                        for _ in words
                    )
                    params: list[Any] = []
                    for w in words:
                        pat = f"%{_like_escape(w)}%"
                        params += [pat, pat]
                    rows = [
                        (cid, title, mid, role, _snippet(content or reasoning, words))
                        for cid, title, mid, role, content, reasoning in self._con.execute(
                            "SELECT m.conversation_id, c.title, m.id, m.role, m.content, "
                            "m.reasoning FROM messages m JOIN conversations c "
                            f"ON c.id = m.conversation_id WHERE {where} "
                            "ORDER BY m.id DESC LIMIT ?",
                            (*params, remaining),
                        )
                    ]
                hits.extend(
                    SearchHit(int(cid), str(title), int(mid), cast(Role, role), str(snip))
                    for cid, title, mid, role, snip in rows
                )
        return hits

    # ---------------------------------------------------------- export
    def snapshot(self, conversation_id: int) -> tuple[Conversation, list[Message], list[Message]]:
        """The conversation, every message of every branch (by id) and the current branch,
        read at one moment."""
        with self._lock:
            conv = self.get_conversation(conversation_id)
            rows = self._con.execute(
                f"SELECT {_MSG_COLS} FROM messages m WHERE m.conversation_id = ? ORDER BY m.id",
                (conversation_id,),
            ).fetchall()
            images = self._images_for([r[0] for r in rows])
            return conv, [self._message(r, images) for r in rows], self.branch(conversation_id)

    def export_json(self, conversation_id: int, *, embed_images: bool = False) -> dict[str, Any]:
        """The whole conversation (every branch) as plain JSON-ready data."""
        return history_export.export_json(self, conversation_id, embed_images=embed_images)

    def export_markdown(self, conversation_id: int, *, assets_dir: Path | None = None) -> str:
        """The current branch as Markdown (images copied into ``assets_dir`` if given)."""
        return history_export.export_markdown(self, conversation_id, assets_dir=assets_dir)

    def write_export(self, conversation_id: int, target: Path, *, fmt: str = "md") -> Path:
        """Write the conversation to ``target`` as ``md`` (with an assets folder) or ``json``."""
        return history_export.write_export(self, conversation_id, target, fmt=fmt)

    # ---------------------------------------------------------- internals

    def _store_image(self, img: PreparedImage) -> StoredImage:
        sha = img.sha256
        path = self.images_dir / sha[:2] / f"{sha}.{EXTENSION[img.format]}"
        if not path.exists():
            try:
                private_dir(self.images_dir)
                write_private(path, img.data)
            except OSError as exc:
                raise HistoryError(
                    f"Cannot store the image {img.name or sha} in {self.images_dir}: "
                    f"{exc.strerror or exc}.",
                    "Check free disk space and permissions.",
                ) from None
        return StoredImage(
            sha,
            img.format,
            img.width,
            img.height,
            len(img.data),
            path,
            display_name(Path(img.name).name),
        )

    def _images_for(self, ids: Sequence[int]) -> dict[int, list[StoredImage]]:
        out: dict[int, list[StoredImage]] = {}
        if not ids:
            return out
        for start in range(0, len(ids), 900):
            chunk = ids[start : start + 900]
            marks = ",".join("?" * len(chunk))
            for mid, sha, fmt, w, h, size, name in self._con.execute(
                "SELECT message_id, sha256, format, width, height, size, name "
                f"FROM message_images WHERE message_id IN ({marks}) ORDER BY message_id, position",
                chunk,
            ):
                if not isinstance(sha, str) or not _SHA256.fullmatch(sha) or fmt not in EXTENSION:
                    continue  # a damaged or forged row: it names no file of ours
                f = cast(ImageFormat, fmt)
                out.setdefault(int(mid), []).append(
                    StoredImage(
                        sha,
                        f,
                        int(w),
                        int(h),
                        int(size),
                        self.images_dir / sha[:2] / f"{sha}.{EXTENSION[f]}",
                        str(name),
                    )
                )
        return out

    @staticmethod
    def _message(row: Sequence[Any], images: dict[int, list[StoredImage]]) -> Message:
        mid, cid, parent, role, content, reasoning, created = row[:7]
        usage, timings, partial, fr, model = row[7:]
        return Message(
            id=int(mid),
            conversation_id=int(cid),
            parent_id=None if parent is None else int(parent),
            role=cast(Role, role),
            content=str(content),
            reasoning=str(reasoning),
            created=float(created),
            images=tuple(images.get(int(mid), ())),
            usage=Usage.from_dict(json.loads(usage)) if usage else None,
            timings=Timings.from_dict(json.loads(timings)) if timings else None,
            partial=bool(partial),
            finish_reason=fr,
            model=model,
        )


def _conversation(row: Sequence[Any]) -> Conversation:
    cid, title, created, updated, system_prompt, settings, tier, model, leaf = row
    try:
        s = ChatSettings.from_dict(json.loads(settings or "{}"))
    except (ValueError, TypeError):
        s = ChatSettings()
    return Conversation(
        id=int(cid),
        title=str(title),
        created=float(created),
        updated=float(updated),
        system_prompt=str(system_prompt),
        settings=s,
        tier=tier,
        model=model,
        current_leaf=None if leaf is None else int(leaf),
    )


_SHA256 = re.compile(r"[0-9a-f]{64}")


def _scrub_opt(value: Any) -> Any:
    return scrub(value) if isinstance(value, str) else value


def _like_escape(word: str) -> str:
    return word.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def query_words(query: str) -> list[str]:
    """The words a search looks for (each must occur): runs of letters and digits."""
    return [w for w in re.findall(r"\w+", query, flags=re.UNICODE) if w]


def snippet_spans(snippet: str, query: str) -> list[tuple[str, bool]]:
    """``snippet`` (as :meth:`HistoryStore.search` writes it, each match in ``[...]``) as
    (text, is a match) pieces: only brackets around a word of ``query`` are markers, so
    brackets of the text itself stay text."""
    words = query_words(query)
    if not words:
        return [(snippet, False)] if snippet else []
    alt = "|".join(re.escape(w) for w in sorted(words, key=len, reverse=True))
    plain = re.sub(rf"\[((?:{alt})\w*)\]", r"\1", snippet, flags=re.IGNORECASE)
    out: list[tuple[str, bool]] = []
    pos = 0
    for m in re.finditer(alt, plain, flags=re.IGNORECASE):
        if m.start() > pos:
            out.append((plain[pos : m.start()], False))
        out.append((m.group(0), True))
        pos = m.end()
    if pos < len(plain):
        out.append((plain[pos:], False))
    return out


def _snippet(text: str, words: Sequence[str], width: int = 60) -> str:
    low = text.lower()
    pos = min((i for w in words if (i := low.find(w.lower())) >= 0), default=0)
    start = max(0, pos - width // 2)
    piece = text[start : start + width]
    for w in words:
        piece = re.sub(f"({re.escape(w)})", r"[\1]", piece, flags=re.IGNORECASE)
    return ("…" if start > 0 else "") + piece + ("…" if start + width < len(text) else "")


def _insert_images(con: sqlite3.Connection, message_id: int, stored: Sequence[StoredImage]) -> None:
    """Link the stored images to ``message_id``, in order."""
    con.executemany(
        "INSERT INTO message_images (message_id, position, sha256, format, width, "
        "height, size, name) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        [
            (message_id, i, s.sha256, s.format, s.width, s.height, s.size, s.name)
            for i, s in enumerate(stored)
        ],
    )
