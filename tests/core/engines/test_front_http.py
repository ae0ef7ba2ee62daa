"""The local API's front (core/engines/front.py) on its own: what it answers before any
router is reached.  A raw socket is the client, so malformed requests can be sent as a
hostile peer would; the answers are read as bytes off the wire."""

from __future__ import annotations

import contextlib
import functools
import gc
import json
import socket
import statistics
import threading
import time
import warnings
from collections.abc import Callable, Iterator

import httpx
import pytest

from k3desk.core.engines.front import (
    ANTHROPIC,
    OPENAI,
    RESPONSES,
    FrontConfig,
    RouterFront,
    Upstream,
    answer_of,
    sent_back,
)

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


class _Upstream:
    """A scripted engine: reads one request head, then sends ``pieces`` (bytes, each after
    its delay in seconds) and closes; when each piece was sent is kept."""

    def __init__(self, pieces: list[tuple[float, bytes]]) -> None:
        self.pieces = pieces
        self.sent: list[float] = []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.sock.accept()
        with conn:
            got = b""
            while b"\r\n\r\n" not in got:
                got += conn.recv(65536)
            for delay, data in self.pieces:
                time.sleep(delay)
                conn.sendall(data)
                self.sent.append(time.monotonic())

    def upstream(self) -> Upstream:
        return Upstream("127.0.0.1", self.sock.getsockname()[1], "k3-app")


def _through(pieces: list[tuple[float, bytes]]) -> tuple[_Upstream, list[tuple[float, int]]]:
    """The pieces sent through a front to a raw client: (when each read came, its size)."""
    up = _Upstream(pieces)
    f = RouterFront(FrontConfig("127.0.0.1", 0, client_keys=(KEY,)), up.upstream)
    f.start()
    reads = []
    try:
        with socket.create_connection(("127.0.0.1", f.port), timeout=10) as s:
            s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
            while chunk := s.recv(1 << 20):
                reads.append((time.monotonic(), len(chunk)))
    finally:
        f.stop()
        up.sock.close()
    return up, reads


def test_a_stop_cuts_off_every_client_at_once_and_leaves_nothing_open() -> None:
    """A client still sending its request, and one waiting on the engine's answer, when
    the front stops (the engine stops with it) see their connection closed at once, not
    left hanging; nothing of the front's is left open for the garbage collector."""
    engine = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    threading.Thread(target=lambda: held.append(engine.accept()[0]), daemon=True).start()
    upstream = Upstream("127.0.0.1", engine.getsockname()[1], "k3-app")
    f = RouterFront(FrontConfig("127.0.0.1", 0, client_keys=(KEY,)), lambda: upstream)
    f.start()
    sending = socket.create_connection(("127.0.0.1", f.port), timeout=5)
    sending.sendall(b"GET /v1/models HTTP/1.1\r\n")  # the head not ended yet
    waiting = socket.create_connection(("127.0.0.1", f.port), timeout=5)
    waiting.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
    deadline = time.monotonic() + 5
    while not held and time.monotonic() < deadline:
        time.sleep(0.02)
    assert held  # the engine has the request and does not answer
    try:
        started = time.monotonic()
        f.stop()
        assert time.monotonic() - started < 3
        for client in (sending, waiting):
            with contextlib.suppress(ConnectionResetError):  # cut off: as good as closed
                assert client.recv(1024) == b""  # closed, within the 5 s timeout
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            gc.collect()
        assert [str(w.message) for w in caught if w.category is ResourceWarning] == []
    finally:
        for s in (sending, waiting, *held, engine):
            s.close()


def test_a_stream_reaches_the_client_piece_by_piece_within_milliseconds() -> None:
    """Tokens 3 ms apart (faster than Kimi-K3 runs anywhere) are passed on as they come or
    held back by the front's rest after a piece, 5 ms at most."""
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n"
    token = b'data: {"choices":[{"text":"a"}]}\n\n'
    up, reads = _through([(0.0, head)] + [(0.003, token)] * 40)
    assert sum(n for _, n in reads) == len(head) + 40 * len(token)
    assert len(reads) >= 10  # not gathered into a few late reads
    late = [min(t for t, _ in reads if t >= sent) - sent for sent in up.sent[1:]]
    assert statistics.median(late) < 0.004, late
    assert max(late) < 0.05, late


