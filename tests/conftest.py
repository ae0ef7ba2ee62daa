"""Test-suite wide setup.

Shared fixtures live in ``tests/fixtures/*.py`` (one module per area) and are
registered here as plugins.  Each test gets its own ``K3DESK_HOME`` so no test
reads or writes the real user's settings, history or keyring.
"""

from __future__ import annotations

import faulthandler
import gc
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest_plugins = [  # a module another one imports comes first, so its asserts are rewritten
    "tests.fixtures.hardware",
    "tests.fixtures.engine",
    "tests.fixtures.tiny",
    "tests.fixtures.twins",
    "tests.fixtures.hub",
    "tests.fixtures.sshd",
    "tests.fixtures.disk",
]

REPO = Path(__file__).resolve().parents[1]

# Qt renders offscreen unless a test run asks for a real display (screenshots).
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
# Never reach the internet from tests.
os.environ.setdefault("HF_HUB_OFFLINE", "0")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
# Never touch the real user's keyring (bridge keys, tokens): tests that need one inject it.
os.environ.setdefault("PYTHON_KEYRING_BACKEND", "keyring.backends.null.Keyring")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> None:
    """A test given more time than the suite's 300 s (its own timeout mark) has its
    threads' stacks dumped only near its own limit: the suite's faulthandler_timeout
    (280 s) printed every thread of a slow test that then passed, a hang's report where
    nothing hung."""
    mark = item.get_closest_marker("timeout")
    limit = mark.args[0] if mark is not None and mark.args else None
    if isinstance(limit, (int, float)) and limit > 300:
        faulthandler.dump_traceback_later(limit - 20, file=sys.__stderr__ or sys.stderr)


@pytest.fixture(autouse=True)
def k3_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh K3DESK_HOME (and HF_HOME) for every test."""
    home = tmp_path_factory.mktemp("k3home")
    monkeypatch.setenv("K3DESK_HOME", str(home))
    monkeypatch.setenv("HF_HOME", str(home / "hf"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    # every test's engine on a free port of its own (the local API's fixed port would be
    # shared by tests, and by a k3desk the person runs); tests of the fixed port set it
    monkeypatch.setenv("K3DESK_API_PORT", "0")
    return home


@pytest.fixture(autouse=True)
def collect_garbage_after() -> Iterator[None]:
    """Collect garbage after every test, so an object a test leaks (an unclosed socket,
    say) is reported against that test, not against whichever one runs when the
    collector next happens to."""
    yield
    gc.collect()
