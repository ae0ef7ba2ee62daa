"""Every read from a hostile Hub is bounded: its bytes (per part, per set, per search,
counted whatever the outcome), its pages, its requests and its time; and what it names
is shown cut short.

One test per mechanism: a request accepted and never answered, pages that never end or
go round in a circle, headers larger than a set may be, a part that is sent again and
again, a search whose sets are each refused at the set cap, an id 5 MB long.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest

from k3desk.app import Services
from k3desk.cli import main as cli_main
from k3desk.core.app.remote_plan import RemotePlanRequest, plan_remote_set
from k3desk.core.app.search import SearchRequest, search_hub
from k3desk.core.errors import HubError
from k3desk.core.hub import headers as hub_headers
from k3desk.core.hub import session as hub_session
from k3desk.core.hub.discovery import search_repos
from k3desk.core.hub.headers import HeaderTooLong, read_remote_headers
from k3desk.core.hub.job import DownloadJob
from k3desk.core.hub.listing import list_remote
from k3desk.core.hub.model import DownloadOptions, DownloadRequest
from k3desk.core.progress import CancelToken
from tests.hostile.conftest import bounded
from tests.hostile.hostile_hub import HostileHub

MiB = 1024 * 1024
REPO_ID = "mallory/Kimi-K3-GGUF"
HW = "1xH200-141GB"
MODEL_INFO = r"^/api/models/[^/]+/[^/]+(/revision/[^/]+)?$"


def long_header(path: Path, strings: int, length: int) -> Path:
    """A GGUF whose header is ``strings`` string values of ``length`` bytes each (holes,
    so it costs no disk), then ``general.architecture``: a parser reads all of it."""

    def kv_string(key: str, n: int) -> bytes:
        k = key.encode()
        return struct.pack("<Q", len(k)) + k + struct.pack("<IQ", 8, n)

    with path.open("wb") as f:
        f.write(b"GGUF" + struct.pack("<IQQ", 3, 0, strings + 1))
        for i in range(strings):
            f.write(kv_string(f"general.k{i}", length))
            f.seek(length, 1)
        f.write(kv_string("general.architecture", 7) + b"kimi-k3")
        f.truncate(f.tell() + MiB)
    return path


def header_bytes_sent(hub: HostileHub) -> int:
    return sum(h.sent for h in hub.hits if h.file and h.method == "GET")


# ------------------------------------------------------------------ time


def test_a_request_accepted_and_never_answered_is_asked_again_then_named(
    hostile_hub: HostileHub, tmp_path: Path, hardware_file: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The model info of the repository never comes: download, plan --remote and search
    each end within the read timeout times the attempts, naming the request."""
    monkeypatch.setattr(hub_session, "READ_TIMEOUT", 0.5)
    hostile_hub.add_repo(REPO_ID, {"IQ1_S/K3-00001-of-00001.gguf": b"GGUF" + bytes(5000)})
    hostile_hub.stall_api = MODEL_INFO
    said = f"got the request for the model info of {REPO_ID} but sent no answer within 0.5 s"

    cancel = CancelToken()
    options = DownloadOptions(endpoint=hostile_hub.endpoint, margin_bytes=0, use_hf_cache=False)
    job = DownloadJob(DownloadRequest(REPO_ID, ("*.gguf",)), tmp_path / "m", options, None, cancel)
    run = bounded(job.run, 30, stop=cancel.cancel)
    assert isinstance(run.error, HubError), run.error
    assert said in run.error.message
    assert "3 times in a row" in run.error.message
    stalled = [h for h in hostile_hub.hits if h.status == 0]
    assert len(stalled) == 3  # asked again a bounded number of times, then given up

    req = RemotePlanRequest(REPO_ID, hardware_file=hardware_file(HW),
                            endpoint=hostile_hub.endpoint, token="")  # fmt: skip
    planned = bounded(lambda: plan_remote_set(Services(), req), 30)
    assert isinstance(planned.error, HubError)
    assert said in planned.error.message

    searched = bounded(
        lambda: search_hub(
            Services(),
            SearchRequest(hardware_file=hardware_file(HW), endpoint=hostile_hub.endpoint,
                          token=""),
        ),
        30,
    )  # fmt: skip
    assert searched.error is None, searched.error
    assert any(said in line for line in searched.value.errors), searched.value.errors


