"""A hostile Hub (or HF_ENDPOINT mirror): lying listings, wrong sizes and hashes,
endless bodies, dropped connections, endless 429s, redirects that fish for the token."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from k3desk.core.errors import HubError
from k3desk.core.hub.job import DownloadJob
from k3desk.core.hub.model import DownloadOptions, DownloadRequest
from k3desk.core.progress import CancelToken
from tests.conftest import REPO
from tests.hostile.conftest import (
    bounded,
    files_under,
    k3desk_env,
    no_traceback,
    run_k3desk,
    written_outside,
)
from tests.hostile.hostile_hub import HostileHub
from tests.hubserver import make_bytes

REPO_ID = "mallory/Kimi-K3-GGUF"
GOOD = {
    "IQ1_S/K3-IQ1_S-00001-of-00002.gguf": b"GGUF" + make_bytes(300_000, 1),
    "IQ1_S/K3-IQ1_S-00002-of-00002.gguf": b"GGUF" + make_bytes(200_000, 2),
}
MiB = 1024 * 1024


def options(hub: HostileHub, **kw: Any) -> DownloadOptions:
    base: dict[str, Any] = {
        "endpoint": hub.endpoint,
        "margin_bytes": 0,
        "backoff_base": 0.02,
        "backoff_max": 0.1,
        "progress_interval": 0.05,
        "use_hf_cache": False,
    }
    base.update(kw)
    return DownloadOptions(**base)


def download(
    hub: HostileHub, target: Path, patterns: tuple[str, ...] = ("*.gguf",), **kw: Any
) -> Any:
    cancel = CancelToken()
    job = DownloadJob(DownloadRequest(REPO_ID, patterns), target, options(hub, **kw), None, cancel)
    return bounded(job.run, 60, stop=cancel.cancel)


def landed(target: Path, files: dict[str, bytes]) -> bool:
    return all((target / p).is_file() and (target / p).read_bytes() == d for p, d in files.items())


# ------------------------------------------------------------------ names


@pytest.mark.parametrize("transport", ["http", "hub"])
def test_listed_names_that_leave_the_folder_are_refused_and_the_rest_lands(
    hostile_hub: HostileHub, tmp_path: Path, transport: str
) -> None:
    outside = tmp_path / "outside"
    evil = {
        "../../escaped-up.gguf": b"GGUF owned",
        str(outside / "absolute.gguf"): b"GGUF owned",
        "IQ1_S/../../../escaped-through.gguf": b"GGUF owned",
        "..\\escaped-backslash.gguf": b"GGUF owned",
        "IQ1_S/evil\x1b[2J.gguf": b"GGUF owned",
    }
    hostile_hub.add_repo(REPO_ID, {**GOOD, **evil})
    target = tmp_path / "a" / "models"
    before = files_under(tmp_path)

    run = download(hostile_hub, target, transport=transport)

    assert isinstance(run.error, HubError), run.error
    message = run.error.message
    assert f"{REPO_ID} at " in message
    assert "lists 5 files k3desk will not write" in message
    for name in evil:
        assert repr(name) in message
    assert "The other 2 files were downloaded and verified" in run.error.hint
    assert "hostile" in run.error.hint
    assert written_outside(tmp_path, before, target) == []
    assert not outside.exists()
    for name in evil:  # refused from the listing: never even asked for
        assert hostile_hub.bytes_sent(name) == 0
    assert landed(target, GOOD)
    assert sorted(p.name for p in target.rglob("*.gguf")) == sorted(Path(p).name for p in GOOD)

    # committed is kept: a second run fetches nothing again, and refuses again
    hostile_hub.reset_log()
    again = download(hostile_hub, target, transport=transport)
    assert isinstance(again.error, HubError)
    assert hostile_hub.bytes_sent() == 0
    assert landed(target, GOOD)


def test_a_link_planted_in_the_target_folder_does_not_lead_files_out(
    hostile_hub: HostileHub, tmp_path: Path
) -> None:
    hostile_hub.add_repo(REPO_ID, GOOD)
    target = tmp_path / "models"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    target.mkdir()
    (target / "IQ1_S").symlink_to(elsewhere)
    before = files_under(tmp_path)

    run = download(hostile_hub, target)

    assert isinstance(run.error, HubError)
    assert "a symbolic link on its way leads out of the folder" in run.error.message
    assert "Nothing was written." in run.error.hint
    assert list(elsewhere.iterdir()) == []
    assert written_outside(tmp_path, before, target / ".k3desk") == []


def test_a_catalog_pattern_does_not_carry_a_name_out_of_the_folder(
    hostile_hub: HostileHub, tmp_path: Path
) -> None:
    """``*`` in a tier's pattern matches '/' and '..' (fnmatch), so the pattern is no guard."""
    sneaky = "IQ1_S/K3-IQ1_S-/../../../../sneaky-of-00002.gguf"
    hostile_hub.add_repo(REPO_ID, {**GOOD, sneaky: b"GGUF owned"})
    target = tmp_path / "a" / "b" / "models"
    before = files_under(tmp_path)
    run = download(hostile_hub, target, ("IQ1_S/K3-IQ1_S-*-of-00002.gguf",))
    assert isinstance(run.error, HubError)
    assert repr(sneaky) in run.error.message
    assert written_outside(tmp_path, before, target) == []
    assert landed(target, GOOD)


