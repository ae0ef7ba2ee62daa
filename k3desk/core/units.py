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
    units = (
        ["B", "KiB", "MiB", "GiB", "TiB", "PiB"] if binary else ["B", "kB", "MB", "GB", "TB", "PB"]
    )
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


def fmt_tps(tps: float) -> str:
    """A decode speed to two significant digits, never in exponent form:
    ``0.55``, ``9.9``, ``13``, ``6,600`` (``:.2g`` would write ``6.6e+03``)."""
    if tps <= 0:
        return "0"
    rounded = float(f"{tps:.2g}")
    return f"{rounded:.2g}" if rounded < 100 else f"{rounded:,.0f}"


def fmt_tps3(tps: float) -> str:
    """A measured speed to three significant digits, never in exponent form:
    ``0.553``, ``12.1``, ``402``, ``6,250``."""
    if tps <= 0:
        return "0"
    rounded = float(f"{tps:.3g}")
    return f"{rounded:.3g}" if rounded < 1000 else f"{rounded:,.0f}"


def fmt_duration(seconds: float) -> str:
    """'5 s', '40 s', '2 min', '1 h 05 min'."""
    if seconds < 60:
        return f"{max(1, round(seconds))} s"
    minutes = round(seconds / 60)
    if minutes < 60:
        return f"{minutes} min"
    return f"{minutes // 60} h {minutes % 60:02d} min"