def test_a_header_read_never_answered_is_asked_again_then_named(
    hostile_hub: HostileHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hub_headers, "TIMEOUT", 0.5)
    name = "Q/K3-00001-of-00001.gguf"
    repo = hostile_hub.add_repo(REPO_ID, {name: b"GGUF" + bytes(5000)})
    hostile_hub.stall_get.add(name)
    listing = list_remote(DownloadRequest(REPO_ID, ("*.gguf",)), endpoint=hostile_hub.endpoint)
    run = bounded(
        lambda: read_remote_headers(
            REPO_ID, repo.sha, listing.files, tmp_path / "cache", endpoint=hostile_hub.endpoint
        ),
        30,
    )
    assert isinstance(run.error, HubError), run.error
    assert f"stopped answering the request for {name}" in run.error.message
    assert len([h for h in hostile_hub.hits if h.status == 0]) == 3


def test_a_search_that_never_answers_ends_offline_with_the_request_named(
    hostile_hub: HostileHub, hardware_file: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hub_session, "READ_TIMEOUT", 0.5)
    hostile_hub.stall_api = r"^/api/models$"
    run = bounded(
        lambda: search_hub(
            Services(),
            SearchRequest(hardware_file=hardware_file(HW), endpoint=hostile_hub.endpoint,
                          token=""),
        ),
        30,
    )  # fmt: skip
    assert run.error is None, run.error
    assert run.value.offline
    assert "got the request for page 1 of the search but sent no answer" in (
        run.value.offline_reason
    )


# ------------------------------------------------------------------ pages


def test_endless_empty_search_pages_stop_at_the_page_bound(hostile_hub: HostileHub) -> None:
    """Every page is empty and links to one more, for ever."""
    hostile_hub.search_next = "endless-empty"
    run = bounded(lambda: search_repos(endpoint=hostile_hub.endpoint, token=""), 30)
    assert isinstance(run.error, HubError), run.error
    assert "k3desk stopped searching" in run.error.message
    assert "it goes on past 10 pages, 0 entries" in run.error.message
    assert len([h for h in hostile_hub.hits if h.path.startswith("/api/models?")]) == 10


def test_listing_pages_that_go_round_in_a_circle_stop_at_the_first_page_seen_again(
    hostile_hub: HostileHub,
) -> None:
    hostile_hub.add_repo(REPO_ID, {"IQ1_S/K3-00001-of-00001.gguf": b"GGUF" + bytes(5000)})
    hostile_hub.tree_next = "circle"
    run = bounded(
        lambda: list_remote(DownloadRequest(REPO_ID, ("*",)), endpoint=hostile_hub.endpoint), 30
    )
    assert isinstance(run.error, HubError), run.error
    assert "its pages go round in a circle (page 3 is one already read)" in run.error.message
    assert len([h for h in hostile_hub.hits if "/tree/" in h.path]) == 2


# ------------------------------------------------------------------ bytes


def test_a_set_whose_headers_together_pass_512_mib_is_refused_there(
    hostile_hub: HostileHub, tmp_path: Path
) -> None:
    """Six parts of 100 MiB headers each, every part under the part cap: the set stops
    at 512 MiB received, the bytes of every part counted."""
    part = long_header(tmp_path / "part.gguf", 50, 2 * MiB)  # about 100 MiB of header
    names = [f"Q/Huge-{i:05d}-of-00006.gguf" for i in range(1, 7)]
    repo = hostile_hub.add_repo(REPO_ID, dict.fromkeys(names, part), hash_content=False)
    listing = list_remote(DownloadRequest(REPO_ID, ("*.gguf",)), endpoint=hostile_hub.endpoint)

    run = bounded(
        lambda: read_remote_headers(
            REPO_ID, repo.sha, listing.files, tmp_path / "cache",
            endpoint=hostile_hub.endpoint, parallel=2,
        ),
        120,
    )  # fmt: skip

    assert isinstance(run.error, HeaderTooLong), run.error
    assert "Reading the headers of this set took more than 512.0 MiB" in run.error.message
    sent = header_bytes_sent(hostile_hub)
    assert 512 * MiB < sent < 540 * MiB, sent


def small_caps(monkeypatch: pytest.MonkeyPatch) -> None:
    """The header caps at a scale a test reads in a second: a part may send 4 MiB (and
    one step of 1 MiB more), a set 6 MiB."""
    monkeypatch.setattr(hub_headers, "MAX_PART_BYTES", 4 * MiB)
    monkeypatch.setattr(hub_headers, "MAX_STEP", 1 * MiB)
    monkeypatch.setattr(hub_headers, "MAX_SET_BYTES", 6 * MiB)


