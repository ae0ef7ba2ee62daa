"""``k3desk serve`` and ``k3desk engine`` as a person runs them (real processes)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import psutil
import pytest

from k3desk.core.app.tool_settings import tool_snippets
from k3desk.devtools.tinyk3 import TinyModel
from tests.processes import gone_within as _gone_within

REPO = Path(__file__).resolve().parents[3]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}


def k3desk(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "k3desk", *args],
        cwd=REPO,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@contextmanager
def serving(*args: str) -> Iterator[tuple[subprocess.Popen[str], dict[str, str]]]:
    """Run ``k3desk serve ...`` until it prints its engine pid; yield (process, facts)."""
    with subprocess.Popen(
        [sys.executable, "-m", "k3desk", "serve", *args],
        cwd=REPO,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    ) as proc:
        facts: dict[str, str] = {}
        seen: list[str] = []
        try:
            assert proc.stdout is not None
            deadline = time.monotonic() + 120
            while "Engine pid" not in facts:
                line = proc.stdout.readline()
                if not line or time.monotonic() > deadline:
                    pytest.fail("k3desk serve did not get ready:\n" + "".join(seen))
                seen.append(line)
                key, sep, value = line.partition(": ")
                if sep:
                    facts[key.strip()] = value.strip()
            facts["output"] = "".join(seen)
            yield proc, facts
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


@pytest.mark.engine
def test_serve_prints_plan_progress_url_and_key_then_sigkill_leaves_nothing(
    llama_server: Path, tiny_k3: TinyModel
) -> None:
    assert tiny_k3.mmproj is not None
    with serving(
        str(tiny_k3.first_part),
        "--mmproj",
        str(tiny_k3.mmproj),
        "--ctx",
        "1024",
        "--engine",
        str(llama_server),
    ) as (proc, facts):
        out = facts["output"]
        assert "Plan: " in out
        assert "Arguments: -m " in out
        assert "loading:" in out
        url, key, pid = facts["URL"], facts["API key"], int(facts["Engine pid"])
        assert url.startswith("http://127.0.0.1:")
        assert key not in (facts.get("Arguments") or "")  # the printed command hides it
        r = httpx.post(
            f"{url}/chat/completions",
            headers={"Authorization": f"Bearer {key}"},
            json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
            timeout=60,
        )
        assert r.status_code == 200, r.text
        assert psutil.Process(pid).ppid() == proc.pid
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert _gone_within(pid, 5.0), "llama-server outlived a SIGKILLed `k3desk serve`"


@pytest.mark.engine
def test_serve_prints_the_settings_for_tools_with_this_launchs_address_and_key(
    llama_server: Path, tiny_k3_single: TinyModel
) -> None:
    with serving(
        str(tiny_k3_single.first_part), "--ctx", "512", "--engine", str(llama_server),
        "--tool-settings",
    ) as (proc, facts):  # fmt: skip
        assert proc.stdout is not None
        block = []
        line = proc.stdout.readline()
        while line and not line.startswith("Press Ctrl-C"):
            block.append(line)
            line = proc.stdout.readline()
        printed = "".join(block)
        base = facts["URL"].removesuffix("/v1")
        # the same texts the Engine page's "Copy for…" copies (run as pasted in
        # tests/core/engines/test_sdk_clients.py)
        for snippet in tool_snippets(base, facts["API key"]):
            assert f"--- {snippet.label}\n{snippet.text}" in printed
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)


@pytest.mark.engine
def test_serve_shows_measured_beside_predicted_then_stops_cleanly_on_sigterm(
    llama_server: Path, tiny_k3_single: TinyModel
) -> None:
    with serving(str(tiny_k3_single.first_part), "--ctx", "512", "--engine", str(llama_server)) as (
        proc,
        facts,
    ):
        assert "Predicted: about " in facts["output"]
        pid = int(facts["Engine pid"])
        # an answer's speeds, as llama-server measured them, next to the prediction
        r = httpx.post(
            f"{facts['URL'].removesuffix('/v1')}/completion",
            headers={"Authorization": f"Bearer {facts['API key']}"},
            json={"prompt": list(range(1, 65)), "n_predict": 16, "ignore_eos": True},
            timeout=60,
        )
        assert r.status_code == 200, r.text
        watchdog = threading.Timer(60, proc.kill)  # readline must not wait for ever
        watchdog.start()
        assert proc.stdout is not None
        line = proc.stdout.readline()
        while line and not line.startswith("measured:"):
            line = proc.stdout.readline()
        watchdog.cancel()
        assert line.startswith("measured: prompt "), "no measured speed printed"
        assert "64 tokens" in line
        assert "predicted" in line
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0
        assert "stopped" in rest
        assert "Stopped." in rest
        assert _gone_within(pid, 1.0)


def test_serve_without_ctx_uses_the_context_the_model_was_trained_for(
    fake_engine: Callable[..., Path],
    tiny_k3_single: TinyModel,
    hardware_file: Callable[[str], Path],
) -> None:
    shard = tiny_k3_single.first_part
    laptop = str(hardware_file("no-gpu-laptop-32GB"))
    engine = str(fake_engine("serve"))
    with serving(str(shard), "--engine", engine, "--hardware", laptop) as (_, facts):
        out = facts["output"]
        assert f"  - Context: 4096 tokens, the most {shard.name} was trained for" in out
        assert " -c 4096 " in facts["Arguments"]
    # a context asked for is checked, not capped
    r = k3desk("serve", str(shard), "--engine", engine, "--hardware", laptop, "--ctx", "8192")
    assert r.returncode == 1
    assert "The context size 8192 exceeds what" in r.stderr
    assert "Use --ctx 4096 or less." in r.stderr


def test_serve_prints_every_attempt_as_it_happens_and_at_exit(
    fake_engine: Callable[..., Path], tiny_k3: TinyModel, hardware_file: Callable[[str], Path]
) -> None:
    # an engine that runs out of GPU memory below --n-cpu-moe 2 (its probe canary loads)
    shard = str(tiny_k3.first_part)
    exe = fake_engine("gpu_oom", FAKE_OOM_BELOW="2", FAKE_OOM_MODEL=shard)
    h200 = str(hardware_file("1xH200-141GB"))
    with serving(shard, "--ctx", "1024", "--hardware", h200, "--engine", str(exe)) as (
        proc,
        facts,
    ):
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0
    oom = "GPU 0 (CUDA0) ran out of memory while loading or running the model (exit 1)"
    replan = "re-planned after GPU out-of-memory: --n-cpu-moe {} -> {} (expert weights of 1 more "
    replan += "layer kept in RAM)"
    # as it happens: each attempt's number, what changed and why, in order
    live = [ln for ln in facts["output"].splitlines() if ln.startswith("attempt ")]
    assert live[0] == "attempt 1: starting"
    assert live[1].startswith(f"attempt 1: crashed: {oom}; {replan.format(0, 1)}")
    assert live[1].endswith("; restarting in 1.0 s")
    assert live[2] == "attempt 2: starting (changed: added --n-cpu-moe 1)"
    assert live[3].startswith(f"attempt 2: crashed: {oom}; {replan.format(1, 2)}")
    assert live[4] == "attempt 3: starting (changed: --n-cpu-moe 1 -> 2)"
    assert live[5] == f"attempt 3: ready at {facts['URL'].removesuffix('/v1')}"
    assert len(live) == 6
    # at exit: the whole history
    history = rest[rest.index("Attempts:\n") :].splitlines()[1:4]
    assert history[0].startswith(f"  attempt 1: {oom}; {replan.format(0, 1)}")
    assert history[1].startswith(f"  attempt 2: changed: added --n-cpu-moe 1; {oom}; ")
    assert replan.format(1, 2) in history[1]
    assert history[2].startswith("  attempt 3: changed: --n-cpu-moe 1 -> 2; ready after ")
    assert history[2].endswith("; stopped on request")


def test_serve_refuses_missing_files(tmp_path: Path) -> None:
    r = k3desk("serve", str(tmp_path / "Nope-00001-of-00003.gguf"))
    assert r.returncode == 1
    assert "does not exist" in r.stderr
    assert "Traceback" not in r.stderr


def test_serve_refuses_an_engine_that_cannot_load_kimi_k3(
    fake_engine: Callable[..., Path], tiny_k3_single: TinyModel
) -> None:
    r = k3desk("serve", str(tiny_k3_single.first_part), "--engine", str(fake_engine("old_engine")))
    assert r.returncode == 1
    assert "cannot load Kimi-K3: it predates kimi-k3 support" in r.stderr
    assert "k3desk engine install" in r.stderr


def test_engine_probe_and_list(fake_engine: Callable[..., Path]) -> None:
    old = fake_engine("old_engine")
    r = k3desk("engine", "probe", str(old))
    assert r.returncode == 1
    assert "This engine cannot load Kimi-K3: it predates kimi-k3 support" in r.stdout
    assert "! it lacks --fit" in r.stdout
    listed = k3desk("engine", "list", "--engine", str(old))
    assert listed.returncode == 0
    first = listed.stdout.splitlines()[0]
    assert first.startswith(f"* {old}")
    assert "[configured]" in first
    assert "cannot load Kimi-K3" in listed.stdout  # the cached probe is shown


def test_engine_install_dry_run_shows_the_flags(hardware_file: Callable[[str], Path]) -> None:
    r = k3desk("engine", "install", "--dry-run", "--hardware", str(hardware_file("1xH200-141GB")))
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("CMAKE_ARGS=")
    assert "-DGGML_RPC=ON" in r.stdout
    assert "-DGGML_NATIVE=ON" not in r.stdout
    # with nvcc: CUDA for sm_90; without: a CPU build that says what to install
    assert "-DCMAKE_CUDA_ARCHITECTURES=90" in r.stdout or "no nvcc" in r.stdout


def test_cli_uses_the_engine_chosen_in_settings(
    fake_engine: Callable[..., Path], k3_home: Path
) -> None:
    """The app's Settings choose the engine for the CLI too: both shells launch the same one."""
    old = fake_engine("old_engine")
    settings = k3_home / "config" / "settings.json"
    settings.parent.mkdir(parents=True, exist_ok=True)
    settings.write_text(json.dumps({"engine_binary": str(old)}), encoding="utf-8")
    listed = k3desk("engine", "list")
    assert listed.returncode == 0
    first = listed.stdout.splitlines()[0]
    assert first.startswith(f"* {old}")
    assert "[configured]" in first

    # an unreadable settings file does not stop the CLI: it finds an engine itself
    settings.write_text("{not json", encoding="utf-8")
    listed = k3desk("engine", "list")
    assert listed.returncode == 0
    assert str(old) not in listed.stdout
