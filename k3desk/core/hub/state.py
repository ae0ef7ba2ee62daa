"""What k3desk remembers inside a target folder, under ``<target>/.k3desk/``.

``state.json``
    Per file: the repo, pinned revision, expected hashes and, once verified,
    the size and mtime it had then.  A restart trusts a file whose size and
    mtime are unchanged instead of re-hashing hundreds of GB.
``partial/<path>.k3part`` + ``.k3part.json``
    A file being transferred, and how many of its bytes are known to be on
    stable storage (``durable``, fsync'ed before it is recorded).  This is the
    thin resume layer huggingface_hub lacks (its partial files carry a random
    suffix, are deleted on failure and restart at byte 0 on the next run,
    upstream issue #4196): a restart after kill -9 or a power cut continues
    from ``durable``, re-fetching at most one checkpoint's worth of bytes.
``staging/``
    Scratch folders for transfers run by huggingface_hub in a child process;
    anything left there after a crash is removed at the next start.

No token or other secret is ever written here.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from k3desk.core.errors import HubError
from k3desk.core.hub.model import RemoteFile
from k3desk.core.private import (
    DIR_MODE,
    FILE_MODE,
    RefusedPath,
    new_file,
    no_write_by_others,
    open_regular,
    own_dir,
    refuse_link,
    replacing,
    shared_modes,
)
from k3desk.core.safepaths import confined

DIRNAME = ".k3desk"
FORMAT = 1
# How long an OS may keep written data only in memory before writing it back
# (Linux: dirty_expire 30 s by default, laptop mode up to 10 min).  Data written
# this long before a crash or reboot is on disk even without an fsync.
FLUSH_GRACE = 600.0


def boot_time() -> float:
    import psutil

    return float(psutil.boot_time())


def survived(written_at: float | None) -> bool:
    """Can data written at ``written_at`` (epoch seconds), without fsync, be trusted now?

    Yes if it was written since this boot (a killed process loses nothing the
    kernel already has), or long enough before the last boot to have been
    written back.  Files finished shortly before a crash are re-checked.
    """
    if written_at is None:
        return False
    booted = boot_time()
    return written_at >= booted or written_at + FLUSH_GRACE <= booted


def meta_dir(target: Path) -> Path:
    return target / DIRNAME


def state_dir(target: Path, *sub: str) -> Path:
    """``<target>/.k3desk[/SUB...]``, made or checked: real folders of this user (never a
    link, never another user's: :class:`RefusedPath`), 0700 whatever the umask."""
    return own_dir(meta_dir(target).joinpath(*sub), DIR_MODE, below=target)


def model_dirs(target: Path, folder: Path) -> int:
    """Make or check the folders from ``target`` down to ``folder`` for a model's file, as
    readable by others as ``target`` is and never writable by them; the file's mode.

    A model is the person's to share: in a folder others can read (a shared models folder,
    0755) its files are 0644, in a private one (0700) 0600."""
    file_mode, dir_mode = shared_modes(target)
    own_dir(folder, dir_mode, below=target)
    return file_mode


def as_hub_error(exc: RefusedPath) -> HubError:
    return HubError(exc.message, exc.hint)


def atomic_write_json(path: Path, data: Any, *, sync: bool = True) -> None:
    """Replace ``path`` with ``data`` as JSON, 0600: readers see the old or the new whole.

    ``sync=False`` skips the fsync, for records whose loss in a power cut only
    costs work (an fsync here also waits for the journal to take the data other
    threads wrote before it: hundreds of MB in the middle of a download).
    The folder is the caller's, checked (:func:`state_dir`).
    """
    text = json.dumps(data, indent=1, sort_keys=True)
    with replacing(path, FILE_MODE, fsync=sync) as f:
        f.write(text.encode("utf-8"))


def expected_hash(f: RemoteFile) -> tuple[str, str]:
    """(kind, hex) the content must hash to: ``sha256`` for LFS, ``git-sha1`` otherwise."""
    return ("sha256", f.sha256) if f.sha256 else ("git-sha1", f.git_sha1)


@dataclass(frozen=True)
class FileRecord:
    repo: str
    revision: str
    size: int
    sha256: str | None
    git_sha1: str
    verified_size: int | None = None
    verified_mtime_ns: int | None = None
    verified_at: float | None = None  # epoch seconds


class TargetState:
    """``<target>/.k3desk/state.json``, safe to update from several threads."""

    def __init__(self, target: Path) -> None:
        self.target = target
        self.path = meta_dir(target) / "state.json"
        self._lock = threading.Lock()
        self.files: dict[str, FileRecord] = {}
        self.downloads: dict[str, dict[str, Any]] = {}
        self.load_error = ""
        self._load()

    def _load(self) -> None:
        try:
            raw = json.loads(refuse_link(self.path).read_text(encoding="utf-8"))
        except RefusedPath as exc:
            raise as_hub_error(exc) from None
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            self.load_error = f"{self.path} is unreadable ({exc}); files will be re-checked"
            return
        if not isinstance(raw, dict) or raw.get("format") != FORMAT:
            self.load_error = f"{self.path} has an unknown format; files will be re-checked"
            return
        for path, rec in (raw.get("files") or {}).items():
            try:
                self.files[str(path)] = FileRecord(
                    repo=str(rec["repo"]),
                    revision=str(rec["revision"]),
                    size=int(rec["size"]),
                    sha256=rec.get("sha256"),
                    git_sha1=str(rec.get("git_sha1") or ""),
                    verified_size=rec.get("verified_size"),
                    verified_mtime_ns=rec.get("verified_mtime_ns"),
                    verified_at=rec.get("verified_at"),
                )
            except (KeyError, TypeError, ValueError):
                continue
        downloads = raw.get("downloads")
        if isinstance(downloads, dict):
            self.downloads = {str(k): v for k, v in downloads.items() if isinstance(v, dict)}

    def _save_locked(self) -> None:
        data = {
            "format": FORMAT,
            "downloads": self.downloads,
            "files": {
                p: {
                    "repo": r.repo,
                    "revision": r.revision,
                    "size": r.size,
                    "sha256": r.sha256,
                    "git_sha1": r.git_sha1,
                    "verified_size": r.verified_size,
                    "verified_mtime_ns": r.verified_mtime_ns,
                    "verified_at": r.verified_at,
                }
                for p, r in sorted(self.files.items())
            },
        }
        # Not fsync'ed: the record is only worth what the files it describes are
        # worth, and those are not fsync'ed either (see is_trusted).  After a
        # power cut it may be the old one, or unreadable (load_error): either way
        # files verified shortly before are hashed again, never trusted blindly.
        try:
            state_dir(self.target)
        except RefusedPath as exc:
            raise as_hub_error(exc) from None
        atomic_write_json(self.path, data, sync=False)

    def record_listing(
        self, key: str, repo: str, revision: str, endpoint: str, files: tuple[RemoteFile, ...]
    ) -> None:
        with self._lock:
            self.downloads[key] = {
                "repo": repo,
                "revision": revision,
                "endpoint": endpoint,
                "files": [f.path for f in files],
            }
            for f in files:
                old = self.files.get(f.path)
                same = (
                    old is not None
                    and old.sha256 == f.sha256
                    and old.git_sha1 == f.git_sha1
                    and old.size == f.size
                )
                self.files[f.path] = FileRecord(
                    repo=repo,
                    revision=revision,
                    size=f.size,
                    sha256=f.sha256,
                    git_sha1=f.git_sha1,
                    verified_size=old.verified_size if same and old else None,
                    verified_mtime_ns=old.verified_mtime_ns if same and old else None,
                    verified_at=old.verified_at if same and old else None,
                )
            self._save_locked()

    def is_trusted(self, f: RemoteFile) -> bool:
        """True when ``f`` was verified before and its size and mtime have not changed.

        Finished files are not fsync'ed (that would make every download wait for
        the disk); a file verified just before a crash is re-hashed instead.
        """
        with self._lock:
            rec = self.files.get(f.path)
        if rec is None or rec.verified_mtime_ns is None:
            return False
        if rec.sha256 != f.sha256 or rec.git_sha1 != f.git_sha1:
            return False
        try:
            st = (self.target / f.path).stat()
        except OSError:
            return False
        unchanged = st.st_size == f.size == rec.verified_size
        if unchanged and st.st_mtime_ns == rec.verified_mtime_ns and survived(rec.verified_at):
            no_write_by_others(self.target / f.path)  # one an older version made 0666
            return True
        return False

    def mark_verified(self, f: RemoteFile, repo: str, revision: str) -> None:
        """``f`` is in the target folder with the Hub's content: recorded, and (as a model
        found there may have been made under a loose umask) writable by nobody else."""
        no_write_by_others(self.target / f.path)
        st = (self.target / f.path).stat()
        with self._lock:
            self.files[f.path] = FileRecord(
                repo=repo,
                revision=revision,
                size=f.size,
                sha256=f.sha256,
                git_sha1=f.git_sha1,
                verified_size=st.st_size,
                verified_mtime_ns=st.st_mtime_ns,
                verified_at=time.time(),
            )
            self._save_locked()

    def forget_verified(self, path: str) -> None:
        with self._lock:
            rec = self.files.get(path)
            if rec is not None and rec.verified_mtime_ns is not None:
                self.files[path] = FileRecord(
                    rec.repo, rec.revision, rec.size, rec.sha256, rec.git_sha1
                )
                self._save_locked()


# ---------------------------------------------------------------- partial files


class Partial:
    """One resumable partial file and its sidecar."""

    def __init__(self, target: Path, f: RemoteFile, repo: str, revision: str) -> None:
        self.target = target
        self.file = f
        self.repo = repo
        self.revision = revision
        # confined: the name comes from the Hub's listing
        self.data = confined(meta_dir(target) / "partial", f.path + ".k3part")
        self.sidecar = self.data.with_name(self.data.name + ".json")

    def _matches(self, raw: Any) -> bool:
        return (
            isinstance(raw, dict)
            and raw.get("repo") == self.repo
            and raw.get("path") == self.file.path
            and raw.get("size") == self.file.size
            and raw.get("sha256") == self.file.sha256
            and raw.get("git_sha1") == self.file.git_sha1
        )

    def resumable_bytes(self) -> int:
        """Bytes of the partial that can be kept.

        Everything on disk if it was written since this boot (a killed process
        loses nothing the kernel already has); after a reboot, or while the file
        is fetched in ranges (``holes``: bytes past ``durable`` may lie beyond a
        gap), only the last fsync'ed checkpoint (``durable``).
        """
        if self.data.is_symlink() or self.sidecar.is_symlink():
            return 0  # refused, naming it, when it is prepared
        try:
            raw = json.loads(self.sidecar.read_text(encoding="utf-8"))
            size = self.data.stat().st_size
        except (OSError, ValueError):
            return 0
        if not self._matches(raw):
            return 0
        durable = raw.get("durable")
        if not isinstance(durable, int) or durable < 0:
            return 0
        boot = raw.get("boot")
        if isinstance(boot, int | float) and abs(boot - boot_time()) < 5 and not raw.get("holes"):
            return min(size, self.file.size)
        return min(durable, size, self.file.size)

    def prepare(self) -> int:
        """Make the partial file ready to append to; return the offset to resume from.

        Its folders are checked (:func:`state_dir`) and a link at the partial file or
        its sidecar is refused (:class:`RefusedPath`), never written through; so are the
        folders the finished file goes to (:func:`model_dirs`), before a byte is fetched."""
        model_dirs(self.target, self.target.joinpath(*self.file.path.split("/")).parent)
        own_dir(self.data.parent, DIR_MODE, below=self.target)
        refuse_link(self.data)
        refuse_link(self.sidecar)
        keep = self.resumable_bytes()
        if keep == 0:
            for p in (self.sidecar, self.data):
                with contextlib.suppress(FileNotFoundError):
                    p.unlink()
            new_file(self.data, FILE_MODE).close()
            # nothing is durable yet, so nothing needs to be made so: a sidecar
            # lost in a power cut means starting at byte 0, which is what it says
            self.checkpoint(0, sync=False)
        else:
            fd = open_regular(self.data, os.O_WRONLY)
            try:
                os.ftruncate(fd, keep)
            finally:
                os.close(fd)
        return keep

    def checkpoint(self, durable: int, *, holes: bool = False, sync: bool = True) -> None:
        """Record that ``durable`` bytes are on stable storage (call after fsync);
        ``holes``: bytes past them are not a contiguous prefix (ranges in flight);
        ``sync``: make the record itself durable before returning.

        The sidecar has a fixed layout (the number is space-padded), so after
        the first write it is overwritten in place: no new disk block is
        needed, which keeps checkpoints working when the disk has just filled up.
        """
        meta = json.dumps(
            {
                "repo": self.repo,
                "revision": self.revision,
                "path": self.file.path,
                "size": self.file.size,
                "sha256": self.file.sha256,
                "git_sha1": self.file.git_sha1,
                "boot": round(boot_time()),
                "holes": holes,
            },
            sort_keys=True,
        )
        text = ('{"durable": ' + f"{durable:>20d}" + ", " + meta[1:] + "\n").encode()
        try:
            fd = open_regular(self.sidecar, os.O_WRONLY)
        except FileNotFoundError:
            own_dir(self.sidecar.parent, DIR_MODE, below=self.target)
            with replacing(self.sidecar, FILE_MODE, fsync=sync) as f:
                f.write(text)
            return
        try:
            if os.fstat(fd).st_size != len(text):
                os.ftruncate(fd, 0)
            os.lseek(fd, 0, os.SEEK_SET)
            os.write(fd, text)  # < 1 KiB: one write, within one disk block
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)

    def discard(self) -> None:
        for p in (self.data, self.sidecar, self.sidecar.with_name(self.sidecar.name + ".tmp")):
            with contextlib.suppress(FileNotFoundError):
                p.unlink()


def discard_partials(target: Path) -> int:
    """Delete every partial file under ``target`` (a cancel, as opposed to a pause)."""
    root = meta_dir(target) / "partial"
    n = 0
    if root.is_dir():
        for p in sorted(root.rglob("*"), reverse=True):
            if p.is_file():
                p.unlink()
                n += p.suffix == ".k3part"
            elif p.is_dir():
                with contextlib.suppress(OSError):
                    p.rmdir()
    return n
