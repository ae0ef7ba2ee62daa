"""The entry point: builds the core services once (:mod:`k3desk.core.app.services`), then
hands them to a shell.

``k3desk`` with a sub-command runs the CLI; with no arguments it opens the
desktop app (Qt is imported only then, lazily).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from k3desk.core.app.services import Services
from k3desk.core.hub import _hfchild

__all__ = ["Services", "gui_main", "main"]


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
