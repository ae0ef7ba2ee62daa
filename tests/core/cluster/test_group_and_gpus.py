"""The restart policy of process groups, and the node probe's reading of nvidia-smi."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from k3desk.core.chat.client import ChatEndpoint
from k3desk.core.cluster.group import (
    GroupEvent,
    GroupPolicy,
    GroupState,
    GroupSupervisor,
    LaunchFailure,
)
from k3desk.core.cluster.probe import PROBE_SCRIPT, _fill_gpu_facts
from k3desk.core.errors import EngineError
from k3desk.core.hardware.profile import HardwareProfile
from k3desk.core.progress import CancelToken


class Scripted(GroupSupervisor):
    """Launches succeed or fail as scripted; a 'member' dies when the test says so."""

    kind = "test group"

    def __init__(self, outcomes: list[str], **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.outcomes = outcomes
        self.launches = 0
        self.teardowns = 0

    def _launch(self, attempt: int, cancel: CancelToken) -> ChatEndpoint:
        self.launches += 1
        outcome = self.outcomes.pop(0) if self.outcomes else "ok"
        self._phase("launching", 0, 1)
        if outcome == "fail":
            raise LaunchFailure("member crashed during load")
        if outcome == "fatal":
            raise LaunchFailure("model refused", "use another tier", fatal=True)
        return ChatEndpoint(f"http://127.0.0.1:{9000 + attempt}")

    def _teardown(self) -> None:
        self.teardowns += 1


FAST = GroupPolicy(backoff_initial=0.01, max_failures=3)


def test_deaths_restart_everything_until_the_budget_is_spent() -> None:
    events: list[GroupEvent] = []
    g = Scripted([], policy=FAST, on_event=events.append)
    g.start()
    assert g.wait_ready(5).root == "http://127.0.0.1:9001"
    g.fault("rank 2 on b killed by SIGKILL")
    assert g.wait_ready(5).root == "http://127.0.0.1:9002"
    g.fault("rank 1 died")
    assert g.wait_ready(5).root == "http://127.0.0.1:9003"
    g.fault("rank 1 died again")
    assert g.wait_stopped(5)
    assert g.state is GroupState.FAILED
    assert g.error is not None
    assert g.error.message == "The test group failed: rank 1 died again (3 times in a row)"
    assert events[-1].final
    assert [a.outcome for a in g.attempts][:2] == [
        "restarted: rank 2 on b killed by SIGKILL", "restarted: rank 1 died"]  # fmt: skip
    assert g.teardowns == 3
    with pytest.raises(EngineError, match="3 times in a row"):
        g.wait_ready(1)


def test_a_stable_group_gets_its_budget_back() -> None:
    g = Scripted([], policy=GroupPolicy(backoff_initial=0.01, max_failures=2, stable_after=0.2))
    g.start()
    for _ in range(4):  # more deaths than the budget, each after a stable period
        g.wait_ready(5)
        time.sleep(0.25)
        g.fault("worker died")
    g.wait_ready(5)
    assert g.state is GroupState.READY
    g.stop()
    assert g.state is GroupState.STOPPED


def test_failed_launches_retry_with_backoff_and_fatal_ones_do_not() -> None:
    g = Scripted(["fail", "fail", "ok"], policy=FAST)
    g.start()
    g.wait_ready(5)
    assert g.launches == 3
    g.stop()
    fatal = Scripted(["fatal"], policy=FAST)
    fatal.start()
    with pytest.raises(EngineError) as err:
        fatal.wait_ready(5)
    assert err.value.message == "The test group failed: model refused"
    assert err.value.hint == "use another tier"
    assert fatal.launches == 1


def test_stop_during_backoff_and_cancel() -> None:
    g = Scripted(["fail"], policy=GroupPolicy(backoff_initial=30))
    g.start()
    assert g.wait_state(GroupState.RESTARTING, 5)
    t0 = time.monotonic()
    g.stop()
    assert time.monotonic() - t0 < 3
    assert g.state is GroupState.STOPPED
    cancel = CancelToken()
    g2 = Scripted(["fail"], policy=GroupPolicy(backoff_initial=30))
    g2.start()
    threading.Timer(0.2, cancel.cancel).start()
    from k3desk.core.errors import Cancelled

    with pytest.raises(Cancelled):
        g2.wait_ready(10, cancel)
    assert g2.state is GroupState.STOPPED


FAKE_SMI = """#!/bin/sh
# what nvidia-smi --query-gpu=... --format=csv,noheader,nounits prints
cat <<'CSV'
{rows}
CSV
"""


@pytest.mark.parametrize(
    ("rows", "expect"),
    [
        # DGX Spark: GB10 reports no memory of its own (it is the system RAM)
        ("0, NVIDIA GB10, [N/A], [N/A], 12.1, GPU-5a1b, 580.95.05",
         [("NVIDIA GB10", (12, 1), "Blackwell", True)]),
        ("0, NVIDIA H200, 143771, 143181, 9.0, GPU-aa, 570.86.15\n"
         "1, NVIDIA H200, 143771, 143181, 9.0, GPU-bb, 570.86.15",
         [("NVIDIA H200", (9, 0), "Hopper", False)] * 2),
    ],
)  # fmt: skip
def test_node_probe_reads_nvidia_smi(
    tmp_path: Path, rows: str, expect: list[tuple[str, tuple[int, int], str, bool]]
) -> None:
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text(FAKE_SMI.format(rows=rows))
    smi.chmod(0o755)
    env = dict(os.environ, PATH=f"{smi.parent}:/usr/bin:/bin")
    out = subprocess.run(
        [sys.executable, "-", json.dumps({"model_path": str(tmp_path)})],
        input=PROBE_SCRIPT.read_bytes(), capture_output=True, env=env, check=True, timeout=60,
    )  # fmt: skip
    data = json.loads(out.stdout)
    profile = _fill_gpu_facts(HardwareProfile.from_dict(data["hardware"]))
    got = [(g.name, g.compute_capability, g.architecture, g.unified_memory) for g in profile.gpus]
    assert got == expect
    assert profile.driver_version in ("580.95.05", "570.86.15")
    if expect[0][3]:  # unified: the GPU's memory is the RAM
        assert profile.gpus[0].vram_total == profile.memory.total
    else:
        assert profile.gpus[0].vram_total == 143771 * 1024**2
