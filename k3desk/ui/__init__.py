"""The desktop app: the only package that imports PySide6.

Widgets are thin: every capability lives in :mod:`k3desk.core`; long work runs
off the GUI thread through :class:`k3desk.ui.tasks.TaskManager`, and core
callbacks reach widgets only as Qt signals made by :mod:`k3desk.ui.bridge`.
"""

from k3desk.ui.qtfix import guard_none_refcount

guard_none_refcount()
