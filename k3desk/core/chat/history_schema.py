"""The conversation store's SQLite schema (version 1) and its full-text index."""

from __future__ import annotations

import sqlite3

SCHEMA_V1 = """
CREATE TABLE conversations (
    id            INTEGER PRIMARY KEY,
    title         TEXT NOT NULL,
    created       REAL NOT NULL,
    updated       REAL NOT NULL,
    system_prompt TEXT NOT NULL DEFAULT '',
    settings      TEXT NOT NULL DEFAULT '{}',
    tier          TEXT,
    model         TEXT,
    current_leaf  INTEGER
);
CREATE INDEX conversations_updated ON conversations(updated DESC);
CREATE TABLE messages (
    id              INTEGER PRIMARY KEY,
    conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    parent_id       INTEGER REFERENCES messages(id) ON DELETE CASCADE,
    role            TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant')),
    content         TEXT NOT NULL DEFAULT '',
    reasoning       TEXT NOT NULL DEFAULT '',
    created         REAL NOT NULL,
    usage           TEXT,
    timings         TEXT,
    partial         INTEGER NOT NULL DEFAULT 0,
    finish_reason   TEXT,
    model           TEXT
);
CREATE INDEX messages_tree ON messages(conversation_id, parent_id, id);
CREATE INDEX messages_parent ON messages(parent_id);
CREATE TABLE message_images (
    message_id INTEGER NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
    position   INTEGER NOT NULL,
    sha256     TEXT NOT NULL,
    format     TEXT NOT NULL,
    width      INTEGER NOT NULL,
    height     INTEGER NOT NULL,
    size       INTEGER NOT NULL,
    name       TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (message_id, position)
);
CREATE INDEX message_images_sha ON message_images(sha256);
"""

FTS_V1 = """
CREATE VIRTUAL TABLE messages_fts USING fts5(
    content, reasoning, content='messages', content_rowid='id',
    tokenize='unicode61 remove_diacritics 2'
);
CREATE TRIGGER messages_fts_ins AFTER INSERT ON messages BEGIN
    INSERT INTO messages_fts(rowid, content, reasoning)
    VALUES (new.id, new.content, new.reasoning);
END;
CREATE TRIGGER messages_fts_del AFTER DELETE ON messages BEGIN
    INSERT INTO messages_fts(messages_fts, rowid, content, reasoning)
    VALUES ('delete', old.id, old.content, old.reasoning);
END;
CREATE TRIGGER messages_fts_upd AFTER UPDATE OF content, reasoning ON messages BEGIN
    INSERT INTO messages_fts(messages_fts, rowid, content, reasoning)
    VALUES ('delete', old.id, old.content, old.reasoning);
    INSERT INTO messages_fts(rowid, content, reasoning)
    VALUES (new.id, new.content, new.reasoning);
END;
"""

def fts5_available() -> bool:
    """Whether this Python's SQLite has the FTS5 full-text module."""
    con = sqlite3.connect(":memory:")
    try:
        con.execute("CREATE VIRTUAL TABLE t USING fts5(x)")
    except sqlite3.OperationalError:
        return False
    finally:
        con.close()
    return True


def split_sql(script: str) -> list[str]:
    """Statements of a schema script (triggers keep their inner semicolons)."""
    out: list[str] = []
    buf: list[str] = []
    in_trigger = False
    for line in script.strip().splitlines():
        if not line.strip():
            continue
        buf.append(line)
        if line.lstrip().upper().startswith("CREATE TRIGGER"):
            in_trigger = True
        if in_trigger:
            if line.strip().upper() == "END;":
                out.append("\n".join(buf))
                buf = []
                in_trigger = False
        elif line.rstrip().endswith(";"):
            out.append("\n".join(buf))
            buf = []
    if buf:
        out.append("\n".join(buf))
    return out
