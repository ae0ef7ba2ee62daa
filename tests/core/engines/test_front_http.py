"""The local API's front (core/engines/front.py) on its own: what it answers before any
router is reached.  A raw socket is the client, so malformed requests can be sent as a
hostile peer would; the answers are read as bytes off the wire."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import httpx
import pytest

from k3desk.core.engines.front import FrontConfig, RouterFront

KEY = "k3-tool"


@pytest.fixture
def front() -> Iterator[RouterFront]:
    config = FrontConfig(
        "127.0.0.1", 0, client_keys=(KEY,), left_out={"Big": "it streams from disk here."}
    )
    f = RouterFront(config, lambda: None)  # no router yet: starting
    f.start()
    yield f
    f.stop()


def _raw(front: RouterFront, data: bytes) -> tuple[int, dict[str, str], bytes]:
    with socket.create_connection(("127.0.0.1", front.port), timeout=10) as s:
        s.sendall(data)
        got = b""
        while chunk := s.recv(65536):
            got += chunk
    head, _, body = got.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), {k.lower(): v for k, v in headers.items()}, body


def test_a_request_while_the_router_starts_is_told_to_come_back(front: RouterFront) -> None:
    got = httpx.get(f"http://127.0.0.1:{front.port}/v1/models", timeout=10)
    assert got.status_code == 503
    assert got.headers["retry-after"] == "5"
    assert "starting" in got.json()["error"]["message"]


@pytest.mark.parametrize(
    ("data", "status", "said"),
    [
        (b"GARBAGE\r\n\r\n", 400, "Not an HTTP request"),
        (b"GET / HTTP/1.1\r\nX: " + b"a" * 70_000 + b"\r\n\r\n", 431, "too long"),
        (b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: -5\r\n\r\n", 400, "Content"),
        (b"GET / HTTP/1.1\r\n: no name\r\n\r\n", 400, "a header without a name"),
    ],
)
def test_malformed_requests_get_a_clear_answer_and_the_front_stays_up(
    front: RouterFront, data: bytes, status: int, said: str
) -> None:
    code, _, body = _raw(front, data)
    assert code == status
    assert said in json.loads(body)["error"]["message"]
    assert httpx.get(f"http://127.0.0.1:{front.port}/v1/models", timeout=10).status_code == 503


def test_a_left_out_model_is_said_in_each_apis_shape_but_only_to_a_valid_key(
    front: RouterFront,
) -> None:
    url = f"http://127.0.0.1:{front.port}"
    body = {"model": "Big", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    openai_shape = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=10,
                              headers={"Authorization": f"Bearer {KEY}"})  # fmt: skip
    assert openai_shape.status_code == 400
    assert openai_shape.json()["error"]["message"] == (
        "Model 'Big' is not served here: it streams from disk here."
    )
    anthropic_shape = httpx.post(f"{url}/v1/messages", json=body, timeout=10,
                                 headers={"x-api-key": KEY})  # fmt: skip
    assert anthropic_shape.json()["type"] == "error"
    assert anthropic_shape.json()["error"]["type"] == "invalid_request_error"
    # a wrong key learns nothing of the front's: it goes on to the router (none yet)
    wrong = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=10,
                       headers={"Authorization": "Bearer k3-wrong"})  # fmt: skip
    assert wrong.status_code == 503
