"""The conversation store: branches, partial answers, search, export, speed, threads."""

from __future__ import annotations

import io
import itertools
import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from PIL import Image

from k3desk.core.chat.history import SCHEMA_VERSION, HistoryError, HistoryStore, fts5_available
from k3desk.core.chat.images import prepare_image
from k3desk.core.chat.model import ChatSettings, Timings, Usage


@pytest.fixture(params=["fts", "like"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[HistoryStore]:
    use_fts = request.param == "fts"
    if use_fts and not fts5_available():
        pytest.skip("this SQLite has no FTS5")
    s = HistoryStore(tmp_path / "history.sqlite3", use_fts=use_fts)
    yield s
    s.close()


def png(color: tuple[int, int, int]) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (16, 16), color).save(buf, format="PNG")
    return buf.getvalue()


def test_conversation_keeps_its_settings_and_survives_reopening(tmp_path: Path) -> None:
    db = tmp_path / "h.sqlite3"
    with HistoryStore(db) as h:
        conv = h.create_conversation(
            "Trip planning",
            system_prompt="Be brief.",
            settings=ChatSettings(temperature=0.7, thinking=False, thinking_effort="low"),
            tier="unsloth-ud-iq1-s",
            model="Kimi-K3",
        )
        h.add_message(conv.id, "user", "Where to?")
        h.add_message(
            conv.id,
            "assistant",
            "Lisbon.",
            reasoning="Warm in spring.",
            usage=Usage(20, 3, 23),
            timings=Timings(20, 5.0, 3, 30.0, 100.0),
            finish_reason="stop",
        )
    with HistoryStore(db) as h:
        conv2, msgs = h.open_conversation(conv.id)
    assert (conv2.title, conv2.system_prompt, conv2.tier, conv2.model) == (
        "Trip planning",
        "Be brief.",
        "unsloth-ud-iq1-s",
        "Kimi-K3",
    )
    assert conv2.settings.temperature == 0.7
    assert conv2.settings.thinking is False
    assert conv2.settings.thinking_effort == "low"
    assert [(m.role, m.content) for m in msgs] == [("user", "Where to?"), ("assistant", "Lisbon.")]
    assert msgs[1].reasoning == "Warm in spring."
    assert msgs[1].usage == Usage(20, 3, 23)
    assert msgs[1].timings is not None
    assert msgs[1].timings.predicted_per_second == 100.0
    assert msgs[1].parent_id == msgs[0].id
    assert conv2.current_leaf == msgs[1].id


def test_edit_and_resend_keeps_the_old_branch(store: HistoryStore) -> None:
    c = store.create_conversation("c")
    q1 = store.add_message(c.id, "user", "What is 2+2?")
    store.add_message(c.id, "assistant", "4")
    q2 = store.add_message(c.id, "user", "And 3+3?")
    a2 = store.add_message(c.id, "assistant", "6")

    edited = store.edit_message(q2.id, "And 3*3?")
    store.add_message(c.id, "assistant", "9")
    assert [m.content for m in store.branch(c.id)] == ["What is 2+2?", "4", "And 3*3?", "9"]
    assert edited.parent_id == q2.parent_id

    # both versions of the question are siblings; the old branch is intact
    assert [m.content for m in store.siblings(q2.id)] == ["And 3+3?", "And 3*3?"]
    assert [m.content for m in store.branch(c.id, a2.id)] == ["What is 2+2?", "4", "And 3+3?", "6"]

    # going back to the old version follows its answer
    assert [m.content for m in store.select_branch(q2.id)][-1] == "6"
    assert store.get_conversation(c.id).current_leaf == a2.id

    # editing the very first message starts a second root
    root2 = store.edit_message(q1.id, "What is 5+5?")
    assert root2.parent_id is None
    assert [m.content for m in store.branch(c.id)] == ["What is 5+5?"]
    assert len(store.siblings(q1.id)) == 2


def test_regenerated_answers_are_siblings(store: HistoryStore) -> None:
    c = store.create_conversation("c")
    q = store.add_message(c.id, "user", "Name a colour")
    first = store.add_message(c.id, "assistant", "Red")
    second = store.add_message(c.id, "assistant", "Blue", parent_id=q.id)
    assert [m.content for m in store.siblings(first.id)] == ["Red", "Blue"]
    assert [m.content for m in store.children(q.id)] == ["Red", "Blue"]
    assert [m.content for m in store.branch(c.id)] == ["Name a colour", "Blue"]
    assert store.select_branch(first.id)[-1].content == "Red"
    assert store.get_conversation(c.id).current_leaf == first.id
    assert second.parent_id == q.id


def test_edit_keeps_images_unless_replaced(store: HistoryStore) -> None:
    c = store.create_conversation("c")
    red = prepare_image(png((255, 0, 0)), name="/tmp/red.png")
    q = store.add_message(c.id, "user", "Colour?", images=[red])
    kept = store.edit_message(q.id, "Which colour?")
    assert [i.sha256 for i in kept.images] == [red.sha256]
    blue = prepare_image(png((0, 0, 255)), name="blue.png")
    swapped = store.edit_message(q.id, "Which colour now?", images=[blue])
    assert [i.name for i in swapped.images] == ["blue.png"]
    assert swapped.images[0].read_bytes() == blue.data


def test_partial_answer_is_marked_and_can_be_completed(store: HistoryStore) -> None:
    c = store.create_conversation("c")
    store.add_message(c.id, "user", "Tell me a story")
    a = store.add_message(c.id, "assistant", "", partial=True)
    # the engine crashed after some text: keep it, still marked partial
    store.update_message(a.id, content="Once upon a", reasoning="A story.", partial=True)
    msgs = store.branch(c.id)
    assert msgs[-1].partial
    assert msgs[-1].content == "Once upon a"
    assert "*(partial answer" in store.export_markdown(c.id)
    done = store.update_message(
        a.id, content="Once upon a time.", partial=False, finish_reason="stop"
    )
    assert not done.partial
    assert done.finish_reason == "stop"


def test_search_finds_words_in_messages_and_titles(store: HistoryStore) -> None:
    a = store.create_conversation("Llama care")
    store.add_message(a.id, "user", "How much hay does a llama eat?")
    store.add_message(
        a.id, "assistant", "About 2 percent of its body weight.", reasoning="Hay rations."
    )
    b = store.create_conversation("Rust lifetimes")
    store.add_message(b.id, "user", "Explain borrowing in Rust")

    hits = store.search("llama")
    assert hits[0].message_id is None  # the title
    assert hits[0].conversation_id == a.id
    msg_hits = [h for h in hits if h.message_id is not None]
    assert [h.conversation_id for h in msg_hits] == [a.id]
    assert "[llama]" in msg_hits[0].snippet.lower()

    both = store.search("hay weight")  # every word must match (content or reasoning)
    assert [h.role for h in both] == ["assistant"]
    assert [h.conversation_id for h in store.search("BORROWING")] == [b.id]
    assert store.search("zebra") == []
    assert store.search("   ") == []
    # query syntax characters are taken as plain text, never as an error
    assert [h.role for h in store.search('"hay* (weight')] == ["assistant"]


def test_search_sees_edits(store: HistoryStore) -> None:
    c = store.create_conversation("c")
    m = store.add_message(c.id, "assistant", "first draft", partial=True)
    store.update_message(m.id, content="final wording")
    assert store.search("draft") == []
    assert [h.message_id for h in store.search("wording")] == [m.id]


def test_rename_and_delete(store: HistoryStore, tmp_path: Path) -> None:
    c = store.create_conversation("old")
    img = prepare_image(png((0, 255, 0)), name="g.png")
    m = store.add_message(c.id, "user", "look", images=[img])
    stored = m.images[0].path
    assert stored.exists()
    assert stored.is_relative_to(tmp_path)

    other = store.create_conversation("keeps the same image")
    store.add_message(other.id, "user", "same", images=[img])

    assert store.rename_conversation(c.id, "  new name ").title == "new name"
    with pytest.raises(HistoryError, match="cannot be empty"):
        store.rename_conversation(c.id, "  ")
    store.delete_conversation(c.id)
    with pytest.raises(HistoryError, match=f"no conversation {c.id}"):
        store.get_conversation(c.id)
    assert stored.exists()  # still used by the other conversation
    store.delete_conversation(other.id)
    assert not stored.exists()
    assert store.list_conversations() == []


def test_list_is_most_recent_first(store: HistoryStore) -> None:
    a = store.create_conversation("a")
    b = store.create_conversation("b")
    time.sleep(0.01)
    store.add_message(a.id, "user", "bump")
    assert [c.title for c in store.list_conversations()] == ["a", "b"]
    assert [c.id for c in store.list_conversations(limit=1, offset=1)] == [b.id]


def test_export_markdown_and_json(store: HistoryStore, tmp_path: Path) -> None:
    c = store.create_conversation("Colours", system_prompt="Answer in one word.")
    img = prepare_image(png((255, 0, 0)), name="/photos/red.png")
    q = store.add_message(c.id, "user", "What colour is this?", images=[img])
    store.add_message(c.id, "assistant", "Red.", reasoning="The pixels are red.")
    store.edit_message(q.id, "Name the colour.")
    store.add_message(c.id, "assistant", "Crimson.")

    md = store.export_markdown(c.id)
    assert md.startswith("# Colours\n")
    assert "## System\n\nAnswer in one word." in md
    assert "Name the colour." in md
    assert "Crimson." in md
    assert "Red." not in md  # only the current branch
    assert "![red.png](file://" in md

    target = store.write_export(c.id, tmp_path / "out" / "colours.md")
    text = target.read_text()
    assert "![red.png](colours_files/" in text
    assets = list((tmp_path / "out" / "colours_files").iterdir())
    assert [p.read_bytes() for p in assets] == [img.data]

    data = store.export_json(c.id)
    assert data["format"] == "k3desk-conversation"
    assert data["conversation"]["system_prompt"] == "Answer in one word."
    assert len(data["messages"]) == 4  # every branch
    by_id = {m["id"]: m for m in data["messages"]}
    assert [by_id[i]["content"] for i in data["current_path"]] == ["Name the colour.", "Crimson."]
    assert by_id[q.id]["images"][0]["mime"] == "image/png"
    assert by_id[q.id + 1]["reasoning"] == "The pixels are red."

    jpath = store.write_export(c.id, tmp_path / "colours.json", fmt="json")
    loaded = json.loads(jpath.read_text())
    import base64

    assert base64.b64decode(loaded["messages"][0]["images"][0]["data"]) == img.data
    with pytest.raises(HistoryError, match="Unknown export format 'pdf'"):
        store.write_export(c.id, tmp_path / "x.pdf", fmt="pdf")


def test_opening_a_10000_message_conversation_is_fast(tmp_path: Path) -> None:
    db = tmp_path / "big.sqlite3"
    with HistoryStore(db) as h:
        c = h.create_conversation("long")
        noise = h.create_conversation("other")
        with h.batch():
            for i in range(10_000):
                role = "user" if i % 2 == 0 else "assistant"
                h.add_message(c.id, role, f"message {i} " + "lorem ipsum " * 20)
                if i % 10 == 0:  # other conversations and side branches in the same file
                    h.add_message(noise.id, "user", f"noise {i}")
            last = h.get_conversation(c.id).current_leaf
            assert last is not None
            side = h.edit_message(last - 5000, "a side branch")
            h.select_branch(last)
    assert side.id != last
    times, anchor = [], []
    for _ in range(3):
        t0 = time.perf_counter()
        with HistoryStore(db) as h:
            _, msgs = h.open_conversation(c.id)
        times.append(time.perf_counter() - t0)
        # the anchor, timed in the same run on the same (possibly busy) machine: the same
        # rows read straight from SQLite, with nothing built from them
        t0 = time.perf_counter()
        con = sqlite3.connect(db)
        rows = con.execute("SELECT * FROM messages WHERE conversation_id = ?", (c.id,)).fetchall()
        con.close()
        anchor.append(time.perf_counter() - t0)
    assert len(msgs) == len(rows) - 1 == 10_000  # the side branch is not on the path
    assert msgs[0].content.startswith("message 0 ")
    assert msgs[-1].content.startswith("message 9999 ")
    assert all(m.parent_id == p.id for p, m in itertools.pairwise(msgs))
    ratio = min(times) / min(anchor)
    print(
        f"open 10,000-message conversation: best {min(times) * 1000:.1f} ms, "
        f"{ratio:.1f}x a plain read of its rows"
    )
    # walking the branch by primary key and building the messages costs a small multiple
    # of reading the rows; a walk that rescanned the table per step would be 1000s of x
    assert ratio < 25


def test_writes_from_several_threads_at_once(tmp_path: Path) -> None:
    with HistoryStore(tmp_path / "t.sqlite3") as h:
        convs = [h.create_conversation(f"c{i}") for i in range(4)]
        errors: list[BaseException] = []

        def work(cid: int) -> None:
            try:
                for j in range(100):
                    m = h.add_message(cid, "user", f"q{j}")
                    h.update_message(m.id, content=f"q{j}!")
                    h.branch(cid)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(c.id,)) for c in convs]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert errors == []
        for c in convs:
            assert [m.content for m in h.branch(c.id)] == [f"q{j}!" for j in range(100)]


