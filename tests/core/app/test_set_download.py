"""A set is its files: a set found on the Hub downloads with its vision projector."""

from __future__ import annotations

import hashlib
import shlex
from pathlib import Path

import pytest

from k3desk.app import Services
from k3desk.cli import main as cli_main
from k3desk.core.app.downloads import DownloadJob, DownloadOptions, DownloadRequest
from k3desk.core.app.hub_choice import download_request_for
from k3desk.core.app.search import SearchRequest, SetRow, search_hub
from tests.fixtures.hub import MMPROJ, SHARD_PATTERN, TIER_REPO, shard_name, tier_files
from tests.hubserver import HubServer, make_bytes

# a 1x1 PNG: a picture the chat would send
PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360000002000100e221bc330000000049454e44ae426082"
)
BF16 = "mmproj-Tiny-K3-BF16.gguf"  # the same projector in another precision, at the root


def _found(hub: HubServer, name: str) -> SetRow:
    result = search_hub(Services(), SearchRequest(endpoint=hub.endpoint, read_headers=False))
    assert not result.offline, result.offline_reason
    return next(r for r in result.rows if r.repo == TIER_REPO and r.remote.name == name)


def _download(hub: HubServer, row: SetRow, target: Path) -> None:
    options = DownloadOptions(endpoint=hub.endpoint, margin_bytes=0, direct_io=False)
    DownloadJob(download_request_for(row), target, options).run()


def _same(path: Path, data: bytes) -> bool:
    return hashlib.sha256(path.read_bytes()).digest() == hashlib.sha256(data).digest()


def test_a_set_found_on_the_hub_downloads_with_its_projector(
    hub_server: HubServer, tmp_path: Path
) -> None:
    files = tier_files()
    files[BF16] = b"GGUF" + make_bytes(300_000, 99)
    hub_server.add_repo(TIER_REPO, files)
    row = _found(hub_server, "IQ1_S/Tiny-K3-IQ1_S")
    _download(hub_server, row, tmp_path)
    for i in range(1, 10):
        assert _same(tmp_path / shard_name(i), files[shard_name(i)])
    assert _same(tmp_path / MMPROJ, files[MMPROJ])  # F16: every engine build reads it
    assert not (tmp_path / BF16).exists()  # one projector, not every precision of it
    assert not list(tmp_path.rglob("*XXS*"))  # nor the look-alike quant


def test_a_projector_beside_the_set_is_the_one_that_comes_with_it(
    hub_server: HubServer, tmp_path: Path
) -> None:
    """A repository with a projector in each quant's folder and one at the root: the set
    takes the one in its folder."""
    files = tier_files()
    own = "IQ1_S/mmproj-Tiny-K3-IQ1_S-F16.gguf"
    files[own] = b"GGUF" + make_bytes(200_000, 5)
    files["Q2/mmproj-Tiny-K3-Q2-F16.gguf"] = b"GGUF" + make_bytes(200_000, 6)
    hub_server.add_repo(TIER_REPO, files)
    _download(hub_server, _found(hub_server, "IQ1_S/Tiny-K3-IQ1_S"), tmp_path)
    assert _same(tmp_path / own, files[own])
    assert not (tmp_path / MMPROJ).exists()
    assert not (tmp_path / "Q2").exists()


def test_the_cli_brings_the_projector_and_chat_names_the_command_for_one_left_out(
    hub_server: HubServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    files = tier_files()
    hub_server.add_repo(TIER_REPO, files)
    monkeypatch.setenv("HF_ENDPOINT", hub_server.endpoint)
    pattern = f"IQ1_S/{SHARD_PATTERN}"
    common = ["--repo", TIER_REPO, "--include", pattern, "--margin", "0"]
    # `k3desk download` of a set: its projector comes with it, as in the app
    with_it = tmp_path / "with"
    assert cli_main(["download", *common, "--to", str(with_it)], Services()) == 0
    assert _same(with_it / MMPROJ, files[MMPROJ])
    assert "projector comes with it" in capsys.readouterr().out
    # a set downloaded without it: the chat refuses the image and says the exact command
    bare = tmp_path / "bare"
    assert cli_main(["download", *common, "--no-projector", "--to", str(bare)], Services()) == 0
    assert not (bare / MMPROJ).exists()
    picture = tmp_path / "cat.png"
    picture.write_bytes(PNG)
    shard = bare / shard_name(1)
    capsys.readouterr()
    assert cli_main(["chat", str(shard), "What is this?", "--image", str(picture)], Services())
    said = capsys.readouterr().err
    command = f"k3desk download --projector-for '{shard}'"
    assert command in said
    # the command does what it says: the projector lands beside the set, nothing else
    hub_server.reset_log()
    args = shlex.split(command)[1:]
    assert cli_main([*args, "--margin", "0"], Services()) == 0
    assert _same(bare / MMPROJ, files[MMPROJ])
    assert {h.file for h in hub_server.content_hits()} == {MMPROJ}


def test_a_tier_whose_card_names_no_projector_takes_the_repositorys(
    hub_server: HubServer, tmp_path: Path
) -> None:
    """unsloth's UD-Q8_K_XL reads images through its fork, but its card does not name the
    projector file: the download brings the one the repository has for the set."""
    tier = Services().catalog.get("unsloth-ud-q8kxl")
    assert tier.vision != "none"
    assert not tier.mmproj
    files = {name: b"GGUF" + make_bytes(2_000, i) for i, name in enumerate(tier.shard_names())}
    folder = tier.first_shard.rsplit("/", 1)[0] + "/" if "/" in tier.first_shard else ""
    files[f"{folder}mmproj-F16.gguf"] = b"GGUF" + make_bytes(3_000, 77)
    files["README.md"] = b"# card\n"
    hub_server.add_repo(tier.repo, files)
    options = DownloadOptions(endpoint=hub_server.endpoint, margin_bytes=0, direct_io=False)
    DownloadJob(DownloadRequest.from_tier(tier), tmp_path, options).run()
    assert _same(tmp_path / f"{folder}mmproj-F16.gguf", files[f"{folder}mmproj-F16.gguf"])
    assert _same(tmp_path / tier.first_shard, files[tier.first_shard])
    assert not (tmp_path / "README.md").exists()
