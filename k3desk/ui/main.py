"""Entry point of the desktop app: ``run_gui(services, args)``.

Options (after ``k3desk`` / ``k3desk --gui``):
  --page NAME        open on a page (chat, models, downloads, engine, settings)
  --wizard           open the tier-picker wizard even when not the first run
  --no-wizard        never open the wizard automatically
  --hardware FILE    judge the tiers for the machine described in FILE (launches here
                     still plan for this machine)

Automation hook (tests, tiny on purpose): with ``K3DESK_AUTOMATION=1`` the app
prints one JSON line ``{"event": "ready", ...}`` to stdout once the main
window is shown, and reads JSON commands from stdin, one per line, answering
each with one JSON line (see :mod:`k3desk.ui.automation`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication

from k3desk.core.app.instance import claim, holder, socket_name
from k3desk.core.app.values import K3Error, Settings
from k3desk.ui.context import AppContext
from k3desk.ui.errors import ErrorReporter, setup_logging
from k3desk.ui.tasks import TaskManager

if TYPE_CHECKING:
    from k3desk.core.app.services import Services
    from k3desk.ui.window import MainWindow

APP_ID = "k3desk"
_SIGTERM_WAKE: list[object] = []
_KEPT: list[object] = []  # the one-app lock and the socket second starts reach
ANSWER_WITHIN_S = 20.0  # how long a second start waits for the running app (it may be starting)


def gui_parser(prog: str = "k3desk-gui") -> argparse.ArgumentParser:
    """The desktop app's options; ``--help`` prints them (and opens no window)."""
    from k3desk.ui.window import PAGES

    parser = argparse.ArgumentParser(
        prog=prog,
        description="Open the k3desk desktop app: pick, download, launch and chat with "
        "Kimi-K3 on this machine.",
        epilog="Every capability is also a command: run `k3desk --help`. Qt's own options "
        "(e.g. -platform offscreen) are passed on to Qt.",
    )
    parser.add_argument("--gui", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--page", default="", choices=[p.key for p in PAGES], help="open on this page"
    )
    parser.add_argument(
        "--wizard", action="store_true", help="open the tier-picker wizard even after the first run"
    )
    parser.add_argument(
        "--no-wizard", action="store_true", help="never open the wizard automatically"
    )
    parser.add_argument(
        "--hardware",
        default="",
        metavar="FILE",
        help="judge the tiers for the machine described in FILE (`k3desk doctor --json` "
        "output); launches here still plan for this machine",
    )
    return parser


def parse_args(args: Sequence[str], prog: str = "k3desk-gui") -> argparse.Namespace:
    """Parse the app's options; unknown ones are left for Qt.  ``--help`` and bad
    values print a message and exit, before any window exists."""
    ns, _unknown = gui_parser(prog).parse_known_args(list(args))
    return ns


def ensure_app() -> QApplication:
    app = QApplication.instance()
    if isinstance(app, QApplication):
        return app
    app = QApplication([sys.argv[0] if sys.argv else APP_ID])
    return app


def create_context(services: Services, app: QApplication, *, theme: bool = True) -> AppContext:
    """Build the shared context: logging, task manager, error reporter, settings, theme."""
    from k3desk.ui import theme as theme_mod

    app.setApplicationName(APP_ID)
    app.setApplicationDisplayName("k3desk")
    app.setOrganizationName(APP_ID)
    app.setDesktopFileName(APP_ID)
    app.setWindowIcon(theme_mod.app_icon())
    paths = services.paths.ensure()
    log_file = setup_logging(paths.logs_dir)
    tasks = TaskManager(app)
    reporter = ErrorReporter(log_file, app)
    tasks.default_error_handler = reporter.report
    store = services.settings_store
    settings_error: K3Error | None = None
    try:
        settings = store.load()
    except K3Error as exc:
        settings, settings_error = Settings(), exc
    tm = theme_mod.ThemeManager(app, settings.theme) if theme else None
    from k3desk.ui import wheel

    wheel.install(app)
    ctx = AppContext(services, tasks, reporter, store, settings, tm, parent=app)
    if settings_error is not None:
        ctx.first_run = False  # the file exists; do not overwrite it behind the user's back
        ctx.settings_unreadable = True
        err = settings_error
        QTimer.singleShot(0, lambda: reporter.report(err))
    return ctx


def build_window(ctx: AppContext, ns: argparse.Namespace | None = None) -> MainWindow:
    from k3desk.ui.window import MainWindow

    ns = ns or parse_args([])
    if ns.hardware:
        ctx.hardware.load_file(ns.hardware)
    window = MainWindow(ctx)
    ctx.reporter.parent_widget = window
    window.show_page(ns.page or "chat")
    return window


