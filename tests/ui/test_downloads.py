"""The download page drives a real download from the local Hub stand-in to completion."""

from __future__ import annotations

import hashlib

import pytest

from k3desk.ui.downloads.panel import DownloadPanel, fmt_eta


@pytest.fixture
def panel(ctx, qtbot, tier_repo):  # type: ignore[no-untyped-def]
    from k3desk.core.hub.tokens import TokenStore

    ctx.__dict__["token_store"] = TokenStore(env={})  # no token from the real environment
    dl = ctx.downloads
    dl.endpoint = tier_repo.hub.endpoint
    p = DownloadPanel(ctx)
    qtbot.addWidget(p)
    p.resize(900, 600)
    p.show()
    return p


def test_download_runs_to_completion_with_every_shard_verified(  # type: ignore[no-untyped-def]
    ctx, qtbot, panel, tier_repo, tmp_path
) -> None:
    target = tmp_path / "models"
    progress: list[float] = []
    dl = ctx.downloads
    dl.changed.connect(lambda st: progress.append(st.fraction))
    dl.start(tier_repo.request(), target)
    assert panel.cancel_btn.isEnabled()
    assert not panel.resume_btn.isEnabled()
    qtbot.waitUntil(lambda: dl.state.status == "done", timeout=60_000)
    wanted = tier_repo.wanted
    assert panel.table.rowCount() == len(wanted)
    states = [panel.table.item(r, 3).text() for r in range(panel.table.rowCount())]
    assert states == ["✓ verified"] * len(wanted)
    assert panel.total.value() == 1000
    assert "all verified" in panel.numbers.text()
    assert "done" in panel.title.text()
    for path, data in wanted.items():
        assert (
            hashlib.sha256((target / path).read_bytes()).digest() == hashlib.sha256(data).digest()
        )
    assert not (target / "IQ1_S" / "Tiny-K3-IQ1_S-XXS-00001-of-00002.gguf").exists()
    assert any(0 < f < 1 for f in progress)  # progress was shown along the way
    assert not panel.pause_btn.isEnabled()


def test_pause_then_resume_finishes_without_starting_over(  # type: ignore[no-untyped-def]
    ctx, qtbot, panel, tier_repo, tmp_path
) -> None:
    hub = tier_repo.hub
    hub.throttle_bps = 4_000_000  # slow enough to pause mid-way
    target = tmp_path / "models"
    dl = ctx.downloads
    dl.start(tier_repo.request(), target)
    qtbot.waitUntil(lambda: dl.state.done > 2_000_000, timeout=30_000)
    panel.pause_btn.click()
    qtbot.waitUntil(lambda: dl.state.status == "paused", timeout=30_000)
    assert panel.resume_btn.isEnabled()
    assert "paused" in panel.title.text()
    sent_before = hub.bytes_sent()
    hub.throttle_bps = 0
    panel.resume_btn.click()
    qtbot.waitUntil(lambda: dl.state.status == "done", timeout=60_000)
    total = sum(len(d) for d in tier_repo.wanted.values())
    resent = hub.bytes_sent() - sent_before
    assert resent < total  # the bytes already on disk were not fetched again
    for path, data in tier_repo.wanted.items():
        assert (target / path).read_bytes() == data


def test_cancel_stops_and_removes_partial_files(ctx, qtbot, panel, tier_repo, tmp_path) -> None:  # type: ignore[no-untyped-def]
    tier_repo.hub.throttle_bps = 2_000_000
    target = tmp_path / "models"
    dl = ctx.downloads
    dl.start(tier_repo.request(), target)
    qtbot.waitUntil(lambda: dl.state.done > 500_000, timeout=30_000)
    panel.cancel_btn.click()
    qtbot.waitUntil(lambda: dl.state.status == "cancelled", timeout=30_000)
    assert not panel.resume_btn.isEnabled()
    partials = [p for p in target.rglob("*") if p.is_file() and "partial" in str(p)]
    assert partials == []


def _table_states(panel: DownloadPanel) -> dict[str, str]:
    t = panel.table
    return {t.item(r, 0).text(): t.item(r, 3).text() for r in range(t.rowCount())}


