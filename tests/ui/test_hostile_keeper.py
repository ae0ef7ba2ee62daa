"""A process that keeps the engine without a window, whose engine was killed and whose
port another program took at once: it gives up (the window quits the app on
``failed``) instead of lingering, and the other program gets no key.  (The rest of the
hostile suite is in tests/hostile, which runs with Qt made unimportable.)"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

from k3desk.core.engines.ports import free_port
from k3desk.core.engines.supervisor import LaunchSpec
from tests.hostile.test_owner_and_transport import wait_free
from tests.hostile.test_port_squatter import squatting


def test_a_keeper_whose_engine_was_killed_and_port_squatted_gives_up(
    ctx: object, qtbot: object, fake_engine: Callable[..., Path], tmp_path: Path
) -> None:
    from k3desk.ui.engine.controller import LaunchRequest

    port = free_port()
    spec = LaunchSpec(fake_engine("serve"), ("-m", str(tmp_path / "model.gguf")), port=port)
    engine = ctx.engine  # type: ignore[attr-defined]
    failed: list[str] = []
    engine.failed.connect(lambda message, _hint: failed.append(message))
    engine.launch(LaunchRequest(spec, model_name="tiny"))
    qtbot.waitUntil(lambda: engine.ready, timeout=30_000)  # type: ignore[attr-defined]
    assert engine.keep_in_background()
    pid = engine.supervisor.endpoint.pid
    os.kill(pid, signal.SIGKILL)
    wait_free(port)
    with squatting(port) as squatter:
        qtbot.waitUntil(lambda: bool(failed), timeout=10_000)  # type: ignore[attr-defined]
    assert f"port {port} was chosen explicitly" in failed[0]
    assert squatter.keys() == []
