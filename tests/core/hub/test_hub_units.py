"""Pattern matching, manifests, cross-checks, hashing, space checks and error texts."""

from __future__ import annotations

import errno
import hashlib
import json
import threading
from pathlib import Path

import pytest

from k3desk.core.errors import HubError
from k3desk.core.hub.errors import RateLimited, Where, disk_error, hub_error
from k3desk.core.hub.hashing import StreamHasher, hash_file
from k3desk.core.hub.listing import crosscheck, manifest_check, parse_manifest, select
from k3desk.core.hub.model import DownloadRequest, Listing, RemoteFile
from k3desk.core.hub.preflight import check_space
from tests.hubserver import make_bytes

SIXBLOCK = [
    "Kimi-K3-IQ1_S-XS-00001-of-00034.gguf",
    "Kimi-K3-IQ1_S-XS-00034-of-00034.gguf",
    "Kimi-K3-IQ1_S-XXS-832e-00001-of-00011.gguf",
    "Kimi-K3-mmproj-BF16.gguf",
    "README.md",
]


def test_patterns_match_exactly_like_hf_download() -> None:
    assert select(SIXBLOCK, ["*IQ1_S-XS-*"]) == SIXBLOCK[:2]
    # a looser pattern picks the sibling tier's shards too
    assert len(select(SIXBLOCK, ["*IQ1_S-*"])) == 3
    # case-sensitive, and '*' crosses folders
    assert select(["Q8_0/Kimi-K3-Q8_0-00001-of-00066.gguf"], ["*Kimi-K3-Q8_0-*"]) == [
        "Q8_0/Kimi-K3-Q8_0-00001-of-00066.gguf"
    ]
    assert select(SIXBLOCK, ["*iq1_s-xs-*"]) == []


def _listing(files: list[RemoteFile]) -> Listing:
    return Listing("o/r", "a" * 40, "main", tuple(files), "https://hub.example")


def test_crosscheck_reports_shard_count_size_and_missing_files() -> None:
    shards = [RemoteFile(f"K-{i:05d}-of-00003.gguf", 1000, "0" * 64, "1" * 40) for i in (1, 2)]
    req = DownloadRequest(
        "o/r",
        ("K-*",),
        label="t1",
        shard_patterns=("K-*",),
        expected_shards=3,
        expected_shard_bytes=3000,
        required=("mmproj-F16.gguf",),
    )
    warnings = crosscheck(req, _listing(shards))
    assert any("lists 3 shards" in w and "has 2" in w for w in warnings)
    assert any("2,000 bytes" in w and "3,000 bytes" in w for w in warnings)
    assert any("'mmproj-F16.gguf' is named by the catalog" in w for w in warnings)
    # within 1 % and complete: silent
    ok = DownloadRequest(
        "o/r", ("K-*",), shard_patterns=("K-*",), expected_shards=2, expected_shard_bytes=2010
    )
    assert crosscheck(ok, _listing(shards)) == []


@pytest.mark.parametrize(
    "raw",
    [
        {"files": [{"name": "a.gguf", "size": 5, "sha256": "AB" * 32}]},
        {"parts": {"a.gguf": {"bytes": 5, "sha256": "sha256:" + "ab" * 32}}},
        [{"path": "sub/a.gguf", "size": 5, "sha256": "ab" * 32}],
    ],
)
def test_manifests_of_different_shapes_are_understood(raw: object) -> None:
    entries = parse_manifest(raw)
    ((name, (size, sha)),) = entries.items()
    assert name.endswith("a.gguf")
    assert (size, sha) == (5, "ab" * 32)


def test_manifest_disagreements_become_warnings_naming_the_file() -> None:
    f = RemoteFile("IQ1_S/K-00001-of-00002.gguf", 100, "cd" * 32, "1" * 40)
    manifest = json.dumps(
        {
            "files": [
                {"name": "K-00001-of-00002.gguf", "size": 99, "sha256": "ab" * 32},
                {"name": "K-00002-of-00002.gguf", "size": 100, "sha256": "ef" * 32},
            ]
        }
    ).encode()
    warnings = manifest_check(manifest, _listing([f]), "manifest.json")
    assert any("K-00001-of-00002.gguf" in w and "99 bytes" in w for w in warnings)
    assert any("K-00001-of-00002.gguf" in w and "sha256 abababab" in w for w in warnings)
    assert any("lists K-00002-of-00002.gguf" in w for w in warnings)
    assert manifest_check(b"{not json", _listing([f]), "manifest.json")[0].startswith(
        "manifest.json is not valid JSON"
    )


def test_git_blob_hash_matches_git(tmp_path: Path) -> None:
    p = tmp_path / "chat_template.jinja"
    p.write_bytes(b"hello\n")
    # `printf 'hello\n' | git hash-object --stdin`
    assert hash_file(p, "git-sha1") == "ce013625030ba8dba906f756967f9e9ca394464a"
    assert hash_file(p) == hashlib.sha256(b"hello\n").hexdigest()


