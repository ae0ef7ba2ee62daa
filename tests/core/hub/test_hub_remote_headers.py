"""Sets on the Hub judged from their real headers before download, against the Hub stand-in.

Repos are made of the 94-part twin of GrEarl's IQ1_S tier (real layout, holes for
data) and of the tiny Kimi-K3 set llama.cpp's format writer produced (3 parts and a
projector).  What a user notices: the verdict and figures equal those of the
downloaded files, the few bytes read, the token never leaving the Hub, a server that
ignores Range not making k3desk download a whole part, a repo that changes under the
read, hostile headers refused cheaply, and the catalog alone when offline.
"""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import time
from pathlib import Path
from typing import Any

import pytest

from k3desk.app import Services
from k3desk.cli import main as cli_main
from k3desk.core.app.remote_plan import RemotePlanRequest, plan_listed_set, plan_remote_set
from k3desk.core.app.search import SearchRequest, search_hub
from k3desk.core.app.shardplan import PlanRequest, plan_shard_set
from k3desk.core.errors import HubError, ValidationError
from k3desk.core.hub.discovery import list_repo_sets
from k3desk.core.hub.headers import MAX_PART_BYTES, HeaderTooLong
from k3desk.core.hub.job import DownloadJob
from k3desk.core.hub.model import DownloadOptions, DownloadRequest
from k3desk.devtools.tinyk3 import TinyModel
from tests.fixtures.twins import TwinFactory
from tests.hubserver import BIG_BLOCK, HubServer

GREARL = "GrEarl/Kimi-K3-GGUF-IQ1_S"
TINY = "tester/Kimi-K3-Tiny-GGUF"
HW = "1xH200-141GB"


def _tiny_files(model: TinyModel) -> dict[str, bytes]:
    files = {f"IQ1_S/{p.name}": p.read_bytes() for p in model.parts}
    assert model.mmproj is not None
    files[model.mmproj.name] = model.mmproj.read_bytes()
    files["README.md"] = b"# tiny\n"
    return files


def _plan_facts(planned: Any) -> dict[str, Any]:
    """Everything a plan says, but the path of its part 1 (which differs by folder)."""
    data = planned.plan.to_dict()
    args = list(data.pop("server_args"))
    args[args.index("-m") + 1] = Path(args[args.index("-m") + 1]).name
    return {
        **data,
        "server_args": args,
        "label": planned.view.label,
        "tier": planned.tier.id if planned.tier else None,
        "suspicious": planned.suspicious,
    }


@pytest.fixture
def grearl_hub(twin_factory: TwinFactory) -> Any:
    parts = twin_factory("grearl-iq1s")
    with HubServer(page_size=40) as hub:  # 94 parts: the tree comes in 3 pages
        hub.add_repo(GREARL, {p.name: p for p in parts}, hash_content=False)
        yield hub, parts


# ------------------------------------------------------------------ plans


def test_the_94_part_set_is_planned_from_its_headers_as_its_files_are(
    grearl_hub: Any, hardware_file: Any
) -> None:
    hub, parts = grearl_hub
    hw = hardware_file(HW)
    services = Services()
    remote = plan_remote_set(
        services, RemotePlanRequest(GREARL, hardware_file=hw, endpoint=hub.endpoint, token="")
    )
    local = plan_shard_set(services, PlanRequest(parts[0], hardware_file=hw))
    assert _plan_facts(remote.planned) == _plan_facts(local)
    assert remote.planned.tier is not None
    assert remote.planned.tier.id == "grearl-iq1s"
    assert remote.basis == "headers"
    assert len(remote.headers.parts) == 94
    # every part's header read, under 1 % of part 1 in all, by ranges only
    first = parts[0].stat().st_size
    assert hub.bytes_sent() == remote.headers.received < 0.01 * first
    assert {h.status for h in hub.content_hits()} == {206}
    # the twin has the real sizes, and holes for the data
    twin = remote.headers.local_paths
    assert [p.stat().st_size for p in twin] == [p.stat().st_size for p in parts]
    assert sum(p.stat().st_blocks * 512 for p in twin) < 64 * 1024 * 1024
    # asked again: the headers of that commit are not read again
    hub.reset_log()
    again = plan_remote_set(
        services, RemotePlanRequest(GREARL, hardware_file=hw, endpoint=hub.endpoint, token="")
    )
    assert again.headers.cached
    assert hub.bytes_sent() == 0
    assert _plan_facts(again.planned) == _plan_facts(local)


