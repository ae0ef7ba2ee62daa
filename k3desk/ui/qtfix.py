"""Work around a reference-count bug in PySide6 6.12.0 on Python 3.11.

With that combination every call of a Qt method that returns nothing drops one
reference to ``None`` instead of adding one (measured: 100 ``QLabel.setText``
calls lower ``sys.getrefcount(None)`` by 100; PySide6 6.11.3 does not), and
every emission of a ``Signal(bool)`` or Python override returning a bool (e.g.
``QWizardPage.isComplete``) drops one reference to ``True``/``False``.  After
some tens of thousands of calls a count reaches zero and CPython aborts with
"Fatal Python error: none_dealloc: deallocating None" (or ``bool_dealloc``).
Python 3.12 made these objects immortal (PEP 683), so it is unaffected.

:func:`guard_none_refcount` measures the leaks once and, only when present,
gives ``None``, ``True`` and ``False`` a reserve of references large enough for
any session.
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


def bool_leak_per_call(calls: int = 200) -> float:
    """References to True lost per emission of a bool signal (0 on a healthy build)."""
    from PySide6.QtCore import QObject, Signal

    class _Probe(QObject):
        fired = Signal(bool)

    probe = _Probe()
    probe.fired.connect(_ignore)
    before = sys.getrefcount(True)
    for _ in range(calls):
        probe.fired.emit(True)
    after = sys.getrefcount(True)
    return max(0.0, (before - after) / calls)


def _ignore(_value: bool) -> None:
    """A slot that does nothing (for the probe)."""


def guard_none_refcount() -> bool:
    """Apply the workaround when needed; True when it was applied (now or before)."""
    if _applied[0]:
        return True
    if sys.version_info >= (3, 12) or sys.implementation.name != "cpython":
        return False
    leak = none_leak_per_call()
    bool_leak = bool_leak_per_call()
    if leak < 0.5 and bool_leak < 0.5:
        return False
    # ob_refcnt is the first field of every object in CPython 3.11 and earlier.
    for singleton in (None, True, False):
        refcnt = ctypes.c_ssize_t.from_address(id(singleton))
        refcnt.value += RESERVE
    _applied[0] = True
    log.warning(
        "PySide6 drops references to None (%.2f per call) and True/False (%.2f per "
        "emission); gave them a reserve of references to keep the app from aborting",
        leak,
        bool_leak,
    )
    return True
