"""Byte units.  The seed cards mix GB (10^9) and GiB (2^30): we keep both exact."""

from __future__ import annotations

KB = 1000
MB = 1000**2
GB = 1000**3
TB = 1000**4
KiB = 1024
MiB = 1024**2
GiB = 1024**3
TiB = 1024**4


def fmt_bytes(n: float, binary: bool = True) -> str:
    """Human form: ``fmt_bytes(330_167_807_328) == '307.5 GiB'``."""
    step = 1024.0 if binary else 1000.0
    units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"] if binary else [
        "B", "kB", "MB", "GB", "TB", "PB"]
    value = float(n)
    sign = "-" if value < 0 else ""
    value = abs(value)
    for unit in units:
        if value < step or unit == units[-1]:
            if unit == "B":
                return f"{sign}{int(value)} B"
            return f"{sign}{value:.1f} {unit}"
        value /= step
    raise AssertionError("unreachable")