def _open_at_once(db: Path, n: int, use_fts: bool | None) -> list[HistoryStore]:
    start = threading.Barrier(n)
    opened: list[HistoryStore] = []
    errors: list[BaseException] = []

    def open_it() -> None:
        start.wait()
        try:
            opened.append(HistoryStore(db, use_fts=use_fts))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=open_it) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for h in opened if errors else ():
        h.close()
    assert errors == []
    return opened


@pytest.mark.parametrize("use_fts", [None, False])
def test_threads_opening_a_new_history_at_once_all_get_it(
    tmp_path: Path, use_fts: bool | None
) -> None:
    """The first start: a worker listing conversations and one saving a message race."""
    for attempt in range(8):
        db = tmp_path / f"race{attempt}" / "history.sqlite3"
        opened = _open_at_once(db, 4, use_fts)
        conv = opened[0].create_conversation("first")
        for h in opened:  # every store sees the one schema and the same data
            assert [c.id for c in h.list_conversations()] == [conv.id]
            h.close()
        con = sqlite3.connect(db)
        assert con.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        con.close()


def test_newer_schema_and_damaged_files_are_refused_clearly(tmp_path: Path) -> None:
    newer = tmp_path / "newer.sqlite3"
    con = sqlite3.connect(newer)
    con.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    con.close()
    with pytest.raises(HistoryError) as err:
        HistoryStore(newer)
    assert str(newer) in err.value.message
    assert "newer k3desk" in err.value.message

    junk = tmp_path / "junk.sqlite3"
    junk.write_bytes(b"this is not a database at all" * 100)
    with pytest.raises(HistoryError) as err2:
        HistoryStore(junk)
    assert str(junk) in err2.value.message
    assert "move it aside" in err2.value.hint


