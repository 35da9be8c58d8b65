"""Owners still open at interpreter exit, closed in a safe order.

A C thread that calls back into Python while the interpreter finalises cannot
take the GIL, so sweepers are closed at exit, before finalisation; and an
engine must outlive the stop of the sweeper using it as its backstop, so
sweepers close before engines.
"""

from __future__ import annotations

import atexit
import weakref

sweepers = weakref.WeakSet()
engines = weakref.WeakSet()


@atexit.register
def _close_all_at_exit():
    for group in (sweepers, engines):
        for owner in list(group):
            try:
                owner.close()
            except Exception:  # pragma: no cover - best effort at exit
                pass
