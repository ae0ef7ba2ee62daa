"""A FIFO or a folder where a model file (or one of its parts) should be: called what it
is, and never opened (a FIFO would block the reader until something writes to it)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from k3desk.devtools.tinyk3 import TinyModel
from tests.hostile.conftest import no_traceback, run_k3desk


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "Tiny-K3-IQ1_S-00001-of-00001.gguf"
    os.mkfifo(path)
    return path


@pytest.mark.parametrize("command", ["validate", "plan", "serve"])
def test_a_fifo_given_as_the_model_is_called_a_fifo_without_blocking(
    command: str, fifo: Path
) -> None:
    r = run_k3desk(command, fifo, timeout=30)
    assert r.returncode == 1
    no_traceback(r.stderr)
    assert f"{fifo} is a named pipe (FIFO), not a model file." in r.stderr.decode()


def test_a_fifo_given_as_the_model_to_chat_is_called_a_fifo(fifo: Path) -> None:
    r = run_k3desk("chat", fifo, "hi", timeout=30)
    assert r.returncode == 1
    no_traceback(r.stderr)
    assert f"{fifo} is a named pipe (FIFO), not a model file." in r.stderr.decode()


@pytest.mark.parametrize("kind", ["folder", "fifo"])
def test_a_part_that_is_not_a_file_is_named_for_what_it_is(
    kind: str, tiny_k3: TinyModel, tmp_path: Path
) -> None:
    for part in tiny_k3.parts:
        shutil.copy(part, tmp_path / part.name)
    second = tmp_path / tiny_k3.parts[1].name
    second.unlink()
    if kind == "folder":
        second.mkdir()
        what = "a folder"
    else:
        os.mkfifo(second)
        what = "a named pipe (FIFO)"
    r = run_k3desk("validate", tmp_path / tiny_k3.first_part.name, timeout=30)
    assert r.returncode == 1
    no_traceback(r.stderr)
    err = r.stderr.decode()
    assert f"Part 00002-of-00003 ({second.name}) is {what}, not a file: {second}." in err
    assert "missing" not in err