# ------------------------------------------------------------------ sizes and hashes


def test_content_that_never_matches_its_hash_is_not_kept(
    hostile_hub: HostileHub, tmp_path: Path
) -> None:
    first, second = sorted(GOOD)
    hostile_hub.add_repo(REPO_ID, GOOD)
    hostile_hub.body[second] = b"GGUF" + make_bytes(len(GOOD[second]) - 4, 99)  # same size
    target = tmp_path / "models"

    run = download(hostile_hub, target, parallel=1)

    assert isinstance(run.error, HubError)
    assert f"{second} arrived twice with the wrong content" in run.error.message
    assert "The bad copy was deleted" in run.error.hint
    assert not (target / second).exists()
    assert not list(target.rglob("*.k3part"))
    assert landed(target, {first: GOOD[first]})  # verified before: kept
    state = json.loads((target / ".k3desk" / "state.json").read_text())
    assert state["files"][first]["verified_size"] == len(GOOD[first])
    assert state["files"][second]["verified_size"] is None


def test_a_body_longer_than_listed_is_a_protocol_violation_not_an_outage(
    hostile_hub: HostileHub, tmp_path: Path
) -> None:
    name = sorted(GOOD)[0]
    hostile_hub.add_repo(REPO_ID, GOOD)
    hostile_hub.body[name] = GOOD[name] + make_bytes(8 * MiB, 3)
    target = tmp_path / "models"

    run = download(hostile_hub, target, (name,))

    assert isinstance(run.error, HubError)
    assert f"broke the HTTP protocol while sending {name}" in run.error.message
    assert f"it sent more than the {len(GOOD[name]):,} bytes listed" in run.error.message
    assert "Cannot reach" not in run.error.message
    assert len(hostile_hub.content_hits(name)) == 1  # not asked for again and again
    kept = list(target.rglob("*.k3part"))
    assert kept  # what came before the excess is kept...
    assert all(p.stat().st_size <= len(GOOD[name]) for p in kept)  # ...and never past the size
    assert run.seconds < 10


def test_an_endless_listing_is_cut_off_in_bounded_memory(
    hostile_hub: HostileHub, tmp_path: Path
) -> None:
    hostile_hub.add_repo(REPO_ID, GOOD)
    hostile_hub.endless_api = r"/tree/"  # 300 MiB of JSON once decoded, 300 KiB on the wire
    target = tmp_path / "models"

    run = download(hostile_hub, target)

    assert isinstance(run.error, HubError)
    assert "broke the HTTP protocol" in run.error.message
    assert "is longer than 33,554,432 bytes" in run.error.message
    assert run.peak_rss_growth < 150 * MiB, run.peak_rss_growth
    assert not target.exists() or files_under(target) == set()


