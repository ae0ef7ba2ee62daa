"""Text in, text out: undecodable bytes in prompts, system prompts and file names, and a
reader that goes away."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from k3desk.core.paths import default_paths
from k3desk.devtools.tinyk3 import TinyModel
from tests.conftest import REPO
from tests.hostile.conftest import StandIn, k3desk_env, no_traceback, run_k3desk

# a strict decoder, as a UTF-8 locale gives stdin: undecodable bytes are then an error
STRICT = {"PYTHONIOENCODING": "utf-8:strict"}


def sent_user_text(standin: StandIn) -> str:
    (request,) = standin.requests
    return str(request["messages"][-1]["content"])


def test_a_prompt_with_undecodable_bytes_is_sent_with_them_replaced(standin: StandIn) -> None:
    r = run_k3desk("chat", "--url", standin.url, "--no-thinking", b"hi \xff there")
    assert r.returncode == 0, r.stderr.decode()
    no_traceback(r.stderr)
    assert r.stdout.decode() == "Hello world\n"
    assert "note: The prompt has bytes that are not UTF-8" in r.stderr.decode()
    assert sent_user_text(standin) == "hi \ufffd there"


def test_a_system_prompt_with_undecodable_bytes_is_sent_with_them_replaced(
    standin: StandIn,
) -> None:
    r = run_k3desk("chat", "--url", standin.url, "--system", b"be \xfe brief", "hi")
    assert r.returncode == 0, r.stderr.decode()
    no_traceback(r.stderr)
    assert "note: The system prompt has bytes that are not UTF-8" in r.stderr.decode()
    (request,) = standin.requests
    assert request["messages"][0] == {"role": "system", "content": "be \ufffd brief"}


def test_undecodable_stdin_is_read_under_a_strict_locale(standin: StandIn) -> None:
    r = run_k3desk(
        "chat", "--url", standin.url, "-", input=b"from stdin \xff\xfe\n", env=k3desk_env(**STRICT)
    )
    assert r.returncode == 0, r.stderr.decode()
    no_traceback(r.stderr)
    assert sent_user_text(standin) == "from stdin \ufffd\ufffd\n"


def test_save_keeps_undecodable_text_and_file_names_readably(
    standin: StandIn, tmp_path: Path
) -> None:
    from PIL import Image

    png = tmp_path / os.fsdecode(b"snap\xff\n\x1b[31m.png")
    Image.new("RGB", (8, 8), (9, 9, 9)).save(png, format="PNG")
    standin.props = {**standin.props, "modalities": {"vision": True}}
    r = run_k3desk(
        "chat", "--url", standin.url, "--save", "--system", b"sys \xff", "--image", png, b"q \xff"
    )
    assert r.returncode == 0, r.stderr.decode()
    no_traceback(r.stderr)
    with sqlite3.connect(default_paths().history_db) as con:
        title, system = con.execute("SELECT title, system_prompt FROM conversations").fetchone()
        (content,) = con.execute("SELECT content FROM messages WHERE role='user'").fetchone()
        (name,) = con.execute("SELECT name FROM message_images").fetchone()
    assert (title, system, content) == ("q \ufffd", "sys \ufffd", "q \ufffd")
    assert name == "snap\ufffd[31m.png"  # no line break, no escape sequence


def test_an_undecodable_file_name_is_printed_not_a_traceback(
    tiny_k3: TinyModel, tmp_path: Path
) -> None:
    odd = Path(os.fsdecode(os.fsencode(tmp_path) + b"/\xff-models"))
    odd.mkdir()
    for part in tiny_k3.parts:
        shutil.copy(part, odd / part.name)
    # stdout as a UTF-8 locale makes it: a name's undecodable byte cannot be written as is
    r = run_k3desk("validate", odd / tiny_k3.first_part.name, env=k3desk_env(**STRICT))
    assert r.returncode == 0, r.stderr.decode()
    no_traceback(r.stderr)
    assert b"kimi-k3" in r.stdout
    missing = run_k3desk("validate", odd / "Nope-00001-of-00002.gguf", env=k3desk_env(**STRICT))
    assert missing.returncode == 1
    no_traceback(missing.stderr)
    assert b"does not exist" in missing.stderr


@pytest.mark.parametrize(
    "argv",
    [["tiers"], ["validate", "{shard}"], ["validate", "--json", "{shard}"]],
    ids=["tiers", "validate", "validate-json"],
)
def test_a_reader_that_goes_away_ends_the_command_quietly(
    argv: list[str], tiny_k3: TinyModel
) -> None:
    """`k3desk validate ... | head`: the pipe closes before k3desk has written its answer."""
    args = [a.format(shard=tiny_k3.first_part) for a in argv]
    proc = subprocess.Popen(
        [sys.executable, "-m", "k3desk", *args],
        cwd=REPO,
        env=k3desk_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None
    proc.stdout.close()  # the reader is gone before the first line
    _, err = proc.communicate(timeout=60)
    no_traceback(err)
    assert err == b""
    assert proc.returncode == 141  # as a shell reports a writer the pipe closed on
