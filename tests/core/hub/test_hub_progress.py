"""Speed and ETA of a download: checked against a clock the test drives at a known byte rate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from k3desk.core.hub import reporting
from k3desk.core.hub.job import DownloadJob
from k3desk.core.hub.model import (
    DownloadEvent,
    DownloadOptions,
    DownloadRequest,
    FileProgress,
    Queued,
)
from k3desk.core.hub.reporting import Events, FileTask, Overall, Rate
from tests.fixtures.hub import MMPROJ, TIER_REPO, TierRepo, shard_name

MB = 1_000_000
CHUNK = 100_000  # bytes per step
STEP = 0.1  # seconds per step: 1 MB/s


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(reporting, "time", c)
    return c


def progress_of(events: list[DownloadEvent]) -> list[FileProgress]:
    return [e for e in events if isinstance(e, FileProgress)]


def transfer(task: FileTask, clock: Clock, n_bytes: int, *, network: bool = True) -> None:
    for _ in range(n_bytes // CHUNK):
        clock.now += STEP
        task.add(CHUNK, network=network)


def test_eta_is_the_remaining_bytes_at_the_measured_rate(clock: Clock) -> None:
    events: list[DownloadEvent] = []
    overall = Overall(10 * MB)
    task = FileTask("a.gguf", 10 * MB, Events(events.append), overall, 0.0)
    task.start_at(0)
    clock.now += 20.0  # connecting, or other files being hashed: no bytes for 20 s
    transfer(task, clock, 4 * MB)
    got = progress_of(events)
    # the first events know no rate yet: they say so instead of guessing from the idle
    # time or from a fraction of a second of bytes
    assert got[0].overall_eta is None
    assert all(e.overall_eta is None for e in got[:19])
    for e in got[20:]:  # from two seconds on: 1 MB/s, so (10 MB - done) / 1 MB/s
        truth = (10 * MB - e.overall_done) / MB
        assert e.overall_eta == pytest.approx(truth, rel=0.05), e
        assert e.overall_speed == pytest.approx(MB, rel=0.05)
    assert got[-1].overall_eta == pytest.approx(6.0, rel=0.05)


def test_hashing_a_file_does_not_blank_the_eta_of_a_download_beside_it(clock: Clock) -> None:
    events: list[DownloadEvent] = []
    overall = Overall(10 * MB)
    fetch = FileTask("a.gguf", 10 * MB, Events(events.append), overall, 0.0)
    check = FileTask("b.gguf", 10 * MB, Events(events.append), overall, 0.0, "verify")
    fetch.start_at(0)
    for _ in range(30):  # both move at once for 3 s
        clock.now += STEP
        fetch.add(CHUNK)
        check.add(CHUNK, network=False)
    late = [e for e in progress_of(events) if e.overall_done > 2 * MB + CHUNK]
    assert {e.phase for e in late} == {"download", "verify"}
    for e in late:
        assert e.overall_eta == pytest.approx((10 * MB - e.overall_done) / MB, rel=0.05), e


def test_a_transfer_that_starts_over_puts_its_bytes_back_on_the_eta(clock: Clock) -> None:
    events: list[DownloadEvent] = []
    overall = Overall(10 * MB)
    task = FileTask("a.gguf", 10 * MB, Events(events.append), overall, 0.0)
    task.start_at(0)
    transfer(task, clock, 3 * MB)
    task.start_at(0)  # the attempt failed; the next one starts from byte 0
    transfer(task, clock, 1 * MB)
    last = progress_of(events)[-1]
    assert last.overall_total == 10 * MB  # the file's size, whatever came twice
    assert last.overall_done == 1 * MB  # the 3 MB of the failed attempt are to come again
    assert last.overall_eta == pytest.approx(9.0, rel=0.05)  # 9 MB of the file still to come


def test_a_resumed_file_counts_what_is_on_disk_as_done(clock: Clock) -> None:
    events: list[DownloadEvent] = []
    # 4 MB of the 10 MB file were on disk when the job listed it
    overall = Overall(10 * MB, done=4 * MB)
    task = FileTask("a.gguf", 10 * MB, Events(events.append), overall, 0.0, counted=4 * MB)
    task.start_at(4 * MB)
    transfer(task, clock, 2 * MB)
    first = progress_of(events)[0]
    assert (first.overall_done, first.overall_total) == (4 * MB + CHUNK, 10 * MB)
    assert progress_of(events)[-1].overall_done == 6 * MB
    task.rewind(0)  # the server ignored the Range request: all 10 MB come again
    transfer(task, clock, 1 * MB)
    last = progress_of(events)[-1]
    assert (last.overall_done, last.overall_total) == (1 * MB, 10 * MB)
    assert last.overall_eta == pytest.approx(9.0, rel=0.05)


def test_files_starting_together_do_not_read_as_a_burst(clock: Clock) -> None:
    """Eight connections open within a few milliseconds on a 1 MB/s link: the speed shown
    is the link's (or unknown), never the bytes of a few milliseconds."""
    events: list[DownloadEvent] = []
    overall = Overall(80 * MB)
    tasks = [
        FileTask(f"{i}.gguf", 10 * MB, Events(events.append), overall, 0.25) for i in range(8)
    ]
    for t in tasks:
        t.start_at(0)
    for _ in range(100):  # 10 s: each connection has an eighth of the link
        for t in tasks:
            clock.now += STEP / 8
            t.add(CHUNK // 8)
    shown = [e.overall_speed for e in progress_of(events) if e.overall_speed > 0]
    assert shown, "no speed was ever shown"
    assert all(s == pytest.approx(MB, rel=0.25) for s in shown), max(shown)
    etas = [e for e in progress_of(events) if e.overall_eta is not None]
    for e in etas:
        assert e.overall_eta == pytest.approx((80 * MB - e.overall_done) / MB, rel=0.25)


def test_a_rate_from_milliseconds_of_bytes_is_unknown() -> None:
    """Two connections' first megabytes 5 ms apart (a socket buffer drained at memory
    speed) are no rate: 200 MB/s would be shown.  Once bytes have come over 2 s the
    rate is said, and it is the link's."""
    rate = Rate()
    rate.add(MB, 100.0)
    rate.add(MB, 100.005)
    assert rate.speed(100.005) == 0.0  # unknown, not 200 MB/s
    assert rate.speed(101.9) == 0.0
    for i in range(1, 31):  # then 1 MB/s for 3 s
        rate.add(MB // 10, 100.005 + i * 0.1)
    assert rate.speed(103.005) > 0
    assert rate.speed(103.005) == pytest.approx(4 * MB / 3.005, rel=0.01)


def test_the_speed_falls_when_the_link_does(clock: Clock) -> None:
    """A link that slows from 1 MB/s to 0.1 MB/s is shown at its new rate within the
    window, not at the average since the start."""
    events: list[DownloadEvent] = []
    overall = Overall(100 * MB)
    task = FileTask("a.gguf", 100 * MB, Events(events.append), overall, 0.0)
    task.start_at(0)
    transfer(task, clock, 60 * MB)  # a minute at 1 MB/s
    for _ in range(200):  # then 20 s at 0.1 MB/s
        clock.now += STEP
        task.add(CHUNK // 10)
    assert progress_of(events)[-1].overall_speed == pytest.approx(MB / 10, rel=0.25)


def _options(hub: Any, **kw: Any) -> DownloadOptions:
    base: dict[str, Any] = {
        "endpoint": hub.endpoint,
        "margin_bytes": 0,
        "backoff_base": 0.05,
        "progress_interval": 0.0,
    }
    base.update(kw)
    return DownloadOptions(**base)


def test_a_file_fetched_twice_ends_the_job_at_its_own_total(
    tier_repo: TierRepo, tmp_path: Path
) -> None:
    """Corrupted in transit, then fetched again: the bar ends full, the ETA at zero."""
    hub = tier_repo.hub
    bad = shard_name(2)
    hub.corrupt_once(bad, 1_000_000)
    events: list[DownloadEvent] = []
    summary = DownloadJob(tier_repo.request(), tmp_path, _options(hub), events.append).run()
    assert summary.refetched == (bad,)
    last = max(progress_of(events), key=lambda e: e.overall_done)  # threads race to report
    assert last.overall_done == last.overall_total == sum(map(len, tier_repo.wanted.values()))
    assert {e.overall_total for e in progress_of(events)} == {last.overall_total}
    assert summary.fetched_bytes == last.overall_total + len(tier_repo.files[bad])
    assert last.overall_eta == 0.0


def test_a_file_already_here_but_damaged_adds_its_bytes_to_the_total(
    tier_repo: TierRepo, tmp_path: Path
) -> None:
    hub = tier_repo.hub
    bad = shard_name(3)
    good = tier_repo.files[bad]
    (tmp_path / bad).parent.mkdir(parents=True)
    (tmp_path / bad).write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
    events: list[DownloadEvent] = []
    summary = DownloadJob(tier_repo.request(), tmp_path, _options(hub), events.append).run()
    assert summary.refetched == (bad,)
    last = max(progress_of(events), key=lambda e: e.overall_done)
    assert last.overall_done == last.overall_total == sum(map(len, tier_repo.wanted.values()))


def test_every_file_is_announced_with_its_plan_before_any_starts(
    tier_repo: TierRepo, tmp_path: Path
) -> None:
    """What a per-file list shows from the start: queued, to resume, to check and reuse."""
    hub = tier_repo.hub
    DownloadJob(DownloadRequest(TIER_REPO, (shard_name(1),)), tmp_path, _options(hub)).run()
    (tmp_path / MMPROJ).write_bytes(tier_repo.files[MMPROJ])  # copied here by hand
    events: list[DownloadEvent] = []
    DownloadJob(tier_repo.request(), tmp_path, _options(hub), events.append).run()
    kinds = [e.kind for e in events]
    queued = events[kinds.index("queued")]
    assert isinstance(queued, Queued)
    assert kinds.index("queued") < kinds.index("file_started")
    plan = {q.path: q.source for q in queued.files}
    assert set(plan) == set(tier_repo.wanted)
    assert plan[shard_name(1)] == "state"
    assert plan[MMPROJ] == "existing"
    assert sorted(p for p, s in plan.items() if s == "download") == sorted(
        set(tier_repo.wanted) - {shard_name(1), MMPROJ}
    )
    sizes = {q.path: q.size for q in queued.files}
    assert sizes == {p: len(d) for p, d in tier_repo.wanted.items()}
