"""`k3desk download` and `k3desk verify` as a user runs them, against the Hub stand-in."""

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

from k3desk.app import Services
from k3desk.cli import main as cli_main
from tests.conftest import REPO
from tests.fixtures.hub import (
    SHARD_PATTERN,
    TEMPLATE,
    TIER_REPO,
    TierRepo,
    shard_name,
)
from tests.hubserver import HubServer

RESUME_CHUNK = 256 * 1024
IN_FLIGHT = 64 * 1024  # the stand-in writes 64 KiB at a time: what a kill can catch mid-air


def _env(hub: HubServer, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {"HF_ENDPOINT": hub.endpoint, "HF_HUB_DISABLE_TELEMETRY": "1", "PYTHONUNBUFFERED": "1"}
    )
    env.pop("HF_TOKEN", None)
    env.update(extra)
    return env


def _args(target: Path, *more: str) -> list[str]:
    return [
        "download",
        "--repo",
        TIER_REPO,
        "--include",
        f"IQ1_S/{SHARD_PATTERN}",
        "--include",
        TEMPLATE,
        "--to",
        str(target),
        "--margin",
        "0",
        *more,
    ]


def _k3desk(args: list[str], env: dict[str, str], **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "k3desk", *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        **kw,
    )


def test_kill_9_mid_file_then_restart_resumes_refetching_at_most_one_chunk_per_shard(
    tier_repo: TierRepo, tmp_path: Path
) -> None:
    hub = tier_repo.hub
    hub.throttle_bps = 1_000_000  # per connection: the kill lands mid-file
    target = tmp_path / "models"
    argv = _args(target, "--json", "--parallel", "3", "--resume-chunk", "256K")
    proc = subprocess.Popen(
        [sys.executable, "-m", "k3desk", *argv],
        env=_env(hub),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + 60
    killed_at = 0
    for line in proc.stdout:
        event = json.loads(line)
        if event["kind"] == "file_progress" and event["overall_done"] > 4_000_000:
            killed_at = event["overall_done"]
            os.kill(proc.pid, signal.SIGKILL)
            break
        assert time.monotonic() < deadline
    proc.wait(10)
    proc.stdout.close()
    assert proc.stderr is not None
    proc.stderr.close()
    assert killed_at, "the download finished before it could be killed"
    assert proc.returncode == -signal.SIGKILL
    partials = list(target.rglob("*.k3part"))
    assert partials, "a kill mid-file leaves partial files to resume from"
    assert not list(target.rglob("*.incomplete"))

    first_run = {p: hub.bytes_sent(p) for p in tier_repo.wanted}
    hub.throttle_bps = 0
    done = _k3desk(argv, _env(hub))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1])["kind"] == "done"

    wanted = {p: d for p, d in tier_repo.wanted.items() if p.startswith("IQ1_S/") or p == TEMPLATE}
    refetched = {p: hub.bytes_sent(p) - len(d) for p, d in wanted.items()}
    resumed = [p for p in wanted if any(h.range_start for h in hub.content_hits(p))]
    print(f"killed after {killed_at:,} bytes; first run per file: {first_run}")
    print(f"re-fetched per file: {refetched}; resumed with Range: {resumed}")
    assert resumed, "at least one file continued where it stopped"
    for p, extra in refetched.items():
        assert 0 <= extra <= RESUME_CHUNK + IN_FLIGHT, (p, extra)
    for p, data in wanted.items():
        assert (target / p).read_bytes() == data, p
    assert not list(target.rglob("*.k3part"))


def test_token_is_used_but_never_logged_stored_or_sent_to_the_cdn(
    tier_repo: TierRepo, tmp_path: Path, k3_home: Path
) -> None:
    secret = "hf_NeverLogThisTokenAnywhere0123456789"
    hub = tier_repo.hub
    hub.use_cdn = True  # LFS files are redirected cross-origin, as on the real Hub
    hub.valid_tokens.add(secret)
    hub.add_repo(TIER_REPO, tier_repo.files, private=True, allowed_tokens={secret})
    target = tmp_path / "models"

    anonymous = _k3desk(_args(target), _env(hub))
    assert anonymous.returncode == 1
    assert "not found" in anonymous.stderr
    assert "token" in anonymous.stderr

    run = _k3desk(_args(target, "--json"), _env(hub, HF_TOKEN=secret, HF_DEBUG="1"))
    assert run.returncode == 0, run.stderr
    assert secret not in run.stdout
    assert secret not in run.stderr
    for root in (target, k3_home):
        for p in root.rglob("*"):
            if p.is_file():
                assert secret.encode() not in p.read_bytes(), p
    hub_hits = [h for h in hub.hits if h.server == "hub"]
    cdn_hits = [h for h in hub.hits if h.server == "cdn"]
    assert cdn_hits, "LFS content came from the CDN"
    assert all(h.token == secret for h in hub_hits if h.token)
    assert not any(h.authorized for h in cdn_hits)


