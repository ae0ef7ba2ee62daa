"""The Engine page's live log: the filter and the Copy log button."""

from __future__ import annotations

from PySide6.QtWidgets import QApplication

from k3desk.ui.engine.page import EnginePage

LOG = [
    "main: build = 0 (unknown)",
    "llama_model_loader: loaded meta data with 48 key-value pairs",
    "load_tensors: CPU_Mapped model buffer size = 12.34 MiB",
    "srv  load_model: loading model '/m/Kimi-K3-UD-IQ1_S-00001-of-00009.gguf'",
    "main: server is listening on http://127.0.0.1:41234 - starting the main loop",
    "srv  log_server_r: request: GET /health 127.0.0.1 200",
    "srv  operator(): ERROR: Load failed for a second request",
]


def test_the_filter_keeps_matching_lines_and_copy_log_copies_what_is_shown(ctx, qtbot) -> None:  # type: ignore[no-untyped-def]
    page = EnginePage(ctx)
    qtbot.addWidget(page)
    page.show()
    page.tabs.setCurrentIndex(1)
    clipboard = QApplication.clipboard()
    clipboard.setText("before")
    assert not page.copy_log.isEnabled()
    assert page.copy_log.toolTip() == "The engine has not written a log line yet."

    # the engine controller delivers the supervisor's lines in batches
    engine = ctx.engine
    engine.log_lines.emit("\n".join(LOG[:4]) + "\n")
    assert page.log.toPlainText() == "\n".join(LOG[:4])
    page.copy_log.click()
    assert clipboard.text() == "\n".join(LOG[:4])

    # a filter (any case) keeps the matching lines, also of lines that arrive later
    page.filter.setText("LOAD")
    engine.log_lines.emit("\n".join(LOG[4:]) + "\n")
    kept = [ln for ln in LOG if "load" in ln.lower()]
    assert len(kept) == 4
    assert page.log.toPlainText().splitlines() == kept
    page.copy_log.click()
    assert clipboard.text() == "\n".join(kept)

    # nothing matches: nothing to copy, and the button says why
    page.filter.setText("CUDA")
    assert page.log.toPlainText() == ""
    assert not page.copy_log.isEnabled()
    assert page.copy_log.toolTip() == "No line contains 'CUDA'."

    # no filter: every line again, in order
    page.filter.clear()
    assert page.log.toPlainText().splitlines() == LOG
    assert page.copy_log.isEnabled()
    page.copy_log.click()
    assert clipboard.text() == "\n".join(LOG)
