"""Reading k3desk's own records back: only regular files, bounded, checked.

The keep-running record, the measured speeds, the tuned launch settings, the
engine check cache, the attached endpoints and the settings are files k3desk
wrote itself, but what is on disk when they are read back is whatever is there:
a named pipe (opening it for reading waits for a writer that never comes), a
link to ``/dev/zero`` (an endless read), a file of 170 MB, a list where a dict
belongs, a process id of ``-1`` or ``1e400``, a timestamp in the year 30000, a
ratio of infinity.  Every one of them is read here:

* :func:`read_regular` opens without blocking (``O_NONBLOCK``: a FIFO opens at
  once), then asks the open file what it is (``fstat``, so no swap between the
  check and the read), refuses anything but a regular file, and reads at most
  ``limit`` bytes;
* :func:`load_json` adds UTF-8 and JSON, and raises :class:`DamagedRecord`
  saying what is wrong;
* :func:`set_aside` renames a damaged record to ``NAME.damaged-TIME`` (kept, not
  deleted, so nothing is lost) and returns the sentence that says so;
* the ``check_*`` helpers are the schema: types and ranges, each failure a
  :class:`ValueError` naming the field.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from k3desk.core.errors import K3Error
from k3desk.core.safepaths import mode_kind

T = TypeVar("T")
log = logging.getLogger(__name__)

# k3desk's records are small: the largest (200 measured runs) is under 100 KiB.
DEFAULT_LIMIT = 1024 * 1024
# Linux's ceiling for pid_max (PID_MAX_LIMIT, include/linux/threads.h): 2**22.
PID_MAX_LIMIT = 4_194_304
# A timestamp k3desk could have written: not before 2000, not over a day ahead.
EARLIEST = 946_684_800.0  # 2000-01-01 UTC
FUTURE_SLACK = 86_400.0


class DamagedRecord(K3Error):
    """A record is not what k3desk writes (not a regular file, too large, not JSON,
    wrong types or ranges).  ``why`` is the reason in words."""

    def __init__(
        self, path: Path, why: str, what: str = "record", *, content: bool = False
    ) -> None:
        super().__init__(f"The {what} {path} is damaged: {why}.")
        self.path = path
        self.why = why
        self.what = what
        # a regular file of a sane size whose text is not UTF-8 JSON (a person can fix
        # it by hand), rather than something that is no file to read at all
        self.content = content


def read_regular(path: Path, *, limit: int = DEFAULT_LIMIT, what: str = "record") -> bytes | None:
    """The bytes of ``path`` (None when it does not exist).

    Raises :class:`DamagedRecord` when it is not a regular file (a folder, a named
    pipe, a device such as ``/dev/zero`` behind a link, a socket) or holds more than
    ``limit`` bytes, and :class:`OSError` when it cannot be opened (permissions).
    Never blocks: a FIFO is opened with ``O_NONBLOCK`` and refused.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0))
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        return None
    except IsADirectoryError:
        raise DamagedRecord(path, "it is a folder, not a file", what) from None
    except OSError as exc:
        if exc.errno is not None and exc.errno in (6, 19):  # ENXIO (socket/FIFO), ENODEV
            raise DamagedRecord(path, "it is not a regular file", what) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise DamagedRecord(path, f"it is {mode_kind(st.st_mode)}, not a regular file", what)
        if st.st_size > limit:
            raise DamagedRecord(
                path, f"it holds {st.st_size:,} bytes, more than the {limit:,} it may", what
            )
        chunks: list[bytes] = []
        got = 0
        while got <= limit:
            chunk = os.read(fd, min(65536, limit + 1 - got))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        if got > limit:  # it grew while being read
            raise DamagedRecord(path, f"it holds more than the {limit:,} bytes it may", what)
        return b"".join(chunks)
    finally:
        os.close(fd)


def load_json(path: Path, *, limit: int = DEFAULT_LIMIT, what: str = "record") -> Any:
    """The JSON value in ``path`` (None when the file does not exist).

    Raises :class:`DamagedRecord` for anything that is not a regular file of at
    most ``limit`` bytes of UTF-8 JSON (``NaN`` and ``Infinity`` included: JSON has
    no such numbers), and :class:`OSError` when it cannot be opened.
    """
    raw = read_regular(path, limit=limit, what=what)
    if raw is None:
        return None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        why = f"it is not UTF-8 text ({exc.reason} at byte {exc.start})"
        raise DamagedRecord(path, why, what, content=True) from None
    try:
        return json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise DamagedRecord(path, "it is nested too deeply", what, content=True) from None
    except ValueError as exc:
        raise DamagedRecord(path, f"it is not valid JSON ({exc})", what, content=True) from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON knows")