def test_cli_prints_preflight_progress_and_summary(
    tier_repo: TierRepo,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HF_ENDPOINT", tier_repo.hub.endpoint)
    assert cli_main(_args(tmp_path), Services()) == 0
    out = capsys.readouterr().out
    # 9 shards, the template, and the set's projector (it comes with the set)
    assert "Listed 11 files" in out
    assert "Preflight:" in out
    assert "11 to fetch" in out
    assert "downloaded, verified" in out
    assert "Done: 11 files" in out
    assert "all hashes verified" in out

    assert cli_main(_args(tmp_path, "--json"), Services()) == 0
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert events[0]["kind"] == "listing"
    assert events[-1]["kind"] == "done"
    assert events[-1]["summary"]["fetched_bytes"] == 0  # all verified already
    assert {e["source"] for e in events if e["kind"] == "file_done"} == {"state"}


def test_cli_gated_repo_error_is_a_message_not_a_traceback(
    tier_repo: TierRepo,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    hub = tier_repo.hub
    hub.add_repo(TIER_REPO, tier_repo.files, gated=True)
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
    assert cli_main(_args(tmp_path, "--json"), Services()) == 1
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    assert "gated" in captured.err
    assert f"{hub.endpoint}/{TIER_REPO}" in captured.err
    last = json.loads(captured.out.splitlines()[-1])
    assert last["kind"] == "error"
    assert "gated" in last["message"]


def test_a_catalog_tier_downloads_by_id_and_size_mismatch_is_reported(
    hub_server: HubServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tests.hubserver import make_bytes

    tier = Services().catalog.get("vcruz305-ud-iq1s")
    files = {
        f"Kimi-K3-UD-IQ1_S-{i:05d}-of-00009.gguf": b"GGUF" + make_bytes(20_000, i)
        for i in range(1, 10)
    }
    files["k3_chat_template.jinja"] = b"{{ messages }}"
    files["Kimi-K3-UD-Q2_K-00001-of-00012.gguf"] = b"GGUF" + make_bytes(20_000, 99)
    hub_server.add_repo(tier.repo, files)
    monkeypatch.setenv("HF_ENDPOINT", hub_server.endpoint)
    assert cli_main(["download", tier.id, "--to", str(tmp_path), "--margin", "0"], Services()) == 0
    out = capsys.readouterr().out
    assert "Done: 10 files" in out
    assert "the catalog says 307.5 GiB" in out  # the stand-in's shards are tiny
    assert not list(tmp_path.glob("*Q2_K*"))
    assert (tmp_path / tier.first_shard).is_file()


def test_each_message_is_printed_once(tier_repo: TierRepo, tmp_path: Path) -> None:
    env = _env(tier_repo.hub)
    nothing = _k3desk(
        ["download", "--repo", TIER_REPO, "--include", "nothing-*.gguf", "--to", str(tmp_path)],
        env,
    )
    assert nothing.returncode == 1
    assert "Traceback" not in nothing.stderr
    assert nothing.stderr.count("matches nothing-*.gguf") == 1, nothing.stderr
    assert "error: Nothing to download" in nothing.stderr
    assert not (tmp_path / ".k3desk").exists()

    # a disagreement with the catalog is a warning: shown once, not also as a raw log line
    from tests.hubserver import make_bytes

    tier = Services().catalog.get("vcruz305-ud-iq1s")
    files = {
        f"Kimi-K3-UD-IQ1_S-{i:05d}-of-00009.gguf": b"GGUF" + make_bytes(2_000, i)
        for i in range(1, 10)
    }
    tier_repo.hub.add_repo(tier.repo, files)
    r = _k3desk(["download", tier.id, "--to", str(tmp_path / "m"), "--margin", "0"], env)
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in (r.stdout + r.stderr).splitlines() if "catalog says 307.5 GiB" in ln]
    # as it happens, and in the summary at the end; never as a bare log line
    assert len(lines) == 2, lines
    assert lines[0].startswith("warning: vcruz305-ud-iq1s: the shards total")
    assert lines[1].startswith("  - vcruz305-ud-iq1s: the shards total")


def test_verify_finds_a_damaged_shard_and_download_repairs_only_it(
    tier_repo: TierRepo,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    hub = tier_repo.hub
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
    assert cli_main(_args(tmp_path), Services()) == 0
    capsys.readouterr()
    assert cli_main(["verify", str(tmp_path)], Services()) == 0
    assert "All files are intact" in capsys.readouterr().out

    bad = shard_name(7)
    with (tmp_path / bad).open("r+b") as f:
        f.seek(1234)
        b = f.read(1)
        f.seek(1234)
        f.write(bytes([b[0] ^ 0x80]))
    # a shard path verifies the download it belongs to
    assert cli_main(["verify", str(tmp_path / shard_name(1))], Services()) == 1
    out = capsys.readouterr().out
    assert f"BAD  {bad}: content differs" in out
    assert out.count("BAD") == 1

    hub.reset_log()
    assert cli_main(_args(tmp_path), Services()) == 0
    assert hub.bytes_sent() == hub.bytes_sent(bad) == len(tier_repo.files[bad])
    capsys.readouterr()
    assert cli_main(["verify", str(tmp_path), "--json"], Services()) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is True
    assert report["method"] == "state"
    assert len(report["files"]) == 11  # the projector came with the set


def test_verify_without_a_record_uses_the_manifest_or_the_gguf_structure(
    tier_repo: TierRepo,
    tmp_path: Path,
    tiny_k3: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import shutil

    from tests.fixtures.hub import MANIFEST

    # a folder filled by another tool, with the publisher's manifest.json
    folder = tmp_path / "copied"
    for p, data in tier_repo.wanted.items():
        (folder / p).parent.mkdir(parents=True, exist_ok=True)
        (folder / p).write_bytes(data)
    assert (folder / MANIFEST).is_file()
    assert cli_main(["verify", str(folder)], Services()) == 0
    out = capsys.readouterr().out
    assert "against the folder's manifest.json" in out
    assert "Checked 9 files" in out
    (folder / shard_name(2)).write_bytes(b"GGUF" + b"\0" * 10)
    assert cli_main(["verify", str(folder)], Services()) == 1
    assert f"BAD  {shard_name(2)}: wrong size" in capsys.readouterr().out

    # no record, no manifest: the GGUF structure is all that can be checked
    plain = tmp_path / "plain"
    plain.mkdir()
    for part in tiny_k3.parts:
        shutil.copy(part, plain / part.name)
    assert cli_main(["verify", str(plain)], Services()) == 0
    out = capsys.readouterr().out
    assert "by GGUF structure only" in out
    assert f"Checked {len(tiny_k3.parts)} files" in out
    assert "only the GGUF structure was checked" in out


def test_verify_of_a_tier_with_a_part_missing_names_the_tier_to_download(
    broken_twin: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    parts, _ = broken_twin("vcruz305-ud-iq1s", "missing-part", tmp_path / "tier")
    assert cli_main(["verify", str(parts[0].parent)], Services()) == 1
    err = capsys.readouterr().err
    assert "Part 00005-of-00009 of Kimi-K3-UD-IQ1_S is missing" in err
    assert "k3desk download vcruz305-ud-iq1s" in err


class _Terminal:
    """A text stream that says it is a terminal, so the progress bar is drawn."""

    def __init__(self) -> None:
        self.text = ""

    def write(self, s: str) -> int:
        self.text += s
        return len(s)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(
    ("eta", "shown"),
    [(None, "ETA --:--"), (0.4, "ETA < 1 s"), (0.0, "ETA < 1 s"), (65.2, "ETA 0:01:05")],
)
def test_the_progress_bar_never_shows_an_eta_of_zero_while_bytes_remain(
    eta: float | None, shown: str
) -> None:
    from k3desk.cli.download import TextOut
    from k3desk.core.hub.model import FileProgress

    bar, out = _Terminal(), _Terminal()
    text = TextOut(bar, out)  # type: ignore[arg-type]
    text.files_total = 9
    text.event(FileProgress("a.gguf", 900, 1000, 500.0, eta, 8_900, 9_000, 500.0, eta))
    line = bar.text.rsplit("\r\033[K", 1)[-1]
    assert shown in line
    assert "0:00:00" not in line