# ------------------------------------------------------------------ the connection


def test_a_server_that_drops_every_connection_is_given_up_on_in_bounded_time(
    hostile_hub: HostileHub, tmp_path: Path
) -> None:
    """It ignores Range and cuts the connection at the same byte every time: bytes move,
    the file never gets further, and that must not count as progress forever."""
    name = sorted(GOOD)[0]
    hostile_hub.add_repo(REPO_ID, GOOD)
    hostile_hub.drop_after[name] = 100_000
    target = tmp_path / "models"

    run = download(hostile_hub, target, (name,), max_retries=3)

    assert isinstance(run.error, HubError), run.error
    assert f"The transfer of {name} from {hostile_hub.endpoint} kept breaking off" in (
        run.error.message
    )
    assert "resumes when run again" in run.error.hint
    assert len(hostile_hub.content_hits(name)) == 4  # the first try and three retries
    assert run.seconds < 20


def test_endless_rate_limiting_ends_with_when_to_come_back(
    hostile_hub: HostileHub, tmp_path: Path
) -> None:
    name = sorted(GOOD)[0]
    hostile_hub.add_repo(REPO_ID, GOOD)
    hostile_hub.always[name] = (429, {"Retry-After": "1"})
    target = tmp_path / "models"

    run = download(hostile_hub, target, (name,), max_retries=2)

    assert isinstance(run.error, HubError)
    assert "rate-limiting this machine (429 Too Many Requests)" in run.error.message
    assert "run the same download again in 1 s" in run.error.hint
    assert 2.0 <= run.seconds < 15


# ------------------------------------------------------------------ the token

SECRET = "hf_HostileMirrorMustNeverSeeThis1234"


@pytest.mark.parametrize("transport", ["http", "hub"])
def test_a_cross_origin_redirect_of_a_download_gets_no_token(
    hostile_hub: HostileHub, tmp_path: Path, transport: str
) -> None:
    hostile_hub.valid_tokens.add(SECRET)
    hostile_hub.add_repo(REPO_ID, GOOD, private=True, allowed_tokens={SECRET})
    hostile_hub.get_redirect |= set(GOOD)  # HEAD answers here, GET sends it elsewhere
    target = tmp_path / "models"

    run = download(hostile_hub, target, token=SECRET, transport=transport)

    assert run.error is None, run.error
    assert landed(target, GOOD)
    cdn = [h for h in hostile_hub.hits if h.server == "cdn"]
    assert cdn, "the redirect was followed"
    assert all(h.token is None for h in cdn)
    assert all(h.token == SECRET for h in hostile_hub.hits if h.server == "hub")


def test_a_cross_origin_redirect_of_the_listing_gets_no_token(
    hostile_hub: HostileHub, tmp_path: Path
) -> None:
    hostile_hub.valid_tokens.add(SECRET)
    hostile_hub.add_repo(REPO_ID, GOOD, private=True, allowed_tokens={SECRET})
    hostile_hub.api_redirect = True

    run = download(hostile_hub, tmp_path / "models", token=SECRET)

    assert isinstance(run.error, HubError)
    cdn = [h for h in hostile_hub.hits if h.server == "cdn"]
    assert cdn, "the redirect was followed"
    assert all(h.token is None for h in cdn)


