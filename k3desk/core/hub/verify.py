"""Re-check a downloaded tier on disk.

With k3desk's state (``<folder>/.k3desk/state.json``) every file is re-hashed
against the hash the Hub published.  Without it, a publisher's
``manifest.json`` in the folder provides the hashes.  Without either, the GGUF
structure of the shard set is validated from its headers (no hashes known).
"""

from __future__ import annotations

import glob
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from k3desk.core.errors import HubError
from k3desk.core.hub.hashing import hash_file
from k3desk.core.hub.listing import parse_manifest
from k3desk.core.hub.model import RemoteFile
from k3desk.core.hub.state import DIRNAME, TargetState
from k3desk.core.progress import CancelToken, Progress, ProgressCallback, no_progress
from k3desk.core.safepaths import UnsafeName, confined

if TYPE_CHECKING:
    from k3desk.core.catalog.model import Tier

# "refused": the record names a file outside the folder (see k3desk.core.safepaths)
Status = Literal["ok", "mismatch", "missing", "wrong-size", "refused"]
Method = Literal["state", "manifest", "gguf"]


@dataclass(frozen=True)
class FileCheck:
    path: str
    status: Status
    expected: str = ""
    actual: str = ""


@dataclass(frozen=True)
class VerifyReport:
    folder: str
    method: Method
    files: tuple[FileCheck, ...]
    notes: tuple[str, ...] = ()
    repo: str = ""
    revision: str = ""

    @property
    def ok(self) -> bool:
        return all(f.status == "ok" for f in self.files)

    @property
    def bad(self) -> tuple[FileCheck, ...]:
        return tuple(f for f in self.files if f.status != "ok")


def find_state_folder(path: Path) -> Path | None:
    """The folder holding ``.k3desk/state.json`` at or above ``path``."""
    p = path if path.is_dir() else path.parent
    for candidate in (p, *p.parents):
        if (candidate / DIRNAME / "state.json").is_file():
            return candidate
    return None


def _hash_files(
    folder: Path,
    expected: list[tuple[str, int | None, str, str]],  # (path, size, kind, hex)
    progress: ProgressCallback,
    cancel: CancelToken | None,
    on_ok: Callable[[str], None] | None = None,
    on_bad: Callable[[str], None] | None = None,
) -> list[FileCheck]:
    total = sum(size or 0 for _, size, _, _ in expected)
    done = 0
    checks = []
    for path, size, kind, want in expected:
        try:  # the names come from a file in the folder: a manifest or a state record
            p = confined(folder, path, what="The recorded file")
        except UnsafeName as exc:
            checks.append(FileCheck(path, "refused", "", exc.reason))
            continue
        if not p.is_file():
            checks.append(FileCheck(path, "missing", want))
            if on_bad:
                on_bad(path)
            continue
        actual_size = p.stat().st_size
        if size is not None and actual_size != size:
            checks.append(FileCheck(path, "wrong-size", f"{size} bytes", f"{actual_size} bytes"))
            done += size
            if on_bad:
                on_bad(path)
            continue

        def tick(n: int, path: str = path) -> None:
            nonlocal done
            done += n
            progress(Progress("Verifying", done, total, path))

        got = hash_file(p, kind, cancel=cancel, on_bytes=tick)
        if got == want:
            checks.append(FileCheck(path, "ok", want, got))
            if on_ok:
                on_ok(path)
        else:
            checks.append(FileCheck(path, "mismatch", want, got))
            if on_bad:
                on_bad(path)
    progress(Progress("Verifying", total, total))
    return checks


def verify_target(
    path: Path | str,
    *,
    progress: ProgressCallback = no_progress,
    cancel: CancelToken | None = None,
    tiers: Iterable[Tier] = (),
) -> VerifyReport:
    """Re-check the download ``path`` is (a folder) or belongs to (a shard).

    ``tiers`` (the catalog) lets a structural failure name the tier to download again."""
    path = Path(path)
    if not path.exists():
        raise HubError(
            f"{path} does not exist.", "Give the folder a tier was downloaded to, or one shard."
        )
    folder = find_state_folder(path)
    if folder is not None:
        return _verify_with_state(folder, path, progress, cancel)
    base = path if path.is_dir() else path.parent
    manifest = base / "manifest.json"
    if manifest.is_file():
        return _verify_with_manifest(base, manifest, progress, cancel)
    return _verify_gguf(path, progress, cancel, tiers)


