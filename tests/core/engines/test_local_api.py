"""The local API stays put: `k3desk serve` twice in a row answers at the same address with
the same key a tool was given, a revoked key is refused at the next launch, and a port held
by another program is named before anything starts.

Real processes throughout: `k3desk api` keeps the port and the key, `k3desk serve` runs the
real llama-server b11434 on the tiny Kimi-K3, and the client is the real OpenAI SDK, set up
as a person would (the address and key `k3desk api settings` prints).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import openai
import psutil
import pytest

from k3desk.core.engines.launch import prepare_launch
from k3desk.core.engines.ports import free_port
from k3desk.core.engines.supervisor import Supervisor
from k3desk.core.hardware.profile import HardwareProfile
from k3desk.core.paths import default_paths
from k3desk.core.planning.memory import slot_context
from k3desk.core.planning.model import PlanOptions
from k3desk.devtools.tinyk3 import TinyModel, write_tiny_k3
from tests.fixtures.hardware import HARDWARE_DIR

REPO = Path(__file__).resolve().parents[3]
pytestmark = [pytest.mark.engine]


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    env.pop("K3DESK_API_PORT", None)  # the port the person chose, as in real use
    return env


def k3desk(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "k3desk", *args],
        cwd=REPO, env=_env(), capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


@contextmanager
def serving(*args: str) -> Iterator[dict[str, str]]:
    """`k3desk serve ...` until its engine is ready; the facts it printed; then SIGTERM
    and wait (the next launch finds the port free, as after a person's Ctrl-C)."""
    with subprocess.Popen(
        [sys.executable, "-m", "k3desk", "serve", *args],
        cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    ) as proc:  # fmt: skip
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
            yield facts
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.communicate(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
            proc.wait()


def ask(url: str, key: str, retries: int = 0) -> str:
    """One short answer through the OpenAI SDK (raises its AuthenticationError on 401)."""
    with openai.OpenAI(base_url=url, api_key=key, max_retries=retries, timeout=60) as client:
        reply = client.chat.completions.create(
            model="kimi-k3",
            messages=[{"role": "user", "content": "Say hello."}],
            max_tokens=4,
            extra_body={"seed": 7, "temperature": 0.0, "chat_template_kwargs": {"thinking": False}},
        )
        return reply.choices[0].message.content or ""


def test_two_launches_serve_at_the_same_address_with_the_same_key_until_it_is_revoked(
    llama_server: Path, tiny_k3_single: TinyModel
) -> None:
    port = free_port()
    assert k3desk("api", "port", str(port)).returncode == 0
    made = k3desk("api", "create", "my-agent")
    assert made.returncode == 0, made.stderr
    key = made.stdout.splitlines()[0]
    assert key.startswith("k3-")
    shown = k3desk("api", "settings").stdout
    url = f"http://127.0.0.1:{port}/v1"
    assert f'base_url="{url}", api_key="{key}"' in shown  # what the person pastes

    serve = (str(tiny_k3_single.first_part), "--ctx", "512", "--engine", str(llama_server))
    answers = []
    for launch in (1, 2):
        with serving(*serve) as facts:
            assert facts["URL"] == url, f"launch {launch} moved"
            assert "my-agent (k3-…" in facts["output"]
            answers.append(ask(url, key))
            app_key = facts["API key"]
            assert app_key != key  # the app's own key is its own, fresh per launch
    assert answers[0] == answers[1]  # the same engine state, the same greedy answer

    gone = k3desk("api", "revoke", "my-agent")
    assert gone.returncode == 0
    assert "next starts" in gone.stdout  # said: a running engine keeps it until then
    with serving(*serve) as facts:
        assert facts["URL"] == url
        with pytest.raises(openai.AuthenticationError):
            ask(url, key)
        assert ask(url, facts["API key"]) == answers[0]  # the app's own key still works


def test_a_program_on_the_api_port_is_named_and_nothing_is_started(
    llama_server: Path, tiny_k3_single: TinyModel
) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        assert k3desk("api", "port", str(port)).returncode == 0
        r = k3desk("serve", str(tiny_k3_single.first_part), "--engine", str(llama_server))
    assert r.returncode != 0
    me = psutil.Process()
    assert f"Port {port} on 127.0.0.1 is already in use by {me.name()} (pid {me.pid})" in r.stderr
    assert "Settings > Local API" in r.stderr
    assert "Traceback" not in r.stderr
    assert "Plan:" not in r.stdout  # refused before minutes of planning and loading


@pytest.mark.parametrize(("ctx", "parallel"), [(1000, 3), (2048, 2), (1536, 4)])
def test_the_plans_slots_are_the_engines_slots(
    llama_server: Path, tiny_k3_single: TinyModel, tmp_path: Path, ctx: int, parallel: int
) -> None:
    """What the plan says of each request's context is what llama-server b11434 gives each
    slot (its /props and /slots), rounding included, for sizes that do and do not divide."""
    hw = HardwareProfile.from_json_file(HARDWARE_DIR / "no-gpu-laptop-32GB.json")
    prepared = prepare_launch(
        tiny_k3_single.first_part,
        mmproj=None,
        hardware=hw,
        options=PlanOptions(ctx=ctx, parallel=parallel),
        paths=default_paths(),
        engine=llama_server,
    )
    total, per_slot = slot_context(ctx, parallel)
    said = f"{parallel} requests at once (--parallel {parallel}): each has {per_slot} tokens"
    assert any(said in note for note in prepared.plan.notes), prepared.plan.notes
    with Supervisor(prepared.spec(), default_paths()) as sup:
        sup.start()
        ep = sup.wait_ready(90)
        props = httpx.get(f"{ep.url}/props", headers=ep.headers, timeout=30).json()
        slots = httpx.get(f"{ep.url}/slots", headers=ep.headers, timeout=30).json()
        sup.stop()
    assert props["total_slots"] == parallel
    assert [s["n_ctx"] for s in slots] == [per_slot] * parallel
    assert per_slot * parallel == total


def test_the_address_stays_up_through_a_crash_and_tools_get_retry_after(
    llama_server: Path, tiny_k3_single: TinyModel
) -> None:
    """Killed under `k3desk serve`, the engine restarts behind the same address: meanwhile
    the address is held (no other program can take it) and answers 503 with Retry-After,
    which the OpenAI SDK waits for and retries into the restarted engine's answer."""
    port = free_port()
    assert k3desk("api", "port", str(port)).returncode == 0
    key = k3desk("api", "create", "my-agent").stdout.splitlines()[0]
    url = f"http://127.0.0.1:{port}/v1"
    serve = (str(tiny_k3_single.first_part), "--ctx", "512", "--engine", str(llama_server))
    with serving(*serve) as facts:
        before = ask(url, key)
        os.kill(int(facts["Engine pid"]), signal.SIGKILL)
        busy = httpx.post(f"{url}/chat/completions", json={"model": "kimi-k3", "messages": []},
                          headers={"Authorization": f"Bearer {key}"}, timeout=30)  # fmt: skip
        assert busy.status_code == 503, busy.text
        assert 1 <= int(busy.headers["retry-after"]) <= 60
        assert "restart" in busy.json()["error"]["message"] or "start" in busy.text
        with socket.socket() as squatter, pytest.raises(OSError, match="in use"):
            squatter.bind(("127.0.0.1", port))
        assert ask(url, key, retries=4) == before  # the SDK's own retries, after Retry-After


def test_a_request_naming_another_of_my_models_is_told_what_serve_runs(
    llama_server: Path, tmp_path: Path
) -> None:
    """llama-server alone would answer it with the model it has, under the name asked for;
    `k3desk serve` says instead which one it runs, and a name of no model of the person's
    (a tool's default) is still answered."""
    a = write_tiny_k3(tmp_path / "a", name="Tiny-A", seed=3)
    b = write_tiny_k3(tmp_path / "b", name="Tiny-B", seed=4)
    for model in (a, b):
        assert k3desk("models", "add", str(model.first_part)).returncode == 0
    port = free_port()
    assert k3desk("api", "port", str(port)).returncode == 0
    url = f"http://127.0.0.1:{port}/v1"
    with serving(str(a.first_part), "--ctx", "512", "--engine", str(llama_server)) as facts:
        key = facts["API key"]
        with openai.OpenAI(base_url=url, api_key=key, max_retries=0, timeout=60) as client:
            with pytest.raises(openai.BadRequestError) as refused:
                client.chat.completions.create(
                    model="Tiny-B", messages=[{"role": "user", "content": "Hi"}], max_tokens=2
                )
            for name in ("Tiny-A", "gpt-4o"):
                reply = client.chat.completions.create(
                    model=name, messages=[{"role": "user", "content": "Hi"}], max_tokens=2
                )
                assert reply.choices, name
    said = refused.value.body["message"] if isinstance(refused.value.body, dict) else ""
    assert "Model 'Tiny-B' is not served here: k3desk serve runs Tiny-A alone" in said
    assert "k3desk api serve" in said
