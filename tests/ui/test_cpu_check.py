"""The wizard's machine step: this CPU's kernel check, offered, refused with a reason, shown."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from PySide6.QtCore import Qt

from k3desk.core.hardware.detect import detect_hardware
from k3desk.core.planning import kernels as kernel_costs
from k3desk.core.tuning.cpuprobe import CpuProbe, CpuProbeStore, ProbeRun, file_identity
from k3desk.core.tuning.identity import machine_key


def test_the_machine_step_offers_the_check_says_why_it_cannot_and_shows_a_kept_one(  # type: ignore[no-untyped-def]
    window, qtbot, tmp_path: Path, k3_home: Path
) -> None:
    ctx = window.ctx
    ctx.hardware.detect()
    wiz = window.open_wizard()
    qtbot.waitUntil(lambda: ctx.hardware.judgement is not None, timeout=60_000)
    page = wiz.machine
    assert "CPU speed" in page.summary.text()
    assert "not timed here" in page.summary.text()
    assert page.check_cpu.isVisibleTo(page)
    # an engine that ships only llama-server: the note says which tool is missing
    lone = tmp_path / "bin" / "llama-server"
    lone.parent.mkdir()
    lone.write_text("#!/bin/sh\n")
    lone.chmod(0o755)
    ctx.update_settings(engine_binary=str(lone))
    qtbot.mouseClick(page.check_cpu, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: "llama-bench is not beside" in page.check_note.text(), timeout=60_000)
    assert page.check_cpu.isEnabled()
    # a check kept for this machine: the summary shows the figures doctor prints
    bench = tmp_path / "bin" / "llama-bench"
    bench.write_bytes(b"build")
    hw = detect_hardware(measure_bandwidth=False)
    runs = (
        ProbeRun(1, 41.0, 15.0, prompt_factor=0.8, decode_factor=0.5, spread=0.01),
        ProbeRun(hw.cpu.physical_cores + 1, 70.0, 25.0, 1.25, 0.4, 0.02),
    )
    probe = CpuProbe(machine_key(hw), file_identity(bench), kernel_costs.load().source,
                     1_790_000_000.0, 20e9, runs)  # fmt: skip
    CpuProbeStore(ctx.services.paths.state).put(probe)
    assert ctx.hardware.profile is not None
    page.show_profile(ctx.hardware.profile)
    text = page.summary.text()
    assert f"timed here on {probe.day}: decodes at 2.50x, prompts at 0.80x" in text
    assert page.check_cpu.text() == "Time this CPU again"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    out = subprocess.run(
        [sys.executable, "-m", "k3desk", "doctor", "--no-benchmark"],
        capture_output=True, text=True, timeout=120, env=env, check=False,
    ).stdout  # fmt: skip
    assert "decoding 25.0 tok/s (2.50x its speed), prompts 70.0 tok/s (0.80x)" in out
    # the tiers judged again predict with it: faster decoding than the shipped costs
    before = {r.tier.id: r for r in ctx.hardware.judgement.rows}
    ctx.hardware.judge()
    qtbot.waitUntil(lambda: ctx.hardware.judgement.rows[0] is not before.get(
        ctx.hardware.judgement.rows[0].tier.id), timeout=60_000)  # fmt: skip
    after = {r.tier.id: r for r in ctx.hardware.judgement.rows}
    faster = [
        t for t, r in after.items()
        if r.speed is not None and before[t].speed is not None
        and r.speed.expected > before[t].speed.expected
    ]  # fmt: skip
    assert faster
