"""A web page of another site cannot read what k3desk's llama-server answers.

llama-server b11434 answers a page of any site by default: its CORS middleware echoes the
request's ``Origin`` and allows credentials (``--cors-origins *`` with
``--cors-credentials``, tools/server/server-http.cpp).  k3desk's launches tell an engine
that has the flags to answer pages of this machine only (``--cors-origins localhost
--no-cors-credentials``): a browser then keeps another site's script from reading the
answer, even one that learned the key.  What it cannot restrict (the ``Host`` header; a
page of this machine) is said in docs/promises.md.

The launch is the real one: ``prepare_launch`` probes the real llama-server for its
flags, the Supervisor starts it with the tiny Kimi-K3.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from k3desk.core.engines.launch import prepare_launch
from k3desk.core.engines.supervisor import Supervisor
from k3desk.core.hardware.profile import HardwareProfile
from k3desk.core.paths import default_paths
from k3desk.core.planning.model import PlanOptions
from k3desk.devtools.tinyk3 import TinyModel

pytestmark = [pytest.mark.engine, pytest.mark.slow]

EVIL = "https://models.example.net"


@pytest.fixture
def served(
    llama_server: Path, tiny_k3_single: TinyModel, hardware_file: object
) -> Iterator[tuple[str, dict[str, str], tuple[str, ...]]]:
    hw = HardwareProfile.from_json_file(hardware_file("no-gpu-laptop-32GB"))  # type: ignore[operator]
    prepared = prepare_launch(
        tiny_k3_single.first_part,
        mmproj=None,
        hardware=hw,
        options=PlanOptions(ctx=512),
        paths=default_paths(),
        engine=llama_server,
    )
    sup = Supervisor(prepared.spec(), default_paths())
    sup.start()
    try:
        ep = sup.wait_ready(90)
        assert sup.pid is not None
        yield ep.url, ep.headers, tuple(psutil.Process(sup.pid).cmdline())
    finally:
        sup.stop()


def test_a_page_of_another_site_gets_no_cors_grant(
    served: tuple[str, dict[str, str], tuple[str, ...]],
) -> None:
    url, headers, cmdline = served
    assert cmdline[cmdline.index("--cors-origins") + 1] == "localhost"
    assert "--no-cors-credentials" in cmdline
    # a script on another site, with the key it somehow learned: the answer comes, but
    # without the grant a browser needs to hand it to the script
    r = httpx.get(f"{url}/v1/models", headers={**headers, "Origin": EVIL}, timeout=10)
    assert r.status_code == 200
    assert "access-control-allow-origin" not in r.headers
    # the browser's preflight for a POST with Authorization: no grant, no credentials
    pre = httpx.options(
        f"{url}/v1/chat/completions",
        headers={
            "Origin": EVIL,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization,content-type",
        },
        timeout=10,
    )
    assert "access-control-allow-origin" not in pre.headers
    assert pre.headers.get("access-control-allow-credentials") == "false"
    # a look-alike host is another site too
    r = httpx.get(
        f"{url}/v1/models",
        headers={**headers, "Origin": "http://localhost.models.example.net"},
        timeout=10,
    )
    assert "access-control-allow-origin" not in r.headers


def test_a_page_of_this_machine_may_still_read_it(
    served: tuple[str, dict[str, str], tuple[str, ...]],
) -> None:
    url, headers, _ = served
    for origin in ("http://localhost:5173", "http://127.0.0.1:8080"):
        r = httpx.get(f"{url}/v1/models", headers={**headers, "Origin": origin}, timeout=10)
        assert r.status_code == 200
        assert r.headers.get("access-control-allow-origin") == origin
        assert r.headers.get("access-control-allow-credentials") != "true"
