"""pytest plugin (tests/run loads it with `-p fired_tally` for the sanitizer runs): counts
the timers every Sweeper of the session fired, read from its own stats (fired_total) just
before it is destroyed, and prints the sum with the library the sweepers loaded, so the
log shows that the sanitized library really fired timers, and how many.

QUEEN_FIRED_TALLY_FILE, when set, also receives the sum (one line, appended), so that
tests/run can add up several pytest runs."""

from __future__ import annotations

import os

import pytest

from queen_sweeper import sweeper as _sweeper

_tally = {"fired": 0, "sweepers": 0, "libraries": set()}
_original_close = _sweeper.Sweeper.close


def _counting_close(self):
    handle = getattr(self, "_handle", None)
    if handle:
        try:
            # The same stop close() makes first; a second stop is a no-op, so close()
            # behaves as before, and fired_total is final when read.
            self._native.stop(handle, 5000)
            _tally["fired"] += int(self.stats().get("fired_total", 0))
            _tally["sweepers"] += 1
            _tally["libraries"].add(self.library_path)
        except Exception:  # a tally must never change what a test sees
            pass
    return _original_close(self)


_sweeper.Sweeper.close = _counting_close


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter):
    libs = ", ".join(sorted(_tally["libraries"])) or "none"
    terminalreporter.write_line(
        f"fired under this library: {_tally['fired']} timers by {_tally['sweepers']} sweepers "
        f"(library: {libs})")
    out = os.environ.get("QUEEN_FIRED_TALLY_FILE")
    if out:
        with open(out, "a", encoding="utf-8") as f:
            f.write(f"{_tally['fired']}\n")