def test_a_remote_plan_equals_the_plan_of_the_downloaded_files(
    hub_server: HubServer, tiny_k3: TinyModel, hardware_file: Any, tmp_path: Path
) -> None:
    hub_server.add_repo(TINY, _tiny_files(tiny_k3))
    hw = hardware_file("no-gpu-laptop-32GB")
    services = Services()
    remote = plan_remote_set(
        services,
        RemotePlanRequest(TINY, hardware_file=hw, endpoint=hub_server.endpoint, token=""),
    )
    read = remote.headers.received
    assert read < sum(p.stat().st_size for p in tiny_k3.parts)
    assert remote.projectors == (tiny_k3.mmproj.name,) if tiny_k3.mmproj else True
    # now download the set for real and plan the files
    DownloadJob(
        DownloadRequest(TINY, (remote.remote.include,)),
        tmp_path / "dl",
        DownloadOptions(endpoint=hub_server.endpoint, margin_bytes=0, use_hf_cache=False),
    ).run()
    downloaded = tmp_path / "dl" / remote.remote.first_path
    assert downloaded.read_bytes() == tiny_k3.parts[0].read_bytes()
    local = plan_shard_set(services, PlanRequest(downloaded, hardware_file=hw))
    assert _plan_facts(remote.planned) == _plan_facts(local)
    assert remote.planned.layout.part_sizes == local.layout.part_sizes


