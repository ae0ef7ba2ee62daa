"""The wizard's tiers step shows what the Hub has beside the catalog: the stand-in's set
judged from its real headers, chosen and downloaded exactly (its parts, at the commit its
headers were read at); offline, the catalog alone, said so."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt

from tests.hubserver import HubServer
from tests.ui.test_wizard import open_wizard_for

REPO = "tester/Kimi-K3-Tiny-GGUF"
SET = "IQ1_S/Tiny-K3-IQ1_S"


def tiers_step(window, qtbot, hw_file: Path):  # type: ignore[no-untyped-def]
    wiz = open_wizard_for(window, qtbot, hw_file)
    wiz.next()
    assert wiz.current_key() == "tiers"
    return wiz


def files_under(folder: Path) -> set[str]:
    return {
        p.relative_to(folder).as_posix()
        for p in folder.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(folder).parts)
    }


def test_a_set_on_the_hub_is_judged_chosen_and_downloaded_at_its_commit(  # type: ignore[no-untyped-def]
    window, qtbot, tiny_k3, tiny_k3_single, hardware_file, monkeypatch, tmp_path
) -> None:
    ctx = window.ctx
    with HubServer() as hub:
        parts: dict[str, bytes | Path] = {f"IQ1_S/{p.name}": p.read_bytes() for p in tiny_k3.parts}
        files: dict[str, bytes | Path] = {
            **parts,
            "Q8_0/Tiny-K3-Q8_0.gguf": tiny_k3_single.parts[0].read_bytes(),  # another set
            "mmproj-Tiny-K3-F16.gguf": tiny_k3.mmproj.read_bytes(),
            "README.md": b"# Tiny K3\n",
        }
        listed = hub.add_repo(REPO, files)
        hub.api_delay = 0.5  # the search takes a while: the wizard does not wait for it
        monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
        wiz = tiers_step(window, qtbot, hardware_file("1xH200-141GB"))
        box = wiz.tiers.hub
        # the catalog's tiers at once, the Hub searched in the background
        assert wiz.tiers.table.rowCount() == len(ctx.services.catalog)
        assert box.searching
        assert "Search" in box.status.text()
        qtbot.waitUntil(lambda: box.result is not None and not box.searching, timeout=120_000)
        hub.api_delay = 0.0
        rows = {r[0]: r for r in box.texts()}
        row = rows[f"{REPO} · {SET}"]
        assert row[1].startswith("GPU: everything on the GPUs"), row
        assert row[2] == "real headers"
        assert row[3] == "3"
        assert "2 judged from their real headers" in box.status.text()
        # a newer commit on the Hub after the search: the download takes what was judged
        newer = dict(files)
        for name in parts:
            del newer[name]
        newer["README.md"] = b"# Tiny K3, the IQ1_S set moved\n"
        assert hub.add_repo(REPO, newer).sha != listed.sha
        # the set's own Download button chooses it and goes on to where it lands
        i = [r[0] for r in box.texts()].index(f"{REPO} · {SET}")
        get = box.table.cellWidget(i, box.table.columnCount() - 1)
        assert get.text() == "Download"
        qtbot.mouseClick(get, Qt.MouseButton.LeftButton)
        assert wiz.hub_set() is not None
        assert wiz.hub_set().remote.name == SET
        assert wiz.selected_tier() is None  # the set, not a catalog tier
        assert "real headers" in wiz.tiers.details.toPlainText()
        assert "and the set's vision projector" in wiz.tiers.details.toPlainText()
        assert wiz.current_key() == "where"
        assert listed.sha[:12] in wiz.where.tier_line.text()
        wiz.where.folder.setText(str(tmp_path / "models"))
        wiz.next()
        assert wiz.current_key() == "download"
        assert "3 parts" in wiz.download.start.text()
        ctx.downloads.endpoint = hub.endpoint
        qtbot.mouseClick(wiz.download.start, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(
            lambda: (
                ctx.downloads.state is not None and ctx.downloads.state.status in ("done", "failed")
            ),
            timeout=120_000,
        )
        state = ctx.downloads.state
        assert state.status == "done", state.error
        assert state.request.revision == listed.sha
        target = wiz.where.target()
        # the set is its files: its parts and the repository's projector, nothing else
        assert files_under(target) == set(parts) | {"mmproj-Tiny-K3-F16.gguf"}
        for name, data in parts.items():
            assert (target / name).read_bytes() == data
        assert wiz.download.isComplete()


def test_offline_the_tiers_step_shows_the_catalog_only_and_says_so(  # type: ignore[no-untyped-def]
    window, qtbot, hardware_file, monkeypatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    wiz = tiers_step(window, qtbot, hardware_file("8xH100-2TB"))
    box = wiz.tiers.hub
    qtbot.waitUntil(lambda: box.result is not None, timeout=60_000)
    assert box.status.text().startswith("Catalog only")
    assert "HF_HUB_OFFLINE" in box.status.text()
    assert box.texts() == []
    assert not box.table.isVisible()
    assert wiz.tiers.table.rowCount() == len(window.ctx.services.catalog)
    assert wiz.selected_tier() is not None
    assert wiz.tiers.isComplete()


def test_the_hub_search_can_be_stopped_and_the_catalog_stays(  # type: ignore[no-untyped-def]
    window, qtbot, hardware_file, monkeypatch
) -> None:
    with HubServer() as hub:
        hub.api_delay = 3.0  # an overloaded Hub
        monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
        wiz = tiers_step(window, qtbot, hardware_file("8xH100-2TB"))
        box = wiz.tiers.hub
        assert box.searching
        assert box.stop.isVisible()
        qtbot.mouseClick(box.stop, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: not box.searching, timeout=30_000)
        assert box.status.text().startswith("Hub search stopped")
        assert box.result is None
        assert wiz.tiers.table.rowCount() == len(window.ctx.services.catalog)
        assert wiz.tiers.isComplete()
        # the search itself ends at its next safe point, its answer unused
        tasks = window.ctx.tasks
        qtbot.waitUntil(
            lambda: not any(t.name == "hub search" and t.running for t in tasks.tasks()),
            timeout=30_000,
        )
        assert box.result is None


def test_planning_for_other_hardware_judges_the_hubs_sets_again(  # type: ignore[no-untyped-def]
    window, qtbot, tiny_k3, hardware_file, monkeypatch
) -> None:
    with HubServer() as hub:
        hub.add_repo(REPO, {f"IQ1_S/{p.name}": p.read_bytes() for p in tiny_k3.parts})
        monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
        wiz = tiers_step(window, qtbot, hardware_file("1xH200-141GB"))
        box = wiz.tiers.hub
        qtbot.waitUntil(lambda: box.result is not None and not box.searching, timeout=60_000)
        assert box.texts()[0][1].startswith("GPU: everything on the GPUs")
        laptop = hardware_file("no-gpu-laptop-32GB")
        window.ctx.hardware.load_file(laptop)  # "Plan for other hardware…" on this step
        qtbot.waitUntil(
            lambda: (
                box.result is not None
                and not box.searching
                and "no-gpu-laptop" in box.result.subject.describe()
            ),
            timeout=60_000,
        )
        verdict = box.texts()[0][1]
        assert not verdict.startswith("GPU"), verdict
        assert box.texts()[0][2] == "real headers"
