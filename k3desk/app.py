"""The composition root: builds the core services once, then hands them to a shell.

``k3desk`` with a sub-command runs the CLI; with no arguments it opens the
desktop app (Qt is imported only then, lazily).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from functools import cached_property
from typing import TYPE_CHECKING

from k3desk.core.paths import AppPaths, default_paths
from k3desk.core.resources import resources_dir

if TYPE_CHECKING:
    from k3desk.core.catalog.loader import Catalog


class Services:
    """Every long-lived core object, built lazily and shared by the CLI and the GUI."""

    def __init__(self, paths: AppPaths | None = None) -> None:
        self.paths = paths or default_paths()
        self.resources = resources_dir()

    @cached_property
    def catalog(self) -> Catalog:
        from k3desk.core.catalog.loader import load_catalog

        return load_catalog(self.resources / "catalog.json")


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    services = Services()
    if not args or args[0] in ("--gui",) or (args and args[0].startswith("--install-desktop")):
        if args and args[0].startswith("--install-desktop"):
            from k3desk.cli import main as cli_main

            return cli_main(["desktop-entry", "install"], services)
        from k3desk.ui.main import run_gui  # lazily: Qt only for the GUI

        return run_gui(services, args)
    from k3desk.cli import main as cli_main

    return cli_main(args, services)


def gui_main() -> int:
    return main([])