def test_a_large_answer_is_not_slowed_by_the_rest() -> None:
    """The rest is for tokens: 128 MiB passes through in about the time it takes straight
    from the engine (rested after each 256 KiB read it would take 2.5 s more)."""
    size = 128 << 20
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size + b"x" * size
    up = _Upstream([(0.0, answer)])
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", up.upstream().port), timeout=10) as s:
        s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
        while s.recv(1 << 20):
            pass
    straight = time.monotonic() - started
    up.sock.close()
    started = time.monotonic()
    _, reads = _through([(0.0, answer)])
    took = time.monotonic() - started
    assert sum(n for _, n in reads) == len(answer)
    assert took < 1.0 + 2 * straight, (took, straight)


def _chunked(body: bytes) -> bytes:
    """``body`` in chunks of 7 bytes, as a server streams it."""
    pieces = [body[i : i + 7] for i in range(0, len(body), 7)]
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


def _event(delta: dict[str, object], finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return b"data: " + json.dumps({"choices": [choice]}).encode() + b"\n\n"


SSE = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
JSON = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n"


def _said(content: object, **more: object) -> dict[str, object]:
    return {"role": "assistant", "content": content, **more}


CALL = {"id": "c1", "type": "function", "function": {"name": "look", "arguments": '{"q": "x"}'}}


@pytest.mark.parametrize(
    ("raw", "said"),
    [
        # streamed, chunked: the text of every delta, once the stream says it finished
        (
            SSE
            + _chunked(
                _event({"role": "assistant"})
                + _event({"content": "Hel"})
                + _event({"content": "lo"})
                + _event({}, "stop")
                + b"data: [DONE]\n\n"
            ),
            _said("Hello"),
        ),
        (JSON + json.dumps({"choices": [{"message": {"content": "Hi."}}]}).encode(), _said("Hi.")),
        # thinking, and tool calls as llama-server streams them (server-chat.cpp): each by
        # its index, its id and name once, its arguments in pieces; two calls in order
        (
            SSE
            + _chunked(
                _event({"reasoning_content": "h"})
                + _event({"reasoning_content": "m"})
                + _event({"content": "x"}, "stop")
            ),
            _said("x", reasoning_content="hm"),
        ),
        (
            SSE
            + _chunked(
                _event(
                    {
                        "tool_calls": [
                            {
                                "index": 0,
                                "id": "c1",
                                "type": "function",
                                "function": {"name": "look"},
                            }
                        ]
                    }
                )
                + _event({"tool_calls": [{"index": 0, "function": {"arguments": '{"q": '}}]})
                + _event(
                    {
                        "tool_calls": [
                            {
                                "index": 1,
                                "id": "c2",
                                "type": "function",
                                "function": {"name": "see", "arguments": "{}"},
                            }
                        ]
                    }
                )
                + _event({"tool_calls": [{"index": 0, "function": {"arguments": '"x"}'}}]})
                + _event({}, "tool_calls")
            ),
            _said(
                "",
                tool_calls=[
                    CALL,
                    {
                        "id": "c2",
                        "type": "function",
                        "function": {"name": "see", "arguments": "{}"},
                    },
                ],
            ),
        ),
        (
            JSON
            + json.dumps(
                {
                    "choices": [
                        {
                            "message": {"content": None, "tool_calls": [{**CALL, "extra": 1}]},
                            "finish_reason": "tool_calls",
                        }
                    ]
                }
            ).encode(),
            _said("", tool_calls=[CALL]),
        ),
        # not answers to keep: cut short, several, a call without a name, refused, garbage
        (SSE + _chunked(_event({"content": "Hel"})), None),
        (SSE + _chunked(_event({"content": "Hel"}, "stop"))[:-5], None),
        (
            SSE
            + _chunked(
                _event({"tool_calls": [{"index": 0, "id": "1"}]}) + _event({}, "tool_calls")
            ),
            None,
        ),
        (JSON + json.dumps({"choices": [{"message": {"content": "a"}}] * 2}).encode(), None),
        (
            JSON
            + json.dumps(
                {"choices": [{"message": {"content": None, "tool_calls": [{}]}}]}
            ).encode(),
            None,
        ),
        (JSON + json.dumps({"choices": [{"message": {"content": 7}}]}).encode(), None),
        (b"HTTP/1.1 500 Internal Server Error\r\n\r\n{}", None),
        (JSON + b"\xff\xfe not json", None),
        (b"garbage", None),
    ],
)
def test_what_an_answer_said_is_read_off_the_wire_or_not_kept(
    raw: bytes, said: dict[str, object] | None
) -> None:
    assert answer_of(raw) == said


@pytest.mark.parametrize(
    ("api", "sends_thinking", "kept"),
    [(OPENAI, False, False), (OPENAI, True, True), (ANTHROPIC, False, True),
     (RESPONSES, False, True)],
)  # fmt: skip
def test_thinking_is_kept_only_where_the_tool_sends_it_back(
    api: str, sends_thinking: bool, kept: bool
) -> None:
    """The template renders an assistant message's thinking when the tool sends it: an
    OpenAI client is taken to send it where an earlier answer in its request carries it;
    an Anthropic client sends its thinking blocks back, a Responses client its reasoning
    items."""
    earlier: dict[str, object] = {"role": "assistant", "content": "Hi."}
    if sends_thinking:
        earlier["reasoning_content"] = "A greeting."
    body = {"messages": [{"role": "user", "content": "Hi"}, earlier,
                         {"role": "user", "content": "And now?"}]}  # fmt: skip
    answer = _said("A dog.", reasoning_content="Look again.")
    assert sent_back(body, answer, api) == (answer if kept else _said("A dog."))


def _anthropic(kind: str, **data: object) -> bytes:
    return f"event: {kind}\ndata: ".encode() + json.dumps({"type": kind, **data}).encode() + b"\n\n"


def _block(index: int, block: dict[str, object]) -> bytes:
    return _anthropic("content_block_start", index=index, content_block=block)


def _delta(index: int, delta: dict[str, object]) -> bytes:
    return _anthropic("content_block_delta", index=index, delta=delta)


# a Messages answer as llama-server streams it (to_json_anthropic_stream, server-task.cpp):
# thinking, then text, then a tool_use block per call, each call's input in pieces
ANTHROPIC_STREAM = (
    _anthropic("message_start", message={"role": "assistant", "content": []})
    + _block(0, {"type": "thinking", "thinking": ""})
    + _delta(0, {"type": "thinking_delta", "thinking": "h"})
    + _block(1, {"type": "text", "text": ""})
    + _delta(1, {"type": "text_delta", "text": "Let me "})
    + _delta(0, {"type": "thinking_delta", "thinking": "m"})
    + _delta(1, {"type": "text_delta", "text": "look."})
    + _block(2, {"type": "tool_use", "id": "c1", "name": "look"})
    + _delta(2, {"type": "input_json_delta", "partial_json": '{"q": '})
    + _delta(2, {"type": "input_json_delta", "partial_json": '"x"}'})
    + _delta(0, {"type": "signature_delta", "signature": ""})
    + _anthropic("content_block_stop", index=0)
    + _anthropic("message_delta", delta={"stop_reason": "tool_use"}, usage={"output_tokens": 9})
    + _anthropic("message_stop")
)
# the same answer as the engine turns it back when the tool sends it back: text blocks
# as they are, thinking as reasoning_content, a call's input dumped compact (server-chat.cpp)
ANTHROPIC_SAID = _said(
    [{"type": "text", "text": "Let me look."}],
    tool_calls=[{"id": "c1", "type": "function",
                 "function": {"name": "look", "arguments": '{"q":"x"}'}}],
    reasoning_content="hm",
)  # fmt: skip


@pytest.mark.parametrize(
    ("raw", "said"),
    [
        (SSE + _chunked(ANTHROPIC_STREAM), ANTHROPIC_SAID),
        (
            JSON
            + json.dumps(
                {
                    "type": "message",
                    "stop_reason": "tool_use",
                    "content": [
                        {"type": "thinking", "thinking": "hm", "signature": ""},
                        {"type": "text", "text": "Let me look."},
                        {"type": "tool_use", "id": "c1", "name": "look", "input": {"q": "x"}},
                    ],
                }
            ).encode(),
            ANTHROPIC_SAID,
        ),
        (JSON + json.dumps({"stop_reason": "end_turn", "content": []}).encode(), _said("")),
        # cut before it said why it stopped; a piece of a block never started; refused
        (SSE + _chunked(ANTHROPIC_STREAM.split(b"event: message_delta")[0]), None),
        (SSE + _chunked(_delta(3, {"type": "text_delta", "text": "x"})), None),
        (JSON + json.dumps({"content": [{"type": "text", "text": "x"}]}).encode(), None),
        (b"HTTP/1.1 400 Bad Request\r\n\r\n{}", None),
    ],
)
def test_what_a_messages_answer_said_is_read_as_the_engine_turns_it_back(
    raw: bytes, said: dict[str, object] | None
) -> None:
    assert answer_of(raw, ANTHROPIC) == said


def _response(kind: str, **data: object) -> bytes:
    return f"event: {kind}\ndata: ".encode() + json.dumps({"type": kind, **data}).encode() + b"\n\n"


# a Responses answer's output items as llama-server gives them (to_json_oaicompat_resp,
# server-task.cpp): the reasoning, the message, a function_call per call
RESPONSES_OUTPUT = [
    {"id": "rs_1", "summary": [], "type": "reasoning", "encrypted_content": "",
     "content": [{"text": "hm", "type": "reasoning_text"}]},
    {"type": "message", "status": "completed", "id": "msg_1", "role": "assistant",
     "content": [{"type": "output_text", "annotations": [], "logprobs": [],
                  "text": "Let me look."}]},
    {"id": "fc_c1", "type": "function_call", "status": "completed",
     "arguments": '{"q":"x"}', "call_id": "call_c1", "name": "look"},
]  # fmt: skip
# streamed: deltas as they come, then each item done, then the whole list once more
RESPONSES_STREAM = (
    _response("response.created", response={"status": "in_progress", "output": []})
    + _response("response.reasoning_text.delta", delta="h")
    + _response("response.reasoning_text.delta", delta="m")
    + _response("response.output_text.delta", delta="Let me look.")
    + _response("response.function_call_arguments.delta", delta='{"q":"x"}')
    + b"".join(_response("response.output_item.done", item=i) for i in RESPONSES_OUTPUT)
    + _response("response.completed", response={"status": "completed", "output": RESPONSES_OUTPUT})
)
# the same answer as the engine turns it back when the tool sends its items back
# (server_chat_convert_responses_to_chatcmpl): one assistant message, the items merged
RESPONSES_SAID = _said(
    [{"text": "Let me look.", "type": "text"}],
    reasoning_content="hm",
    tool_calls=[{"function": {"arguments": '{"q":"x"}', "name": "look"}, "id": "call_c1",
                 "type": "function"}],
)  # fmt: skip


@pytest.mark.parametrize(
    ("raw", "said"),
    [
        (SSE + _chunked(RESPONSES_STREAM), RESPONSES_SAID),
        (JSON + json.dumps({"status": "completed", "output": RESPONSES_OUTPUT}).encode(),
         RESPONSES_SAID),
        (JSON + json.dumps({"status": "completed", "output": RESPONSES_OUTPUT[1:2]}).encode(),
         {"id": "msg_1", "role": "assistant", "content": [{"text": "Let me look.",
                                                            "type": "text"}]}),
        # cut before the list came; nothing said; not completed; refused
        (SSE + _chunked(RESPONSES_STREAM.split(b"event: response.completed")[0]), None),
        (JSON + json.dumps({"status": "completed", "output": []}).encode(), None),
        (JSON + json.dumps({"status": "failed", "output": RESPONSES_OUTPUT}).encode(), None),
        (b"HTTP/1.1 400 Bad Request\r\n\r\n{}", None),
    ],
)  # fmt: skip
def test_what_a_responses_answer_said_is_read_as_the_engine_turns_it_back(
    raw: bytes, said: dict[str, object] | None
) -> None:
    assert answer_of(raw, RESPONSES) == said


def test_a_long_streamed_answer_is_read_in_time_linear_in_its_size() -> None:
    """20,000 streamed tokens (one chunk each, about 1.3 MB): read in well under a second,
    where taking the chunks apart by copying the rest each time took seconds."""
    events = [_event({"content": "a"})] * 20_000 + [_event({}, "stop")]
    raw = SSE + b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events) + b"0\r\n\r\n"
    started = time.monotonic()
    assert answer_of(raw) == _said("a" * 20_000)
    assert time.monotonic() - started < 1.0


