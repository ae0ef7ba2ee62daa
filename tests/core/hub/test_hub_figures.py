"""What a download says of itself on a real (stand-in) link: its rate and ETA on a paced
link, its total across a resume, and "waiting for the Hub" when the Hub goes away."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from k3desk.core.errors import Cancelled, HubError
from k3desk.core.hub.job import DownloadJob
from k3desk.core.hub.model import (
    DownloadEvent,
    DownloadOptions,
    DownloadRequest,
    FileProgress,
    HubWaiting,
)
from tests.fixtures.hub import TIER_REPO, TierRepo, shard_name

LINK = 1_000_000  # bytes/s: every connection together, as a link of that rate


def _options(hub: Any, **kw: Any) -> DownloadOptions:
    base: dict[str, Any] = {
        "endpoint": hub.endpoint,
        "margin_bytes": 0,
        "backoff_base": 0.05,
        "progress_interval": 0.1,
        "direct_io": False,
    }
    base.update(kw)
    return DownloadOptions(**base)


class Timed:
    """Every event with the time it came."""

    def __init__(self) -> None:
        self.events: list[tuple[float, DownloadEvent]] = []
        self.lock = threading.Lock()

    def __call__(self, e: DownloadEvent) -> None:
        with self.lock:
            self.events.append((time.monotonic(), e))

    def progress(self) -> list[tuple[float, FileProgress]]:
        return [(t, e) for t, e in self.events if isinstance(e, FileProgress)]


def _shards(n: int) -> DownloadRequest:
    return DownloadRequest(TIER_REPO, tuple(shard_name(i) for i in range(1, n + 1)))


def test_a_paced_link_shows_its_rate_and_an_eta_that_comes_true(
    tier_repo: TierRepo, tmp_path: Path
) -> None:
    """Five shards (7.5 MB) over a 1 MB/s link, five connections at once: every speed
    shown is within 25 % of the link's, and every ETA within 25 % (and a second) of
    the time the download really took to end."""
    hub = tier_repo.hub
    hub.link_bps = LINK
    timed = Timed()
    DownloadJob(_shards(5), tmp_path, _options(hub), timed).run()
    end = timed.events[-1][0]
    shown = [(t, e) for t, e in timed.progress() if e.phase == "download"]
    speeds = [e.overall_speed for _, e in shown if e.overall_speed > 0]
    assert len(speeds) > 10, "the rate was hardly ever known"
    assert all(s == pytest.approx(LINK, rel=0.25) for s in speeds), (min(speeds), max(speeds))
    etas = [(t, e.overall_eta) for t, e in shown if e.overall_eta and end - t >= 1.0]
    assert etas
    for t, eta in etas:
        assert abs(eta - (end - t)) <= 0.25 * (end - t) + 1.0, (eta, end - t)


def test_a_resumed_download_keeps_its_total_and_counts_what_it_has(
    tier_repo: TierRepo, tmp_path: Path
) -> None:
    hub = tier_repo.hub
    hub.throttle_bps = 1_000_000
    request = _shards(4)
    size = sum(len(tier_repo.files[p]) for p in request.allow_patterns)
    first = Timed()
    jobs: list[DownloadJob] = []

    def pause_midway(e: DownloadEvent) -> None:
        first(e)
        if isinstance(e, FileProgress) and e.overall_done > size // 2:
            jobs[0].pause()

    jobs.append(DownloadJob(request, tmp_path, _options(hub), pause_midway))
    with pytest.raises(Cancelled):
        jobs[0].run()
    hub.throttle_bps = 0
    had = max(e.overall_done for _, e in first.progress())
    second = Timed()
    DownloadJob(request, tmp_path, _options(hub), second).run()
    totals = {e.overall_total for _, e in first.progress() + second.progress()}
    assert totals == {size}  # the set's size, before and after the resume
    pre = next(e for _, e in second.events if e.kind == "preflight")
    assert pre.have_bytes >= size // 4  # what the first run left counts as done at once
    again = second.progress()
    assert again[0][1].overall_done >= pre.have_bytes
    assert again[-1][1].overall_done == size
    assert had <= size


def test_a_hub_that_goes_down_is_said_within_fifteen_seconds(
    tier_repo: TierRepo, tmp_path: Path
) -> None:
    hub = tier_repo.hub
    hub.link_bps = 500_000
    timed = Timed()
    gone: list[float] = []

    def watch(e: DownloadEvent) -> None:
        timed(e)
        if isinstance(e, FileProgress) and e.overall_done > 1_000_000 and not gone:
            gone.append(time.monotonic())
            threading.Thread(target=hub.close, daemon=True).start()  # the Hub goes away
            give_up.start()  # whatever it says, the test ends 20 s on
        if isinstance(e, HubWaiting) and e.waiting:
            job.pause()

    job = DownloadJob(_shards(4), tmp_path, _options(hub, max_retries=50), watch)
    give_up = threading.Timer(20.0, job.pause)
    try:
        with pytest.raises((Cancelled, HubError)):
            job.run()
    finally:
        give_up.cancel()
    waits = [(t, e) for t, e in timed.events if isinstance(e, HubWaiting) and e.waiting]
    assert gone, "the download ended before the Hub went away"
    assert waits, "the job never said it was waiting for the Hub"
    assert waits[0][0] - gone[0] <= 15.0
    assert waits[0][1].reason
