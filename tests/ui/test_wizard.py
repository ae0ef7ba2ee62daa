"""The tier-picker wizard on the shipped hardware files, and the main window's first run."""

from __future__ import annotations

from pathlib import Path

import pytest


def open_wizard_for(window, qtbot, hw_file: Path):  # type: ignore[no-untyped-def]
    hw = window.ctx.hardware
    hw.load_file(hw_file)
    wiz = window.open_wizard()
    qtbot.waitUntil(
        lambda: hw.recommendation is not None and hw.from_file == hw_file, timeout=30_000
    )
    return wiz


def verdicts(wiz) -> dict[str, str]:  # type: ignore[no-untyped-def]
    t = wiz.tiers.table
    return {tv.tier.id: t.item(r, 1).text() for r, tv in enumerate(t.rows)}


@pytest.mark.parametrize(
    ("name", "best", "closest", "expect"),
    [
        (
            "no-gpu-laptop-32GB",
            None,
            # nothing fits in RAM: the tier missing the least, the one download its disk holds
            "vcruz305-ud-iq1s",
            {"vcruz305-ud-iq1s": "streams from disk:", "atomicchat-q8_0": "streams from disk:"},
        ),
        (
            "1xRTX5090-256GB",
            None,
            "vcruz305-ud-iq1s",
            {"vcruz305-ud-iq1s": "streams from disk: 44.6 GiB beyond RAM"},
        ),
        (
            "8xH100-2TB",
            "atomicchat-q3ks",
            None,
            {
                "atomicchat-q3ks": "hybrid: 45 expert layers on CPU",
                "grearl-iq1s": "GPU: everything on the GPUs",
                "atomicchat-q8_0": "streams from disk:",
            },
        ),
        ("3xGB10-node", None, "vcruz305-ud-iq1s", {"vcruz305-ud-iq1s": "streams from disk:"}),
    ],
)
def test_wizard_recommends_per_hardware_file(  # type: ignore[no-untyped-def]
    window, qtbot, hardware_file, name, best, closest, expect
) -> None:
    wiz = open_wizard_for(window, qtbot, hardware_file(name))
    rec = window.ctx.hardware.recommendation
    assert (rec.best.tier.id if rec.best else None) == best
    assert (rec.closest.tier.id if rec.closest else None) == closest
    # page 1: the machine and the needs-vs-has chart
    summary = wiz.machine.summary.text()
    hw = window.ctx.hardware.profile
    for g in hw.gpus:
        assert g.name in summary
    if not hw.gpus:
        assert "GPU" in summary
    assert "RAM" in summary
    assert len(wiz.machine.chart.rows) == len(rec.verdicts)
    starred = [r for r in wiz.machine.chart.rows if r.recommended]
    assert len(starred) == 1
    assert wiz.machine.isComplete()
    # page 2: every tier with its verdict; the recommendation preselected with its reason
    wiz.next()
    assert wiz.current_key() == "tiers"
    assert wiz.tiers.table.rowCount() == len(window.ctx.services.catalog)
    chosen = rec.best or rec.closest
    assert wiz.selected_tier().tier.id == chosen.tier.id
    assert wiz.tiers.reason.text() == rec.summary
    got = verdicts(wiz)
    for tier_id, text in expect.items():
        assert got[tier_id].startswith(text), (tier_id, got[tier_id])
    assert chosen.tier.name in wiz.tiers.details.toPlainText()


def test_fit_chart_bars_compare_needs_with_the_machine(window, qtbot, hardware_file) -> None:  # type: ignore[no-untyped-def]
    wiz = open_wizard_for(window, qtbot, hardware_file("8xH100-2TB"))
    rows = {
        r.name.split(" · ")[0] + "/" + r.name.split(" · ")[1]: r for r in wiz.machine.chart.rows
    }
    hw = window.ctx.hardware.profile
    rec = window.ctx.hardware.recommendation
    q3 = rows["Q3_K_S/AtomicChat"]
    labels = [b.resource for b in q3.bars]
    assert labels == ["VRAM", "RAM", "Disk"]
    vram, ram, disk = q3.bars
    # the tracks are the planner's budgets: free VRAM less a 1 GiB margin per GPU, the RAM
    # less what is kept for the system
    plan = next(tv.plan for tv in rec.verdicts if tv.tier.id == "atomicchat-q3ks")
    gpus = [d for d in plan.devices if d.device != "RAM"]
    assert vram.have == sum(d.capacity for d in gpus)
    assert vram.have == sum(g.vram_free for g in hw.gpus) - len(hw.gpus) * 2**30
    assert vram.need == sum(d.used for d in gpus)
    assert ram.have == plan.devices[-1].capacity < hw.memory.usable_total
    assert disk.have == hw.disk.free
    assert vram.fits
    assert ram.fits
    q8 = rows["Q8_0/AtomicChat"]
    assert not q8.bars[1].fits  # Q8_0 misses RAM on this machine
    # ... by what the planner says it misses (the 292 GiB it streams), not twice that
    q8_plan = next(tv for tv in rec.verdicts if tv.tier.id == "atomicchat-q8_0")
    assert q8.bars[1].short == q8_plan.shortfall == q8_plan.plan.stream_bytes > 0
    img = wiz.machine.chart.grab().toImage()
    assert img.width() > 300
    assert img.height() >= 28 + wiz.machine.chart.ROW * len(rows) - 1


def test_first_run_opens_the_wizard_and_finishing_saves_the_choice(  # type: ignore[no-untyped-def]
    ctx, qtbot, hardware_file
) -> None:
    from k3desk.ui.main import build_window, parse_args

    assert ctx.first_run
    w = build_window(ctx, parse_args(["--hardware", str(hardware_file("8xH100-2TB"))]))
    qtbot.addWidget(w)
    w.show()
    wiz = w.open_wizard()
    hw = ctx.hardware
    qtbot.waitUntil(lambda: hw.recommendation is not None, timeout=30_000)
    wiz.next()
    wiz.tiers.table.select_tier("grearl-iq1s")
    wiz.next()
    assert wiz.current_key() == "where"
    qtbot.waitUntil(lambda: bool(wiz.where.free.text()), timeout=10_000)
    assert "free" in wiz.where.free.text()
    wiz.where.parallel.setValue(3)
    wiz.next()
    assert wiz.current_key() == "download"
    assert "94 shards" in wiz.download.start.text()
    assert not wiz.download.isComplete()
    wiz.accept()
    assert ctx.store.exists
    assert ctx.settings.tier_id == "grearl-iq1s"
    assert ctx.settings.download_workers == 3
    assert ctx.settings.wizard_done


def test_a_bad_hardware_file_is_reported_by_name(window, qtbot, tmp_path) -> None:  # type: ignore[no-untyped-def]
    bad = tmp_path / "box.json"
    bad.write_text("{nope")
    window.ctx.hardware.load_file(bad)
    qtbot.waitUntil(lambda: window.ctx.reporter.last is not None, timeout=10_000)
    message, _hint, unexpected = window.ctx.reporter.last
    assert str(bad) in message
    assert "not valid JSON" in message
    assert not unexpected