class _Engine:
    """A scripted engine answering every request at once with one Chat Completions answer,
    and the requests it got (their targets), in order."""

    ANSWER = json.dumps({"choices": [{"message": {"content": "Yes."}, "finish_reason": "stop"}]})

    def __init__(self) -> None:
        self.targets: list[str] = []
        self.sock = socket.create_server(("127.0.0.1", 0))
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                got = b""
                while b"\r\n\r\n" not in got:
                    got += conn.recv(65536)
                head, _, body = got.partition(b"\r\n\r\n")
                length = next((int(x.split(b":")[1]) for x in head.split(b"\r\n")
                               if x.lower().startswith(b"content-length:")), 0)  # fmt: skip
                while len(body) < length:
                    body += conn.recv(65536)
                self.targets.append(head.split(b" ")[1].decode())
                answer = self.ANSWER.encode()
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\nConnection: close\r\n\r\n%s"
                             % (len(answer), answer))  # fmt: skip

    def upstream(self) -> Upstream:
        return Upstream("127.0.0.1", self.sock.getsockname()[1], "k3-app", pid=1)


class _Recorded:
    """Conversations that only record what the front asked of them, in order."""

    def __init__(self) -> None:
        self.said: list[tuple[str, str]] = []

    def conversation(self, body: dict[str, object]) -> str:
        return str(body["messages"][0]["content"])  # type: ignore[index]

    def resume(self, body: dict[str, object], engine: Upstream) -> None:
        self.said.append(("resume", self.conversation(body)))

    def answered(
        self, body: dict[str, object], answer: dict[str, object], engine: Upstream
    ) -> None:
        self.said.append(("kept", self.conversation(body)))


