"""UI tests: offscreen Qt, every test here is marked ``gui``."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.gui)


@pytest.fixture
def services(k3_home: Path) -> object:
    from k3desk.app import Services

    return Services()


@pytest.fixture
def ctx(qapp: object, services: object) -> Iterator[object]:
    """An AppContext on a fresh K3DESK_HOME (dialogs suppressed: errors are recorded)."""
    from k3desk.ui.main import create_context

    context = create_context(services, qapp)  # type: ignore[arg-type]
    context.reporter.show_dialogs = False
    yield context
    context.close()
    context.tasks.shutdown(timeout=10)
    context.setParent(None)
    context.deleteLater()


@pytest.fixture
def window(ctx, qtbot):  # type: ignore[no-untyped-def]
    """The main window, shown (a test module that needs it otherwise defines its own)."""
    from k3desk.ui.window import MainWindow

    w = MainWindow(ctx)
    qtbot.addWidget(w)
    w.show()
    return w


@pytest.fixture
def launch_engine(ctx, qtbot):  # type: ignore[no-untyped-def]
    """Start the real llama-server on a tiny model through the app's engine controller."""
    from k3desk.core.engines.supervisor import LaunchSpec
    from k3desk.ui.engine.controller import LaunchRequest

    def launch(server: Path, model, vision: bool = True, ctx_size: int = 4096):  # type: ignore[no-untyped-def]
        args = ["-m", str(model.first_part), "-c", str(ctx_size), "--jinja", "-ngl", "0"]
        if vision and model.mmproj is not None:
            args += ["--mmproj", str(model.mmproj)]
        spec = LaunchSpec(server, tuple(args), ready_timeout=60)
        engine = ctx.engine
        engine.launch(LaunchRequest(spec, model_name=model.name, vision=vision))
        qtbot.waitUntil(lambda: engine.ready, timeout=60_000)
        return engine

    return launch


@pytest.fixture
def this_machine(services, monkeypatch):  # type: ignore[no-untyped-def]
    """``this_machine(hardware_file)``: detection on this machine reports the machine the
    file describes.  A stand-in for GPUs this machine does not have (NVML needs a driver):
    what is launched and built here is planned for "this machine", which the pages judge
    only when asked to (``ctx.hardware.detect()``)."""

    def use(path):  # type: ignore[no-untyped-def]
        profile = services.load_hardware(path)

        def detect(disk_path=None, *, measure_bandwidth=True):  # type: ignore[no-untyped-def]
            return profile

        monkeypatch.setattr(services, "detect_hardware", detect)
        return profile

    return use


@pytest.fixture(scope="session")
def empty_hub() -> Iterator[object]:
    """A Hub stand-in with no repositories (one for the whole run)."""
    from tests.hubserver import HubServer

    with HubServer() as hub:
        yield hub


@pytest.fixture(autouse=True)
def hub_endpoint_for_the_wizard(empty_hub: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The wizard's tiers step searches the Hub: in tests an empty stand-in answers, never
    the internet (a test with repositories points HF_ENDPOINT at its own stand-in)."""
    monkeypatch.setenv("HF_ENDPOINT", empty_hub.endpoint)
