"""Ctrl-C that always stops the command line (exit status 130).

Python turns SIGINT into ``KeyboardInterrupt`` in whatever frame is running.
When that frame is a ``__del__`` -- Amaranth's ``MustUse.__del__`` runs
whenever an unused elaboratable is collected, which a long elaboration does
thousands of times -- the interpreter prints "Exception ignored in ..." and
carries on, so the run completes and exits 0. The handler here records every
Ctrl-C; it raises at once unless a ``__del__`` is on the stack, and
:func:`check` (called at every progress step and when the command returns)
raises the recorded interrupt at the next safe point.
"""

from __future__ import annotations

import contextlib
import signal
import threading

__all__ = ["handled", "check", "interrupted"]

_pending = False


def interrupted() -> bool:
    """Whether a Ctrl-C arrived since :func:`handled` was entered."""
    return _pending


def check() -> None:
    """Raise ``KeyboardInterrupt`` if a Ctrl-C arrived and was not raised yet."""
    if _pending:
        raise KeyboardInterrupt


def _in_finaliser(frame) -> bool:
    while frame is not None:
        if frame.f_code.co_name == "__del__":
            return True
        frame = frame.f_back
    return False


def _on_sigint(signum, frame):
    global _pending
    _pending = True
    if not _in_finaliser(frame):
        raise KeyboardInterrupt


@contextlib.contextmanager
def handled():
    """Install the handler for the duration of a command (main thread only;
    elsewhere Python's default stays)."""
    global _pending
    _pending = False
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGINT, _on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)
        _pending = False
