"""One k3desk per person: the lock in the private runtime folder that the desktop app
holds while it runs, and the name of the socket second starts reach it by."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from k3desk.core.app.instance import claim, holder, socket_name
from k3desk.core.paths import default_paths

HOLD = (
    "import sys, time\n"
    "from k3desk.core.app.instance import claim\n"
    "from k3desk.core.paths import default_paths\n"
    "lock = claim(default_paths())\n"
    "print('held' if lock else 'refused', flush=True)\n"
    "time.sleep(60)\n"
)


def test_one_process_holds_the_lock_and_a_kill_9_frees_it(tmp_path: Path) -> None:
    paths = default_paths()
    first = subprocess.Popen(
        [sys.executable, "-c", HOLD], stdout=subprocess.PIPE, text=True, env=dict(os.environ)
    )
    try:
        assert first.stdout is not None
        assert first.stdout.readline().strip() == "held"
        assert claim(paths) is None  # a second start: the app is open
        assert holder(paths) == first.pid
        run = paths.state / "run"
        assert (run.stat().st_mode & 0o777) == 0o700
        assert ((run / "app.lock").stat().st_mode & 0o777) == 0o600
    finally:
        first.kill()  # kill -9: no clean-up ran, the file stays
        first.wait()
        if first.stdout is not None:
            first.stdout.close()
    assert (paths.state / "run" / "app.lock").exists()
    t0 = time.monotonic()
    lock = claim(paths)  # taken over at once: the kernel let go of the dead one's lock
    assert lock is not None
    assert time.monotonic() - t0 < 1
    assert holder(paths) == os.getpid()
    lock.release()


def test_the_socket_lies_in_the_runtime_folder_or_a_private_one_when_too_long(
    tmp_path: Path,
) -> None:
    short = default_paths({"K3DESK_HOME": str(tmp_path / "h")})
    assert socket_name(short) == str(short.state / "run" / "app.sock")
    deep = default_paths({"K3DESK_HOME": str(tmp_path / ("d" * 120))})
    name = Path(socket_name(deep))
    assert len(os.fsencode(name)) < 104  # fits an AF_UNIX address (sun_path)
    assert name.parent.name == f"k3desk-{os.getuid()}"
    assert (name.parent.stat().st_mode & 0o777) == 0o700
    assert socket_name(deep) == str(name)  # the same home: the same socket
    other = default_paths({"K3DESK_HOME": str(tmp_path / ("e" * 120))})
    assert socket_name(other) != str(name)  # another home: another app