@contextlib.contextmanager
def _keeping_front(
    conversations: _Recorded, on_slot: Callable[[], None] | None = None
) -> Iterator[tuple[RouterFront, _Engine, str]]:
    """A front before a scripted engine, keeping tools' conversations through
    ``conversations``: the front, the engine and the front's URL; both stop after."""
    engine = _Engine()
    config = FrontConfig("127.0.0.1", 0, client_keys=(KEY,), conversations=conversations,
                         on_slot=on_slot)  # fmt: skip
    f = RouterFront(config, engine.upstream)
    f.start()
    try:
        yield f, engine, f"http://127.0.0.1:{f.port}"
    finally:
        f.stop()
        engine.sock.close()


def _chat(url: str, conversation: str) -> None:
    """One turn of ``conversation`` (its one message) through the front at ``url``."""
    body = {"messages": [{"role": "user", "content": conversation}]}
    got = httpx.post(f"{url}/v1/chat/completions", json=body,
                     headers={"Authorization": f"Bearer {KEY}"}, timeout=10)  # fmt: skip
    assert got.json()["choices"][0]["message"]["content"] == "Yes."


def test_the_front_brings_a_conversation_back_when_the_slot_may_hold_another() -> None:
    """A fresh engine's first request, a switch and any other kind of generation request
    (its prompt may have taken the slot) leave the slot's content unknown: the next
    request of a conversation brings its kept state back; its next turn does not, nor one
    after a request that takes no slot (counting tokens).  The conversation switched away
    from is kept before the other's is brought back."""
    recorded = _Recorded()
    auth = {"Authorization": f"Bearer {KEY}"}
    with _keeping_front(recorded) as (_, engine, url):
        chat = functools.partial(_chat, url)
        chat("A")
        chat("A")
        got = httpx.post(f"{url}/v1/messages/count_tokens", json={"messages": []}, headers=auth,
                         timeout=10)  # fmt: skip
        assert got.status_code == 200
        chat("A")
        assert recorded.said == [("resume", "A")]  # counting tokens takes no slot
        got = httpx.post(f"{url}/completion", json={"prompt": "Hi"}, headers=auth, timeout=10)
        assert got.status_code == 200
        chat("A")
        assert recorded.said == [("resume", "A")] * 2
        chat("B")
        assert recorded.said[2:] == [("kept", "A"), ("resume", "B")]
        chats = ["/v1/chat/completions"]
        assert engine.targets == chats * 2 + ["/v1/messages/count_tokens"] + chats + [
            "/completion"
        ] + chats * 2  # fmt: skip