def test_a_next_page_on_another_origin_gets_no_token_and_nothing_is_downloaded(
    hostile_hub: HostileHub, tmp_path: Path
) -> None:
    """The listing's ``Link: rel="next"`` points at another server that lists files too."""
    hostile_hub.valid_tokens.add(SECRET)
    hostile_hub.add_repo(REPO_ID, GOOD, private=True, allowed_tokens={SECRET})
    hostile_hub.tree_next = "other-origin"
    target = tmp_path / "models"

    run = download(hostile_hub, target, token=SECRET)

    assert isinstance(run.error, HubError)
    assert "its next page is on another server (http://127.0.0.1:" in run.error.message
    assert "the HF token goes to the Hub's own address only" in run.error.message
    cdn = [h for h in hostile_hub.hits if h.server == "cdn"]
    assert all(h.token is None for h in cdn), "the token went to the other origin"
    assert cdn == [], "the other origin was not even asked"
    assert not any(h.file for h in hostile_hub.hits), "nothing listed was fetched"
    assert not target.exists() or files_under(target) == set()


def test_while_listing_no_request_carries_the_token_to_another_origin(
    hostile_hub: HostileHub,
) -> None:
    """The last guard, whoever builds the request (a pagination link followed by a newer
    huggingface_hub, a redirect handled by hand): in a listing's thread, a request with
    the token to any origin but the Hub's is refused before a byte is sent; the Hub's
    own origin still gets it, and requests without it go anywhere."""
    from huggingface_hub import get_session

    from k3desk.core.hub.session import TokenRefused, guard_session, token_only_to

    hostile_hub.add_repo(REPO_ID, GOOD)
    guard_session()
    auth = {"authorization": f"Bearer {SECRET}"}
    other = f"{hostile_hub.cdn_endpoint}/api/models/{REPO_ID}"
    with token_only_to(hostile_hub.endpoint):
        with pytest.raises(TokenRefused, match="would have carried the HF token"):
            get_session().get(other, headers=auth)
        get_session().get(other)  # no token: not the guard's business
        get_session().get(f"{hostile_hub.endpoint}/api/models/{REPO_ID}", headers=auth)
    deadline = time.monotonic() + 5  # the stand-in logs a request after answering it
    while len(hostile_hub.hits) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sorted((h.server, h.token) for h in hostile_hub.hits) == [
        ("cdn", None),
        ("hub", SECRET),
    ]


def test_an_endless_run_of_listing_pages_stops_with_a_message_in_bounded_time_and_memory(
    hostile_hub: HostileHub, tmp_path: Path
) -> None:
    """Every page names 50 new files and links to one more page, for ever."""
    hostile_hub.add_repo(REPO_ID, GOOD)
    hostile_hub.tree_next = "endless"

    cancel = CancelToken()
    job = DownloadJob(
        DownloadRequest(REPO_ID, ("*.gguf",)), tmp_path / "m", options(hostile_hub), None, cancel
    )
    run = bounded(job.run, 10, stop=cancel.cancel)

    assert isinstance(run.error, HubError)
    assert "it goes on past 50 pages" in run.error.message, run.error.message
    assert run.peak_rss_growth < 256 * MiB
    pages = [h for h in hostile_hub.hits if "/tree/" in h.path]
    assert len(pages) == 50


# ------------------------------------------------------------------ the CLI


def test_the_cli_says_what_was_refused_and_exits_1(hostile_hub: HostileHub, tmp_path: Path) -> None:
    hostile_hub.add_repo(REPO_ID, {**GOOD, "../../../escaped.gguf": b"GGUF owned"})
    target = tmp_path / "x" / "y" / "models"
    before = files_under(tmp_path)
    r = run_k3desk(
        "download",
        "--repo",
        REPO_ID,
        "--include",
        "*.gguf",
        "--to",
        target,
        "--margin",
        "0",
        env=k3desk_env(HF_ENDPOINT=hostile_hub.endpoint),
    )
    err = r.stderr.decode()
    assert r.returncode == 1, err
    no_traceback(r.stderr)
    out = r.stdout.decode()
    assert "warning: '../../../escaped.gguf' is listed by the Hub but was refused" in out
    assert "error: mallory/Kimi-K3-GGUF at " in err
    assert "all hashes verified" not in out
    assert written_outside(tmp_path, before, target) == []
    assert landed(target, GOOD)


