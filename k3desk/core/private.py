"""Private by default: k3desk's own folders are 0700 and its files 0600.

Conversations, engine logs (prompts can appear in them), API key files,
settings and the cluster and server lists are nobody else's business on a
shared machine.  Everything k3desk writes goes through here, with its mode set
explicitly (never left to the umask: under ``umask 000`` a plain ``mkdir`` or
``open`` makes a folder 0777 and a file 0666):

* :func:`private_dir` makes a folder (and the missing ones above it inside the
  same tree) 0700, and tightens an existing folder of ours that is looser;
* :func:`own_dir` makes or checks every folder from a trusted one down to a
  path: a real folder (not a link) of this user, exactly ``mode`` when made,
  tightened to it when not (``.k3desk/`` in a download folder, the header cache);
* :func:`shared_modes` says how readable a model put in a folder may be: as
  readable by others as the folder the person chose is, never writable by them;
* :func:`new_file` creates a file that did not exist (``O_CREAT|O_EXCL|O_NOFOLLOW``),
  :func:`replacing` writes a fresh one beside a path and renames it over it,
  :func:`write_private` replaces a file's content that way (0600 from the start);
* :func:`private_file` makes an empty file, or tightens an existing one, 0600
  (:func:`make_private` only tightens what exists);
* :func:`open_private` opens a file for writing or appending, created 0600;
* :func:`put_in_place` gives a finished file its mode and renames it into place.

What is opened in place (not replaced) must be a regular file and no symbolic
link: a link is refused (:class:`RefusedPath`, naming it), never followed, and a
named pipe or a device is refused with an OSError, never waited on.  A temporary
file has a fresh random name and is created exclusively, so a link planted at
any name k3desk might use is never written through.

A folder or file owned by someone else is left as it is (k3desk cannot and
should not change it); where k3desk keeps records of its own, it is refused.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import IO, BinaryIO, Literal, overload

from k3desk.core.safepaths import mode_kind

DIR_MODE = 0o700
FILE_MODE = 0o600
# what others may do with a model in a folder they can read: read it, never write it
SHARED_DIR_MODE = 0o755
SHARED_FILE_MODE = 0o644
_NOFOLLOW: int = getattr(os, "O_NOFOLLOW", 0)


class RefusedPath(OSError):
    """A path where k3desk writes its own files that is not what k3desk makes there:
    a symbolic link (never followed), not a folder, or another user's folder."""

    def __init__(self, path: Path, why: str) -> None:
        super().__init__(errno.ELOOP, f"{path} {why}; k3desk does not follow or use it", str(path))
        self.path = path
        self.why = why
        self.message = f"{path} {why}; k3desk does not follow or use it."
        self.hint = "Remove it (k3desk did not put it there), or choose another folder."


def _link_or_kind(path: Path, mode: int, *, want_dir: bool) -> str:
    """Why an entry of this ``st_mode`` cannot be one of k3desk's ("" when it can)."""
    if stat.S_ISLNK(mode):
        return "is a symbolic link"
    if want_dir and not stat.S_ISDIR(mode):
        return f"is {mode_kind(mode) or 'a file'}, not a folder"
    if not want_dir and not stat.S_ISREG(mode):
        return f"is {mode_kind(mode)}, not a regular file"
    return ""


def _tighten(path: Path, mode: int) -> None:
    with contextlib.suppress(OSError):
        st = os.stat(path)
        if st.st_uid == os.getuid() and st.st_mode & 0o777 & ~mode:
            os.chmod(path, st.st_mode & 0o777 & mode)


def own_dir(path: Path, mode: int = DIR_MODE, *, below: Path) -> Path:
    """Make or check every folder from ``below`` (excluded: it is trusted) down to ``path``.

    A missing folder is made with exactly ``mode``; an existing one must be a real folder
    (not a symbolic link) owned by this user, and loses the permission bits ``mode`` does
    not have.  Raises :class:`RefusedPath` naming the first one that is not.
    """
    current = below
    for part in path.relative_to(below).parts:
        current = current / part
        with contextlib.suppress(FileExistsError):
            os.mkdir(current, mode)
            os.chmod(current, mode)  # mkdir's mode passes through the umask: exact
        st = os.lstat(current)
        why = _link_or_kind(current, st.st_mode, want_dir=True)
        if not why and st.st_uid != os.getuid():
            why = "belongs to another user"
        if why:
            raise RefusedPath(current, why)
        if st.st_mode & 0o777 & ~mode:
            os.chmod(current, st.st_mode & 0o777 & mode)
    return path


def _existing_ancestor(path: Path) -> Path:
    p = path.absolute()
    while not os.path.lexists(p) and p.parent != p:
        p = p.parent
    return p


