"""Work around a reference-count bug in PySide6 6.12.0 on Python 3.11.

With that combination every call of a Qt method that returns nothing drops one
reference to ``None`` instead of adding one (measured: 100 ``QLabel.setText``
calls lower ``sys.getrefcount(None)`` by 100; PySide6 6.11.3 does not).  After
some tens of thousands of calls the count reaches zero and CPython aborts with
"Fatal Python error: none_dealloc: deallocating None".  Python 3.12 made
``None`` immortal (PEP 683), so it is unaffected.

:func:`guard_none_refcount` measures the leak once and, only when present,
gives ``None`` a reserve of references large enough for any session.
"""

from __future__ import annotations

import ctypes
import logging
import sys

log = logging.getLogger(__name__)

RESERVE = 1 << 40
_applied = [False]


def none_leak_per_call(calls: int = 200) -> float:
    """References to None lost per void Qt call (0 on a healthy build)."""
    from PySide6.QtCore import QObject

    obj = QObject()
    before = sys.getrefcount(None)
    for _ in range(calls):
        obj.setObjectName("probe")
    after = sys.getrefcount(None)
    return max(0.0, (before - after) / calls)


def guard_none_refcount() -> bool:
    """Apply the workaround when needed; True when it was applied (now or before)."""
    if _applied[0]:
        return True
    if sys.version_info >= (3, 12) or sys.implementation.name != "cpython":
        return False
    leak = none_leak_per_call()
    if leak < 0.5:
        return False
    # ob_refcnt is the first field of every object in CPython 3.11 and earlier.
    refcnt = ctypes.c_ssize_t.from_address(id(None))
    refcnt.value += RESERVE
    _applied[0] = True
    log.warning(
        "PySide6 drops a reference to None on each call (%.2f per call); "
        "gave None a reserve of references to keep the app from aborting",
        leak,
    )
    return True