def test_plan_remote_in_the_cli_says_it_rests_on_real_headers(
    hub_server: HubServer,
    tiny_k3: TinyModel,
    hardware_file: Any,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    hub_server.add_repo(TINY, _tiny_files(tiny_k3))
    monkeypatch.setenv("HF_ENDPOINT", hub_server.endpoint)
    hw = str(hardware_file(HW))
    args = ["plan", "--remote", f"{TINY}@main", "--hardware", hw, "--json"]
    assert cli_main(args, Services()) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["basis"] == "headers"
    assert data["remote"]["repo"] == TINY
    # the command is the one for the download, not for the twin
    assert "tester--Kimi-K3-Tiny-GGUF/IQ1_S/Tiny-K3-IQ1_S-00001-of-00003.gguf" in data["command"]
    assert data["remote"]["header_bytes_read"] > 0
    assert data["parts"] == 3
    # the header twin is a set `k3desk plan` takes as it is
    assert cli_main(["plan", data["remote"]["header_twin"], "--hardware", hw], Services()) == 0
    assert "Verdict:" in capsys.readouterr().out
    # bad input: a clear message, no traceback
    assert cli_main(["plan", "--remote", "not-a-repo"], Services()) != 0
    assert "is not a Hub repository" in capsys.readouterr().err
    assert cli_main(["plan", "--remote", TINY, "--include", "nothing*"], Services()) != 0
    assert "matches 'nothing*'" in capsys.readouterr().err


# ------------------------------------------------------------------ the wire


def _tcp_max(name: str) -> int:
    """The largest socket buffer the kernel grows to (net.ipv4.tcp_rmem / tcp_wmem)."""
    try:
        return int(Path(f"/proc/sys/net/ipv4/{name}").read_text().split()[2])
    except (OSError, IndexError, ValueError):
        return 64 * 1024 * 1024  # no such setting here: a generous bound


def test_a_server_that_ignores_range_is_read_only_as_far_as_the_header(
    grearl_hub: Any, hardware_file: Any
) -> None:
    hub, parts = grearl_hub
    hub.ranges = False  # 200 and the whole 6 GB part to every ranged request
    remote = plan_remote_set(
        Services(),
        RemotePlanRequest(GREARL, hardware_file=hardware_file(HW), endpoint=hub.endpoint, token=""),
    )
    assert any(p.ranges_ignored for p in remote.headers.parts)
    assert {h.status for h in hub.content_hits()} == {200}
    # k3desk dropped each stream after the header: the server sent a sliver of the set
    assert remote.headers.received < 0.01 * parts[0].stat().st_size
    # what the server pushed before each drop is what k3desk read of that part plus what
    # the loopback socket buffers can hold (the kernel's own limits: loopback receive
    # buffers grow to tcp_rmem's maximum, 32 MiB on some machines) plus the block the
    # stand-in was sending: no part came whole (a 6 GB part would have without the drop)
    read = {p.path: p for p in remote.headers.parts}
    buffers = _tcp_max("tcp_rmem") + _tcp_max("tcp_wmem") + BIG_BLOCK
    for h in hub.content_hits():
        assert h.sent <= read[h.file].received + buffers
        assert h.sent < read[h.file].size // 10
    assert remote.planned.tier is not None
    assert remote.planned.tier.id == "grearl-iq1s"


def test_a_redirect_to_the_cdn_carries_no_token(tiny_k3: TinyModel, hardware_file: Any) -> None:
    with HubServer(cdn=True) as hub:
        hub.valid_tokens.add("hf_member")
        hub.add_repo(TINY, _tiny_files(tiny_k3), gated=True, allowed_tokens={"hf_member"})
        req = RemotePlanRequest(TINY, hardware_file=hardware_file(HW), endpoint=hub.endpoint)
        with pytest.raises(HubError, match="gated"):
            plan_remote_set(Services(), RemotePlanRequest(**{**req.__dict__, "token": ""}))
        hub.reset_log()
        remote = plan_remote_set(
            Services(), RemotePlanRequest(**{**req.__dict__, "token": "hf_member"})
        )
        cdn = [h for h in hub.hits if h.server == "cdn"]
        assert cdn
        assert all(h.status == 206 and not h.authorized for h in cdn)
        # (the refused anonymous attempt's 401 may be logged late: only answers count)
        assert all(h.authorized for h in hub.hits if h.server == "hub" and h.status < 400)
        assert len(remote.headers.parts) == 3


def test_a_repo_that_changes_after_its_listing_is_read_at_the_listed_commit(
    hub_server: HubServer, tiny_k3: TinyModel, hardware_file: Any, tmp_path: Path
) -> None:
    from k3desk.devtools.tinyk3 import write_tiny_k3

    hub_server.add_repo(TINY, _tiny_files(tiny_k3))
    listed = list_repo_sets(TINY, endpoint=hub_server.endpoint)
    # a new commit: the set re-split into 2 parts
    two = write_tiny_k3(tmp_path / "two", shards=2, mmproj=True)
    newer = hub_server.add_repo(TINY, _tiny_files(two))
    assert newer.sha != listed.revision
    remote = plan_listed_set(
        Services(),
        RemotePlanRequest(
            TINY, hardware_file=hardware_file(HW), endpoint=hub_server.endpoint, token=""
        ),
        listed,
        listed.sets[0],
    )
    assert remote.headers.revision == listed.revision
    assert len(remote.planned.layout.parts) == 3  # the listed set, not a mix
    assert all(listed.revision in h.path for h in hub_server.content_hits())


# ------------------------------------------------------------------ hostile headers


def _kv_string_ref(key: str, length: int) -> bytes:
    k = key.encode()
    return struct.pack("<Q", len(k)) + k + struct.pack("<IQ", 8, length)


def test_hostile_headers_are_refused_within_the_bounds(
    hub_server: HubServer, hardware_file: Any, tmp_path: Path
) -> None:
    # three 60 MiB strings, then a key: the parser would have to read at byte 180 MiB,
    # past the cap, so it stops before a byte of them is fetched
    big = tmp_path / "big-00001-of-00001.gguf"
    keys = [f"general.k{i}" for i in range(3)]
    with big.open("wb") as f:
        f.write(b"GGUF" + struct.pack("<IQQ", 3, 0, len(keys) + 1))
        pos = 24
        for k in keys:
            entry = _kv_string_ref(k, 60 * 1024 * 1024)
            f.seek(pos)
            f.write(entry)
            pos += len(entry) + 60 * 1024 * 1024
        f.seek(pos)
        f.write(_kv_string_ref("general.architecture", 7) + b"kimi-k3")
        f.truncate(4 * 1024**3)
    hub_server.add_repo("evil/Kimi-K3-Long-GGUF", {big.name: big}, hash_content=False)
    hub_server.add_repo(
        "evil/Kimi-K3-Page-GGUF",
        {"page-00001-of-00001.gguf": b"<html>" + b"x" * 200_000},
    )
    req = RemotePlanRequest("", hardware_file=hardware_file(HW), endpoint=hub_server.endpoint,
                            token="")  # fmt: skip
    with pytest.raises(HeaderTooLong) as long_:
        plan_remote_set(
            Services(), RemotePlanRequest(**{**req.__dict__, "repo": "evil/Kimi-K3-Long-GGUF"})
        )
    assert "k3desk reads no more of it before a download" in long_.value.message
    assert hub_server.bytes_sent() < 4 * 1024 * 1024 < MAX_PART_BYTES
    with pytest.raises(ValidationError, match="not a GGUF file"):
        plan_remote_set(
            Services(), RemotePlanRequest(**{**req.__dict__, "repo": "evil/Kimi-K3-Page-GGUF"})
        )


# ------------------------------------------------------------------ search


def test_search_lists_the_hubs_k3_sets_with_a_verdict_each(
    grearl_hub: Any,
    tiny_k3: TinyModel,
    hardware_file: Any,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    hub, _ = grearl_hub
    hub.add_repo(TINY, _tiny_files(tiny_k3))
    hub.add_repo("other/Llama-9B-GGUF-Kimi-K3-style", {"x.gguf": b"GGUF" + b"\0" * 2000},
                 gguf={"architecture": "llama"})  # fmt: skip
    hub.add_repo("other/Kimi-K3-safetensors", {"model.safetensors": b"\0" * 2000}, tags=())
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
    assert cli_main(["search", "--hardware", str(hardware_file(HW)), "--json"], Services()) == 0
    data = json.loads(capsys.readouterr().out)
    assert not data["offline"]
    sets = {(s["repo"], s["set"]): s for s in data["sets"]}
    assert set(sets) == {(GREARL, "Kimi-K3-IQ1_S"), (TINY, "IQ1_S/Tiny-K3-IQ1_S")}
    grearl = sets[(GREARL, "Kimi-K3-IQ1_S")]
    assert grearl["basis"] == "headers"
    assert grearl["tier"] == "grearl-iq1s"
    assert grearl["parts"] == 94
    assert grearl["verdict"]
    assert grearl["quality"]
    tiny = sets[(TINY, "IQ1_S/Tiny-K3-IQ1_S")]
    assert tiny["basis"] == "headers"
    assert tiny["verdict"] == "gpu"
    assert tiny["projectors"] == [tiny_k3.mmproj.name] if tiny_k3.mmproj else True
    # the text table, with the catalog's estimate when no header is read
    assert cli_main(["search", "--hardware", str(hardware_file(HW)), "--no-headers"],
                    Services()) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "catalog estimate" in out
    assert "not judged" in out
    assert "grearl-iq1s" in out


def test_offline_or_unreachable_the_catalog_alone_is_shown_and_says_so(
    hardware_file: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Said at once: a connection never made (nothing listening, a name that does not
    resolve, as with no network) is not asked again for seconds on end."""
    with HubServer() as hub:
        gone = hub.endpoint  # closed when the block ends: nothing listens there
    started = time.monotonic()
    with contextlib.suppress(OSError):
        socket.getaddrinfo("no-such-hub.invalid", 80)  # .invalid never resolves
    resolving = time.monotonic() - started  # however long this machine's resolver takes
    for endpoint in (gone, "http://no-such-hub.invalid"):
        started = time.monotonic()
        result = search_hub(
            Services(), SearchRequest(hardware_file=hardware_file(HW), endpoint=endpoint, token="")
        )
        assert time.monotonic() - started < 5 + resolving  # five tries would take ~15 s
        assert result.offline
        assert result.status.startswith("catalog only (offline)")
        assert len(result.catalog.rows) >= 10
        assert not result.rows
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert cli_main(["search", "--hardware", str(hardware_file(HW))], Services()) == 0
    out = capsys.readouterr().out
    assert out.startswith("Catalog only (offline): HF_HUB_OFFLINE is set")
    assert "grearl-iq1s" in out


def test_llama_fit_params_judges_the_header_twin_as_it_judges_the_files(
    grearl_hub: Any,
    llama_server: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    hub, parts = grearl_hub
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
    assert cli_main(["plan", "--remote", GREARL, "--fit-params", "--json"], Services()) == 0
    remote = json.loads(capsys.readouterr().out)
    assert cli_main(["plan", str(parts[0]), "--fit-params", "--json"], Services()) == 0
    local = json.loads(capsys.readouterr().out)
    # the engine's own figures for this machine: the same for the twin as for the files
    assert remote["engine_memory_mib"] == local["engine_memory_mib"]
    host = next(d for d in remote["engine_memory_mib"] if d["device"] == "Host")
    assert host["model"] > 0
    assert (
        remote["command"].split(" -m ")[1].split()[1:]
        == local["command"].split(" -m ")[1].split()[1:]
    )
    # with a hardware file the engine would measure another machine: refused, clearly
    args = ["plan", "--remote", GREARL, "--fit-params", "--hardware", "x.json"]
    assert cli_main(args, Services()) != 0
    assert "does not go with --hardware" in capsys.readouterr().err


def test_a_search_reads_headers_up_to_its_budget_then_says_how_to_read_more(
    hub_server: HubServer,
    tiny_k3: TinyModel,
    hardware_file: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import k3desk.core.app.search as search

    hw = hardware_file(HW)
    hub_server.add_repo("a/Kimi-K3-Tiny-GGUF", _tiny_files(tiny_k3))
    one = plan_remote_set(  # what one set's headers cost (then cached: a's cost nothing)
        Services(), RemotePlanRequest("a/Kimi-K3-Tiny-GGUF", hardware_file=hw,
                                      endpoint=hub_server.endpoint, token="")
    ).headers.received  # fmt: skip
    for name in "bcd":
        hub_server.add_repo(f"{name}/Kimi-K3-Tiny-GGUF", _tiny_files(tiny_k3))
    # the budget holds one set and a half: b is read, c is cut off, d is not asked for
    monkeypatch.setattr(search, "SEARCH_HEADER_BUDGET", one + one // 2)
    result = search_hub(
        Services(), SearchRequest(hardware_file=hw, endpoint=hub_server.endpoint, token="")
    )
    cached, first, cut, unread = result.rows
    assert cached.basis == first.basis == "headers"
    assert cached.header_bytes == 0
    assert first.header_bytes == one
    assert cut.basis == "none"
    assert cut.header_bytes > 0
    # past the budget by at most what was in flight: a chunk for each of c's 3 parts
    assert first.header_bytes + cut.header_bytes <= one + one // 2 + 3 * 64 * 1024
    assert "headers not read in full: This search has read" in cut.problem
    assert unread.header_bytes == 0
    assert "headers not read: this search read" in unread.problem
    for row in (cut, unread):
        assert "k3desk plan --remote" in row.problem


def test_a_hiccup_is_retried_and_a_part_that_keeps_failing_is_named(
    hub_server: HubServer, tiny_k3: TinyModel, hardware_file: Any
) -> None:
    hub_server.add_repo(TINY, _tiny_files(tiny_k3))
    part2 = f"IQ1_S/{tiny_k3.parts[1].name}"
    req = RemotePlanRequest(
        TINY, hardware_file=hardware_file(HW), endpoint=hub_server.endpoint, token=""
    )
    for _ in range(3):
        hub_server.fail_next(part2, 503)
    with pytest.raises(HubError) as failed:
        plan_remote_set(Services(), req)
    assert "503" in str(failed.value)
    hub_server.fail_next(part2, 503)  # once: retried
    assert len(plan_remote_set(Services(), req).headers.parts) == 3


def test_the_search_asks_the_hub_for_gguf_and_the_base_model_and_follows_its_pages() -> None:
    from k3desk.core.hub.discovery import search_repos

    with HubServer(page_size=2) as hub:  # every search answer comes in pages
        base = ("gguf", "base_model:moonshotai/Kimi-K3")
        for i in range(5):
            hub.add_repo(f"q{i}/Kimi-K3-GGUF", {"a.gguf": b"GGUF" + bytes(2000)}, tags=base)
        hub.add_repo("other/Kimi-K3-GGUF", {"a.gguf": b"GGUF" + bytes(2000)})
        hub.add_repo("x/Kimi-K3-Llama-GGUF", {"a.gguf": b"GGUF"}, gguf={"architecture": "llama"})
        found = [h.repo for h in search_repos(endpoint=hub.endpoint, token="")]
        assert found == ["other/Kimi-K3-GGUF", *(f"q{i}/Kimi-K3-GGUF" for i in range(5))]
        based = search_repos(base_model="moonshotai/Kimi-K3", endpoint=hub.endpoint, token="")
        assert [h.repo for h in based] == [f"q{i}/Kimi-K3-GGUF" for i in range(5)]
        assert all(len(h.revision) == 40 for h in based)
        searches = [h for h in hub.hits if h.path.startswith("/api/models?")]
        assert all("filter=gguf" in h.path for h in searches)


def test_a_commit_planned_before_is_planned_again_with_the_hub_out_of_reach(
    tiny_k3: TinyModel, hardware_file: Any
) -> None:
    hw = hardware_file(HW)
    with HubServer() as hub:
        hub.add_repo(TINY, _tiny_files(tiny_k3))
        online = plan_remote_set(
            Services(), RemotePlanRequest(TINY, hardware_file=hw, endpoint=hub.endpoint, token="")
        )
        gone = hub.endpoint
    sha = online.headers.revision
    # by its commit: the headers read before are enough
    offline = plan_remote_set(
        Services(), RemotePlanRequest(TINY, sha, hardware_file=hw, endpoint=gone, token="")
    )
    assert offline.headers.cached
    assert _plan_facts(offline.planned) == _plan_facts(online.planned)
    # by a branch name: which commit it is now cannot be known, so it is not guessed
    with pytest.raises(HubError):
        plan_remote_set(
            Services(), RemotePlanRequest(TINY, "main", hardware_file=hw, endpoint=gone, token="")
        )
