"""`k3desk api` given what a person (or a script) might: names that look like options, a
port that is no port, a damaged list of keys, a variable set to nonsense.  Each answer is
one clear sentence, exit status 1 or 2, nothing lost, no traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from k3desk.devtools.tinyk3 import TinyModel
from tests.hostile.conftest import k3desk_env, no_traceback, run_k3desk


def api(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    r = run_k3desk("api", *args, env=k3desk_env(**(env or {})), timeout=60)
    no_traceback(r.stderr)
    return r.returncode, r.stdout.decode(), r.stderr.decode()


def test_a_key_made_is_listed_printed_and_revoked_by_name(k3_home: Path) -> None:
    rc, out, _ = api("create", "vscode")
    assert rc == 0
    secret = out.splitlines()[0]
    rc, out, _ = api("keys", "--json")
    (row,) = json.loads(out)
    assert row["name"] == "vscode"
    assert row["shown"] == f"k3-…{secret[-4:]}"
    assert secret not in out  # a list never shows a key whole
    assert api("key", "VSCODE")[1].strip() == secret
    rc, out, _ = api("revoke", "vscode")
    assert rc == 0
    rc, _, err = api("key", "vscode")
    assert rc == 1
    assert "There is no API key named 'vscode' (keys: none yet)." in err


@pytest.mark.parametrize("name", ["-x", "--engine=/bin/sh", "a b\nc", "x" * 41, "ключ"])
def test_a_name_that_looks_like_an_option_or_is_no_name_is_refused(name: str) -> None:
    rc, _, err = api("create", "--", name)
    assert rc == 1
    assert "cannot name a key" in err
    assert "1-40 letters" in err
    assert api("keys", "--json")[1].strip() == "[]"  # nothing was kept


@pytest.mark.parametrize(
    ("port", "said"),
    [
        ("80", "Port 80 is privileged"),
        ("70000", "70000 is not a port"),
        ("-1", "-1 is not a port"),
    ],
)
def test_a_port_that_cannot_serve_is_refused_and_the_old_one_kept(port: str, said: str) -> None:
    assert api("port", "9123")[0] == 0
    rc, _, err = api("port", "--", port)
    assert rc == 1
    assert said in err
    assert api("port", env={"K3DESK_API_PORT": ""})[1].strip() == "9123"


def test_a_port_variable_that_is_no_port_is_said_by_name() -> None:
    rc, _, err = api(env={"K3DESK_API_PORT": "80a"})
    assert rc == 1
    assert "K3DESK_API_PORT='80a' is not a port." in err
    assert "0 for a free port each launch" in err


def test_a_damaged_list_of_keys_is_set_aside_with_a_warning_and_a_new_one_begins(
    k3_home: Path,
) -> None:
    assert api("create", "a")[0] == 0
    index = next(k3_home.rglob("api-keys.json"))
    index.write_bytes(b"\xff\xfe not json")
    rc, out, _ = api()
    assert rc == 0
    assert "Warning: The list of API keys" in out
    assert "api-keys.json.damaged" in out
    assert api("create", "b")[0] == 0
    assert [r["name"] for r in json.loads(api("keys", "--json")[1])] == ["b"]
    assert list(index.parent.glob("api-keys.json.damaged*"))  # nothing lost


def test_settings_without_a_key_say_how_to_make_one() -> None:
    rc, _, err = api("settings")
    assert rc == 1
    assert "There is no API key for your tools yet." in err
    assert "k3desk api create NAME" in err


@pytest.mark.parametrize("n", ["0", "17", "-3"])
def test_serve_refuses_a_number_of_requests_at_once_it_cannot_plan(
    n: str, tiny_k3_single: TinyModel
) -> None:
    r = run_k3desk("serve", tiny_k3_single.first_part, "--parallel", n, timeout=60)
    no_traceback(r.stderr)
    assert r.returncode == 1
    assert f"--parallel {n} is outside 1-16." in r.stderr.decode()
    assert "Plan:" not in r.stdout.decode()