def private_dir(path: Path) -> Path:
    """Create ``path`` (with its missing parents) as 0700; tighten it if it exists.

    Raises what :func:`os.mkdir` raises (the callers word it for their context).
    """
    own_dir(path.absolute(), DIR_MODE, below=_existing_ancestor(path))
    _tighten(path, DIR_MODE)
    return path


def shared_modes(folder: Path) -> tuple[int, int]:
    """(file mode, folder mode) for what k3desk puts in ``folder`` for a person: readable
    by group and others as far as ``folder`` itself is (its read and search bits), never
    writable by them.  ``folder`` 0755 gives 0644 / 0755, 0700 gives 0600 / 0700."""
    bits = os.stat(folder).st_mode & (SHARED_DIR_MODE & ~DIR_MODE)
    return FILE_MODE | (bits & SHARED_FILE_MODE), DIR_MODE | bits


def shared_dir(path: Path) -> Path:
    """Create ``path`` (with its missing parents) as readable as the folder it is made in
    (:func:`shared_modes`), never writable by others; an existing one is left as it is."""
    base = _existing_ancestor(path)
    if base != path.absolute():
        own_dir(path.absolute(), shared_modes(base)[1], below=base)
    return path


def make_private(path: Path) -> None:
    """Tighten an existing file (0600) or folder (0700) of ours; nothing if it is missing."""
    _tighten(path, DIR_MODE if path.is_dir() else FILE_MODE)


def _open_regular(path: Path, flags: int, mode: int = FILE_MODE) -> int:
    """``os.open`` that never waits, never follows a link and gives only a regular file:
    a named pipe without a reader would block a plain open for writing for ever
    (``O_NONBLOCK`` makes it fail with ENXIO instead), a pipe with a reader, a device or a
    socket is refused, and a symbolic link is :class:`RefusedPath`.  A file of ours looser
    than ``mode`` is tightened to it."""
    try:
        fd = os.open(path, flags | os.O_NONBLOCK | _NOFOLLOW | getattr(os, "O_NOCTTY", 0), mode)
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            raise OSError(
                errno.ENXIO, "it is a named pipe or socket, not a file", str(path)
            ) from None
        if exc.errno in (errno.ELOOP, errno.EMLINK) and os.path.islink(path):
            raise RefusedPath(path, "is a symbolic link") from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "it is not a regular file (a pipe or a device)", str(path))
    if st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) & ~mode:
        os.fchmod(fd, stat.S_IMODE(st.st_mode) & mode)
    os.set_blocking(fd, True)
    return fd


def open_regular(path: Path, flags: int) -> int:
    """A descriptor of the existing regular file ``path`` (see :func:`_open_regular`), for
    k3desk's own files that are written or read in place (a partial download)."""
    return _open_regular(path, flags | os.O_CLOEXEC)


def new_file(path: Path, mode: int = FILE_MODE) -> BinaryIO:
    """``path`` created for writing, exactly ``mode``; FileExistsError when anything (a
    file, a link) is already there: nothing is ever written through a planted link."""
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | _NOFOLLOW | os.O_CLOEXEC
    fd = os.open(path, flags, mode)
    try:
        os.fchmod(fd, mode)  # the mode of os.open passes through the umask: exact
        return os.fdopen(fd, "w+b")
    except BaseException:
        os.close(fd)
        raise


def fresh_file(folder: Path, name: str, mode: int = FILE_MODE) -> tuple[Path, BinaryIO]:
    """A new file of a random name beside ``name`` in ``folder`` (``.NAME.RANDOM.tmp``)."""
    for _ in range(100):
        tmp = folder / f".{name[:200]}.{secrets.token_hex(6)}.tmp"
        with contextlib.suppress(FileExistsError):
            return tmp, new_file(tmp, mode)
    raise FileExistsError(errno.EEXIST, "no free temporary name", str(folder))


@contextlib.contextmanager
def replacing(path: Path, mode: int = FILE_MODE, *, fsync: bool = False) -> Iterator[BinaryIO]:
    """A new file, exactly ``mode``, that replaces ``path`` when the block ends.

    It is made beside ``path`` under a fresh random name (:func:`new_file`), then renamed
    over ``path``: a crash or a full disk leaves the old file intact, and a link at
    ``path`` is replaced, never written through.  Removed again when the block fails.
    The caller has checked the folder (:func:`private_dir`, :func:`own_dir`).
    """
    tmp, f = fresh_file(path.parent, path.name, mode)
    try:
        with f:
            yield f
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def private_file(path: Path) -> Path:
    """Create ``path`` empty as 0600 if it does not exist; tighten it if it does.

    Raises OSError when it exists and is not a regular file (never waits on a pipe)."""
    private_dir(path.parent)
    fd = _open_regular(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC)
    os.close(fd)
    return path


