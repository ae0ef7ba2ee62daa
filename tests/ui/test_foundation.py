"""The task manager, the signal bridge, settings and error reporting."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from k3desk.core.errors import Cancelled, K3Error
from k3desk.core.progress import CancelToken
from k3desk.core.settings import Settings, SettingsError, SettingsStore
from k3desk.ui.bridge import Relay, StreamBuffer, Throttled
from k3desk.ui.tasks import TaskManager


def test_task_callbacks_run_on_the_main_thread(qtbot) -> None:
    tm = TaskManager()
    main = threading.get_ident()
    seen: dict[str, int] = {}

    def work(_token: CancelToken) -> int:
        seen["worker"] = threading.get_ident()
        return 42

    results: list[int] = []
    tm.run(work, on_done=lambda r: (results.append(r), seen.update(done=threading.get_ident())))
    qtbot.waitUntil(lambda: results == [42], timeout=5000)
    assert seen["worker"] != main
    assert seen["done"] == main
    tm.shutdown()


def test_errors_and_cancellation_reach_the_right_callback(qtbot) -> None:
    tm = TaskManager()
    errors: list[BaseException] = []
    cancelled: list[bool] = []

    tm.run(
        lambda _t: (_ for _ in ()).throw(K3Error("bad shard", "re-download")),
        on_error=errors.append,
    )

    def slow(token: CancelToken) -> None:
        while not token.wait(0.01):
            pass
        raise Cancelled()

    task = tm.run(
        slow,
        on_done=lambda _r: pytest.fail("not cancelled"),
        on_cancelled=lambda: cancelled.append(True),
    )
    task.cancel()
    qtbot.waitUntil(lambda: bool(errors and cancelled), timeout=5000)
    assert isinstance(errors[0], K3Error)
    assert errors[0].message == "bad shard"
    assert tm.active == 0
    tm.shutdown()


def test_nothing_starts_once_the_app_is_quitting(qtbot) -> None:
    """A handler that starts work after the shutdown (a late refresh at quit) starts
    nothing and raises nothing: the task comes back cancelled and no callback runs."""
    tm = TaskManager()
    tm.shutdown()
    ran: list[str] = []
    task = tm.run(
        lambda _t: ran.append("work"),
        on_done=lambda _r: ran.append("done"),
        on_error=lambda _e: ran.append("error"),
        on_cancelled=lambda: ran.append("cancelled"),
        on_finally=lambda: ran.append("finally"),
    )
    qtbot.wait(100)
    assert ran == []
    assert task.token.cancelled
    assert not task.running
    assert tm.active == 0


def test_serial_tasks_run_in_submission_order(qtbot) -> None:
    tm = TaskManager()
    order: list[int] = []
    for i in range(20):
        tm.run(lambda _t, i=i: (time.sleep(0.001 * (20 - i)), order.append(i)), serial=True)
    qtbot.waitUntil(lambda: len(order) == 20, timeout=5000)
    assert order == list(range(20))
    tm.shutdown()


def test_relay_delivers_worker_calls_as_main_thread_signals(qtbot) -> None:
    relay = Relay()
    got: list[tuple[int, int]] = []
    relay.fired.connect(lambda v: got.append((v, threading.get_ident())))
    t = threading.Thread(target=lambda: [relay(i) for i in range(5)])
    t.start()
    t.join()
    qtbot.waitUntil(lambda: len(got) == 5, timeout=3000)
    assert [v for v, _ in got] == list(range(5))
    assert {tid for _, tid in got} == {threading.get_ident()}


def test_throttled_keeps_only_the_newest_value(qtbot) -> None:
    th = Throttled(hz=20)
    got: list[int] = []
    th.fired.connect(got.append)
    t = threading.Thread(target=lambda: [th(i) for i in range(10_000)])
    t.start()
    t.join()
    qtbot.waitUntil(lambda: bool(got) and got[-1] == 9999, timeout=3000)
    assert len(got) < 20  # 10,000 calls collapsed into a handful of updates


def test_stream_buffer_batches_without_losing_text(qtbot) -> None:
    buf = StreamBuffer(hz=30)
    batches: list[dict] = []
    buf.batch.connect(batches.append)

    def produce() -> None:
        for i in range(3000):
            buf.append("content", f"{i} ")
            if i % 3 == 0:
                buf.append("reasoning", "r")
            if i % 500 == 0:
                time.sleep(0.02)

    t = threading.Thread(target=produce)
    t.start()
    t.join()
    qtbot.waitUntil(lambda: sum(b["#pieces"] for b in batches) == 4000, timeout=5000)
    text = "".join(b.get("content", "") for b in batches)
    assert text == "".join(f"{i} " for i in range(3000))
    assert "".join(b.get("reasoning", "") for b in batches) == "r" * 1000
    assert len(batches) < 60


def test_settings_round_trip_and_first_run(tmp_path: Path) -> None:
    store = SettingsStore(tmp_path / "config" / "settings.json")
    assert not store.exists
    assert store.load() == Settings()
    s = Settings(model_dirs=("/models/a",), ctx=16384, theme="dark", thinking=False)
    store.save(s)
    assert store.exists
    assert store.load() == s


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("{not json", "cannot be read"),
        ("[1, 2]", "must hold a JSON object"),
        (json.dumps({"ctx": "lots"}), "wrong type"),
        (json.dumps({"theme": "purple"}), "theme 'purple'"),
    ],
)
def test_bad_settings_file_is_named_in_the_error(
    tmp_path: Path, content: str, expected: str
) -> None:
    path = tmp_path / "settings.json"
    path.write_text(content)
    with pytest.raises(SettingsError) as info:
        SettingsStore(path).load()
    assert expected in info.value.message
    assert str(path) in info.value.message
    assert info.value.hint


def test_unexpected_errors_are_logged_not_shown_as_tracebacks(ctx, qtbot) -> None:
    reported: list[tuple[str, str, bool]] = []
    ctx.reporter.reported.connect(lambda m, h, u: reported.append((m, h, u)))

    def boom(_t: CancelToken) -> None:
        raise ZeroDivisionError("division by zero")

    ctx.tasks.run(boom)
    ctx.tasks.run(lambda _t: (_ for _ in ()).throw(K3Error("Shard 2 is missing", "Download it")))
    qtbot.waitUntil(lambda: len(reported) == 2, timeout=5000)
    unexpected = next(r for r in reported if r[2])
    expected = next(r for r in reported if not r[2])
    assert unexpected[0] == "Unexpected error: ZeroDivisionError: division by zero"
    assert "Traceback" not in unexpected[0] + unexpected[1]
    assert str(ctx.reporter.log_file) in unexpected[1]
    log_text = ctx.reporter.log_file.read_text()
    assert "Traceback" in log_text
    assert "ZeroDivisionError" in log_text
    assert expected[:2] == ("Shard 2 is missing", "Download it")


def test_the_app_log_and_its_rotations_are_private(tmp_path: Path) -> None:
    """The log can hold prompts and paths: 0600 in a 0700 folder, whatever the umask."""
    import logging
    import os
    import stat

    from k3desk.ui.errors import setup_logging

    old = os.umask(0)
    root = logging.getLogger()
    try:
        path = setup_logging(tmp_path / "logs")
        handler = next(h for h in root.handlers if getattr(h, "baseFilename", "") == str(path))
        handler.maxBytes = 200  # type: ignore[attr-defined]
        for i in range(20):
            logging.getLogger("k3desk.test").warning("line %d of a private log", i)
        handler.flush()
    finally:
        os.umask(old)
        for h in [
            h for h in root.handlers if getattr(h, "baseFilename", "").startswith(str(tmp_path))
        ]:
            root.removeHandler(h)
            h.close()
    files = sorted((tmp_path / "logs").iterdir())
    assert len(files) > 1  # rotated at least once
    assert {stat.S_IMODE(p.stat().st_mode) for p in files} == {0o600}
    assert stat.S_IMODE((tmp_path / "logs").stat().st_mode) == 0o700