def test_kill_9_mid_download_keeps_what_was_verified_and_writes_nowhere_else(
    hostile_hub: HostileHub, tmp_path: Path
) -> None:
    files = {f"IQ1_S/K3-IQ1_S-0000{i}-of-00004.gguf": make_bytes(1_500_000, i) for i in range(1, 5)}
    hostile_hub.add_repo(REPO_ID, files)
    hostile_hub.throttle_bps = 3_000_000
    target = tmp_path / "models"
    before = files_under(tmp_path)
    argv = ["download", "--repo", REPO_ID, "--include", "*.gguf", "--to", str(target)]
    argv += ["--margin", "0", "--json", "--parallel", "1"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "k3desk", *argv],
        env=k3desk_env(HF_ENDPOINT=hostile_hub.endpoint),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    verified: list[str] = []
    deadline = time.monotonic() + 60
    for line in proc.stdout:
        event = json.loads(line)
        if event["kind"] == "file_done":
            verified.append(event["path"])
        if len(verified) == 2 and event["kind"] == "file_progress" and event["done"] > 100_000:
            os.kill(proc.pid, signal.SIGKILL)
            break
        assert time.monotonic() < deadline
    proc.wait(10)
    proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    assert written_outside(tmp_path, before, target) == []

    hostile_hub.throttle_bps = 0
    hostile_hub.reset_log()
    r = run_k3desk(*argv, env=k3desk_env(HF_ENDPOINT=hostile_hub.endpoint))
    assert r.returncode == 0, r.stderr.decode()
    for path in verified:  # committed before the kill: not fetched again
        assert hostile_hub.bytes_sent(path) == 0, path
    assert landed(target, files)
    assert not list(target.rglob("*.k3part"))


# ------------------------------------------------------------------ records in the folder


def test_verify_does_not_follow_a_manifest_out_of_the_folder(tmp_path: Path) -> None:
    """A publisher's manifest.json (or one planted in the folder) names the files to hash."""
    import hashlib

    secret = tmp_path / "secret.key"
    secret.write_bytes(b"not yours to hash")
    folder = tmp_path / "models" / "k3"
    folder.mkdir(parents=True)
    (folder / "K3-00001-of-00001.gguf").write_bytes(GOOD[sorted(GOOD)[0]])
    entries = [
        {"name": "../../secret.key", "sha256": hashlib.sha256(secret.read_bytes()).hexdigest()},
        {"name": "*", "sha256": "0" * 64},
    ]
    (folder / "manifest.json").write_text(json.dumps({"parts": entries}))

    r = run_k3desk("verify", folder)

    out = r.stdout.decode()
    assert r.returncode == 1, out
    no_traceback(r.stderr)
    assert "BAD  ../../secret.key: not checked: it climbs out of its folder with '..'" in out
    assert "BAD  *: missing" in out  # a name, not a pattern that matches every file


def test_verify_does_not_follow_a_forged_download_record_out_of_the_folder(
    hostile_hub: HostileHub, tmp_path: Path
) -> None:
    hostile_hub.add_repo(REPO_ID, GOOD)
    target = tmp_path / "models"
    assert download(hostile_hub, target).error is None
    state_file = target / ".k3desk" / "state.json"
    state = json.loads(state_file.read_text())
    record = next(iter(state["files"].values()))
    state["files"]["../outside.gguf"] = record
    next(iter(state["downloads"].values()))["files"].append("../outside.gguf")
    state_file.write_text(json.dumps(state))
    (tmp_path / "outside.gguf").write_bytes(GOOD[sorted(GOOD)[0]])

    r = run_k3desk("verify", target)

    out = r.stdout.decode()
    assert r.returncode == 1, out
    assert "BAD  ../outside.gguf: not checked: it climbs out of its folder with '..'" in out
    assert out.count("BAD") == 1  # the real files are fine
