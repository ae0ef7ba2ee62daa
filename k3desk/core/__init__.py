"""The capabilities of k3desk as plain Python.

Nothing below this package imports Qt: the GUI (``k3desk.ui``) and the CLI
(``k3desk.cli``) are two shells over it.  Long operations take a progress
callback and a :class:`~k3desk.core.progress.CancelToken`.
"""
