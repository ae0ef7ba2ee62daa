"""The composition root: every long-lived core object, built once and shared by the shells.

``k3desk.app`` (the entry point) builds one :class:`Services` and hands it to the CLI
or to the desktop app; both call the use-cases of :mod:`k3desk.core.app` with it.
Everything is built lazily, so ``k3desk doctor --json`` does not pay for the catalog.
"""

from __future__ import annotations

import os
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from k3desk.core.paths import AppPaths, default_paths, legacy_paths, migrate_legacy
from k3desk.core.resources import resources_dir

if TYPE_CHECKING:
    from k3desk.core.catalog.loader import Catalog
    from k3desk.core.catalog.model import Tier
    from k3desk.core.hardware.profile import HardwareProfile
    from k3desk.core.planning.model import PlanOptions
    from k3desk.core.secrets import SecretStore
    from k3desk.core.settings import Settings, SettingsStore


class Services:
    """Every long-lived core object, built lazily and shared by the CLI and the GUI."""

    def __init__(self, paths: AppPaths | None = None) -> None:
        if paths is None:
            paths = default_paths()
            if not os.environ.get("K3DESK_HOME"):
                migrate_legacy(paths, legacy_paths())  # once: the folders of older versions
        self.paths = paths
        self.resources = resources_dir()
        self._hardware: dict[tuple[str, bool], HardwareProfile] = {}

    @cached_property
    def catalog(self) -> Catalog:
        from k3desk.core.catalog.loader import load_catalog

        return load_catalog(self.resources / "catalog.json")

    def catalog_tiers(self) -> tuple[Tier, ...]:
        """The catalog's tiers, or none when the catalog cannot be read.

        For advice only (which tier a shard set is, its card's ``--n-cpu-moe``): a
        broken catalog must not stop planning or launching a model file.
        """
        from k3desk.core.errors import CatalogError

        try:
            return tuple(self.catalog.tiers)
        except (CatalogError, OSError):
            return ()

    @cached_property
    def settings_store(self) -> SettingsStore:
        from k3desk.core.settings import SettingsStore

        return SettingsStore(self.paths.settings_file)

    @cached_property
    def secrets(self) -> SecretStore:
        """The one secret store (keyring, else this session) every shell uses."""
        from k3desk.core.secrets import SecretStore

        return SecretStore()

    def settings(self) -> Settings:
        """The saved settings, read afresh (the app may have changed them)."""
        return self.settings_store.load()

    def configured_engine(self) -> str | None:
        """The llama-server chosen in Settings, if any ('' = find one automatically).

        An unreadable settings file is reported when the app opens; the CLI then
        simply finds an engine itself.
        """
        from k3desk.core.errors import K3Error

        try:
            return self.settings().engine_binary or None
        except K3Error:
            return None

    def detect_hardware(
        self, disk_path: Path | None = None, *, measure_bandwidth: bool = True
    ) -> HardwareProfile:
        """This machine's profile, detected once per disk path (free space included).

        Its RAM bandwidth is the one figure kept for this machine
        (:mod:`k3desk.core.hardware.ram_rate`), so every view predicts the same speeds:
        measured now when none is kept yet, unless ``measure_bandwidth`` is False
        (then, with none kept, estimated from the CPU model)."""
        key = (str(disk_path) if disk_path is not None else "", measure_bandwidth)
        if key not in self._hardware:
            from k3desk.core.hardware.detect import detect_hardware

            hw = detect_hardware(disk_path, measure_bandwidth=False)
            self._hardware[key] = self._kept_bandwidth(hw, measure=measure_bandwidth)
        return self._hardware[key]

    def _kept_bandwidth(
        self, hw: HardwareProfile, *, measure: bool, again: bool = False
    ) -> HardwareProfile:
        from k3desk.core.hardware.bandwidth import with_ram_bandwidth
        from k3desk.core.hardware.ram_rate import (
            RamBandwidthStore,
            kept_ram_bandwidth,
            measure_here,
        )
        from k3desk.core.tuning.identity import machine_key

        store = RamBandwidthStore(self.paths.state)
        bw = kept_ram_bandwidth(
            store, machine_key(hw), (lambda: measure_here(hw)) if measure else None, again=again
        )
        return with_ram_bandwidth(hw, bw) if bw is not None else hw

    def measure_ram_again(self) -> HardwareProfile:
        """Measure this machine's RAM bandwidth again and keep the new figure: every view
        predicts with it from now on (``k3desk doctor --remeasure``)."""
        from k3desk.core.hardware.detect import detect_hardware

        self._hardware.clear()
        return self._kept_bandwidth(
            detect_hardware(None, measure_bandwidth=False), measure=True, again=True
        )

    def this_machine(self, disk_path: Path | None = None) -> HardwareProfile:
        """The machine k3desk runs on, as launches plan for it and the pages judge it
        (the RAM bandwidth kept for it: see :meth:`detect_hardware`)."""
        return self.detect_hardware(disk_path)

    def with_disk_rate(self, opts: PlanOptions, shard: Path) -> PlanOptions:
        """``opts`` with the read rate of the disk holding ``shard`` on this machine:
        kept from an earlier measurement of that disk, else measured now on the shard
        (at most 256 MiB, about a second; see :mod:`k3desk.core.hardware.disk_rate`),
        else the kind of device's figure.  Unknown: ``opts`` as they were."""
        from dataclasses import replace

        from k3desk.core.hardware.detect import filesystem_type
        from k3desk.core.hardware.disk_rate import DiskRateStore, read_around_bytes, read_rate

        try:
            real = shard.resolve()
        except OSError:
            return opts
        if opts.read_around_bytes is None:
            # what a page fault on the shards reads (planning/speed.py's streaming rules)
            opts = replace(opts, read_around_bytes=read_around_bytes(real))
        rate = read_rate(real, DiskRateStore(self.paths.state), filesystem=filesystem_type(real))
        if rate.bytes_per_s <= 0 or rate.source == "unknown":
            why = f" ({rate.note})" if rate.note else ""
            return replace(
                opts, disk_read_note=f"{opts.disk_read_bps / 1e9:.1f} GB/s, assumed{why}"
            )
        note = f"{rate.bytes_per_s / 1e9:.1f} GB/s, {rate.source}: {rate.note}"
        return replace(opts, disk_read_bps=rate.bytes_per_s, disk_read_note=note)

    def with_measured_disk(self, profile: HardwareProfile) -> HardwareProfile:
        """``profile`` with its disk's read rate measured on the largest GGUF file in the
        folder (or kept from an earlier measurement of that disk); as it was when the
        folder holds none or the file is sparse."""
        from dataclasses import replace

        from k3desk.core.hardware.disk_rate import DiskRateStore, largest_gguf, read_rate

        disk = profile.disk
        if disk is None:
            return profile
        sample = largest_gguf(Path(disk.probed_path))
        if sample is None:
            return profile
        rate = read_rate(sample, DiskRateStore(self.paths.state), filesystem=disk.filesystem)
        if rate.source != "measured":
            return profile
        return profile.with_disk(replace(disk, read_rate=rate))

    def load_hardware(self, path: str | Path) -> HardwareProfile:
        """A hardware file (``k3desk doctor --json`` output); missing bandwidths are filled in."""
        from k3desk.core.hardware.bandwidth import fill_missing_bandwidths
        from k3desk.core.hardware.profile import HardwareProfile

        return fill_missing_bandwidths(HardwareProfile.from_json_file(path))