def test_resumed_prefix_is_hashed_while_the_rest_is_appended(tmp_path: Path) -> None:
    data = bytes(range(256)) * 40_000  # ~10 MB
    p = tmp_path / "part"
    prefix = 6_000_123
    p.write_bytes(data[:prefix])
    hasher = StreamHasher(p, "sha256", len(data), prefix=prefix)
    with p.open("ab", buffering=0) as f:
        pos = prefix
        while pos < len(data):
            chunk = data[pos : pos + 65_536]
            f.write(chunk)
            hasher.feed(chunk, pos)
            pos += len(chunk)
    assert hasher.hexdigest() == hashlib.sha256(data).hexdigest()
    assert not [t for t in threading.enumerate() if t.name.startswith("hash:")]


def test_written_buffers_are_hashed_on_a_helper_thread_and_handed_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer reuses its buffers: each is hashed before it comes back, in order,
    and what did not fit in the queue is read back from the file (never skipped)."""
    monkeypatch.setattr(StreamHasher, "QUEUE_BYTES", 3 * 1_000_003)
    data = make_bytes(24_000_000, 7)
    p = tmp_path / "part"
    p.write_bytes(b"")
    hasher = StreamHasher(p, "sha256", len(data))
    free: list[bytearray] = []
    released_on: list[str] = []
    fed = 0

    def release(buf: bytearray) -> None:
        released_on.append(threading.current_thread().name)
        free.append(buf)

    with p.open("ab", buffering=0) as f:
        pos = 0
        while pos < len(data):
            buf = free.pop() if free else bytearray(1_000_003)
            n = min(len(buf), len(data) - pos)
            buf[:n] = data[pos : pos + n]
            f.write(memoryview(buf)[:n])
            hasher.feed(memoryview(buf)[:n], pos, lambda b=buf: release(b))
            fed += 1
            pos += n
    assert hasher.hexdigest() == hashlib.sha256(data).hexdigest()
    assert len(released_on) == fed  # every buffer came back
    assert any(name.startswith("hash:") for name in released_on)  # hashed off the writer
    assert not [t for t in threading.enumerate() if t.name.startswith("hash:")]


def test_space_check_refuses_with_how_much_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import k3desk.core.hub.preflight as pf

    monkeypatch.setattr(pf, "free_bytes", lambda p: 100 * 1024**3)
    where = Where("o/r", "https://hub.example")
    check, warnings = check_space(tmp_path, 90 * 1024**3, 2 * 1024**3, 10, where)
    assert check.missing == 0
    assert warnings == []
    with pytest.raises(HubError) as exc:
        check_space(tmp_path, 330 * 1024**3, 2 * 1024**3, 10, where)
    msg = str(exc.value)
    assert "needs 330.0 GiB more" in msg
    assert "only 100.0 GiB is free" in msg
    assert "232.0 GiB is missing" in msg
    assert "Nothing was downloaded" in msg


def test_fat_filesystems_warn_and_refuse_files_over_4_gib(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import k3desk.core.hub.preflight as pf

    monkeypatch.setattr(pf, "free_bytes", lambda p: 10**15)
    monkeypatch.setattr(pf, "filesystem_type", lambda p: "vfat")
    where = Where("o/r", "https://hub.example")
    _, warnings = check_space(tmp_path, 10, 0, 3 * 1024**3, where)
    assert "FAT" in warnings[0]
    with pytest.raises(HubError, match="cannot hold files over 4 GiB"):
        check_space(tmp_path, 10, 0, 5 * 1024**3, where)


def test_error_texts_name_the_problem_and_the_fix() -> None:
    where = Where("org/model", "https://hub.example", "main", "a.gguf", "/data/a.gguf")
    full = disk_error(OSError(errno.ENOSPC, "No space left on device"), where, kept=5 * 1024**2)
    assert "full" in full.message
    assert "5.0 MiB" in full.message
    assert "resume" in full.hint
    denied = disk_error(PermissionError(errno.EACCES, "Permission denied"), where)
    assert "Permission denied writing to /data/a.gguf" in denied.message
    assert "--to DIR" in denied.hint
    assert "read-only" in disk_error(OSError(errno.EROFS, "ro"), where).message

    class FakeResponse:
        status_code = 429

        def __init__(self) -> None:
            self.headers = {"Retry-After": "120"}

    class FakeHttpError(Exception):
        response = FakeResponse()

    limited = hub_error(FakeHttpError("429"), where)
    assert isinstance(limited, RateLimited)
    assert limited.retry_after == 120
    assert "429" in limited.message
    assert "in 120 s" in limited.hint
