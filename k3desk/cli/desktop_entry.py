"""``k3desk desktop-entry install|uninstall|show``: the launcher in the desktop's menus.

Writes a freedesktop ``.desktop`` file to ``$XDG_DATA_HOME/applications`` (default
``~/.local/share/applications``) whose ``Exec`` is the installed ``k3desk``, the icon
to ``$XDG_DATA_HOME/icons/hicolor`` (PNGs 48-512 and the SVG) and the AppStream
metainfo to ``$XDG_DATA_HOME/metainfo``.  ``k3desk --install-desktop-entry`` is the
same as ``k3desk desktop-entry install``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from k3desk.core.app.desktop import refresh_desktop_caches
from k3desk.core.app.values import K3Error, write_shared

if TYPE_CHECKING:
    from k3desk.core.app.services import Services

APP_ID = "k3desk"
METAINFO = "io.github.k3desk.k3desk.metainfo.xml"
ICON_SIZES = (48, 64, 128, 256, 512)


@dataclass(frozen=True)
class Installed:
    desktop: Path
    icons: tuple[Path, ...]
    metainfo: Path
    exec_line: str


def data_home(env: dict[str, str] | None = None) -> Path:
    e = os.environ if env is None else env
    base = e.get("XDG_DATA_HOME")
    return Path(base) if base else Path(e.get("HOME", str(Path.home()))) / ".local" / "share"


def launcher_command() -> list[str]:
    """How the desktop should start k3desk: the frozen app, the installed script, or python -m."""
    # the interpreter path is kept as is (not resolved): a venv's python is a symlink
    python = Path(sys.executable).absolute()
    if getattr(sys, "frozen", False):
        return [str(python), "--gui"]
    script = python.with_name("k3desk")
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script), "--gui"]
    found = shutil.which("k3desk")
    if found:
        return [str(Path(found).absolute()), "--gui"]
    package_root = Path(__file__).resolve().parents[2]
    if not str(package_root).startswith(sys.prefix):
        # a source checkout that is not pip-installed: tell python where it is
        return ["env", f"PYTHONPATH={package_root}", str(python), "-m", "k3desk", "--gui"]
    return [str(python), "-m", "k3desk", "--gui"]


def desktop_entry_text(resources: Path, command: list[str]) -> str:
    template = resources / "desktop" / "k3desk.desktop.in"
    try:
        text = template.read_text(encoding="utf-8")
    except OSError as exc:
        raise K3Error(
            f"The desktop entry template {template} cannot be read: {exc.strerror or exc}.",
            "Reinstall k3desk: its resources folder is incomplete.",
        ) from None
    exec_line = " ".join(_quote(a) for a in command)
    try_exec = command[2] if command[0] == "env" else command[0]
    return text.replace("@EXEC@", exec_line).replace("@TRYEXEC@", try_exec)


def _quote(arg: str) -> str:
    """Quote per the Desktop Entry spec (double quotes; escape \\ " ` $)."""
    if arg and all(c.isalnum() or c in "-_./+:=@" for c in arg):
        return arg
    escaped = "".join("\\" + c if c in '\\"`$' else c for c in arg)
    return f'"{escaped}"'


def install(resources: Path, target: Path | None = None) -> Installed:
    base = target or data_home()
    apps = base / "applications"
    icons_root = base / "icons" / "hicolor"
    meta_dir = base / "metainfo"
    command = launcher_command()
    text = desktop_entry_text(resources, command)
    written: list[Path] = []
    try:
        # for the desktop to read, never for others to change: its Exec line is run
        desktop = apps / f"{APP_ID}.desktop"
        write_shared(desktop, text)
        for size in ICON_SIZES:
            src = resources / "icons" / "hicolor" / f"{size}x{size}" / "apps" / f"{APP_ID}.png"
            if src.is_file():
                dest = icons_root / f"{size}x{size}" / "apps" / f"{APP_ID}.png"
                write_shared(dest, src.read_bytes())
                written.append(dest)
        svg = resources / "icons" / f"{APP_ID}.svg"
        if svg.is_file():
            dest = icons_root / "scalable" / "apps" / f"{APP_ID}.svg"
            write_shared(dest, svg.read_bytes())
            written.append(dest)
        metainfo = meta_dir / METAINFO
        write_shared(metainfo, (resources / "desktop" / METAINFO).read_bytes())
    except OSError as exc:
        where = exc.filename or base
        raise K3Error(
            f"Cannot write the desktop entry to {where}: {exc.strerror or exc}.",
            "Check that the folder is writable, or set XDG_DATA_HOME to one that is.",
        ) from None
    if not written:
        raise K3Error(
            f"No icon files were found under {resources / 'icons'}.",
            "Reinstall k3desk: its resources folder is incomplete.",
        )
    refresh_desktop_caches(apps, icons_root)
    return Installed(desktop, tuple(written), metainfo, " ".join(_quote(a) for a in command))


def uninstall(target: Path | None = None) -> list[Path]:
    base = target or data_home()
    paths = [base / "applications" / f"{APP_ID}.desktop", base / "metainfo" / METAINFO]
    paths += [
        base / "icons" / "hicolor" / f"{s}x{s}" / "apps" / f"{APP_ID}.png" for s in ICON_SIZES
    ]
    paths.append(base / "icons" / "hicolor" / "scalable" / "apps" / f"{APP_ID}.svg")
    removed = []
    for p in paths:
        if p.is_file():
            p.unlink()
            removed.append(p)
    return removed


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "desktop-entry",
        help="add k3desk to the desktop's application menu",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("action", choices=("install", "uninstall", "show"), nargs="?", default="install")
    p.add_argument(
        "--prefix",
        type=Path,
        default=None,
        help="data folder to write to (default: $XDG_DATA_HOME or ~/.local/share)",
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace, services: Services) -> int:
    if args.action == "show":
        print(desktop_entry_text(services.resources, launcher_command()), end="")
        return 0
    if args.action == "uninstall":
        removed = uninstall(args.prefix)
        print(f"Removed {len(removed)} file(s)." if removed else "Nothing to remove.")
        return 0
    done = install(services.resources, args.prefix)
    print(f"Desktop entry: {done.desktop}")
    print(f"Starts: {done.exec_line}")
    print(f"Icons: {len(done.icons)} files under {done.icons[0].parents[2]}")
    print(f"AppStream: {done.metainfo}")
    print("k3desk is now in your application menu (log out and in if it does not show yet).")
    return 0
