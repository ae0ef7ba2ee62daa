"""`k3desk api serve` reached from the network (`k3desk api lan on`): the local API's front
(core/engines/front.py) before llama-server's router, attacked as the engine alone is in
test_local_api_lan.py.  The router is the real llama-server b11434 with a tiny Kimi-K3.

What holds: without a valid key every request is the router's 401 and loads nothing; a
page of an origin the person did not list is never allowed to read an answer; a 100 MB body
without a key is refused at once and the front's memory does not grow by it; 1,000 idle
connections and 50 half-sent requests held open do not delay a keyed client (the front
holds them, the router never sees them), and a client that drops mid-answer ends its
generation at once and nothing else.
"""

from __future__ import annotations

import socket
import statistics
import time
from pathlib import Path

import httpx
import psutil
import pytest

from k3desk.core.engines.ports import free_port
from k3desk.devtools.tinyk3 import write_tiny_k3
from tests.core.engines.test_local_api import k3desk
from tests.core.engines.test_on_demand import _api_serve, _ask, _states
from tests.hostile.test_local_api_lan import ORIGIN, lan_ip, models, preflight

pytestmark = [pytest.mark.engine]
__all__ = ["lan_ip"]  # the fixture, used by name

CHAT = {"model": "Tiny-A", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}


def test_through_the_front_keys_origins_floods_and_big_bodies_hold(
    llama_server: Path, tmp_path: Path, lan_ip: str
) -> None:
    port = free_port()
    assert k3desk("api", "port", str(port)).returncode == 0
    assert k3desk("api", "lan", "on", "--cors-origin", ORIGIN).returncode == 0
    kept = k3desk("api", "create", "laptop").stdout.splitlines()[0]
    revoked = k3desk("api", "create", "old-phone").stdout.splitlines()[0]
    assert k3desk("api", "revoke", "old-phone").returncode == 0
    tiny = write_tiny_k3(tmp_path / "a", name="Tiny-A", seed=3)
    assert k3desk("models", "add", str(tiny.first_part)).returncode == 0
    url = f"http://{lan_ip}:{port}"
    serve = _api_serve(llama_server, "--load-wait", "0")
    with serve as out:
        assert "Tiny-A" in out
        front = psutil.Process(serve.proc.pid)  # the front runs in k3desk api serve
        for key in (None, "k3-wrong", revoked, kept[:-1], kept + "x"):
            assert models(url, key).status_code == 401, key
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            chat = httpx.post(f"{url}/v1/chat/completions", json=CHAT, headers=headers, timeout=30)
            assert chat.status_code == 401, key
        assert _states(f"{url}/v1", kept) == {"Tiny-A": "unloaded"}  # no load for them

        # a browser's preflight and request from a page of another site; and the front's own
        # answer (503 while loading) follows the same rule
        for origin, allowed in ((ORIGIN, True), ("http://evil.example", False)):
            pre = preflight(url, origin)
            keyed = {"Authorization": f"Bearer {kept}", "Origin": origin}
            busy = httpx.post(f"{url}/v1/chat/completions", json=CHAT, headers=keyed, timeout=30)
            assert busy.status_code in (200, 503)
            for r in (pre, models(url, kept, Origin=origin), busy):
                allow = r.headers.get("access-control-allow-origin")
                assert (allow == origin) is allowed, (r.request.url, allow)
                assert allow != "*"

        # a 100 MB body without a key: refused at once, the front's memory unchanged by it
        rss = front.memory_info().rss
        started = time.monotonic()
        try:
            big = httpx.post(f"{url}/v1/chat/completions", content=b"x" * (100 << 20),
                             headers={"Content-Type": "application/json"}, timeout=60)  # fmt: skip
            assert big.status_code == 401
        except httpx.TransportError:
            pass  # the router may close the connection on the unread rest: also refused
        assert time.monotonic() - started < 10
        assert front.memory_info().rss < rss + 32 * 1024 * 1024

        # 1,000 idle connections, 50 of them half a request: a keyed client is not delayed
        held: list[socket.socket] = []
        try:
            for _ in range(1000):
                held.append(socket.create_connection((lan_ip, port), timeout=10))
            for s in held[:50]:
                s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
            started = time.monotonic()
            assert _ask(f"http://127.0.0.1:{port}/v1", kept, "Tiny-A")
            assert time.monotonic() - started < 10
        finally:
            for s in held:
                s.close()
        # a client that drops in the middle of a streamed answer ends its generation (the
        # router's one slot is free at once) and nothing else.  Against the whole answer,
        # read to its end in the same run (its generation fills the context): a question
        # that had to wait for the dropped one would take about as long.  The median of
        # three drops: on 2 busy cores the OS now and then leaves a process unscheduled
        # for a second or two (seen with a bare asyncio loop beside the engine), and the
        # front acts on a drop only once it runs
        long = {"model": "Tiny-A", "prompt": "Once", "stream": True, "max_tokens": 100000,
                "ignore_eos": True}  # fmt: skip
        auth = {"Authorization": f"Bearer {kept}"}
        started = time.monotonic()
        with httpx.stream("POST", f"{url}/v1/completions", timeout=120, json=long,
                          headers=auth) as r:  # fmt: skip
            assert r.status_code == 200
            for _ in r.iter_bytes():
                pass
        whole = time.monotonic() - started
        after_drop: list[float] = []
        for _ in range(3):
            with httpx.stream("POST", f"{url}/v1/completions", timeout=30, json=long,
                              headers=auth) as r:  # fmt: skip
                assert r.status_code == 200
                next(r.iter_bytes())
            started = time.monotonic()
            assert _ask(f"{url}/v1", kept, "Tiny-A")
            after_drop.append(time.monotonic() - started)
        assert statistics.median(after_drop) < whole / 4, (after_drop, whole)
        assert front.is_running()