def _verify_with_state(
    folder: Path, path: Path, progress: ProgressCallback, cancel: CancelToken | None
) -> VerifyReport:
    state = TargetState(folder)
    if state.load_error:
        raise HubError(state.load_error, "Run `k3desk download` again to rebuild it.")
    wanted: list[str]
    if path.is_file():
        rel = path.resolve().relative_to(folder.resolve()).as_posix()
        sets = [d for d in state.downloads.values() if rel in d.get("files", [])]
        if not sets and rel not in state.files:
            raise HubError(
                f"{path} is not part of a download k3desk recorded in {folder}.",
                f"Run `k3desk verify {folder}` to check the whole folder.",
            )
        wanted = sorted({p for d in sets for p in d["files"]} or {rel})
    else:
        wanted = sorted(
            {p for d in state.downloads.values() for p in d.get("files", [])}
        ) or sorted(state.files)
    records = {p: state.files[p] for p in wanted if p in state.files}
    expected: list[tuple[str, int | None, str, str]] = [
        (p, r.size, "sha256" if r.sha256 else "git-sha1", r.sha256 or r.git_sha1)
        for p, r in records.items()
    ]

    def remote(p: str) -> RemoteFile:
        r = records[p]
        return RemoteFile(p, r.size, r.sha256, r.git_sha1)

    def ok(p: str) -> None:
        r = records[p]
        state.mark_verified(remote(p), r.repo, r.revision)

    checks = _hash_files(folder, expected, progress, cancel, on_ok=ok, on_bad=state.forget_verified)
    first = next(iter(records.values()), None)
    return VerifyReport(
        str(folder),
        "state",
        tuple(checks),
        repo=first.repo if first else "",
        revision=first.revision if first else "",
    )


def _verify_with_manifest(
    base: Path, manifest: Path, progress: ProgressCallback, cancel: CancelToken | None
) -> VerifyReport:
    try:
        entries = parse_manifest(json.loads(manifest.read_text(encoding="utf-8")))
    except (OSError, ValueError) as exc:
        raise HubError(
            f"{manifest} is not readable JSON ({exc}).",
            "Download the tier again with `k3desk download`, which restores it.",
        ) from exc
    expected: list[tuple[str, int | None, str, str]] = []
    notes = []
    for name, (size, sha) in sorted(entries.items()):
        pattern = glob.escape(Path(name).name)  # a name, not a pattern ("*" would match all)
        found = [p for p in base.rglob(pattern) if ".k3desk" not in p.parts] if pattern else []
        rel = found[0].relative_to(base).as_posix() if found else name
        if sha:
            expected.append((rel, size, "sha256", sha))
        else:
            notes.append(f"{manifest.name} gives no sha256 for {name}; not checked.")
    checks = _hash_files(base, expected, progress, cancel)
    return VerifyReport(str(base), "manifest", tuple(checks), tuple(notes))


def _verify_gguf(
    path: Path, progress: ProgressCallback, cancel: CancelToken | None, tiers: Iterable[Tier]
) -> VerifyReport:
    from k3desk.core.gguf.validate import inspect_shard_set

    target = path
    if path.is_dir():
        firsts = sorted(path.rglob("*-00001-of-*.gguf")) or sorted(
            p for p in path.rglob("*.gguf") if "mmproj" not in p.name.lower()
        )
        if not firsts:
            raise HubError(
                f"{path} holds no GGUF shards and no k3desk download record.",
                "Give the folder a tier was downloaded to, or one of its shards.",
            )
        target = firsts[0]
    report = inspect_shard_set(target, tiers=tiers, progress=progress, cancel=cancel)
    base = target.parent
    checks = tuple(
        FileCheck(p.relative_to(base).as_posix() if p.is_relative_to(base) else str(p), "ok")
        for p in report.layout.parts
    )
    notes = (
        "No hashes are known for these files (no k3desk download record or manifest.json): "
        "only the GGUF structure was checked, not the tensor data.",
        *report.notes,
    )
    return VerifyReport(str(base), "gguf", checks, notes)