def set_aside(
    path: Path,
    why: str,
    *,
    what: str = "record",
    clock: Callable[[], float] = time.time,
    warn: bool = True,
) -> str:
    """Rename the damaged ``path`` to ``NAME.damaged-TIME``; the sentence that says so.

    The rename moves a link or a pipe itself, never what it points to.  When even
    the rename fails, the sentence says that instead.  With ``warn`` the sentence is
    also logged as a warning (the log file in the app; stderr in the CLI).
    """
    note = _set_aside(path, why, what, clock)
    if warn:
        log.warning("%s", note)
    return note


def _set_aside(path: Path, why: str, what: str, clock: Callable[[], float]) -> str:
    bad = path.with_name(f"{path.name}.damaged-{int(clock())}")
    try:
        os.replace(path, bad)
    except FileNotFoundError:
        return f"The {what} {path} was damaged ({why}); it is gone now."
    except OSError as exc:
        return (
            f"The {what} {path} is damaged ({why}) and could not be set aside "
            f"({exc.strerror or exc}); k3desk goes on without it."
        )
    with contextlib.suppress(OSError):  # a link or a pipe is moved, not changed
        if stat.S_ISREG(os.lstat(bad).st_mode):
            os.chmod(bad, 0o600)
    return (
        f"The {what} {path} was damaged ({why}); it was kept as {bad.name} "
        "and k3desk goes on without it."
    )


def load_checked(
    path: Path,
    parse: Callable[[Any], T],
    *,
    what: str = "record",
    limit: int = DEFAULT_LIMIT,
    clock: Callable[[], float] = time.time,
) -> tuple[T | None, str]:
    """``parse`` of the JSON in ``path``, and "" -- or (None, the set-aside sentence)
    when the file is damaged or ``parse`` raises ValueError/TypeError/KeyError.
    (None, "") when there is no file; (None, why) when it cannot be opened."""
    try:
        data = load_json(path, limit=limit, what=what)
    except DamagedRecord as exc:
        return None, set_aside(path, exc.why, what=what, clock=clock)
    except OSError as exc:
        return (
            None,
            f"The {what} {path} cannot be read ({exc.strerror or exc}); k3desk goes on without it.",
        )
    if data is None:
        return None, ""
    try:
        return parse(data), ""
    except (ValueError, TypeError, KeyError, OverflowError, AttributeError) as exc:
        return None, set_aside(path, _reason(exc), what=what, clock=clock)


def _reason(exc: BaseException) -> str:
    text = str(exc)
    if isinstance(exc, KeyError):
        text = f"{text} is missing"
    return text[:200] or type(exc).__name__


# ----------------------------------------------------------------- the schema


def check_dict(value: Any, name: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"{name} must be an object, not {type(value).__name__}")
    return value


def check_int(value: Any, name: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be a whole number, not {_short(value)}")
    if not lo <= value <= hi:
        raise ValueError(f"{name} {_short(value)} is outside {lo}-{hi}")
    return value


def check_float(value: Any, name: str, lo: float, hi: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a number, not {_short(value)}")
    try:
        f = float(value)
    except OverflowError:
        raise ValueError(f"{name} {_short(value)} is outside {lo:g}-{hi:g}") from None
    if not math.isfinite(f) or not lo <= f <= hi:
        raise ValueError(f"{name} {_short(value)} is outside {lo:g}-{hi:g}")
    return f


def check_text(value: Any, name: str, max_len: int = 4096) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{name} must be text, not {type(value).__name__}")
    if len(value) > max_len:
        raise ValueError(f"{name} is {len(value)} characters long, more than {max_len}")
    return value


def pid_max() -> int:
    """The kernel's largest process id (``/proc/sys/kernel/pid_max``; 2**22 elsewhere)."""
    try:
        with open("/proc/sys/kernel/pid_max", "rb") as f:
            return max(1, min(int(f.read(32).strip() or b"0"), PID_MAX_LIMIT))
    except (OSError, ValueError):
        return PID_MAX_LIMIT


def check_pid(value: Any, name: str = "pid") -> int:
    return check_int(value, name, 1, pid_max())


def check_port(value: Any, name: str = "port") -> int:
    return check_int(value, name, 1, 65535)


def check_when(value: Any, name: str = "when", *, now: float | None = None) -> float:
    """A time k3desk could have recorded: from 2000 to a day from ``now``."""
    latest = (time.time() if now is None else now) + FUTURE_SLACK
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a time, not {_short(value)}")
    try:
        f = float(value)
    except OverflowError:
        raise ValueError(
            f"{name} {_short(value)} is not a time k3desk could have written"
        ) from None
    if not math.isfinite(f) or not EARLIEST <= f <= latest:
        raise ValueError(f"{name} {_short(value)} is not a time k3desk could have written")
    return f


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
