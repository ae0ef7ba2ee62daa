"""A conversation continued after the engine stopped is not read again: its state is kept.

Each `k3desk chat SHARD` below starts the real llama-server b11434 on the tiny Kimi-K3 and
stops it at the end, as a restart does.  The oracles are the engine's own: its timings
say how many prompt tokens it read (``prompt_n``) and took from the restored state
(``cache_n``), and a run with no state kept gives the answer a restored one must equal
(greedy, fixed seed, thinking off).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from k3desk.core.app.chat_turn import (
    ConversationStates,
    TurnRecord,
    delete_conversation,
    run_turn,
)
from k3desk.core.chat.client import ChatClient, ChatEndpoint, ChatMessage
from k3desk.core.chat.history import HistoryStore
from k3desk.core.chat.images import load_image
from k3desk.core.chat.kept_state import (
    DELETED,
    MIN_RATE_TOKENS,
    ORPHAN_AGE,
    OVERTAKEN,
    PER_CONVERSATION,
    PICTURE,
    Kept,
    StateKeeper,
    states_dir,
)
from k3desk.core.chat.model import ChatSettings
from k3desk.core.engines.supervisor import LaunchSpec, Supervisor
from k3desk.core.paths import default_paths
from k3desk.core.progress import CancelToken
from k3desk.core.units import fmt_bytes
from k3desk.devtools.tinyk3 import TinyModel
from tests.processes import SlotsHeld

REPO = Path(__file__).resolve().parents[3]
pytestmark = [pytest.mark.engine]
QUESTIONS = ("Tell me a long story about a cat and a dog.", "And then?")
SETTINGS = ChatSettings(thinking=False, max_tokens=4, seed=1, temperature=0.0)


def chat(home: Path, engine: Path, shard: Path, *args: str) -> dict[str, Any]:
    """`k3desk chat SHARD ... --json` in ``home``; its JSON answer (and stderr)."""
    env = {**os.environ, "K3DESK_HOME": str(home), "PYTHONPATH": str(REPO)}
    r = subprocess.run(
        [sys.executable, "-m", "k3desk", "chat", str(shard), "--engine", str(engine), "--json",
         "--seed", "1", "--temperature", "0", "--no-thinking", "--max-tokens", "8", *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    out: dict[str, Any] = json.loads(r.stdout.splitlines()[-1])
    return out


def two_turns(
    home: Path, engine: Path, shard: Path, *more: str, then: tuple[str, ...] = ()
) -> dict[str, Any]:
    """A saved first turn (with ``more``), then the second with --continue (with ``then``),
    a fresh engine each."""
    first = chat(home, engine, shard, "--save", QUESTIONS[0], *more)
    assert first["engine_state"]["kept"]["done"], first["engine_state"]
    return chat(home, engine, shard, *then, "--continue", str(first["conversation"]), QUESTIONS[1])


def read_again(out: dict[str, Any], why: str) -> None:
    """The kept state was not used, for ``why``, and the engine read the whole prompt."""
    restored = out["engine_state"]["restored"]
    assert not restored["done"]
    assert why in restored["why"]
    assert out["timings"]["cache_n"] == 0
    assert restored["reread"] == out["timings"]["prompt_n"]  # the engine's own count, said
    assert restored["said"].startswith(f"Re-reading {restored['reread']:,} tokens")
    assert out["text"]


@contextlib.contextmanager
def engine(llama_server: Path, model: TinyModel, folder: Path | None) -> Iterator[ChatClient]:
    """llama-server on ``model`` (one slot) saving states in ``folder``; a client of it."""
    vision = ("--mmproj", str(model.mmproj)) if model.mmproj else ()
    spec = LaunchSpec(llama_server, ("-m", str(model.first_part), "-c", "2048", "-np", "1",
                                     "--jinja", *vision), state_dir=folder)  # fmt: skip
    with Supervisor(spec, default_paths()) as sup:
        sup.start()
        ep = sup.wait_ready(90)
        with ChatClient(ChatEndpoint(ep.url, ep.api_key, owner_pid=ep.pid)) as client:
            yield client
        assert not sup.wait_stopped(0.1)  # still running
        sup.stop()


def test_a_continued_conversation_starts_from_its_kept_state(
    llama_server: Path, tiny_k3_single: TinyModel, tmp_path: Path
) -> None:
    os.umask(0)  # the state folder and files are private whatever the umask
    try:
        kept = two_turns(tmp_path / "kept", llama_server, tiny_k3_single.first_part)
    finally:
        os.umask(0o022)
    restored = kept["engine_state"]["restored"]
    assert restored["done"], restored
    # the engine read only the new question: everything before came from the state
    assert kept["timings"]["cache_n"] == restored["tokens"] > 0
    assert restored["said"].startswith(f"Resumed from saved state ({restored['tokens']:,} tokens")
    assert kept["timings"]["prompt_n"] < kept["usage"]["prompt_tokens"] - restored["tokens"] + 1

    # the same two turns with nothing kept: read again, the same answer
    cold_home = tmp_path / "cold"
    first = chat(cold_home, llama_server, tiny_k3_single.first_part, "--save", QUESTIONS[0])
    for f in states_dir(cold_home / "cache").iterdir():
        f.unlink()
    cold = chat(cold_home, llama_server, tiny_k3_single.first_part, "--continue",
                str(first["conversation"]), QUESTIONS[1])  # fmt: skip
    assert not cold["engine_state"]["restored"]["done"]
    read_again(cold, "No engine state was kept")  # its tokens said, the picture's included
    assert cold["text"] == kept["text"]

    folder = states_dir(tmp_path / "kept" / "cache")
    assert folder.stat().st_mode & 0o777 == 0o700
    files = list(folder.iterdir())
    assert files
    assert all(f.stat().st_mode & 0o077 == 0 for f in files), [oct(f.stat().st_mode) for f in files]


def picture(folder: Path, color: str) -> Path:
    path = folder / f"{color}.png"
    Image.new("RGB", (48, 48), color).save(path)
    return path


def test_a_conversation_with_a_picture_starts_from_its_kept_state(
    llama_server: Path, tiny_k3: TinyModel, tmp_path: Path
) -> None:
    """The picture is read into the kept state with the words around it (the engine saves
    a slot's picture chunks): continued after a restart, the engine reads only the new
    question, and answers as it does reading the picture and all again."""
    assert tiny_k3.mmproj is not None
    vision = ("--mmproj", str(tiny_k3.mmproj))
    looked = (*vision, "--image", str(picture(tmp_path, "red")))
    kept = two_turns(tmp_path / "kept", llama_server, tiny_k3.first_part, *looked, then=vision)
    restored = kept["engine_state"]["restored"]
    assert restored["done"], restored
    assert kept["timings"]["cache_n"] == restored["tokens"] > 0
    assert kept["timings"]["prompt_n"] < kept["usage"]["prompt_tokens"] - restored["tokens"] + 1

    cold_home = tmp_path / "cold"
    first = chat(cold_home, llama_server, tiny_k3.first_part, *looked, "--save", QUESTIONS[0])
    for f in states_dir(cold_home / "cache").iterdir():
        f.unlink()
    cold = chat(cold_home, llama_server, tiny_k3.first_part, *vision, "--continue",
                str(first["conversation"]), QUESTIONS[1])  # fmt: skip
    read_again(cold, "No engine state was kept")  # its tokens said, the picture's included
    assert cold["text"] == kept["text"]


def test_a_conversation_with_a_picture_goes_on_being_kept_on_a_model_without_vision(
    llama_server: Path, tiny_k3: TinyModel, tmp_path: Path
) -> None:
    """Continued on a model without vision (the picture stays in the history and is not
    sent), the conversation is kept as it was sent, and the next turn starts from it."""
    assert tiny_k3.mmproj is not None
    looked = ("--mmproj", str(tiny_k3.mmproj), "--image", str(picture(tmp_path, "red")))
    home, shard = tmp_path / "home", tiny_k3.first_part
    first = chat(home, llama_server, shard, "--save", QUESTIONS[0], *looked)
    n = str(first["conversation"])
    blind = chat(home, llama_server, shard, "--continue", n, QUESTIONS[1])
    read_again(blind, "projector")
    assert blind["engine_state"]["kept"]["done"], blind["engine_state"]
    again = chat(home, llama_server, shard, "--continue", n, "Why?")
    restored = again["engine_state"]["restored"]
    assert restored["done"], restored
    assert again["timings"]["cache_n"] == restored["tokens"] > 0


def test_the_same_words_with_another_picture_are_not_resumed(
    llama_server: Path, tiny_k3: TinyModel, tmp_path: Path
) -> None:
    """A kept state is known by its pictures too: a question whose picture was swapped
    for another (the same words) is read again, not resumed short of its picture."""
    keeper = StateKeeper(tmp_path / "states")

    def talk(color: str) -> list[ChatMessage]:
        seen = load_image(picture(tmp_path, color))
        return [
            ChatMessage("user", "What is this?", (seen,)),
            ChatMessage("assistant", "A square."),
        ]

    then = ChatMessage("user", "And then?")
    with engine(llama_server, tiny_k3, tmp_path / "states") as client:
        assert keeper.keep(client, "c", talk("red"), SETTINGS).done
    with engine(llama_server, tiny_k3, tmp_path / "states") as client:
        other = keeper.bring_back(client, "c", [*talk("blue"), then], SETTINGS)
        assert not other.done
        assert "changed" in other.why
        # words holding the very mark k3desk gives a picture, the picture itself later on
        posing = [ChatMessage("user", PICTURE + "What is this?"), talk("red")[1],
                  replace(then, images=talk("red")[0].images)]  # fmt: skip
        assert not keeper.bring_back(client, "c", posing, SETTINGS).done
        same = keeper.bring_back(client, "c", [*talk("red"), then], SETTINGS)
        assert same.done, same.why
        timings = client.chat([*talk("red"), then], SETTINGS).timings
        assert timings is not None
        assert timings.cache_n == same.tokens


def test_a_long_conversation_on_a_slow_engine_is_kept(llama_server: Path, tmp_path: Path) -> None:
    """Keeping a state makes the engine read what its slot lacks of the conversation (all
    of it on an engine just started; on a machine streaming its experts from disk, seconds
    a token): that is waited for as an answer is, not cut off at the read limit of the
    engine's quick calls.  Here that limit is 0.5 s, and the wide tiny K3 reads the
    conversation for about 1.4 s; the 9-part twin's 4,000-token state was lost this way."""
    import httpx

    from k3desk.devtools.tinyk3 import write_tiny_k3

    model = write_tiny_k3(tmp_path / "wide", wide=True)
    folder = tmp_path / "states"
    story = " ".join(["the miller counted sacks of grain by the river"] * 3)
    history = [ChatMessage(role, f"{n}: {story}.") for n in range(16)
               for role in ("user", "assistant")]  # fmt: skip
    spec = LaunchSpec(llama_server, ("-m", str(model.first_part), "-c", "4096", "-np", "1",
                                     "--jinja"), state_dir=folder)  # fmt: skip
    quick = httpx.Timeout(connect=5.0, read=0.5, write=5.0, pool=5.0)
    with Supervisor(spec, default_paths()) as sup:
        sup.start()
        ep = sup.wait_ready(90)
        endpoint = ChatEndpoint(ep.url, ep.api_key, owner_pid=ep.pid)
        with ChatClient(endpoint, timeout=quick) as client:
            kept = StateKeeper(folder).keep(client, "long", history, SETTINGS)
        sup.stop()
    assert kept.done, kept.why
    assert kept.tokens > 3000
    assert kept.seconds > quick.read  # it did take longer than the quick calls' limit


def test_a_state_slow_to_write_and_to_read_is_still_kept_and_brought_back(
    llama_server: Path, tiny_k3_single: TinyModel, tmp_path: Path
) -> None:
    """Saving and restoring a state are the engine writing and reading a file that grows
    with the conversation (537.6 MiB for the twin's 3,596 tokens): both are waited for as
    an answer is, not cut off at the read limit of the engine's quick calls.  Here the
    engine answers each a second late, against that limit set to 0.5 s."""
    import httpx

    folder = tmp_path / "states"
    one = [ChatMessage("user", QUESTIONS[0]), ChatMessage("assistant", "Once.")]
    keeper = StateKeeper(folder)
    quick = httpx.Timeout(connect=5.0, read=0.5, write=5.0, pool=5.0)
    asked = [*one, ChatMessage("user", QUESTIONS[1])]
    with (
        engine(llama_server, tiny_k3_single, folder) as direct,
        SlotsHeld(direct.endpoint, timeout=quick) as client,
    ):
        kept = keeper.keep(client, "1", one, SETTINGS)
        assert kept.done, kept.why  # the save waited for
        back = keeper.bring_back(client, "1", asked, SETTINGS)
    assert back.done, back.why  # the restore waited for
    assert back.tokens == kept.tokens > 0
    assert kept.seconds > quick.read  # both were held
    assert back.seconds > quick.read


def test_the_next_question_does_not_wait_for_its_conversation_to_be_kept(
    llama_server: Path, tmp_path: Path
) -> None:
    """After an answer the window keeps its conversation's state on a thread of its own
    (``ConversationStates.keep_later``): the engine reads the conversation into its slot,
    which takes minutes where it streams its experts from disk.  The next question in
    that conversation withdraws it at once; one in another conversation waits for it, so
    that the first conversation is kept before the slot becomes the other's."""
    from k3desk.devtools.tinyk3 import write_tiny_k3

    model = write_tiny_k3(tmp_path / "wide", wide=True)
    folder = tmp_path / "states"
    states = ConversationStates(StateKeeper(folder))
    story = " ".join(["the miller counted sacks of grain by the river"] * 3)
    long_question = "\n".join(f"{n}: {story}." for n in range(40))
    spec = LaunchSpec(llama_server, ("-m", str(model.first_part), "-c", "4096", "-np", "1",
                                     "--jinja"), state_dir=folder)  # fmt: skip

    def read_from_scratch(record: TurnRecord) -> list[Kept]:
        """Keep ``record``'s conversation from an empty slot (all of it read again)."""
        status, _ = client.call("POST", "/slots/0?action=erase")
        assert status == 200
        got: list[Kept] = []
        states.keep_later(client, record, SETTINGS, on_kept=got.append)
        return got

    with (
        HistoryStore(tmp_path / "history.sqlite3") as store,
        Supervisor(spec, default_paths()) as sup,
    ):
        sup.start()
        ep = sup.wait_ready(90)
        with ChatClient(ChatEndpoint(ep.url, ep.api_key, owner_pid=ep.pid)) as client:
            first = TurnRecord.new_conversation(store, long_question, settings=SETTINGS)
            other = TurnRecord.new_conversation(store, QUESTIONS[0], settings=SETTINGS)
            for record in (other, first):
                assert run_turn(client, record.request_messages(), SETTINGS,
                                record=record).error is None  # fmt: skip
            for _ in range(2):  # timed the second time (the engine's identity read once)
                t0 = time.monotonic()
                whole = read_from_scratch(first)
                states.settle()
                keeping = time.monotonic() - t0  # how long keeping it takes here
            assert whole[0].done, whole[0].why
            assert whole[0].tokens > 2500
            assert whole[0].rate is not None
            read = whole[0].tokens / whole[0].rate.tps  # of which the engine's read
            before_read = keeping - read

            withdrawn = read_from_scratch(first)
            time.sleep(before_read + read / 4)  # a quarter into the engine's read
            t1 = time.monotonic()
            asked = TurnRecord.ask(store, first.conversation.id, QUESTIONS[1])
            states.before(client, first.conversation.id, asked.request_messages(), SETTINGS)
            took = time.monotonic() - t1
            assert took < read / 2, (took, read, keeping)  # it did not wait for the read
            assert withdrawn[0].why == OVERTAKEN

            waited = read_from_scratch(first)
            time.sleep(before_read + read / 4)
            asked = TurnRecord.ask(store, other.conversation.id, QUESTIONS[1])
            states.before(client, other.conversation.id, asked.request_messages(), SETTINGS)
            assert waited  # the first conversation's keep ended before the other's turn
            assert waited[0].done, (waited[0].why, read, keeping)
        sup.stop()


def test_a_damaged_state_is_refused_before_the_engine_sees_it(
    llama_server: Path, tiny_k3_single: TinyModel, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    first = chat(home, llama_server, tiny_k3_single.first_part, "--save", QUESTIONS[0])
    (state,) = states_dir(home / "cache").glob("k3c-*.bin")
    data = bytearray(state.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit, in the middle of the KV data
    state.write_bytes(bytes(data))
    out = chat(home, llama_server, tiny_k3_single.first_part, "--continue",
               str(first["conversation"]), QUESTIONS[1])  # fmt: skip
    read_again(out, "damaged or was replaced")
    assert not state.exists()  # deleted unread


def test_a_damaged_newest_state_gives_way_to_the_one_before(
    llama_server: Path, tiny_k3_single: TinyModel, tmp_path: Path
) -> None:
    folder = tmp_path / "states"
    one = [ChatMessage("user", QUESTIONS[0]), ChatMessage("assistant", "Once.")]
    two = [*one, ChatMessage("user", QUESTIONS[1]), ChatMessage("assistant", "Then.")]
    keeper = StateKeeper(folder)
    with engine(llama_server, tiny_k3_single, folder) as client:
        older = keeper.keep(client, "1", one, SETTINGS)
        time.sleep(0.01)
        newer = keeper.keep(client, "1", two, SETTINGS)
    assert older.done, older.why
    assert newer.done, newer.why
    newest = max(folder.glob("k3c-*.bin"), key=lambda f: f.stat().st_size)  # more tokens
    data = bytearray(newest.read_bytes())
    data[-1] ^= 0x01  # one bit of its last byte
    newest.write_bytes(bytes(data))
    asked = [*two, ChatMessage("user", "And?")]
    with engine(llama_server, tiny_k3_single, folder) as client:
        back = keeper.bring_back(client, "1", asked, SETTINGS)
        result = client.chat(asked, SETTINGS)
    assert back.done, back.why
    assert back.tokens == older.tokens == result.timings.cache_n
    assert not newest.exists()  # deleted unread
    assert len(keeper.entries()) == 1


def test_a_state_made_for_another_context_is_not_used(
    llama_server: Path, tiny_k3_single: TinyModel, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    first = chat(home, llama_server, tiny_k3_single.first_part, "--save", "--ctx", "2048",
                 QUESTIONS[0])  # fmt: skip
    out = chat(home, llama_server, tiny_k3_single.first_part, "--ctx", "1024", "--continue",
               str(first["conversation"]), QUESTIONS[1])  # fmt: skip
    read_again(out, "another engine, model, projector, context or cache type")


def test_an_edited_conversation_is_read_again(
    llama_server: Path, tiny_k3_single: TinyModel, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    first = chat(home, llama_server, tiny_k3_single.first_part, "--save", QUESTIONS[0])
    with HistoryStore(home / "data" / "history.sqlite3") as store:
        (question,) = [m for m in store.branch(first["conversation"]) if m.role == "user"]
        # a new branch, its prompt longer than what was kept: only its text tells them apart
        store.edit_message(question.id, QUESTIONS[0] + " Make it about a fox as well, " * 12)
    out = chat(home, llama_server, tiny_k3_single.first_part, "--continue",
               str(first["conversation"]), QUESTIONS[1])  # fmt: skip
    read_again(out, "changed since its state was kept")


def test_the_least_recently_used_state_makes_way_for_the_budget(
    llama_server: Path, tiny_k3_single: TinyModel, tmp_path: Path
) -> None:
    folder = tmp_path / "states"
    with engine(llama_server, tiny_k3_single, folder) as client:
        talk = [ChatMessage("user", QUESTIONS[0]), ChatMessage("assistant", "Once.")]
        one = StateKeeper(folder, budget=1 << 30).keep(client, "1", talk, SETTINGS)
        assert one.done, one.why
        # room for one state and a half: the second pushes the first out
        keeper = StateKeeper(folder, budget=one.size * 3 // 2)
        time.sleep(0.01)
        two = keeper.keep(client, "2", [*talk, ChatMessage("user", "More.")], SETTINGS)
        assert two.done, two.why
        assert [c for c, _, _ in keeper.entries()] == ["2"]
        assert len(list(folder.glob("k3c-*.bin"))) == 1
        # over the budget by itself: not kept, and nothing left behind
        tiny = StateKeeper(folder, budget=one.size // 2)
        three = tiny.keep(client, "3", talk, SETTINGS)
        assert not three.done
        assert "over the budget" in three.why
        assert [c for c, _, _ in tiny.entries()] == []
        assert list(folder.glob("k3c-*.bin")) == []


def _fill(disk: Path, room: int) -> None:
    """Fill ``disk`` (a tmpfs: its pages are real) until exactly ``room`` bytes are free."""
    with open(disk / "filler", "wb") as f:
        f.write(bytes(shutil.disk_usage(disk).free - room))
    assert shutil.disk_usage(disk).free == room


def test_a_full_disk_keeps_nothing_leaves_nothing_and_says_what_is_free(
    llama_server: Path, tiny_k3_single: TinyModel, tmpfs: Callable[[int], Path]
) -> None:
    """The disk holding kept states fills up.  When the engine cannot write a state,
    or writes it and the index cannot be written after it, nothing is kept, no part of
    a state stays to hold the space unseen, the reason says how much is free, and what
    was kept before is still brought back."""
    disk = tmpfs(64)
    folder = disk / "states"
    keeper = StateKeeper(folder)
    one = [ChatMessage("user", QUESTIONS[0]), ChatMessage("assistant", "Once.")]
    with engine(llama_server, tiny_k3_single, folder) as client:
        first = keeper.keep(client, "1", one, SETTINGS)
        assert first.done, first.why
        kept_before = sorted(folder.glob("k3c-*.bin"))
        page = os.statvfs(disk).f_frsize
        state = -(-first.size // page) * page  # the same conversation's state: as large
        engine_wrote = r"the engine( could not write the state|'s state file holds [\d,]+ of)"
        for room, why in (
            (state - page, engine_wrote),
            (state, r"its index could not be written \(No space left on device\)"),
        ):
            _fill(disk, room)
            kept = keeper.keep(client, "2", one, SETTINGS)
            assert not kept.done
            assert kept.disk  # said in the window
            assert re.search(why, kept.why), kept.why
            assert f"{fmt_bytes(room)} free on the disk that holds kept states" in kept.why
            assert sorted(folder.glob("k3c-*.bin")) == kept_before  # nothing left behind
            assert [c for c, _, _ in keeper.entries()] == ["1"]
            (disk / "filler").unlink()
        back = keeper.bring_back(client, "1", [*one, ChatMessage("user", QUESTIONS[1])],
                                 SETTINGS)  # fmt: skip
    assert back.done, back.why
    assert back.tokens == first.tokens


def test_a_state_no_index_lists_is_deleted_once_an_hour_old(
    llama_server: Path, tiny_k3_single: TinyModel, tmp_path: Path
) -> None:
    """k3desk killed (or the power cut) after the engine wrote a state and before the
    index listed it leaves a file no budget counts.  The next keep deletes such a file
    once it is an hour old; a younger one may be another k3desk's keep about to be
    listed, and stays."""
    folder = tmp_path / "states"
    keeper = StateKeeper(folder)
    one = [ChatMessage("user", QUESTIONS[0]), ChatMessage("assistant", "Once.")]
    old, young = folder / f"k3c-{'a' * 16}.bin", folder / f"k3c-{'b' * 16}.bin"
    with engine(llama_server, tiny_k3_single, folder) as client:
        assert client.chat(one[:1], SETTINGS).text is not None
        for unlisted in (old, young):  # what the engine has written when its keeper dies
            status, _ = client.call("POST", "/slots/0?action=save", {"filename": unlisted.name})
            assert status == 200
        then = time.time() - ORPHAN_AGE - 60
        os.utime(old, (then, then))
        kept = keeper.keep(client, "1", one, SETTINGS)
    assert kept.done, kept.why
    assert not old.exists()
    assert young.exists()
    assert len(keeper.entries()) == 1


def test_a_deleted_conversation_takes_its_kept_states_with_it(
    llama_server: Path, tiny_k3_single: TinyModel, tmp_path: Path
) -> None:
    """A kept state holds the tokens the engine read, so the conversation's words:
    deleting the conversation deletes its states, the one still being kept included."""
    folder = tmp_path / "states"
    states = ConversationStates(StateKeeper(folder))
    with (
        HistoryStore(tmp_path / "history.sqlite3") as store,
        engine(llama_server, tiny_k3_single, folder) as direct,
        SlotsHeld(direct.endpoint) as client,
    ):
        gone = TurnRecord.new_conversation(store, QUESTIONS[0], settings=SETTINGS)
        other = TurnRecord.new_conversation(store, QUESTIONS[1], settings=SETTINGS)
        for record in (gone, other):
            assert run_turn(client, record.request_messages(), SETTINGS,
                            record=record).error is None  # fmt: skip
            states.keep_later(client, record, SETTINGS)
            assert states.settle(30)
        assert len(states.keeper.entries()) == 2
        asked = TurnRecord.ask(store, gone.conversation.id, "And then?")
        assert run_turn(client, asked.request_messages(), SETTINGS, record=asked).error is None
        got: list[Kept] = []
        client.held_at = 0.0
        states.keep_later(client, asked, SETTINGS, on_kept=got.append)
        deadline = time.monotonic() + 30
        while client.held_at == 0.0 and time.monotonic() < deadline:
            time.sleep(0.01)  # the engine is writing the newest state
        delete_conversation(store, states, gone.conversation.id)
        assert got  # the keep ended before the conversation's states were deleted
    assert [c for c, _, _ in states.keeper.entries()] == [str(other.conversation.id)]
    assert len(list(folder.glob("k3c-*.bin"))) == 1


def test_a_state_written_for_a_deleted_conversation_is_not_listed(
    llama_server: Path, tiny_k3_single: TinyModel, tmp_path: Path
) -> None:
    """While the engine writes a conversation's state: the next question coming leaves
    it kept (it is whole, and that question waits for the write anyway), but the
    conversation being deleted lists nothing, even when the wait for the keep ran out
    and the forget came first."""
    folder = tmp_path / "states"
    keeper = StateKeeper(folder)
    one = [ChatMessage("user", QUESTIONS[0]), ChatMessage("assistant", "Once.")]

    def while_written(conversation: str, meanwhile: Callable[[CancelToken], None]) -> Kept:
        token, out = CancelToken(), []
        client.held_at = 0.0
        keeping = threading.Thread(
            target=lambda: out.append(keeper.keep(client, conversation, one, SETTINGS, token))
        )
        keeping.start()
        deadline = time.monotonic() + 30
        while client.held_at == 0.0 and time.monotonic() < deadline:
            time.sleep(0.01)  # the engine is held as it is asked to write the state
        meanwhile(token)
        keeping.join(30)
        return out[0]

    with (
        engine(llama_server, tiny_k3_single, folder) as direct,
        SlotsHeld(direct.endpoint) as client,
    ):
        asked = while_written("1", lambda token: token.cancel())
        deleted = while_written("2", lambda _token: keeper.forget("2"))
    assert asked.done, asked.why
    assert deleted.why == DELETED
    assert [c for c, _, _ in keeper.entries()] == ["1"]
    assert len(list(folder.glob("k3c-*.bin"))) == 1


def test_a_keep_that_outlasts_the_wait_for_it_is_not_trusted(
    llama_server: Path, tiny_k3_single: TinyModel, tmp_path: Path
) -> None:
    """A tool's request waits for the chat's keep only so long; then it takes the slot,
    and what the slot holds is no longer known: the keep that ends after it does not
    make the chat trust the slot, so the conversation's next turn brings its state back."""
    folder = tmp_path / "states"
    states = ConversationStates(StateKeeper(folder))
    with (
        HistoryStore(tmp_path / "history.sqlite3") as store,
        engine(llama_server, tiny_k3_single, folder) as direct,
        SlotsHeld(direct.endpoint) as client,
    ):
        client.pause = 2.0
        record = TurnRecord.new_conversation(store, QUESTIONS[0], settings=SETTINGS)
        assert run_turn(client, record.request_messages(), SETTINGS, record=record).error is None
        got: list[Kept] = []
        states.keep_later(client, record, SETTINGS, on_kept=got.append)
        t0 = time.monotonic()
        states.slot_taken(timeout=0.3)
        assert time.monotonic() - t0 < 1.5  # the tool did not wait for the keep's end
        assert states.settle(30)
        assert got
        assert got[0].done, got[0].why
        asked = TurnRecord.ask(store, record.conversation.id, QUESTIONS[1])
        back = states.before(client, record.conversation.id, asked.request_messages(), SETTINGS)
    assert back is not None  # brought back, the slot not trusted
    assert back.done, back.why


def test_a_keep_that_fails_unexpectedly_says_so_and_frees_the_chat(
    llama_server: Path, tiny_k3_single: TinyModel, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A keep runs on a thread of its own: an error nothing foresaw there is said (and
    logged with its trace), and the next question does not wait for it."""

    class Broken(StateKeeper):
        def keep(self, *args: Any, **kwargs: Any) -> Kept:
            raise RuntimeError("the index is on fire")

    states = ConversationStates(Broken(tmp_path / "states"))
    got: list[Kept] = []
    with (
        HistoryStore(tmp_path / "history.sqlite3") as store,
        engine(llama_server, tiny_k3_single, tmp_path / "states") as client,
        caplog.at_level(logging.ERROR, logger="k3desk.core.app.chat_turn"),
    ):
        record = TurnRecord.new_conversation(store, QUESTIONS[0], settings=SETTINGS)
        assert run_turn(client, record.request_messages(), SETTINGS, record=record).error is None
        states.keep_later(client, record, SETTINGS, on_kept=got.append)
        assert states.settle(30)
        asked = TurnRecord.ask(store, record.conversation.id, QUESTIONS[1])
        states.before(client, record.conversation.id, asked.request_messages(), SETTINGS)
        assert run_turn(client, asked.request_messages(), SETTINGS, record=asked).error is None
    assert [k.why for k in got] == ["Not kept: RuntimeError: the index is on fire (in the log)."]
    assert "Traceback" in caplog.text
    assert "its state was not kept" in caplog.text


@pytest.mark.parametrize("damage", ["truncated", "random", "huge-token-count", "empty"])
def test_the_engine_survives_a_hostile_state_file(
    llama_server: Path, tiny_k3_single: TinyModel, tmp_path: Path, damage: str
) -> None:
    """What k3desk refuses by its SHA-256 the engine is tested against directly: it
    answers the restore with an error, keeps running, and answers the next question."""
    folder = tmp_path / "states"
    with engine(llama_server, tiny_k3_single, folder) as client:
        talk = [ChatMessage("user", QUESTIONS[0]), ChatMessage("assistant", "Once.")]
        kept = StateKeeper(folder).keep(client, "1", talk, SETTINGS)
        assert kept.done, kept.why
        (good,) = folder.glob("k3c-*.bin")
        data = good.read_bytes()
        bad = {
            "truncated": data[: len(data) // 3],
            "random": os.urandom(len(data)),
            # the header's token count (after magic and version) set to 2^31 - 1
            "huge-token-count": data[:8] + (0x7FFFFFFF).to_bytes(4, "little") + data[12:],
            "empty": b"",
        }[damage]
        (folder / "hostile.bin").write_bytes(bad)
        status, got = client.call("POST", "/slots/0?action=restore", {"filename": "hostile.bin"})
        assert status != 200 or (got or {}).get("n_restored", 0) == 0, got
        answer = client.chat([ChatMessage("user", "Hi")], SETTINGS)
        assert answer.text or answer.reasoning


def kept_turn(
    states: ConversationStates, client: ChatClient, record: TurnRecord
) -> tuple[Kept | None, Any]:
    """One turn as the chat window's worker runs it (ConversationStates around run_turn):
    what was brought back before it, and its result; its state must be kept after."""
    messages = record.request_messages()
    back = states.before(client, record.conversation.id, messages, SETTINGS)
    outcome = run_turn(client, messages, SETTINGS, record=record)
    assert outcome.error is None
    kept = states.after(client, record, SETTINGS)
    assert kept is not None
    assert kept.done, kept.why
    return back, outcome.result


def test_switching_conversations_brings_each_back_from_its_state(
    llama_server: Path, tiny_k3_single: TinyModel, tmp_path: Path
) -> None:
    """What the chat window's worker does (ConversationStates around run_turn): two
    conversations answered in turn on one engine; going back to the first restores its
    state, so the engine reads only the new question, and the answer is the one a fresh
    engine gives."""
    folder = tmp_path / "states"
    states = ConversationStates(StateKeeper(folder))

    def turn(client: ChatClient, store: HistoryStore, conv: int | None, text: str) -> Any:
        if conv is None:
            record = TurnRecord.new_conversation(store, text, settings=SETTINGS)
        else:
            record = TurnRecord.ask(store, conv, text)
        back, result = kept_turn(states, client, record)
        return record.conversation.id, back, result

    with HistoryStore(tmp_path / "history.sqlite3") as store:
        with engine(llama_server, tiny_k3_single, folder) as client:
            a, back, _ = turn(client, store, None, QUESTIONS[0])
            assert back is None  # a new conversation: nothing to bring back
            a, back, _ = turn(client, store, a, "And then?")
            assert back is None  # the slot holds it already
            turn(client, store, None, "Write a poem about the sea.")  # the slot: another
            a, back, result = turn(client, store, a, "What happened next?")
            assert back is not None
            assert back.done, back.why
            assert result.timings.cache_n == back.tokens
        talk = [m for m in store.branch(a) if m.role in ("user", "assistant")]
    # a fresh engine, nothing kept, the same history: the same last answer
    with engine(llama_server, tiny_k3_single, None) as client:
        cold = client.chat([ChatMessage(m.role, m.content) for m in talk[:-1]], SETTINGS)
    assert cold.text == talk[-1].content
    assert result.text == cold.text


def cold_answer(llama_server: Path, model: TinyModel, messages: list[ChatMessage]) -> str:
    """What a fresh engine with nothing kept answers ``messages``."""
    with engine(llama_server, model, None) as client:
        return client.chat(messages, SETTINGS).text


def test_a_regenerated_answer_and_an_edited_question_start_from_the_turn_before(
    llama_server: Path, tiny_k3_single: TinyModel, tmp_path: Path
) -> None:
    """Each answer's state is kept beside the earlier ones: answering a question again, on
    the same engine, and editing it, after a restart, restore the state kept after the
    answer before it (the longest the new prompt begins with); the engine reads only the
    question, and answers as it does reading everything."""
    folder = tmp_path / "states"
    with HistoryStore(tmp_path / "history.sqlite3") as store:
        states = ConversationStates(StateKeeper(folder))

        def turn(client: ChatClient, record: TurnRecord) -> tuple[Kept | None, Any]:
            return kept_turn(states, client, record)

        with engine(llama_server, tiny_k3_single, folder) as client:
            first = TurnRecord.new_conversation(store, QUESTIONS[0], settings=SETTINGS)
            turn(client, first)
            conv = first.conversation.id
            second = TurnRecord.ask(store, conv, QUESTIONS[1])
            turn(client, second)
            after_first = min(t for c, t, _ in states.keeper.entries() if c == str(conv))
            assert second.answer is not None
            again = TurnRecord.again(store, second.answer.id)
            back, result = turn(client, again)
            assert back is not None
            assert back.done, back.why
            assert back.tokens == after_first
            assert result.timings.cache_n == after_first
        assert result.text == cold_answer(llama_server, tiny_k3_single, again.request_messages())

        states = ConversationStates(StateKeeper(folder))  # a restart of the app as well
        with engine(llama_server, tiny_k3_single, folder) as client:
            edited = TurnRecord.edited(store, second.question.id, "What did the dog say?")
            back, result = turn(client, edited)
            assert back is not None
            assert back.done, back.why
            assert back.tokens == after_first
            assert result.timings.cache_n == after_first
            assert back.said().startswith(f"Resumed from saved state ({after_first:,} tokens, ")
            for text in ("More.", "Again.", "Once more.", "And more."):
                turn(client, TurnRecord.ask(store, conv, text))
        assert result.text == cold_answer(llama_server, tiny_k3_single, edited.request_messages())
        # continued after a restart: every kept state fits; the longest is restored
        states = ConversationStates(StateKeeper(folder))
        with engine(llama_server, tiny_k3_single, folder) as client:
            newest = max(t for _, t, _ in states.keeper.entries())
            back, result = turn(client, TurnRecord.ask(store, conv, "The end?"))
            assert back is not None
            assert back.tokens == newest == result.timings.cache_n
    # the newest few per conversation, each in a file of its own
    assert len(states.keeper.entries()) == PER_CONVERSATION
    assert len(list(folder.glob("k3c-*.bin"))) == PER_CONVERSATION


def test_a_conversation_read_again_says_how_many_tokens_and_about_how_long(
    llama_server: Path, tiny_k3_single: TinyModel, tmp_path: Path
) -> None:
    """No kept state fits (its first question was changed): the chat is told how many
    tokens the engine reads -- the count its own timings then show -- and a prediction
    from the reading rate measured when the conversation's state was kept."""
    folder = tmp_path / "states"
    story = "Once upon a time a cat and a dog lived by a river near an old mill. " * 4
    talk = [ChatMessage("user", QUESTIONS[0]), ChatMessage("assistant", story)]
    with engine(llama_server, tiny_k3_single, folder) as client:
        kept = StateKeeper(folder).keep(client, "7", talk, SETTINGS)
    assert kept.done, kept.why
    assert kept.rate is not None  # a fresh engine read it all: enough tokens to say
    assert kept.rate.tokens >= MIN_RATE_TOKENS
    changed = [ChatMessage("user", "Tell me about the sea."), talk[1], ChatMessage("user", "More.")]
    with engine(llama_server, tiny_k3_single, folder) as client:
        back = ConversationStates(StateKeeper(folder)).before(client, 7, changed, SETTINGS)
        # nothing measured at all (no state kept): the plan's predicted rate is said
        planned = ConversationStates(StateKeeper(tmp_path / "none"), planned_tps=5.0)
        first = planned.before(client, 8, changed, SETTINGS)
        result = client.chat(changed, SETTINGS)
    assert first is not None
    assert "No engine state was kept" in first.said()
    assert first.predicted_s == pytest.approx(first.reread / 5.0)
    assert back is not None
    assert not back.done
    assert result.timings is not None
    assert back.reread == result.timings.prompt_n > 0
    assert result.timings.cache_n == 0
    assert back.predicted_s == pytest.approx(back.reread / kept.rate.tps)
    assert back.said().startswith(f"Re-reading {back.reread:,} tokens (about ")
    assert "changed since its state was kept" in back.said()
