"""The first hour, polished: what a newcomer met on a real screen (issue 25's D-items)."""

from __future__ import annotations

import pytest
from PySide6.QtGui import QGuiApplication

from k3desk.ui.window import GEOMETRY_KEY, MainWindow


def _free(widget):  # type: ignore[no-untyped-def]
    return (widget.screen() or QGuiApplication.primaryScreen()).availableGeometry()


def test_the_window_opens_within_the_screen(ctx, qtbot) -> None:  # type: ignore[no-untyped-def]
    """D7: the offscreen screen is 800x800; a fixed 1280x800 hid the status bar."""
    w = MainWindow(ctx)
    qtbot.addWidget(w)
    w.show()
    qtbot.waitExposed(w)
    free = _free(w)
    assert free.width() < 1280  # the small screen this test is about
    assert w.width() <= free.width()
    assert w.height() <= free.height()
    bar = w.statusBar()
    assert bar.isVisible()
    assert bar.geometry().bottom() < w.height()


def test_a_size_saved_on_a_larger_screen_is_fitted(ctx, qtbot) -> None:  # type: ignore[no-untyped-def]
    ctx.remember(**{GEOMETRY_KEY: {"x": 0, "y": 0, "w": 1900, "h": 1150, "maximized": False}})
    w = MainWindow(ctx)
    qtbot.addWidget(w)
    w.show()
    free = _free(w)
    assert w.width() <= free.width()
    assert w.height() <= free.height()


def test_an_answer_that_is_only_reasoning_shows_it(qapp, qtbot) -> None:  # type: ignore[no-untyped-def]
    """D18: the body was empty and the heading said "Reasoning (1 words)"."""
    from k3desk.ui.chat.view import MessageView, MessageVM

    view = MessageView()
    qtbot.addWidget(view)
    view.set_messages(
        [
            MessageVM("1", "user", "Why?"),
            MessageVM("2", "assistant", "", reasoning="Because"),
        ]
    )
    text = view.toPlainText()
    assert "Reasoning (1 word)" in text
    assert "words" not in text
    assert "Because" in text  # shown without a click: it is all there is
    assert "wrote no answer" in text
    # and one with an answer keeps its reasoning folded
    view.set_messages([MessageVM("3", "assistant", "Yes.", reasoning="Because of two things")])
    assert "Because of" not in view.toPlainText()
    assert "Reasoning (4 words)" in view.toPlainText()


def test_an_answer_with_no_text_says_so(qapp, qtbot) -> None:  # type: ignore[no-untyped-def]
    """A model whose first token ends the turn left an empty bubble with no word."""
    from k3desk.ui.chat.view import MessageView, MessageVM

    view = MessageView()
    qtbot.addWidget(view)
    view.set_messages([MessageVM("1", "user", "Why?"), MessageVM("2", "assistant", " ")])
    assert "ended this answer without writing anything" in view.toPlainText()
    # not while it streams, nor for an answer with text, reasoning or its own note
    for vm in (
        MessageVM("3", "assistant", "", streaming=True),
        MessageVM("4", "assistant", "Yes."),
        MessageVM("5", "assistant", "", reasoning="Because"),
        MessageVM("6", "assistant", "", partial=True, partial_note="no answer arrived."),
    ):
        view.set_messages([vm])
        assert "without writing anything" not in view.toPlainText(), vm


def test_copy_says_copied(qapp, qtbot) -> None:  # type: ignore[no-untyped-def]
    """D23: Copy copied without a word."""
    from PySide6.QtCore import QUrl
    from PySide6.QtWidgets import QToolTip

    from k3desk.ui.chat.view import MessageView, MessageVM

    view = MessageView()
    qtbot.addWidget(view)
    view.show()
    view.set_messages([MessageVM("2", "assistant", "Use `-c 8192`:\n\n```bash\nk3desk serve\n```")])
    view.anchorClicked.emit(QUrl("k3:copy/2/0"))
    assert QGuiApplication.clipboard().text().startswith("Use")
    qtbot.waitUntil(QToolTip.isVisible, timeout=2000)
    assert QToolTip.text() == "Copied"
    view.anchorClicked.emit(QUrl("k3:copy-code/2/0"))
    assert QGuiApplication.clipboard().text() == "k3desk serve"
    assert QToolTip.text() == "Copied the code"


