"""Names that come from outside, turned into paths only when they stay where they belong.

A Hub listing, a mirror behind ``HF_ENDPOINT``, a history database, a cluster
setting or a command line all hand k3desk text that ends up joined to a folder.
``folder / name`` is only as safe as ``name``: ``../../x``, ``/abs/x`` or a
drive letter puts the file anywhere.  The rule applied everywhere:

* a name is a relative POSIX path of normal segments: no ``..`` or ``.``, no
  empty segment (``a//b``, a leading or trailing ``/``), no backslash, no drive
  letter (``C:``), no control character, no undecodable byte;
* and the folder it lands in, with symbolic links resolved, is inside the
  folder it was meant for.

(huggingface_hub's own downloader refuses the traversal cases too:
``_validate_relative_filename`` in ``huggingface_hub/_local_folder.py``, 2.4.)

Also here: what a path that should be a regular file actually is, so that a
folder or a named pipe given as a model file is called that, not "missing".
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from k3desk.core.errors import K3Error

_DRIVE = re.compile(r"^[A-Za-z]:")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_SURROGATE = re.compile(r"[\ud800-\udfff]")


class UnsafeName(K3Error):
    """A name from outside would put a file outside its folder (or is no file name)."""

    def __init__(self, message: str, hint: str, name: str, reason: str) -> None:
        super().__init__(message, hint)
        self.name = name
        self.reason = reason


def name_problem(name: str) -> str:
    """Why ``name`` is not a safe relative path of normal segments ("" when it is)."""
    if not name:
        return "it is empty"
    if _SURROGATE.search(name):
        return "it contains bytes that are not UTF-8"
    if _CONTROL.search(name):
        return "it contains control characters"
    if "\\" in name:
        return "it contains a backslash"
    if name.startswith("/"):
        return "it is an absolute path"
    for segment in name.split("/"):
        if segment == "":
            return "it has an empty path segment"
        if segment == "..":
            return "it climbs out of its folder with '..'"
        if segment == ".":
            return "it has a '.' path segment"
        if _DRIVE.match(segment):
            return "it names a drive"
    return ""


def file_name_problem(name: str) -> str:
    """Why ``name`` is not one plain file name, without any folder ("" when it is)."""
    problem = name_problem(name)
    if problem:
        return problem
    if "/" in name:
        return "it names a folder as well as a file"
    return ""


_UNSAFE_IN_NAME = re.compile(r'[\x00-\x1f\x7f/\\:*?"<>|]+')
_RESERVED = {"con", "prn", "aux", "nul", *(f"{d}{i}" for d in ("com", "lpt") for i in range(10))}


def safe_file_name(
    title: str, suffix: str, *, fallback: str = "conversation", limit: int = 80
) -> str:
    """A file name made from ``title`` that every desktop file system takes: no folder
    separators, no characters Windows refuses (``<>:"/\\|?*``), no control characters,
    no leading dot, not a reserved device name, at most ``limit`` characters before the
    ``.suffix``.  ``fallback`` when nothing of the title is left."""
    name = _UNSAFE_IN_NAME.sub(" ", scrub(title))
    name = re.sub(r"\s+", " ", name).strip().lstrip(".").strip()
    name = name[:limit].rstrip(" .")
    if not name or name.lower() in _RESERVED:
        name = fallback
    return f"{name}.{suffix.lstrip('.')}" if suffix else name


def _inside(real: str, real_root: str) -> bool:
    return real == real_root or real.startswith(real_root.rstrip(os.sep) + os.sep)


def confined(root: Path, name: str, *, what: str = "The file name") -> Path:
    """``root / name``, or :class:`UnsafeName` when it would not be inside ``root``.

    The folder the file goes into is resolved (symbolic links followed, as far as
    it exists), so a link planted inside ``root`` cannot lead the file elsewhere.
    The file itself may be a link: k3desk replaces files by renaming onto them,
    which replaces a link rather than writing through it.
    """
    problem = name_problem(name)
    if problem:
        raise UnsafeName(
            f"{what} {name!r} was refused: {problem}.",
            f"Only plain relative names are written, and only inside {root}.",
            name,
            problem,
        )
    dest = root.joinpath(*name.split("/"))
    if not _inside(os.path.realpath(dest.parent), os.path.realpath(root)):
        problem = "a symbolic link on its way leads out of the folder"
        raise UnsafeName(
            f"{what} {name!r} was refused: {problem} ({dest.parent} -> "
            f"{os.path.realpath(dest.parent)}).",
            f"Remove the link from {root}, or choose another folder.",
            name,
            problem,
        )
    return dest


def scrub(text: str) -> str:
    """``text`` with every undecodable byte (a lone surrogate) as U+FFFD.

    Python hands undecodable bytes of arguments, stdin and file names over as
    lone surrogates (PEP 383); they cannot be encoded as UTF-8, so JSON, SQLite
    and HTTP would fail on them.
    """
    return _SURROGATE.sub("\ufffd", text)


# what a terminal acts on instead of showing: C0 controls but line break and tab, DEL,
# the C1 controls (a lone 0x9b is a CSI on many terminals), and the bidirectional
# overrides/isolates that reorder what is shown
_NOT_SHOWN = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _escape(m: re.Match[str]) -> str:
    # \\u001b rather than \\x1b: the same escape is valid inside a JSON string
    return f"\\u{ord(m.group()):04x}"


def visible(text: str) -> str:
    """``text`` from outside (a server's answer, a GGUF string, a file name) fit to print.

    Escape and control sequences are shown as ``\\u001b``-style escapes instead of being
    acted on by the terminal (colours, a moved cursor, a retitled window, text hidden
    by a carriage return); line breaks and tabs stay.  Undecodable bytes are left to
    the stream (the CLI's shows them as ``\\udcff``).  Everything the CLI prints goes
    through here (:class:`k3desk.cli.VisibleText`).
    """
    return _NOT_SHOWN.sub(_escape, text)


def has_undecodable(text: str) -> bool:
    return _SURROGATE.search(text) is not None


def display_name(name: str) -> str:
    """A name fit to show and to store as a label: undecodable bytes replaced,
    control characters (line breaks, escape sequences) dropped."""
    return _CONTROL.sub("", scrub(name))


SHOWN_LIMIT = 200  # characters of a name, an id or a message from outside that are shown


def shown(text: object, limit: int = SHOWN_LIMIT) -> str:
    """Text from outside (an id, a name or a message from a Hub, a server or a file) as
    it may be shown: :func:`display_name`, then cut to ``limit`` characters, the cut said
    ("... [5,242,800 more characters]")."""
    clean = display_name(str(text))
    if len(clean) <= limit:
        return clean
    keep = max(1, limit - 40)
    return f"{clean[:keep]}... [{len(clean) - keep:,} more characters]"


def what_is(path: Path) -> str:
    """What ``path`` is when it is not a regular file, in words ("" for a regular file).

    ``"missing"``, ``"a folder"``, ``"a named pipe (FIFO)"``, ``"a socket"``,
    ``"a device"``, or ``"unreadable (...)"``.  Symbolic links are followed.
    Nothing is opened: opening a FIFO would block until something writes to it.
    """
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "missing"
    except NotADirectoryError:
        return "missing"
    except OSError as exc:
        return f"unreadable ({exc.strerror or exc})"
    return mode_kind(mode)


def mode_kind(mode: int) -> str:
    """What a file of this ``st_mode`` is, for a message ("" for a regular file)."""
    if stat.S_ISREG(mode):
        return ""
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"
