"""``k3desk chat``: on a local GGUF (real llama-server) and against a URL."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from PIL import Image

import k3desk.cli as cli
from k3desk.app import Services
from k3desk.core.chat.history import HistoryStore
from k3desk.core.paths import default_paths
from k3desk.devtools.tinyk3 import TinyModel
from tests.core.chat.conftest import StandIn

Run = Callable[..., tuple[int, str, str]]


@pytest.fixture
def k3chat(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Run:
    """Run ``k3desk chat ...`` in-process (only the chat command registered)."""
    monkeypatch.setattr(cli, "COMMAND_MODULES", ("k3desk.cli.chat",))

    def run(*argv: str | Path) -> tuple[int, str, str]:
        rc = cli.main(["chat", *map(str, argv)], Services())
        out = capsys.readouterr()
        return rc, out.out, out.err

    return run


@pytest.fixture
def tiny(tiny_k3: TinyModel) -> tuple[Path, Path]:
    """The shared tiny kimi-k3 (3 parts) and its projector: (part 1, mmproj)."""
    assert tiny_k3.mmproj is not None
    return tiny_k3.first_part, tiny_k3.mmproj


@pytest.fixture
def red_png(tmp_path: Path) -> Path:
    p = tmp_path / "red.png"
    Image.new("RGB", (64, 48), (200, 30, 30)).save(p)
    return p


def llama_children() -> list[psutil.Process]:
    return [
        c
        for c in psutil.Process().children(recursive=True)
        if "llama-server" in c.name() and c.status() != psutil.STATUS_ZOMBIE
    ]


# ------------------------------------------------------------------ with a URL


def test_answer_on_stdout_reasoning_and_stats_on_stderr(k3chat: Run, standin: StandIn) -> None:
    rc, out, err = k3chat("--url", standin.url, "Hello")
    assert rc == 0
    assert out == "Hello world\n"
    assert "Let me think." in err
    assert "Hello world" not in err
    assert "[12 prompt tokens, 3 generated, 300.0 tok/s]" in err


def test_json_prints_one_object(k3chat: Run, standin: StandIn) -> None:
    rc, out, _ = k3chat("--url", standin.url, "--json", "--no-thinking", "--seed", "5", "Hello")
    assert rc == 0
    data = json.loads(out)
    assert data["text"] == "Hello world"
    assert data["reasoning"] == "Let me think."
    assert data["usage"] == {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}
    assert data["timings"]["predicted_n"] == 3
    assert data["partial"] is False
    sent = standin.requests[0]
    assert sent["chat_template_kwargs"] == {"thinking": False}
    assert sent["seed"] == 5


def test_api_key_from_the_environment_and_a_wrong_one(
    k3chat: Run, standin: StandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    standin.api_key = "s3cret"
    monkeypatch.setenv("K3DESK_API_KEY", "s3cret")
    assert k3chat("--url", standin.url, "Hi")[0] == 0
    rc, _, err = k3chat("--url", standin.url, "--api-key", "nope", "Hi")
    assert rc == 1
    assert "refused the API key" in err
    assert "Traceback" not in err


def test_cut_stream_exits_1_and_keeps_the_partial_answer(k3chat: Run, standin: StandIn) -> None:
    standin.tokens = [("content", "The answer"), ("content", " is"), ("content", " 42")]
    standin.cut_after = 2
    rc, out, err = k3chat("--url", standin.url, "Q?")
    assert rc == 1
    assert out == "The answer is\n"
    assert "stopped in the middle of the answer" in err
    assert "partial answer" in err
    rc, out, _ = k3chat("--url", standin.url, "--json", "Q?")
    assert rc == 1
    data = json.loads(out)
    assert data["text"] == "The answer is"
    assert data["partial"] is True
    assert "stopped in the middle" in data["error"]


def test_a_prompt_rendered_to_nothing_or_an_empty_reply_is_an_error(
    k3chat: Run, standin: StandIn
) -> None:
    # a model whose template/tokenizer turn the conversation into no tokens answers noise
    # about nothing: named, exit 1 (not an empty answer and exit 0)
    standin.tokens = []
    standin.prompt_tokens = 0
    rc, out, err = k3chat("--url", standin.url, "Q?")
    assert rc == 1
    assert out == ""
    assert "0 prompt tokens" in err
    assert "chat template" in err
    rc, out, _ = k3chat("--url", standin.url, "--json", "Q?")
    assert rc == 1
    assert "0 prompt tokens" in json.loads(out)["error"]
    # a prompt that rendered, and a reply of nothing at all
    standin.prompt_tokens = 12
    rc, out, err = k3chat("--url", standin.url, "Q?")
    assert rc == 1
    assert "without generating anything" in err


def test_an_answer_ended_at_once_says_so(k3chat: Run, standin: StandIn) -> None:
    # the first token generated ends the turn (random or damaged weights): one token, no
    # text; not an error, but not silence either
    standin.tokens = [("content", "")]
    rc, out, err = k3chat("--url", standin.url, "Q?")
    assert rc == 0
    assert out == ""
    assert "[12 prompt tokens, 1 generated" in err
    assert "no text: the model ended its turn at once" in err
    # an answer with text does not say it
    standin.tokens = [("content", "Yes")]
    rc, out, err = k3chat("--url", standin.url, "Q?")
    assert out == "Yes\n"
    assert "no text" not in err


def test_unreachable_server_is_a_plain_error(k3chat: Run, closed_port: int) -> None:
    rc, out, err = k3chat("--url", f"http://127.0.0.1:{closed_port}", "Hi")
    assert rc == 1
    assert out == ""
    assert "Cannot connect to the engine" in err
    assert "Traceback" not in err


def test_save_keeps_the_exchange_in_history(k3chat: Run, standin: StandIn) -> None:
    rc, _, err = k3chat("--url", standin.url, "--save", "--system", "Be kind.", "Hello there")
    assert rc == 0
    assert "Saved as conversation" in err
    with HistoryStore(default_paths().history_db) as h:
        (conv,) = h.list_conversations()
        msgs = h.branch(conv.id)
    assert conv.title == "Hello there"
    assert conv.system_prompt == "Be kind."
    assert [(m.role, m.content) for m in msgs] == [
        ("user", "Hello there"),
        ("assistant", "Hello world"),
    ]
    assert msgs[1].reasoning == "Let me think."
    assert msgs[1].usage is not None


# ------------------------------------------------------------------ refused early


def test_text_file_named_png_is_refused_before_anything_starts(
    k3chat: Run, tiny: tuple[Path, Path], tmp_path: Path
) -> None:
    fake = tmp_path / "photo.png"
    fake.write_text("just words")
    shard, mmproj = tiny
    rc, _, err = k3chat(shard, "--mmproj", mmproj, "--image", fake, "What is it?")
    assert rc == 1
    assert f"{fake} is not an image" in err
    assert not default_paths().logs_dir.exists() or not any(default_paths().logs_dir.iterdir())


def test_image_without_projector_is_refused(
    k3chat: Run, tiny: tuple[Path, Path], red_png: Path
) -> None:
    rc, _, err = k3chat(tiny[0], "--image", red_png, "What is it?")
    assert rc == 1
    assert "--image needs --mmproj FILE" in err


def test_later_part_or_missing_file_is_refused(k3chat: Run, tiny: tuple[Path, Path]) -> None:
    part2 = tiny[0].with_name(tiny[0].name.replace("00001-of", "00002-of"))
    rc, _, err = k3chat(part2, "Hi")
    assert rc == 1
    assert "must be given part 1" in err
    rc, _, err = k3chat(tiny[0].with_name("nothing.gguf"), "Hi")
    assert rc == 1
    assert "does not exist" in err


def test_usage_errors(k3chat: Run, standin: StandIn) -> None:
    rc, _, err = k3chat("--url", standin.url, "model.gguf", "Hi")
    assert rc == 1
    assert "With --url, give only the prompt" in err
    rc, _, err = k3chat("--url", standin.url, "--mmproj", "x.gguf", "Hi")
    assert rc == 1
    assert "apply only when k3desk starts the engine" in err


# ------------------------------------------------------------------ on a shard (real engine)


@pytest.mark.engine
def test_chat_on_shard_1_sees_the_image_and_stops_the_engine(
    k3chat: Run, llama_server: Path, tiny: tuple[Path, Path], red_png: Path
) -> None:
    shard, mmproj = tiny
    common = ("--mmproj", mmproj, "--ctx", "4096", "--json", "--no-thinking")
    common += ("--max-tokens", "4", "--seed", "1")
    rc, out, err = k3chat(shard, *common, "What colour is this?")
    assert rc == 0, err
    plain = json.loads(out)
    rc, out, err = k3chat(shard, *common, "--image", red_png, "What colour is this?")
    assert rc == 0, err
    seen = json.loads(out)
    assert seen["text"]  # --no-thinking: the answer is in the content
    assert seen["reasoning"] == ""
    assert seen["usage"]["completion_tokens"] <= 4
    # the projector's 16 image embeddings are in the prompt
    assert seen["usage"]["prompt_tokens"] - plain["usage"]["prompt_tokens"] == 16
    assert llama_children() == []  # the engine was stopped afterwards


@pytest.mark.engine
def test_chat_on_shard_streams_with_progress(
    k3chat: Run, llama_server: Path, tiny: tuple[Path, Path]
) -> None:
    rc, _, err = k3chat(tiny[0], "--ctx", "4096", "--max-tokens", "8", "--seed", "1", "Hi")
    assert rc == 0, err
    assert "Starting llama-server on" in err
    assert "Engine ready in" in err
    facts = r"\[\d+ prompt tokens, [1-8] generated, [\d.]+ tok/s(, stopped at the token limit)?\]"
    assert re.search(facts, err), err
    assert llama_children() == []


@pytest.mark.engine
def test_chat_on_shard_without_ctx_uses_the_context_the_model_was_trained_for(
    k3chat: Run, llama_server: Path, tiny: tuple[Path, Path]
) -> None:
    rc, _, err = k3chat(tiny[0], "--max-tokens", "2", "--seed", "1", "--no-thinking", "Hi")
    assert rc == 0, err
    assert "Engine ready in" in err
    assert re.search(r"\[\d+ prompt tokens, [0-2] generated", err), err
    assert f"  - Context: 4096 tokens, the most {tiny[0].name} was trained for" in err
    assert llama_children() == []


@pytest.mark.engine
def test_chat_on_shard_plans_for_a_hardware_file(
    k3chat: Run, llama_server: Path, tiny: tuple[Path, Path], hardware_file: Callable[[str], Path]
) -> None:
    epyc = hardware_file("epyc9554p-1.5TB-cpu")
    args = ("--ctx", "1024", "--max-tokens", "2", "--seed", "1", "--hardware", epyc, "Hi")
    rc, _, err = k3chat(tiny[0], *args)
    assert rc == 0, err
    # the plan is made for the 1.5 TB EPYC of the file, not for this machine
    assert re.search(r"Plan: Runs on the CPU .* of the 1\.4 TiB RAM available", err), err
    assert llama_children() == []
    rc, _, err = k3chat(tiny[0], "--hardware", tiny[1].parent / "nope.json", "Hi")
    assert rc == 1
    assert "nope.json does not exist" in err
    rc, _, err = k3chat("--url", "http://127.0.0.1:9", "--hardware", epyc, "Hi")
    assert rc == 1
    assert "apply only when k3desk starts the engine" in err


def test_ctrl_c_mid_answer_hangs_up_and_exits_130(standin: StandIn) -> None:
    standin.tokens = [("content", f"w{i} ") for i in range(5000)]
    # the stand-in sends 50 words, then nothing until the client hangs up: the answer
    # cannot end before the Ctrl-C, however slow the machine
    standin.hold_after = 50
    # A child inherits an ignored or blocked SIGINT from the process that starts it, and
    # Python then leaves Ctrl-C ignored; in full core runs the child once never reacted to
    # it (the stand-in's hold ran out), so the child starts as a shell would start it:
    # SIGINT at its default, unblocked.  (What in the test process left it so is not found.)
    parent_sigint = signal.getsignal(signal.SIGINT)
    launch = (
        "import runpy, signal, sys; "
        "signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT}); "
        "signal.signal(signal.SIGINT, signal.default_int_handler); "
        "sys.argv = ['k3desk', *sys.argv[1:]]; "
        "runpy.run_module('k3desk', run_name='__main__', alter_sys=True)"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", launch, "chat", "--url", standin.url, "Count"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=Path(__file__).resolve().parents[3],
    )
    stdout, stderr = proc.stdout, proc.stderr
    assert stdout is not None
    assert stderr is not None
    # what the child prints, read as it comes (it flushes each word): Ctrl-C only once
    # the answer is on the screen
    out = bytearray()

    def read_out() -> None:
        while chunk := stdout.read1():
            out.extend(chunk)

    reader = threading.Thread(target=read_out, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 120
        while not out.startswith(b"w0 w1 w2 ") and time.monotonic() < deadline:
            assert proc.poll() is None, stderr.read().decode(errors="replace")
            time.sleep(0.02)
        assert out.startswith(b"w0 w1 w2 "), "the answer never reached the screen"
        proc.send_signal(signal.SIGINT)
        err = stderr.read()
        proc.wait(timeout=30)
        reader.join(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join(timeout=30)
        stdout.close()
        stderr.close()
    # what the child said and how far the answer got, should it ever exit otherwise
    seen = (
        f"stderr: {err.decode(errors='replace')[-2000:]!r}; printed {len(out)} bytes; "
        f"stand-in sent {standin.tokens_sent} words, saw the hang-up: "
        f"{standin.client_gone.is_set()}; the test process's SIGINT handler: {parent_sigint!r}"
    )
    assert proc.returncode == 130, seen
    assert out.startswith(b"w0 w1 w2 ")
    assert b"Interrupted." in err
    assert b"Traceback" not in err
    assert standin.client_gone.wait(5)  # the server saw the hang-up and stopped
    assert standin.tokens_sent < 5000
