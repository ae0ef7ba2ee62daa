"""The download use-case both shells call: the job for a request, with the Hub token found
for it, the Hub HF_ENDPOINT names (or the one asked for), and the models folder's folder
named after the tier (Qt-free, against the suite's Hub stand-in)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from k3desk.app import Services
from k3desk.core.app.downloads import (
    DownloadEvent,
    DownloadOptions,
    DownloadRequest,
    Preflight,
    TokenStore,
    download_folder,
    start_download,
)
from k3desk.core.app.values import K3Error
from tests.fixtures.hub import TierRepo


def test_a_tier_lands_in_its_folder_with_the_token_and_hub_of_the_environment(
    tier_repo: TierRepo, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub = tier_repo.hub
    tier_repo.repo.gated = True  # the files need a token the Hub accepts
    tier_repo.repo.allowed_tokens = {"hf_good"}
    hub.valid_tokens.add("hf_good")
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
    services = Services()
    request = tier_repo.request()
    events: list[DownloadEvent] = []

    anonymous = start_download(services, request, tokens=TokenStore(), on_event=events.append)
    assert anonymous.options.token is None
    assert anonymous.options.endpoint == hub.endpoint
    with pytest.raises(K3Error):  # gated: refused without a token, in words
        anonymous.run()

    monkeypatch.setenv("HF_TOKEN", "hf_good")
    job = start_download(services, request, tokens=TokenStore(), on_event=events.append)
    assert job.options.token == "hf_good"
    assert job.target == services.paths.models_dir / "tiny-iq1s"
    summary = job.run()
    assert summary.files == len(tier_repo.wanted)
    for name, data in tier_repo.wanted.items():
        got = job.target / name
        assert hashlib.sha256(got.read_bytes()).digest() == hashlib.sha256(data).digest()
    assert any(isinstance(e, Preflight) for e in events)  # the shell hears the job


def test_the_hub_and_folder_asked_for_win(
    tier_repo: TierRepo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing there
    target = tmp_path / "elsewhere"
    options = DownloadOptions(endpoint=tier_repo.hub.endpoint, parallel=2)
    job = start_download(
        Services(), tier_repo.request(), target, tokens=TokenStore(), options=options
    )
    assert (job.options.endpoint, job.options.parallel, job.target) == (
        tier_repo.hub.endpoint,
        2,
        target,
    )
    assert job.run().files == len(tier_repo.wanted)
    assert sorted(p.name for p in target.rglob("*.gguf")) == sorted(
        Path(n).name for n in tier_repo.wanted if n.endswith(".gguf")
    )


def test_the_folder_of_a_repo_without_a_tier() -> None:
    repo = DownloadRequest(repo="someone/Some-GGUF", allow_patterns=("*.gguf",), label="")
    assert download_folder(repo) == "someone--Some-GGUF"
    same = DownloadRequest(
        repo="someone/Some-GGUF", allow_patterns=("*.gguf",), label="someone/Some-GGUF"
    )
    assert download_folder(same) == "someone--Some-GGUF"
    job = start_download(Services(), repo, tokens=TokenStore())
    assert job.target == Services().paths.models_dir / "someone--Some-GGUF"
