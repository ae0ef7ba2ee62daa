"""The endpoint use-cases both shells call: attach a server (checked now or not), check it,
say what kind of server it is, detach it (Qt-free, against the suite's OpenAI-compatible
stand-in)."""

from __future__ import annotations

import pytest

from k3desk.app import Services
from k3desk.core.app.endpoints import (
    EndpointRequest,
    add_endpoint,
    check_endpoint,
    endpoint_store,
    remove_endpoint,
    set_endpoint_server,
)
from k3desk.core.app.values import K3Error
from tests.core.chat.conftest import StandIn
from tests.core.chat.conftest import closed_port as _closed_port_fixture
from tests.core.chat.conftest import standin as _standin_fixture

standin = _standin_fixture  # the fixtures, under their own names, for this module
closed_port = _closed_port_fixture


def test_attach_check_and_detach_a_server(standin: StandIn) -> None:
    store = endpoint_store(Services())
    ep, where = add_endpoint(store, EndpointRequest("lab", standin.url + "/", api_key="s3cret"))
    assert ep.url == standin.url  # the trailing slash dropped
    assert ep.server == "llama-server"  # what the check found, kept with it
    # the test session's keyring is the null backend: never a plain file
    assert where.startswith("no usable system keyring: the API key is kept for this session")
    assert "s3cret" not in store.file.read_text()
    assert [e.name for e in endpoint_store(Services()).load()] == ["lab"]

    st = check_endpoint(store, "lab")
    assert st.up
    assert st.capabilities is not None
    assert st.latency_s >= 0

    # a taken name is refused unless replaced; a bad URL is refused; nothing is lost
    with pytest.raises(K3Error, match="An endpoint named 'lab' is already attached"):
        add_endpoint(store, EndpointRequest("lab", standin.url, check=False))
    with pytest.raises(K3Error):
        add_endpoint(store, EndpointRequest("bad", "ftp://nowhere", check=False))
    assert [e.name for e in store.load()] == ["lab"]

    gone = remove_endpoint(store, "lab")
    assert gone.url == standin.url
    assert store.load() == []
    with pytest.raises(K3Error, match="lab"):
        check_endpoint(store, "lab")


def test_a_server_that_does_not_answer(closed_port: int) -> None:
    store = endpoint_store(Services())
    url = f"http://127.0.0.1:{closed_port}"
    with pytest.raises(K3Error):  # checked now: refused, nothing saved
        add_endpoint(store, EndpointRequest("down", url))
    assert store.load() == []

    ep, where = add_endpoint(store, EndpointRequest("down", url, check=False))
    assert (ep.server, where) == ("", "no API key")
    st = check_endpoint(store, "down")  # never raises for a down server
    assert not st.up
    assert st.error


def test_say_what_kind_of_server_it_is(closed_port: int) -> None:
    store = endpoint_store(Services())
    add_endpoint(store, EndpointRequest("x", f"http://127.0.0.1:{closed_port}", check=False))
    ep, st = set_endpoint_server(store, "x", "vllm")
    assert (ep.server, ep.server_set, st) == ("vllm", True, None)
    assert store.get("x").server == "vllm"  # kept

    ep, st = set_endpoint_server(store, "x", "auto", check=True)  # find out again
    assert (ep.server, ep.server_set) == ("", False)
    assert st is not None
    assert not st.up

    with pytest.raises(K3Error):
        set_endpoint_server(store, "x", "no-such-server")
    assert store.get("x").server_set is False
