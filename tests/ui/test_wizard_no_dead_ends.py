"""The wizard never dead-ends: files one already has are one click from the first step, a
full disk or too little memory is a warning with the numbers (Next stays open), and each
step names the tier it judges, refreshed when the tier changes."""

from __future__ import annotations

import pytest
from PySide6.QtWidgets import QFileDialog, QWizard

from tests.ui.test_wizard import open_wizard_for


def next_enabled(wiz) -> bool:  # type: ignore[no-untyped-def]
    return bool(wiz.button(QWizard.WizardButton.NextButton).isEnabled())


def test_a_full_disk_warns_with_the_numbers_and_the_step_follows_the_tier(  # type: ignore[no-untyped-def]
    window, qtbot, hardware_file, tmpfs
) -> None:
    small = tmpfs(6)  # a real 6 MiB disk: every tier is short of space there
    window.ctx.update_settings(download_dir=str(small))
    wiz = open_wizard_for(window, qtbot, hardware_file("8xH100-2TB"))
    wiz.next()
    wiz.tiers.table.select_tier("vcruz305-ud-iq1s")
    wiz.next()
    where = wiz.where
    assert wiz.current_key() == "where"
    assert "vcruz305 UD-IQ1_S" in where.tier_line.text()
    assert "307.5 GiB" in where.tier_line.text()
    qtbot.waitUntil(lambda: where.shortfall.isVisible(), timeout=10_000)
    warning = where.shortfall.text.text()
    assert "307.5 GiB" in warning
    assert "short" in warning
    assert "Browse" in warning
    assert "smaller tier" in warning
    assert next_enabled(wiz)  # a warning, not a lock
    assert where.have.isVisible()
    # another tier: the step judges that one, not the previous one
    wiz.back()
    wiz.tiers.table.select_tier("grearl-iq1s")
    wiz.next()
    grearl = window.ctx.services.catalog.get("grearl-iq1s")
    assert f"{grearl.publisher} {grearl.name}" in where.tier_line.text()
    assert "528.0 GiB" in where.tier_line.text()
    qtbot.waitUntil(lambda: "528.0 GiB" in where.shortfall.text.text(), timeout=10_000)
    assert "307.5 GiB" not in where.shortfall.text.text()
    # the numbers are said once: the free-space line gives the disk, the warning the rest
    assert "free on" in where.free.text()
    assert "needs" not in where.free.text()
    assert "short" not in where.free.text()
    wiz.next()
    assert wiz.current_key() == "download"


def test_too_little_memory_is_a_warning_with_the_numbers(window, qtbot, hardware_file) -> None:  # type: ignore[no-untyped-def]
    wiz = open_wizard_for(window, qtbot, hardware_file("no-gpu-laptop-32GB"))
    wiz.next()
    wiz.tiers.table.select_tier("grearl-iq1s")
    warning = wiz.tiers.fit_warning
    assert warning.isVisible()
    text = warning.text.text()
    assert "does not fit in the memory of" in text
    assert "short" in text
    assert "GiB" in text
    assert next_enabled(wiz)
    wiz.next()
    assert wiz.current_key() == "where"


@pytest.mark.parametrize("step", ["machine", "tiers"])
def test_i_already_have_the_files_from_the_first_steps(  # type: ignore[no-untyped-def]
    window, qtbot, hardware_file, tiny_k3, monkeypatch, step
) -> None:
    wiz = open_wizard_for(window, qtbot, hardware_file("no-gpu-laptop-32GB"))
    if step == "tiers":
        wiz.next()
    assert wiz.current_key() == step
    monkeypatch.setattr(
        QFileDialog, "getOpenFileName", lambda *a, **k: (str(tiny_k3.first_part), "")
    )
    button = wiz.machine.have if step == "machine" else wiz.tiers.have
    assert button.isVisible()
    button.click()
    qtbot.waitUntil(lambda: window.wizard is None, timeout=10_000)
    assert window.current_page() == "models"
    mine = window.models_page().mine
    qtbot.waitUntil(lambda: len(mine.rows()) == 1, timeout=30_000)
    assert mine.rows()[0].model.shard == tiny_k3.first_part
    assert window.ctx.settings.wizard_done  # not opened again on the next start
