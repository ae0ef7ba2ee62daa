"""The composition root: builds the core services once, then hands them to a shell.

``k3desk`` with a sub-command runs the CLI; with no arguments it opens the
desktop app (Qt is imported only then, lazily).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from k3desk.core.hub import _hfchild
from k3desk.core.paths import AppPaths, default_paths, legacy_paths, migrate_legacy
from k3desk.core.resources import resources_dir

if TYPE_CHECKING:
    from k3desk.core.catalog.loader import Catalog
    from k3desk.core.hardware.profile import HardwareProfile
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
        """This machine's profile, detected once per disk path (free space included)."""
        key = (str(disk_path) if disk_path is not None else "", measure_bandwidth)
        if key not in self._hardware:
            from k3desk.core.hardware.detect import detect_hardware

            self._hardware[key] = detect_hardware(disk_path, measure_bandwidth=measure_bandwidth)
        return self._hardware[key]

    def load_hardware(self, path: str | Path) -> HardwareProfile:
        """A hardware file (``k3desk doctor --json`` output); missing bandwidths are filled in."""
        from k3desk.core.hardware.bandwidth import fill_missing_bandwidths
        from k3desk.core.hardware.profile import HardwareProfile

        return fill_missing_bandwidths(HardwareProfile.from_json_file(path))


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == [_hfchild.HUB_CHILD_FLAG]:
        # a download child of this very program (a frozen build has no `python -m`)
        return _hfchild.main()
    services = Services()
    # the desktop app's own options (k3desk.ui.main) open it without --gui as well
    gui_options = ("--gui", "--page", "--wizard", "--no-wizard", "--hardware")
    if (
        not args
        or args[0].split("=", 1)[0] in gui_options
        or args[0].startswith("--install-desktop")
    ):
        if args and args[0].startswith("--install-desktop"):
            from k3desk.cli import main as cli_main

            return cli_main(["desktop-entry", "install"], services)
        from k3desk.ui.main import run_gui  # lazily: Qt only for the GUI

        return run_gui(services, args)
    from k3desk.cli import main as cli_main

    return cli_main(args, services)


def gui_main() -> int:
    """``k3desk-gui``: the desktop app, with its own options (``k3desk-gui --help``)."""
    args = sys.argv[1:]
    if args[:1] == [_hfchild.HUB_CHILD_FLAG]:
        return _hfchild.main()
    from k3desk.ui.main import run_gui  # lazily: Qt only for the GUI

    return run_gui(Services(), args, prog="k3desk-gui")