def _contrast(a: str, b: str) -> float:
    from PySide6.QtGui import QColor

    def lum(c: str) -> float:
        q = QColor(c)
        ch = [q.redF(), q.greenF(), q.blueF()]
        lin = [x / 12.92 if x <= 0.03928 else ((x + 0.055) / 1.055) ** 2.4 for x in ch]
        return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]

    hi, lo = sorted((lum(a), lum(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def _chat_page_with(ctx, qtbot, titles_and_texts):  # type: ignore[no-untyped-def]
    from k3desk.core.chat.history import HistoryStore
    from k3desk.ui.chat.page import ChatPage

    store = HistoryStore(ctx.services.paths.history_db)
    for title, text in titles_and_texts:
        conv = store.create_conversation(title)
        store.add_message(conv.id, "user", text)
        store.add_message(conv.id, "assistant", "Noted.")
    store.close()
    page = ChatPage(ctx)
    qtbot.addWidget(page)
    page.resize(1024, 700)
    page.show()
    qtbot.waitExposed(page)
    page.chat.refresh_list()
    qtbot.waitUntil(lambda: page.list.count() == len(titles_and_texts), timeout=5000)
    return page


LONG = (
    "Before we start, some background on the machine in the lab: it has two sockets and "
    "a lot of memory, and the pelicans that nest on the roof in winter make a racket."
)


def test_search_results_show_their_snippet_and_marks_stand_out(ctx, qtbot) -> None:  # type: ignore[no-untyped-def]
    """D5: the snippet was cut off (its height taken before the text wrapped), and the
    match in the transcript was marked in a colour barely off white."""
    from k3desk.ui import theme

    page = _chat_page_with(ctx, qtbot, [("Birds", LONG), ("Other", "Something else")])
    page.search.setText("pelicans")
    qtbot.waitUntil(lambda: page.list.count() == 1, timeout=5000)
    qtbot.wait(50)
    item = page.list.item(0)
    cell = page.list.itemWidget(item)
    assert "pelicans" in page.search_hit_text(0)
    rect = page.list.visualItemRect(item)
    assert rect.width() <= page.list.viewport().width()  # wrapped at the list's width
    assert cell.height() >= cell.heightForWidth(cell.width())  # every wrapped line shown
    assert cell.heightForWidth(cell.width()) > 2 * cell.fontMetrics().height()  # a snippet too
    page.list.setCurrentRow(0)
    qtbot.waitUntil(lambda: page.view.marked() == ["pelicans"], timeout=5000)
    sel = page.view.extraSelections()[0]
    fmt = sel.format
    mark, text = fmt.background().color().name(), fmt.foreground().color().name()
    assert _contrast(mark, theme.current().base) >= 1.35  # marked, on the page's background
    assert _contrast(mark, text) >= 4.5  # and still readable


def test_long_titles_are_elided_not_scrolled(ctx, qtbot) -> None:  # type: ignore[no-untyped-def]
    """D16: a long title widened the list and a horizontal scroll bar appeared."""
    title = "A conversation about planning Kimi-K3 on eight H100s with two TB of RAM " * 2
    page = _chat_page_with(ctx, qtbot, [(title, "hello")])
    qtbot.wait(50)
    bar = page.list.horizontalScrollBar()
    assert not bar.isVisible()
    assert bar.maximum() == 0
    assert page.list.item(0).toolTip().startswith(title.strip()[:40])  # the whole title there
    # the header's title too: elided at its width, whole in its tooltip
    page.list.setCurrentRow(0)
    qtbot.waitUntil(lambda: page.title.text().startswith(title[:40]), timeout=5000)
    qtbot.wait(50)
    full = page.title.text()
    shown = page.title.shown_text()
    assert shown.endswith("…")
    assert page.title.fontMetrics().horizontalAdvance(shown) <= page.title.width()
    assert page.title.geometry().right() < page.export_btn.geometry().left()  # not under it
    assert page.title.toolTip() == full


def test_engine_paths_keep_the_binarys_name(ctx, qtbot, hardware_file) -> None:  # type: ignore[no-untyped-def]
    """D22: a long path was cut at its end, hiding which binary it is."""
    from PySide6.QtWidgets import QStyleOptionViewItem

    from k3desk.core.app.engines import EngineRow
    from k3desk.ui.engine.page import EnginePanel

    panel = EnginePanel(ctx)
    qtbot.addWidget(panel)
    panel.resize(900, 400)
    panel.show()
    hw = ctx.services.load_hardware(hardware_file("8xH100-2TB"))
    deep = "/home/alice/.local/share/k3desk/engines/llama.cpp-b11434-cuda12/build/bin"
    panel._show_rows([EngineRow(f"{deep}/llama-server", "built by k3desk", error="x")], hw)
    table = panel.engines
    assert not table.wordWrap()  # wrapped at its slashes, only the first line showed
    index = table.model().index(0, 0)
    opt = QStyleOptionViewItem()
    opt.rect = table.visualRect(index)
    opt.textElideMode = table.textElideMode()  # as the view starts each cell's option
    table.itemDelegateForIndex(index).initStyleOption(opt, index)
    shown = opt.fontMetrics.elidedText(opt.text, opt.textElideMode, table.columnWidth(0) - 8)
    assert shown != opt.text  # the path is longer than its column
    assert shown.endswith("/llama-server")
    assert shown.startswith("/home")


def test_the_memory_tables_parts_add_up_to_used(ctx, qtbot, hardware_file, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """D20: "Used" counted a projector's buffer that no column showed."""
    from k3desk.core.engines.supervisor import LaunchSpec
    from k3desk.core.planning.estimate import estimate_layout
    from k3desk.core.planning.model import PlanOptions
    from k3desk.core.planning.plan import make_plan
    from k3desk.core.units import GiB
    from k3desk.ui.engine.controller import LaunchRequest
    from k3desk.ui.engine.page import EnginePage

    hw = ctx.services.load_hardware(hardware_file("8xH100-2TB"))
    layout = estimate_layout(ctx.services.catalog.get("6block-iq1s-xs"))
    opts = PlanOptions(mmproj=tmp_path / "mmproj-F16.gguf", mmproj_bytes=GiB)
    plan = make_plan(hw, layout, opts)
    page = EnginePage(ctx)
    qtbot.addWidget(page)
    page._launched(LaunchRequest(LaunchSpec(tmp_path / "llama-server", ()), plan=plan))
    table = page.memory
    heads = [table.horizontalHeaderItem(j).text() for j in range(table.columnCount())]
    parts = [h for h in heads if h not in ("Device", "Budget", "Used", "Left")]
    assert "Projector" in parts
    for i, d in enumerate(plan.devices):
        shown = dict(zip(heads, (table.item(i, j).text() for j in range(len(heads))), strict=True))
        assert shown["Device"] == d.device
        # what the cells say adds up to Used, to the rounding of their text
        total = sum(_bytes(shown[h]) for h in parts)
        assert abs(total - _bytes(shown["Used"])) <= 0.05 * GiB * (len(parts) + 1), shown


def _bytes(text: str) -> float:
    number, unit = text.split()
    scale = {"B": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3, "TiB": 1024**4}[unit]
    return float(number.replace(",", "")) * scale


def _small_machine(hardware_file, tmp_path, available_gib: int):  # type: ignore[no-untyped-def]
    """The 32 GB laptop's file as a 24 GiB machine with ``available_gib`` free."""
    import json

    data = json.loads(hardware_file("no-gpu-laptop-32GB").read_text(encoding="utf-8"))
    data["memory"]["total"] = 24 << 30
    data["memory"]["available"] = available_gib << 30
    data["label"] = "a 24 GiB laptop"
    path = tmp_path / f"24GiB-{available_gib}.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def _wizard_tiers(ctx, qtbot, hw_file):  # type: ignore[no-untyped-def]
    w = MainWindow(ctx)
    qtbot.addWidget(w)
    w.show()
    hw = ctx.hardware
    hw.load_file(hw_file)
    wiz = w.open_wizard()
    wiz.resize(1100, 720)  # as it opens on a 1366x768 screen
    qtbot.waitUntil(
        lambda: hw.recommendation is not None and hw.from_file == hw_file, timeout=30_000
    )
    return w, wiz


def test_nothing_fits_the_closest_is_not_called_recommended(
    ctx, qtbot, hardware_file, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    """D14: a star "recommended" beside "Not recommended: would need ... more RAM", the row
    below the fold, and a footer offering to stream a tier that cannot stream."""
    _w, wiz = _wizard_tiers(ctx, qtbot, _small_machine(hardware_file, tmp_path, 8))
    rec = ctx.hardware.recommendation
    assert rec.best is None
    assert rec.closest is not None
    assert rec.closest.verdict == "no-fit"
    # the machine page's chart shows the preselected row (9th of 10) without scrolling
    chart, scroll = wiz.machine.chart, wiz.machine.chart_scroll
    top = chart.pick_top()
    assert top > scroll.viewport().height()  # it would be below the fold
    qtbot.waitUntil(lambda: scroll.verticalScrollBar().value() > 0, timeout=5000)
    shown = scroll.verticalScrollBar().value()
    assert shown <= top
    assert top + chart.ROW <= shown + scroll.viewport().height()
    wiz.next()
    qtbot.wait(100)
    table = wiz.tiers.table
    row = table.current()
    assert row.tier.id == rec.closest.tier.id  # still preselected
    r = table.rows.index(row)
    name = table.item(r, 0).text()
    assert not name.startswith("★")  # not starred as the recommendation
    assert name.startswith("☆")
    assert "closest" in table.item(r, 0).toolTip()
    details = wiz.tiers.details.toPlainText()
    assert "Not recommended" not in details
    assert "closest option" in details
    rect = table.visualItemRect(table.item(r, 0))
    assert table.viewport().rect().contains(rect)  # on screen, not below the fold
    footer = wiz.tiers.fit_warning.text.text()
    assert "stream" not in footer
    assert "larger machine" in footer
    wiz.reject()


def test_a_tier_that_streams_is_offered_to_stream(ctx, qtbot, hardware_file, tmp_path) -> None:  # type: ignore[no-untyped-def]
    _w, wiz = _wizard_tiers(ctx, qtbot, _small_machine(hardware_file, tmp_path, 20))
    assert ctx.hardware.recommendation.closest.verdict == "stream"
    wiz.next()
    assert "stream it from disk" in wiz.tiers.fit_warning.text.text()
    wiz.reject()


def test_tier_cells_and_chart_labels_are_whole_at_1366(ctx, qtbot, hardware_file, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """D15: "won't fit: 704.4 GiB short of R...", "717.0 GiB · gue...", "yes (fork b...",
    and a fit-chart verdict covered by its bars."""
    from k3desk.ui.tiers import COLUMNS

    _w, wiz = _wizard_tiers(ctx, qtbot, _small_machine(hardware_file, tmp_path, 8))
    chart = wiz.machine.chart
    qtbot.waitUntil(lambda: bool(chart.rows), timeout=5000)
    chart.repaint()
    small = chart.font()
    small.setPointSizeF(max(7.0, chart.font().pointSizeF() * 0.85))
    from PySide6.QtGui import QFontMetrics

    fm = QFontMetrics(small)
    label_w = getattr(chart, "label_width", lambda: chart.LABEL_W)()
    for row in chart.rows:
        assert row.verdict in chart.painted  # drawn whole
        assert fm.horizontalAdvance(row.verdict) <= label_w - 12, row.verdict  # left of the bars
    wiz.next()
    qtbot.wait(100)
    table = wiz.tiers.table
    for name in ("Verdict", "Speed", "Size", "Vision"):
        col = COLUMNS.index(name)
        longest = max((table.item(r, col).text() for r in range(table.rowCount())), key=len)
        # as wide as its widest cell: none elided
        assert table.columnWidth(col) >= table.sizeHintForColumn(col), (name, longest)
    wiz.reject()


@pytest.mark.engine
@pytest.mark.slow
def test_an_engine_kept_without_a_window_shows_a_tray_icon(  # type: ignore[no-untyped-def]
    ctx, qtbot, launch_engine, llama_server, tiny_k3_single, monkeypatch
) -> None:
    """D26: the windowless process keeping the engine showed no sign of itself."""
    from PySide6.QtWidgets import QApplication, QSystemTrayIcon

    from k3desk.ui.tray import OPEN_TEXT, STOP_TEXT

    engine = launch_engine(llama_server, tiny_k3_single, vision=False)
    monkeypatch.setattr(QSystemTrayIcon, "isSystemTrayAvailable", staticmethod(lambda: True))
    app = QApplication.instance()
    w = MainWindow(ctx)
    qtbot.addWidget(w)
    w.show()
    w.close_choice = "keep"
    try:
        w.close()
        tray = w.tray
        assert tray is not None
        assert tray.icon.isVisible()
        assert tray.actions() == [OPEN_TEXT, STOP_TEXT]
        assert tiny_k3_single.name in tray.icon.toolTip()
        assert engine.address() in tray.icon.toolTip()  # where the person's tools go
        assert tray.stop == app.quit  # Stop quits this process, which stops the engine
        opened: list[bool] = []
        tray.open = lambda: opened.append(True)
        tray._activated(QSystemTrayIcon.ActivationReason.Trigger)  # a click on the icon
        assert opened == [True]
    finally:
        app.setQuitOnLastWindowClosed(True)
        if w.tray is not None:
            w.tray.icon.hide()
        engine.stop()


@pytest.mark.parametrize(
    ("key", "mod"),
    [("Key_F1", "NoModifier"), ("Key_Slash", "ControlModifier")],
)
def test_f1_lists_every_shortcut(ctx, qtbot, key, mod) -> None:  # type: ignore[no-untyped-def]
    """Item 4: a shortcut list, as LM Studio and Jan have; it names every QShortcut."""
    from PySide6.QtCore import Qt
    from PySide6.QtGui import QShortcut

    w = MainWindow(ctx)
    qtbot.addWidget(w)
    w.show()
    qtbot.waitExposed(w)
    w.activateWindow()
    qtbot.wait(100)
    qtbot.keyClick(w.sidebar, getattr(Qt.Key, key), getattr(Qt.KeyboardModifier, mod))
    qtbot.waitUntil(
        lambda: w.shortcut_list is not None and w.shortcut_list.isVisible(), timeout=2000
    )
    listed = " ".join(r[0] for r in w.shortcut_list.rows())
    chat = w.chat_page()
    found = {
        sc.key().toString()
        for owner in (w, chat)
        for sc in owner.findChildren(QShortcut)
        if not sc.key().isEmpty()
    }
    assert found >= {"Ctrl+N", "Ctrl+F", "Ctrl+E", "Del", "F1", "Ctrl+/", "Ctrl+1"}
    for key in found:
        if key.startswith("Ctrl+") and key[5:].isdigit():
            continue  # "Ctrl+1 … Ctrl+6"
        assert key.replace("Del", "Delete") in listed, key
    assert "Ctrl+1 … Ctrl+6" in listed
    w.shortcut_list.close()


def test_the_cluster_page_needs_no_sideways_scroll_at_1280(ctx, qtbot) -> None:  # type: ignore[no-untyped-def]
    """At 1366x768 the window opens 1280 wide: the engine card's buttons and ports were
    cut at the right edge, behind a horizontal scroll bar."""
    import time

    from PySide6.QtWidgets import QScrollArea

    from k3desk.core.cluster.nodes import Cluster, Node
    from k3desk.ui.cluster.controller import ProbeRun
    from tests.core.cluster.reports import report

    w = MainWindow(ctx)
    qtbot.addWidget(w)
    w.setMinimumSize(0, 0)
    w.resize(1280, 720)
    w.show()
    nodes = tuple(
        Node(host=f"spark{i}", user="alice", address=f"10.0.0.{10 + i}", model_path="/models/k3")
        for i in (1, 2, 3)
    )
    sparks = Cluster("sparks", nodes)
    ctx.cluster.save_cluster(sparks)
    ctx.cluster.probes["sparks"] = ProbeRun(
        "vcruz305-ud-iq1s", tuple(report(n) for n in nodes), time.time()
    )
    w.show_page("cluster")
    page = w.cluster_page()
    page.reload(select="sparks")
    qtbot.wait(200)
    scroll = page.findChildren(QScrollArea)[0]
    assert scroll.widget().minimumSizeHint().width() <= scroll.viewport().width()


def test_the_engine_pages_copy_buttons_say_copied(ctx, qtbot) -> None:  # type: ignore[no-untyped-def]
    """D23 elsewhere: the URL, key and log copy buttons only changed a tooltip nobody saw."""
    from PySide6.QtWidgets import QToolTip

    from k3desk.ui.engine.page import EnginePage

    page = EnginePage(ctx)
    qtbot.addWidget(page)
    page.show()
    qtbot.waitExposed(page)
    page.url.copy.setEnabled(True)
    QToolTip.hideText()
    page.url.copy.click()
    assert QGuiApplication.clipboard().text() == page.url.edit.text()
    qtbot.waitUntil(QToolTip.isVisible, timeout=2000)
    assert QToolTip.text() == "Copied"
    QToolTip.hideText()
    page.copy_log.click()
    qtbot.waitUntil(QToolTip.isVisible, timeout=2000)
    assert QToolTip.text() == "Copied"