@overload
def open_private(path: Path, mode: Literal["w", "a"] = "w") -> IO[str]: ...
@overload
def open_private(path: Path, mode: Literal["wb", "ab"]) -> IO[bytes]: ...
def open_private(path: Path, mode: str = "w") -> IO[str] | IO[bytes]:
    """Open ``path`` for writing (``w``/``wb``) or appending (``a``/``ab``), created 0600."""
    private_dir(path.parent)
    flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC
    flags |= os.O_APPEND if mode.startswith("a") else os.O_TRUNC
    fd = _open_regular(path, flags)
    if "b" in mode:
        return os.fdopen(fd, mode)
    return os.fdopen(fd, mode, encoding="utf-8", errors="replace")


def write_private(path: Path, data: str | bytes, *, fsync: bool = False) -> None:
    """Replace ``path``'s content with ``data`` atomically; the file is 0600 from the
    start, never briefly readable by others (:func:`replacing`)."""
    private_dir(path.parent)
    _write(path, data, FILE_MODE, fsync)


def write_shared(path: Path, data: str | bytes) -> None:
    """Replace ``path``'s content with ``data`` atomically, for other programs to read (a
    desktop's menus): as readable as its folder is, never writable by others
    (:func:`shared_modes`); missing folders are made the same way."""
    shared_dir(path.parent)
    _write(path, data, shared_modes(path.parent)[0], False)


def _write(path: Path, data: str | bytes, mode: int, fsync: bool) -> None:
    with replacing(path, mode, fsync=fsync) as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)


def copy_new(src: Path, dest: Path, mode: int = FILE_MODE) -> Path:
    """A copy of ``src`` made as the new file ``dest`` (:func:`new_file`: exclusively,
    exactly ``mode``)."""
    with open(src, "rb") as fin, new_file(dest, mode) as fout:
        shutil.copyfileobj(fin, fout, 8 * 1024 * 1024)
    return dest


def refuse_link(path: Path) -> Path:
    """``path``, or :class:`RefusedPath` when it is a symbolic link (read nothing through it)."""
    if os.path.islink(path):
        raise RefusedPath(path, "is a symbolic link")
    return path


def private_tree(folder: Path) -> Path:
    """Take from everything in ``folder`` (itself included) the permission bits of group
    and others, whatever the umask of the programs that wrote there (a build, pip): the
    user's own bits, execute included, stay.  Links are not followed."""
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in [*dirnames, *filenames]:
            _take_bits(Path(dirpath, name), 0o077)
    _take_bits(folder, 0o077)
    return folder


def no_write_by_others(path: Path) -> None:
    """Take the write bits of group and others from ``path``, a file of this user that
    k3desk keeps where it is (a model an older version made under a loose umask).
    A link is left alone; a file that cannot be changed too."""
    with contextlib.suppress(OSError):
        _take_bits(path, 0o022)


def _take_bits(path: Path, bits: int) -> None:
    st = os.lstat(path)
    if not stat.S_ISLNK(st.st_mode) and st.st_uid == os.getuid() and st.st_mode & bits:
        os.chmod(path, stat.S_IMODE(st.st_mode) & ~bits)


def refuse_links_under(folder: Path) -> Path:
    """``folder``, or :class:`RefusedPath` naming the first symbolic link found in it (at
    any depth, never followed): in a folder only k3desk writes to, a link was planted."""
    for dirpath, dirnames, filenames in os.walk(folder):  # links to folders are not entered
        for name in sorted(dirnames + filenames):
            if os.path.islink(os.path.join(dirpath, name)):
                raise RefusedPath(Path(dirpath, name), "is a symbolic link")
    return folder


def put_in_place(src: Path, dest: Path, mode: int) -> Path:
    """Give the finished file ``src`` (one of k3desk's, in a folder it checked) exactly
    ``mode`` and rename it to ``dest`` (a link there is replaced, not followed)."""
    st = os.lstat(src)
    why = _link_or_kind(src, st.st_mode, want_dir=False)
    if why:
        raise RefusedPath(src, why)
    if st.st_nlink > 1:
        # a hard link to a file kept elsewhere too (a blob of the Hugging Face cache): its
        # mode is that file's as well, so only the write bits of others are taken from it
        mode = stat.S_IMODE(st.st_mode) & ~0o022
    if st.st_uid == os.getuid():
        os.chmod(src, mode)
    os.replace(src, dest)
    return dest