def test_every_file_of_the_tier_is_listed_from_the_start(  # type: ignore[no-untyped-def]
    ctx, qtbot, panel, tier_repo, tmp_path
) -> None:
    tier_repo.hub.throttle_bps = 1_000_000  # four at a time: the others wait their turn
    dl = ctx.downloads
    dl.start(tier_repo.request(), tmp_path / "models")
    qtbot.waitUntil(
        lambda: any(r.state == "downloading" for r in dl.state.files.values()), timeout=30_000
    )
    shown = _table_states(panel)
    assert set(shown) == set(tier_repo.wanted)
    assert "queued" in shown.values()
    assert "downloading" in shown.values()
    panel.pause_btn.click()
    qtbot.waitUntil(lambda: dl.state.status == "paused", timeout=30_000)
    assert set(_table_states(panel)) == set(tier_repo.wanted)


def test_files_already_here_are_shown_as_reused(  # type: ignore[no-untyped-def]
    ctx, qtbot, panel, tier_repo, tmp_path
) -> None:
    from tests.fixtures.hub import MMPROJ

    target = tmp_path / "models"
    (target / MMPROJ).parent.mkdir(parents=True)
    (target / MMPROJ).write_bytes(tier_repo.files[MMPROJ])  # copied in by hand
    dl = ctx.downloads
    dl.start(tier_repo.request(), target)
    qtbot.waitUntil(lambda: dl.state.status == "done", timeout=60_000)
    shown = _table_states(panel)
    assert shown.pop(MMPROJ) == "✓ reused"
    assert set(shown.values()) == {"✓ verified"}
    row = next(r for r in range(panel.table.rowCount()) if panel.table.item(r, 0).text() == MMPROJ)
    assert "sha256 checked" in panel.table.item(row, 3).toolTip()

    dl.start(tier_repo.request(), target)  # again: nothing is fetched, all is reused
    qtbot.waitUntil(lambda: dl.state.status == "done", timeout=60_000)
    assert set(_table_states(panel).values()) == {"✓ reused"}
    assert len(_table_states(panel)) == len(tier_repo.wanted)


def test_eta_never_says_zero_seconds_when_it_does_not_know(  # type: ignore[no-untyped-def]
    ctx, panel, tier_repo, tmp_path
) -> None:
    from k3desk.ui.downloads.controller import DownloadState

    assert fmt_eta(None) == "—"
    assert fmt_eta(0.0) == "< 1 s"
    assert fmt_eta(0.4) == "< 1 s"
    assert fmt_eta(1.0) == "1 s"
    assert fmt_eta(61) == "1 min 01 s"
    assert fmt_eta(3 * 3600 + 125) == "3 h 02 min"
    st = DownloadState(tier_repo.request(), tmp_path, status="running", total=10, done=5)
    panel.show_state(st)  # no rate measured yet
    assert "ETA —" in panel.numbers.text()
    st.speed, st.eta = 2_000_000.0, 0.3
    panel.show_state(st)
    assert "ETA < 1 s" in panel.numbers.text()


def test_a_hub_that_goes_away_reads_waiting_for_the_hub_within_fifteen_seconds(  # type: ignore[no-untyped-def]
    ctx, qtbot, panel, tier_repo, tmp_path
) -> None:
    """The page never says "running" with nothing coming: the Hub gone, the title says
    it waits for the Hub (and why) within 15 s, and the total stays the set's size."""
    import threading
    import time

    hub = tier_repo.hub
    hub.link_bps = 1_000_000
    dl = ctx.downloads
    dl.start(tier_repo.request(), tmp_path / "models")
    qtbot.waitUntil(lambda: dl.state.done > 1_000_000, timeout=30_000)
    total = dl.state.total
    threading.Thread(target=hub.close, daemon=True).start()
    gone = time.monotonic()
    qtbot.waitUntil(lambda: dl.state.status == "waiting for the Hub", timeout=15_000)
    assert time.monotonic() - gone <= 15.0
    assert "waiting for the Hub" in panel.title.text()
    assert "no data for" in panel.numbers.text()
    assert dl.state.total == total == sum(len(d) for d in tier_repo.wanted.values())
    dl.pause()
    qtbot.waitUntil(lambda: dl.state.status == "paused", timeout=30_000)
