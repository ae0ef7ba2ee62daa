"""The chat history under attack and accident: forged rows, kill -9 mid-write, a full disk,
and ``chat --save`` killed mid-answer."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from k3desk.core.chat.history import HistoryStore
from k3desk.core.chat.images import prepare_image
from k3desk.core.paths import default_paths
from tests.conftest import REPO
from tests.hostile.conftest import (
    StandIn,
    files_under,
    k3desk_env,
    no_traceback,
    png,
    run_k3desk,
)


def test_a_forged_image_row_names_no_file_outside_the_history(tmp_path: Path) -> None:
    """A history file from elsewhere (or edited) may hold any text where a hash should be."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    db = tmp_path / "data" / "history.sqlite3"
    with HistoryStore(db) as h:
        conv = h.create_conversation("forged")
        msg = h.add_message(conv.id, "user", "look", images=[prepare_image(png(), name="a.png")])
    forged = os.path.relpath(tmp_path / "victim", db.parent / "history-images" / "xx")
    with sqlite3.connect(db) as con:
        con.execute(
            "INSERT INTO message_images VALUES (?, 1, ?, 'png', 1, 1, 1, 'x')", (msg.id, forged)
        )
        con.execute(
            "INSERT INTO message_images VALUES (?, 2, ?, 'exe', 1, 1, 1, 'y')", (msg.id, "f" * 64)
        )
    before = files_under(tmp_path)
    with HistoryStore(db) as h:
        _, branch = h.open_conversation(conv.id)
        assert [len(m.images) for m in branch] == [1]  # the genuine one only
        md = h.export_markdown(conv.id, assets_dir=tmp_path / "export_files")
        assert "victim" not in md
        h.delete_conversation(conv.id)
    assert victim.read_text() == "precious"
    assert files_under(tmp_path) - before <= files_under(tmp_path / "export_files")


def test_image_names_are_labels_not_paths_or_markup(tmp_path: Path) -> None:
    with HistoryStore(tmp_path / "h.sqlite3") as h:
        conv = h.create_conversation("names")
        names = ["../../../x.png", "x\n## System\n![pwn](javascript:alert(1)) \udcff.png"]
        images = [prepare_image(png(i), name=n) for i, n in enumerate(names)]
        h.add_message(conv.id, "user", "see", images=images)
        stored = h.branch(conv.id)[0].images
        assert [i.name for i in stored] == [
            "x.png",
            "x## System![pwn](javascript:alert(1)) \ufffd.png",
        ]
        for img in stored:  # stored by their hash, nowhere else
            assert img.path.parent.parent == h.images_dir
        md = h.export_markdown(conv.id)
    assert "\n## System" not in md
    assert r"!\[pwn\](javascript" in md


WRITER = textwrap.dedent(
    """
    import sys
    from k3desk.core.chat.history import HistoryStore
    with HistoryStore(sys.argv[1]) as h:
        for i in range(100000):
            with h.batch():
                c = h.create_conversation(f"c{i}")
                h.add_message(c.id, "user", "q" * 2000)
                h.add_message(c.id, "assistant", "a" * 4000)
            print(c.id, flush=True)  # committed
    """
)


def test_kill_9_during_history_writes_loses_nothing_committed(tmp_path: Path) -> None:
    db = tmp_path / "history.sqlite3"
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(db)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    committed: list[int] = []
    for line in proc.stdout:
        committed.append(int(line))
        if len(committed) == 150:
            os.kill(proc.pid, signal.SIGKILL)
            break
    proc.wait(10)
    proc.stdout.close()
    with sqlite3.connect(db) as con:
        assert con.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    with HistoryStore(db) as h:
        ids = {c.id for c in h.list_conversations()}
        assert set(committed) <= ids
        for cid in committed:  # each one whole: both messages, or it would not be listed
            assert [m.role for m in h.branch(cid)] == ["user", "assistant"]
        h.add_message(h.create_conversation("after").id, "user", "still writable")


@pytest.fixture
def full_disk(tmpfs: Callable[[int], Path]) -> tuple[Path, Path]:
    """A real 8 MiB filesystem, and the file that will fill it (delete it to free the space)."""
    mnt = tmpfs(8)
    return mnt, mnt / "filler"


def fill(mnt: Path, filler: Path) -> None:
    with filler.open("wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass


def test_a_full_disk_is_a_message_and_what_was_saved_stays(
    full_disk: tuple[Path, Path], standin: StandIn
) -> None:
    mnt, filler = full_disk
    home = mnt / "home"
    env = k3desk_env(K3DESK_HOME=str(home))
    first = run_k3desk("chat", "--url", standin.url, "--save", "first question", env=env)
    assert first.returncode == 0, first.stderr.decode()
    fill(mnt, filler)

    r = run_k3desk("chat", "--url", standin.url, "--save", "-", input=b"q" * 200_000, env=env)
    err = r.stderr.decode()
    assert r.returncode == 1, err
    no_traceback(r.stderr)
    assert "error: Cannot " in err
    assert "the chat history" in err
    assert "the disk holding it is full" in err
    assert "Free some disk space and try again; what was saved before is kept." in err

    filler.unlink()
    with HistoryStore(home / "data" / "history.sqlite3") as h:
        convs = h.list_conversations()
        assert [c.title for c in convs] == ["first question"]
        assert [m.content for m in h.branch(convs[0].id)] == ["first question", "Hello world"]


def test_chat_save_killed_mid_answer_keeps_the_prompt_and_what_arrived(standin: StandIn) -> None:
    standin.tokens = [("content", f"word{i} ") for i in range(200)]
    standin.token_delay = 0.05
    proc = subprocess.Popen(
        [sys.executable, "-m", "k3desk", "chat", "--url", standin.url, "--save", "keep me"],
        cwd=REPO,
        env=k3desk_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert proc.stdout is not None
    got = b""
    deadline = time.monotonic() + 30
    while got.count(b"word") < 40:  # two seconds of answer
        got += proc.stdout.read1(4096)
        assert time.monotonic() < deadline
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    proc.stdout.close()
    with HistoryStore(default_paths().history_db) as h:
        (conv,) = h.list_conversations()
        question, answer = h.branch(conv.id)
    assert (question.role, question.content) == ("user", "keep me")
    assert answer.role == "assistant"
    assert answer.partial
    assert answer.content.startswith("word0 word1 ")  # up to its last second, at least
    assert answer.content.count("word") >= 10


def test_chat_save_writes_the_answer_whole_when_it_completes(standin: StandIn) -> None:
    r = run_k3desk("chat", "--url", standin.url, "--save", "--json", "hello")
    assert r.returncode == 0, r.stderr.decode()
    result = json.loads(r.stdout)
    with HistoryStore(default_paths().history_db) as h:
        (conv,) = h.list_conversations()
        _, answer = h.branch(conv.id)
    assert answer.content == result["text"] == "Hello world"
    assert answer.reasoning == "Let me think."
    assert not answer.partial
    assert answer.usage is not None
    assert conv.model == "tiny-k3"


def test_a_history_that_cannot_be_written_fails_before_the_question_is_asked(
    standin: StandIn, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    (home / "data").mkdir(parents=True)
    (home / "data" / "history.sqlite3").mkdir()  # a folder where the file should be
    r = run_k3desk(
        "chat", "--url", standin.url, "--save", "hi", env=k3desk_env(K3DESK_HOME=str(home))
    )
    assert r.returncode == 1
    no_traceback(r.stderr)
    assert "chat history" in r.stderr.decode()
    assert standin.requests == []  # nothing asked that could not be kept
