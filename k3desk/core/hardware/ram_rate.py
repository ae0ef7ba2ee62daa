"""This machine's RAM bandwidth, measured once and kept: one figure per machine.

Every speed k3desk predicts for a tier that runs from RAM divides the bytes a token
reads by the RAM bandwidth.  The copy benchmark (:func:`measure_ram_bandwidth`) reads
differently from one run to the next (12.7 and 19.8 GB/s a second apart on a shared
2-core machine), so a figure measured on every start made the wizard, ``k3desk tiers``
and ``k3desk models list`` give the same tier different speeds.

The first measurement on a machine is therefore kept in the state folder
(``ram-bandwidth.json``, one record per machine fingerprint, written 0600 through
:mod:`k3desk.core.private`) and every view uses it from then on; ``k3desk doctor
--remeasure`` measures again and keeps the new figure.  A damaged file is set aside
(``core/localfiles.py``) and the figure measured afresh.  Within one process a figure
measured for a machine is reused for another state folder rather than measured twice.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from k3desk.core.hardware.bandwidth import benchmark_threads, measure_ram_bandwidth
from k3desk.core.hardware.profile import Bandwidth, HardwareProfile
from k3desk.core.localfiles import check_dict, check_float, check_int, check_text, load_checked
from k3desk.core.private import write_private
from k3desk.core.units import MiB

if TYPE_CHECKING:
    from pathlib import Path

RECORD_FILE = "ram-bandwidth.json"
SCHEMA = 1
MAX_FILE_BYTES = 256 * 1024
MAX_MACHINES = 16
REMEASURE = "`k3desk doctor --remeasure` measures it again"

# the benchmark's buffer: a sixteenth of the free RAM, between 16 and 256 MiB
MIN_BUFFER = 16 * MiB
MAX_BUFFER = 256 * MiB


def benchmark_bytes(available: int) -> int:
    """The copy benchmark's buffer for a machine with ``available`` bytes of free RAM."""
    return max(MIN_BUFFER, min(MAX_BUFFER, available // 16))


def measure_here(hw: HardwareProfile) -> Bandwidth:
    """The copy benchmark on this machine (``hw`` as detected here), as ``detect`` runs it."""
    return measure_ram_bandwidth(
        buffer_bytes=benchmark_bytes(hw.memory.available),
        threads=benchmark_threads(hw.cpu.usable_cores),
    )


@dataclass(frozen=True)
class KeptRate:
    machine: str  # the machine's fingerprint (``core/tuning/identity.machine_key``)
    bytes_per_s: float
    note: str  # how it was measured
    when: float

    def bandwidth(self) -> Bandwidth:
        day = time.strftime("%Y-%m-%d", time.localtime(self.when))
        return Bandwidth(
            self.bytes_per_s, "measured", f"{self.note}; measured here on {day} ({REMEASURE})"
        )


def _parse(data: Any) -> dict[str, KeptRate]:
    d = check_dict(data, "RAM bandwidth record")
    if check_int(d.get("schema"), "schema", SCHEMA, SCHEMA) != SCHEMA:
        raise ValueError("unknown schema")
    machines = d.get("machines", [])
    if not isinstance(machines, list):
        raise ValueError("machines must be a list")
    out: dict[str, KeptRate] = {}
    for item in machines[:MAX_MACHINES]:
        item = check_dict(item, "machine")
        rec = KeptRate(
            machine=check_text(item["machine"], "machine", 64),
            bytes_per_s=check_float(item["bytes_per_s"], "bytes_per_s", 1e6, 1e14),
            note=check_text(item["note"], "note", 1000),
            when=check_float(item["when"], "when", 0.0, 1e11),
        )
        out[rec.machine] = rec
    return out


_lock = threading.Lock()
# measured in this process, per machine: a second state folder gets the same figure
_measured: dict[str, Bandwidth] = {}


class RamBandwidthStore:
    """The RAM bandwidth measured on each machine this state folder served."""

    def __init__(self, state_dir: Path, clock: Callable[[], float] = time.time) -> None:
        self.path = state_dir / RECORD_FILE
        self._clock = clock
        self.note = ""  # what was set aside, if the file was damaged

    def _records(self) -> dict[str, KeptRate]:
        out, note = load_checked(
            self.path,
            _parse,
            what="record of the RAM bandwidth",
            limit=MAX_FILE_BYTES,
            clock=self._clock,
        )
        if note:
            self.note = note
        return out or {}

    def get(self, machine: str) -> KeptRate | None:
        return self._records().get(machine)

    def put(self, machine: str, bw: Bandwidth) -> KeptRate:
        rec = KeptRate(machine, bw.bytes_per_s, bw.note, self._clock())
        with _lock:
            recs = self._records()
            recs[machine] = rec
            kept = sorted(recs.values(), key=lambda r: r.when)[-MAX_MACHINES:]
            payload = {
                "schema": SCHEMA,
                "machines": [
                    {"machine": r.machine, "bytes_per_s": r.bytes_per_s, "note": r.note,
                     "when": r.when}
                    for r in kept
                ],
            }  # fmt: skip
            write_private(self.path, json.dumps(payload, indent=1) + "\n")
        return rec


def kept_ram_bandwidth(
    store: RamBandwidthStore,
    machine: str,
    measure: Callable[[], Bandwidth] | None,
    *,
    again: bool = False,
) -> Bandwidth | None:
    """The RAM bandwidth of ``machine``: the kept figure; else (or with ``again``)
    ``measure()`` now, kept for every later view; None when nothing is kept and there
    is nothing to measure with (the caller then estimates)."""
    if not again:
        kept = store.get(machine)
        if kept is not None:
            return kept.bandwidth()
    if measure is None:
        return None
    bw = _measured.get(machine) if not again else None
    if bw is None:
        bw = measure()
        if bw.source != "measured" or bw.bytes_per_s <= 0:
            return bw
        _measured[machine] = bw
    try:
        return store.put(machine, bw).bandwidth()
    except OSError:
        return bw  # not kept (a read-only state folder): this run's figure all the same