def run_gui(services: Services, args: Sequence[str], prog: str = "k3desk") -> int:
    t0 = time.perf_counter()
    ns = parse_args(args, prog)
    app = ensure_app()
    first, name = _claim(services)
    if not first:
        forwarded = _bring_forward(services, name, ns)
        if forwarded is not None:
            return forwarded
        first = True  # the app that held the lock ended meanwhile: this one is the app
    ctx = create_context(services, app)
    ctx.reporter.install_hooks(ctx.tasks.run_on_main)
    window = build_window(ctx, ns)
    if name:
        from k3desk.ui.instance import InstanceServer

        def show(request: dict[str, object]) -> None:
            window.bring_forward(str(request.get("page") or ""))

        server = InstanceServer(name, show, app)
        # quitting: a start from now on waits for the lock instead of being answered
        app.aboutToQuit.connect(server.server.close)
        _KEPT.append(server)
    window.show()
    if (ctx.first_run or ns.wizard) and not ns.no_wizard:
        QTimer.singleShot(0, window.open_wizard)
    automation = None
    if os.environ.get("K3DESK_AUTOMATION") == "1":
        from k3desk.ui.automation import Automation

        automation = Automation(ctx, window, started=t0)
        QTimer.singleShot(0, automation.announce_ready)
    app.aboutToQuit.connect(lambda: _shutdown(ctx))
    _quit_on_sigterm(app)
    rc = app.exec()
    if automation is not None:
        automation.close()
    return int(rc)


def _claim(services: Services) -> tuple[bool, str]:
    """Whether this is the home's one app (it then holds the lock for as long as it runs),
    and the socket name second starts reach it by ("" when the runtime folder cannot
    hold them: the app opens, alone or not)."""
    try:
        name = socket_name(services.paths)
        lock = claim(services.paths)
    except OSError as exc:
        sys.stderr.write(f"k3desk: cannot tell whether k3desk is already open ({exc})\n")
        return True, ""
    if lock is None:
        return False, name
    _KEPT.append(lock)  # held until the process ends
    return True, name


def _bring_forward(services: Services, name: str, ns: argparse.Namespace) -> int | None:
    """A second start: the running app brings its window forward, and this one exits
    (0; 1 when the app holding the lock never answers).  None when that app ended
    meanwhile (quitting as this one started) and this process now holds the lock."""
    from k3desk.ui.instance import ask_running

    deadline = time.monotonic() + ANSWER_WITHIN_S
    answer = None
    while answer is None and time.monotonic() < deadline:
        left = deadline - time.monotonic()
        answer = ask_running(name, {"cmd": "show", "page": ns.page}, left, connect_for=2.0)
        if answer is None and _claim(services)[0]:
            return None
    pid = answer.get("pid") if answer is not None else holder(services.paths)
    automation = os.environ.get("K3DESK_AUTOMATION") == "1"
    if answer is not None and answer.get("ok"):
        if automation:
            sys.stdout.write(json.dumps({"event": "forwarded", "pid": pid}) + "\n")
        else:
            sys.stdout.write(f"k3desk is already open (process {pid}): its window is in front.\n")
        sys.stdout.flush()
        return 0
    why = (
        f"k3desk is already open (process {pid}) but did not answer; wait for it, or end "
        f"that process (kill {pid}) and start k3desk again."
    )
    if automation:
        sys.stdout.write(json.dumps({"event": "not-answered", "pid": pid}) + "\n")
        sys.stdout.flush()
    sys.stderr.write(why + "\n")
    if os.environ.get("QT_QPA_PLATFORM") != "offscreen":
        from PySide6.QtWidgets import QMessageBox

        QMessageBox.warning(None, "k3desk", why)
    return 1


def _quit_on_sigterm(app: QApplication) -> None:
    """SIGTERM quits the app in order (the engine stopped as on any exit): what stops an
    engine kept in the background (:mod:`k3desk.core.app.background`).  The signal wakes
    the event loop through a socket (``signal.set_wakeup_fd``)."""
    import signal
    import socket

    from PySide6.QtCore import QSocketNotifier

    try:
        reader, writer = socket.socketpair()
        reader.setblocking(False)
        writer.setblocking(False)
        signal.set_wakeup_fd(writer.fileno())
        signal.signal(signal.SIGTERM, lambda _sig, _frame: None)
    except (ValueError, OSError):  # not the main thread, or no socket pair
        return
    notifier = QSocketNotifier(reader.fileno(), QSocketNotifier.Type.Read, app)

    def woke() -> None:
        try:
            data = reader.recv(64)
        except OSError:
            return
        if signal.SIGTERM in data:
            app.quit()

    notifier.activated.connect(woke)
    _SIGTERM_WAKE[:] = [reader, writer, notifier]  # kept alive with the app


def _shutdown(ctx: AppContext) -> None:
    ctx.close()
    ctx.tasks.shutdown(timeout=5.0)