def test_a_part_sent_again_and_again_counts_every_attempt_against_its_cap(
    hostile_hub: HostileHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server cuts every answer at 3 MiB of a 3.5 MiB header: each attempt alone is
    under the part's cap, the attempts together are not."""
    small_caps(monkeypatch)
    part = long_header(tmp_path / "part.gguf", 4, 900 * 1024)  # decoded: read whole
    name = "Q/Cut-00001-of-00001.gguf"
    repo = hostile_hub.add_repo(REPO_ID, {name: part}, hash_content=False)
    hostile_hub.drop_after[name] = 3 * MiB
    listing = list_remote(DownloadRequest(REPO_ID, ("*.gguf",)), endpoint=hostile_hub.endpoint)

    run = bounded(
        lambda: read_remote_headers(
            REPO_ID, repo.sha, listing.files, tmp_path / "cache", endpoint=hostile_hub.endpoint
        ),
        60,
    )

    assert isinstance(run.error, HeaderTooLong), run.error
    assert f"The server sent more than 4.0 MiB of {name}" in run.error.message
    assert len(hostile_hub.content_hits(name)) == 2  # the third attempt is never made
    assert header_bytes_sent(hostile_hub) <= 6 * MiB


def test_a_part_read_in_more_requests_than_a_header_needs_is_refused(
    hostile_hub: HostileHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """80 strings a step apart, each jumped over: a window fetched for each, few bytes
    but a request each; the part stops at its request bound."""
    monkeypatch.setattr(hub_headers, "MAX_STEP", 1 * MiB)
    part = long_header(tmp_path / "part.gguf", 80, int(1.2 * MiB))
    name = "Q/Many-00001-of-00001.gguf"
    repo = hostile_hub.add_repo(REPO_ID, {name: part}, hash_content=False)
    listing = list_remote(DownloadRequest(REPO_ID, ("*.gguf",)), endpoint=hostile_hub.endpoint)

    run = bounded(
        lambda: read_remote_headers(
            REPO_ID, repo.sha, listing.files, tmp_path / "cache", endpoint=hostile_hub.endpoint
        ),
        60,
    )

    assert isinstance(run.error, HeaderTooLong), run.error
    assert f"Reading the header of {name} took more than 64 requests" in run.error.message
    assert len([h for h in hostile_hub.content_hits(name) if h.method == "GET"]) == 64


def test_a_set_sent_a_few_bytes_at_a_time_stops_at_its_time_bound(
    hostile_hub: HostileHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hub_headers, "SET_SECONDS", 1.0)
    part = long_header(tmp_path / "part.gguf", 4, 900 * 1024)  # 3.5 MiB of header
    name = "Q/Slow-00001-of-00001.gguf"
    repo = hostile_hub.add_repo(REPO_ID, {name: part}, hash_content=False)
    listing = list_remote(DownloadRequest(REPO_ID, ("*.gguf",)), endpoint=hostile_hub.endpoint)
    hostile_hub.throttle_bps = 1_000_000  # 3.5 s for the header

    run = bounded(
        lambda: read_remote_headers(
            REPO_ID, repo.sha, listing.files, tmp_path / "cache", endpoint=hostile_hub.endpoint
        ),
        30,
    )

    assert isinstance(run.error, HeaderTooLong), run.error
    assert "Reading the headers of this set took longer than 1 s" in run.error.message
    assert run.seconds < 2.5


def test_a_search_counts_every_header_byte_it_receives_and_stops_at_its_budget(
    hostile_hub: HostileHub,
    tmp_path: Path,
    hardware_file: Any,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """One repository of six sets, each refused at the set cap: the bytes each refused
    set cost are counted and said, and the search stops reading at its budget."""
    import k3desk.core.app.search as search

    small_caps(monkeypatch)
    monkeypatch.setattr(search, "SEARCH_HEADER_BUDGET", 16 * MiB)
    part = long_header(tmp_path / "part.gguf", 4, 900 * 1024)  # 3 parts: 10.5 MiB a set
    files = {f"S{k}/Huge-S{k}-{i:05d}-of-00003.gguf": part for k in range(1, 7) for i in (1, 2, 3)}
    hostile_hub.add_repo("evil/Kimi-K3-Huge-GGUF", files, hash_content=False)
    monkeypatch.setenv("HF_ENDPOINT", hostile_hub.endpoint)

    args = ["search", "--hardware", str(hardware_file(HW)), "--json"]
    assert bounded(lambda: cli_main(args, Services()), 120).value == 0
    data = json.loads(capsys.readouterr().out)

    rows = data["sets"]
    assert len(rows) == 6, data
    refused = [r for r in rows if "took more than 6.0 MiB" in (r["problem"] or "")]
    assert len(refused) == 2
    assert all(5 * MiB < r["header_bytes_read"] for r in refused)
    cut = [r for r in rows if "This search has read 16.0 MiB of headers, all it may" in
           (r["problem"] or "")]  # fmt: skip
    assert len(cut) == 1
    assert cut[0]["header_bytes_read"] > 0
    unread = [r for r in rows if (r["problem"] or "").startswith("headers not read: this search")]
    assert len(unread) == 3  # past the budget: not even asked for
    assert all(r["header_bytes_read"] == 0 for r in unread)
    read = sum(r["header_bytes_read"] for r in rows)
    sent = header_bytes_sent(hostile_hub)
    # what arrived is counted: the budget and at most a chunk per part in flight
    assert 16 * MiB < read < 17 * MiB, read
    # the server may have sent more into the socket than arrived before k3desk hung up:
    # at most the range each part in flight asked for (a step, 1 MiB), in 3 sets of 3
    assert read <= sent < 16 * MiB + 9 * MiB, (read, sent)

    assert cli_main(["search", "--hardware", str(hardware_file(HW))], Services()) == 0
    out = capsys.readouterr().out
    assert "Headers read this time: 0 B" not in out
    assert "Headers read this time: 1" in out  # 16-19 MiB, as counted above


# ------------------------------------------------------------------ text


def test_an_enormous_id_from_the_hub_is_shown_once_and_cut(
    hostile_hub: HostileHub,
    hardware_file: Any,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    big = "mallory/" + "K" * (5 * 1000 * 1000)
    hostile_hub.search_extra = [
        {"_id": "0" * 24, "id": big, "modelId": big, "sha": "0" * 40, "private": False,
         "gguf": {"architecture": "kimi-k3"}, "tags": ["gguf"]},
    ]  # fmt: skip
    monkeypatch.setenv("HF_ENDPOINT", hostile_hub.endpoint)

    assert cli_main(["search", "--hardware", str(hardware_file(HW))], Services()) == 0
    captured = capsys.readouterr()
    shown = captured.out + captured.err
    assert len(shown) < 20_000, len(shown)
    assert len([line for line in shown.splitlines() if "KKKK" in line]) == 1
    assert "[4,999," in shown
    assert "more characters]" in shown
    assert "not a repository id (it is 5,000,008 characters long); skipped" in shown
    assert not [h for h in hostile_hub.hits if "KKKK" in h.path]  # never asked about


def test_names_and_messages_from_the_hub_are_cut_where_the_app_shows_them() -> None:
    """A file name 1 MB long in a listing (a set's name) and a message 1 MB long (its
    problem): the wizard's cells and details show each cut, the cut said."""
    from k3desk.core.app.presenters.hub_sets import hub_set_cells, hub_set_details
    from k3desk.core.app.search import SetRow
    from k3desk.core.hub.discovery import RemoteSet, RepoHit
    from k3desk.core.hub.model import RemoteFile

    name = "Q/" + "N" * 1_000_000
    part = RemoteFile(name + ".gguf", 10, None, "0" * 40)
    remote = RemoteSet(REPO_ID, "0" * 40, name, 1, (part,))
    row = SetRow(RepoHit(REPO_ID, "0" * 40), remote, None, "none", "not judged", "",
                 problem="the server says: " + "x" * 1_000_000)  # fmt: skip
    texts = [t for c in hub_set_cells(row) for t in (c.text, c.tooltip or "")]
    texts += hub_set_details(row)
    assert sum(map(len, texts)) < 10_000
    assert any("[999,8" in t and "more characters]" in t for t in texts)


def test_a_search_lists_repositories_for_a_bounded_time_then_says_what_it_left(
    hostile_hub: HostileHub, hardware_file: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Hub that takes half a second for every answer: the search lists for its time,
    then names how many repositories it did not list."""
    import k3desk.core.app.search as search

    monkeypatch.setattr(search, "SEARCH_SECONDS", 0.5, raising=False)
    for owner in "abcd":
        hostile_hub.add_repo(f"{owner}/Kimi-K3-GGUF", {"a.gguf": b"GGUF" + bytes(5000)})
    hostile_hub.api_delay = 0.5
    req = SearchRequest(hardware_file=hardware_file(HW), endpoint=hostile_hub.endpoint,
                        token="", read_headers=False)  # fmt: skip
    run = bounded(lambda: search_hub(Services(), req), 30)
    assert run.error is None, run.error
    assert [r.repo for r in run.value.rows] == ["a/Kimi-K3-GGUF"]
    assert run.value.errors == (
        "the search took longer than 0.5 s; 3 repositories were not listed "
        "(search for one of them by name)",
    )
