"""The Engine page's Attempts table shows every attempt of a launch that runs out of GPU
memory: why each one ended and the re-plan that followed (more expert layers in RAM)."""

from __future__ import annotations

import dataclasses

import pytest

from k3desk.core.engines.launch import prepare_launch
from k3desk.core.hardware.profile import HardwareProfile
from k3desk.core.planning.model import PlanOptions
from k3desk.ui.engine.controller import LaunchRequest
from k3desk.ui.engine.page import EnginePage

pytestmark = pytest.mark.slow


def test_the_attempts_table_shows_each_replan_and_why(  # type: ignore[no-untyped-def]
    ctx, qtbot, fake_engine, tiny_k3, hardware_file
) -> None:
    h200 = HardwareProfile.from_json_file(hardware_file("1xH200-141GB"))
    prepared = prepare_launch(
        tiny_k3.first_part,
        mmproj=None,
        hardware=h200,
        options=PlanOptions(ctx=1024),
        paths=ctx.services.paths,
        engine=fake_engine("serve", FAKE_GPU="1"),  # a CUDA build: the plan keeps the GPU
    )
    # the same launch on an engine that runs out of GPU memory below --n-cpu-moe 2
    oom = fake_engine("gpu_oom", FAKE_OOM_BELOW="2")
    spec = dataclasses.replace(prepared.spec(), executable=oom)
    page = EnginePage(ctx)
    qtbot.addWidget(page)
    engine = ctx.engine
    engine.launch(LaunchRequest(spec, prepared.plan, "Tiny", replan=prepared.replan_after_oom))
    qtbot.waitUntil(lambda: engine.ready and page.attempts.rowCount() == 3, timeout=60_000)
    column = {
        page.attempts.horizontalHeaderItem(j).text(): j for j in range(page.attempts.columnCount())
    }
    rows = [page.attempts.item(i, column["What happened"]).text() for i in range(3)]
    oom_said = "GPU 0 (CUDA0) ran out of memory while loading or running the model (exit 1)."
    for row, (old, new) in zip(rows, ((0, 1), (1, 2)), strict=False):
        assert row.startswith(oom_said), row
        assert f"re-planned after GPU out-of-memory: --n-cpu-moe {old} -> {new} " in row
        assert "restarting in" in row
    assert rows[2] == "running"
    # a visible column says how each command differs from the one before it
    changed = [page.attempts.item(i, column["Changed"]).text() for i in range(3)]
    assert changed == ["—", "added --n-cpu-moe 1", "--n-cpu-moe 1 -> 2"]
    # each row's tooltip has the command it ran: the re-planned --n-cpu-moe
    assert "--n-cpu-moe 2" in page.attempts.item(2, 0).toolTip()
    assert "--n-cpu-moe" not in page.attempts.item(0, 0).toolTip()
    engine.stop()
    qtbot.waitUntil(lambda: engine.state_name() == "stopped", timeout=30_000)
