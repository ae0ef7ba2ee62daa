"""The app survives PySide6 builds that leak references to None on every call."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

CODE = """
import sys
import k3desk.ui  # applies the guard when the installed PySide6 needs it
from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import QApplication, QLabel
class Flag(QObject):
    changed = Signal(bool)
app = QApplication([])
label = QLabel()
flag = Flag()
flag.changed.connect(lambda v: None)
for i in range(300_000):
    label.setText("x")
    flag.changed.emit(True)
    flag.changed.emit(False)
del label, flag, app
print("survived")
"""


def test_many_void_qt_calls_do_not_abort_the_interpreter() -> None:
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-c", CODE], capture_output=True, text=True, env=env, timeout=120
    )
    assert "deallocating None" not in proc.stderr
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "survived"