class _SlowKeeper(_Recorded):
    """Conversations kept slowly: each answer takes ``seconds`` to keep."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def answered(
        self, body: dict[str, object], answer: dict[str, object], engine: Upstream
    ) -> None:
        time.sleep(self.seconds)
        super().answered(body, answer, engine)


def test_a_stop_waits_for_the_last_answer_to_be_kept_only_so_long_and_says_so(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C on ``k3desk serve`` keeps the conversation answered last before the engine
    stops, but a person is not kept waiting longer than ``STOP_KEEP_SECONDS``: past that
    the stop goes on, and says the conversation will be read again."""
    from k3desk.cli import serve

    slow = _SlowKeeper(1.5)
    with _keeping_front(slow) as (f, _, url):
        _chat(url, "A")
        monkeypatch.setattr(serve, "STOP_KEEP_SECONDS", 0.3)
        started = time.monotonic()
        serve._flush(f)
        assert time.monotonic() - started < 1.2  # not the keeper's 1.5 s
        said = capsys.readouterr().err
        assert "The conversation a tool had answered last was not kept within 0 s" in said
        assert ("kept", "A") not in slow.said
        assert f.flush(5)  # given the time, it is kept
        assert ("kept", "A") in slow.said


def test_a_conversation_is_kept_only_while_the_slot_holds_it_and_before_the_window_takes_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Kept when idle while the engine's slot still holds it; not after another request
    may have taken the slot (keeping it would read it all again).  Before the app window's
    own chat takes the slot (``slot_taken``) it is kept at once, and its next request
    brings it back; a tool's request that may take the slot tells the window (``on_slot``)."""
    from k3desk.core.engines import front as front_module

    monkeypatch.setattr(front_module, "IDLE_SECONDS", 0.3)
    recorded = _Recorded()
    told: list[str] = []
    auth = {"Authorization": f"Bearer {KEY}"}
    with _keeping_front(recorded, on_slot=lambda: told.append("taken")) as (f, _, url):
        chat = functools.partial(_chat, url)
        chat("A")
        got = httpx.post(f"{url}/completion", json={"prompt": "Hi"}, headers=auth, timeout=10)
        assert got.status_code == 200
        time.sleep(1.0)
        assert ("kept", "A") not in recorded.said  # the slot may hold "Hi" now
        assert told == ["taken", "taken"]
        httpx.post(f"{url}/tokenize", json={"content": "Hi"}, headers=auth, timeout=10)
        httpx.post(f"{url}/completion", json={"prompt": "Hi"}, timeout=10)  # no key: refused
        assert told == ["taken", "taken"]  # neither takes the slot
        chat("B")
        deadline = time.monotonic() + 10  # the idle keep, however slow this machine is
        while ("kept", "B") not in recorded.said and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ("kept", "B") in recorded.said  # idle, the slot still holding it
        chat("C")
        assert f.slot_taken(5)
        assert recorded.said[-1] == ("kept", "C")  # at once, not after the idle time
        chat("C")
        assert recorded.said[-1] == ("resume", "C")  # the window had the slot meanwhile