def test_the_store_is_sqlite_in_wal_mode_with_a_version(tmp_path: Path) -> None:
    db = tmp_path / "h.sqlite3"
    HistoryStore(db).close()
    con = sqlite3.connect(db)
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert con.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    con.close()


def test_bad_references_are_refused(store: HistoryStore) -> None:
    a = store.create_conversation("a")
    b = store.create_conversation("b")
    m = store.add_message(a.id, "user", "hi")
    with pytest.raises(HistoryError, match=f"Message {m.id} is not part of conversation {b.id}"):
        store.add_message(b.id, "assistant", "hello", parent_id=m.id)
    with pytest.raises(HistoryError, match="no conversation 999"):
        store.add_message(999, "user", "x")
    with pytest.raises(HistoryError, match="no message 999"):
        store.update_message(999, content="x")


def test_a_batch_that_fails_half_way_leaves_nothing_behind(tmp_path: Path) -> None:
    """All or nothing: a failure after some writes of a batch undoes those writes, and what
    was saved before the batch stays -- also for the next start, reading the file again."""
    path = tmp_path / "history.sqlite3"
    with HistoryStore(path) as s:
        kept = s.create_conversation("kept")
        s.add_message(kept.id, "user", "saved before")

        class Interrupted(Exception):
            pass

        def half_a_batch() -> None:
            with s.batch():
                half = s.create_conversation("half")
                s.add_message(half.id, "user", "written inside the batch")
                s.add_message(kept.id, "assistant", "also inside the batch")
                raise Interrupted

        with pytest.raises(Interrupted):
            half_a_batch()
        assert [c.title for c in s.list_conversations()] == ["kept"]
        assert s.search("inside") == []
        # the store is usable again after the failure
        s.add_message(kept.id, "assistant", "after the batch")
    with HistoryStore(path) as again:
        titles = [c.title for c in again.list_conversations()]
        assert titles == ["kept"]
        _, messages = again.open_conversation(kept.id)
        assert [m.content for m in messages] == ["saved before", "after the batch"]
