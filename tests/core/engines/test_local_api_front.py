"""The local API's front before llama-server's router (`k3desk api serve`): what the router
cannot do itself (core/engines/front.py).  The router is the real llama-server b11434 with
tiny Kimi-K3 sets; the clients are the real OpenAI and Anthropic SDKs and raw HTTP.

* A request naming a model that is still loading waits at most ``--load-wait`` seconds,
  then gets 503 with Retry-After; the load goes on, and the SDKs' own retries, honouring
  that header, get the answer.
* A model whose load fails is said as such (500), and the endpoint stays up.
* Nothing of this is given to a request without a valid key: the router refuses it (401)
  and starts no load for it.
"""

from __future__ import annotations

import time
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from k3desk.core.engines.ports import free_port
from k3desk.devtools.tinyk3 import write_tiny_k3
from tests.core.engines.test_local_api import k3desk
from tests.core.engines.test_on_demand import _api_serve, _ask, _states

pytestmark = [pytest.mark.engine]

HELLO = {
    "messages": [{"role": "user", "content": "Say hello."}],
    "max_tokens": 4,
    "seed": 7,
    "temperature": 0.0,
    "chat_template_kwargs": {"thinking": False},
}


def _setup(tmp_path: Path, *names: str) -> tuple[str, str, dict[str, Path]]:
    port = free_port()
    assert k3desk("api", "port", str(port)).returncode == 0
    key = k3desk("api", "create", "agent").stdout.splitlines()[0]
    parts = {}
    for i, name in enumerate(names):
        m = write_tiny_k3(tmp_path / name, name=name, seed=3 + i)
        added = k3desk("models", "add", str(m.first_part))
        assert added.returncode == 0, added.stderr
        parts[name] = m.first_part
    return f"http://127.0.0.1:{port}/v1", key, parts


def test_a_request_for_a_model_still_loading_gets_503_with_retry_after_and_the_sdk_then_its_answer(
    llama_server: Path, tmp_path: Path
) -> None:
    url, key, _ = _setup(tmp_path, "Tiny-A")
    with _api_serve(llama_server, "--load-wait", "0") as out:
        assert f"URL: {url}" in out  # the front's address, the local API's port
        body = {**HELLO, "model": "Tiny-A"}
        # no valid key: the router's 401, and no load started for it
        wrong = httpx.post(f"{url}/chat/completions", json=body, timeout=30,
                           headers={"Authorization": "Bearer k3-wrong"})  # fmt: skip
        assert wrong.status_code == 401
        assert _states(url, key) == {"Tiny-A": "unloaded"}
        # a keyed request: the load starts, the answer is 503 at once (a bound of 0 s)
        started = time.monotonic()
        busy = httpx.post(f"{url}/chat/completions", json=body, timeout=30,
                          headers={"Authorization": f"Bearer {key}"})  # fmt: skip
        assert time.monotonic() - started < 5
        assert busy.status_code == 503
        assert 1 <= int(busy.headers["retry-after"]) <= 60
        error = busy.json()["error"]
        assert error["type"] == "unavailable_error"
        assert "'Tiny-A' is loading" in error["message"]
        assert _states(url, key)["Tiny-A"] in ("loading", "loaded")  # the load goes on
        # the OpenAI SDK retries a 503 after its Retry-After by itself, and is answered
        with openai.OpenAI(base_url=url, api_key=key, max_retries=8, timeout=120) as client:
            reply = client.chat.completions.create(
                model="Tiny-A",
                messages=HELLO["messages"],  # type: ignore[arg-type]
                max_tokens=4,
                extra_body={"seed": 7, "temperature": 0.0,
                            "chat_template_kwargs": {"thinking": False}},
            )  # fmt: skip
        assert reply.choices[0].message.content
        assert _states(url, key) == {"Tiny-A": "loaded"}
        # loaded: answered at once, the same words as the SDK's
        assert _ask(url, key, "Tiny-A") == reply.choices[0].message.content


def test_a_load_that_fails_is_said_and_the_endpoint_stays_up(
    llama_server: Path, tmp_path: Path
) -> None:
    url, key, parts = _setup(tmp_path, "Tiny-A", "Tiny-B")
    with _api_serve(llama_server, "--load-wait", "60") as out:
        assert "Tiny-B" in out
        # the set is damaged after it was planned: its engine dies while loading
        with open(parts["Tiny-B"], "r+b") as f:
            f.truncate(4096)
        started = time.monotonic()
        client = anthropic.Anthropic(
            base_url=url.removesuffix("/v1"), api_key=key, max_retries=0, timeout=120
        )
        with client, pytest.raises(anthropic.InternalServerError, match="failed to load") as said:
            client.messages.create(
                model="Tiny-B", max_tokens=4, messages=[{"role": "user", "content": "Hi"}]
            )
        assert said.value.type == "api_error"
        assert time.monotonic() - started < 60  # said when it failed, not at the bound
        # the other model still loads and answers
        assert _ask(url, key, "Tiny-A")
        assert _states(url, key)["Tiny-A"] == "loaded"
